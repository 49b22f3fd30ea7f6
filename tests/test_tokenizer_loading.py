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
