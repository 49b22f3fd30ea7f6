"""serl.models.loading.load_tokenizer: left padding, a pad token, and no WordPiece clean-up on BPE."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from serl.models.loading import load_tokenizer

TOKENIZER_DIR = Path(__file__).parent / "fixtures" / "smollm2_tokenizer"


def test_bpe_tokenizer_asking_for_clean_up_decodes_unchanged_without_a_warning(tmp_path, capfd):
    d = tmp_path / "tok"
    shutil.copytree(TOKENIZER_DIR, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["clean_up_tokenization_spaces"] = True  # as a config may ask (transformers 5.17 warned on SmolLM2)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_tokenizer(str(d))
    assert tok.clean_up_tokenization_spaces is False and tok.padding_side == "left" and tok.pad_token_id is not None
    assert tok.decode(tok("Hello , world !")["input_ids"]) == "Hello , world !"  # spaces before punctuation kept
    assert "clean_up_tokenization_spaces" not in capfd.readouterr().err


def test_eos_is_the_chat_templates_end_of_turn(tmp_path):
    """A tokenizer whose eos is not the token that closes an assistant turn (transformers 5.17's GGUF
    conversion of SmolLM2 gave eos = bos = <|im_start|>) gets eos = <|im_end|>, so SFT targets end
    with it and generation stops at it; pad defaults to it."""
    from serl.agent.chat_template import end_of_turn_token

    d = tmp_path / "tok"
    shutil.copytree(TOKENIZER_DIR, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<|im_start|>"  # what the 5.17 conversion wrote
    cfg.pop("pad_token")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(d)).eos_token == "<|im_start|>"
    tok = load_tokenizer(str(d))
    assert end_of_turn_token(tok) == "<|im_end|>"
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)
    reply = tok.apply_chat_template([{"role": "user", "content": "u"}, {"role": "assistant", "content": "ok"}],
                                    tokenize=False)
    assert reply.rstrip().endswith("ok" + tok.eos_token)


def test_a_template_without_an_end_of_turn_token_keeps_eos(tmp_path):
    from serl.agent.chat_template import end_of_turn_token

    d = tmp_path / "tok"
    shutil.copytree(TOKENIZER_DIR, d)
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    tok = load_tokenizer(str(d))
    assert end_of_turn_token(tok) is None and tok.eos_token == "<|im_end|>"


def test_a_reply_ends_at_the_end_of_turn_or_at_a_new_turn(tmp_path):
    """The rollout engine stops a reply at the tokenizer's eos (<|im_end|>) and at the chat template's
    turn-start token (<|im_start|>, the first token of the generation prompt); a template with no
    special tokens adds no turn-start stop."""
    from types import SimpleNamespace

    from serl.agent.chat_template import turn_start_token
    from serl.rollout.engine import HFEngine

    tok = load_tokenizer(str(TOKENIZER_DIR))
    assert turn_start_token(tok) == "<|im_start|>"
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))
    assert HFEngine._eos_ids(model, tok) == {tok.convert_tokens_to_ids("<|im_start|>"), tok.eos_token_id} == {1, 2}
    d = tmp_path / "tok"
    shutil.copytree(TOKENIZER_DIR, d)
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                                           "{% if add_generation_prompt %}assistant: {% endif %}")
    plain = load_tokenizer(str(d))
    assert turn_start_token(plain) is None and HFEngine._eos_ids(model, plain) == {plain.eos_token_id}
