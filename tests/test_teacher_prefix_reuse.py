"""SERL's teacher on conversation rows reuses each row's common prefix with the row before
(serl.train.scoring.score_logprobs_reusing_prefixes): the same log-probs as scoring every whole
prompt, for fewer tokens run."""

from __future__ import annotations

import pytest
import torch

from serl.train.batch import UpdateBatch
from serl.train.scoring import score_logprobs, score_logprobs_reusing_prefixes


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from serl.models.loading import load_causal_lm

    return load_causal_lm(str(tiny_model_dir), torch.float32, "cpu").eval()


def _ids(g: torch.Generator, n: int) -> list[int]:
    return torch.randint(5, 200, (n,), generator=g).tolist()


def _episode_rows(g: torch.Generator, steps: int) -> tuple[list[list[int]], list[list[int]]]:
    """A conversation's teacher rows: row t = the chat up to step t (first turn, then each earlier
    step's user turn and reply) + step t's privileged user turn; its response = step t's reply."""
    first, chat, prompts, replies = _ids(g, 40), [], [], []
    chat = list(first)
    for _ in range(steps):
        user, privileged, reply = _ids(g, 12), _ids(g, 20), _ids(g, 6)
        prompts.append(chat + privileged + user)
        replies.append(reply)
        chat = chat + user + reply
    return prompts, replies


def _batch(prompts, replies, masks=None) -> UpdateBatch:
    masks = masks or [torch.ones(len(r)) for r in replies]
    return UpdateBatch(prompt_ids=prompts, response_ids=replies, response_masks=masks,
                       advantages=[torch.zeros(len(r)) for r in replies], old_log_probs=[None] * len(replies))


def test_reusing_prefixes_gives_the_log_probs_of_whole_prompts(model, monkeypatch):
    g = torch.Generator().manual_seed(0)
    p1, r1 = _episode_rows(g, 4)
    p2, r2 = _episode_rows(g, 3)  # another episode: nothing in common with the row before
    prompts, replies = p1 + p2, r1 + r2
    masks = [torch.ones(len(r)) for r in replies]
    masks[2] = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])  # tokens without loss: log-prob 0 there
    masks[5] = torch.zeros(6)  # an all-zero mask keeps every position, as collate does
    batch = _batch(prompts, replies, masks)
    want = score_logprobs(model, batch, 4, pad_id=0, temperature=0.7)
    ran: list[int] = []
    real = model.forward

    def counting(*args, input_ids=None, **kwargs):
        ran.append(input_ids.shape[1])
        return real(*args, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(model, "forward", counting)
    stats: dict[str, int] = {}
    got = score_logprobs_reusing_prefixes(model, batch, temperature=0.7, stats=stats)
    for w, x in zip(want, got):
        torch.testing.assert_close(x, w, rtol=0, atol=2e-5)
    assert got[2][1] == 0 and got[2][4] == 0 and bool((got[5] != 0).all())
    # row t > 0 of an episode runs its last turn, its privileged turn and reply; the first row of each
    # episode (and of the second, which shares nothing) runs whole
    whole = [len(p) + len(r) for p, r in zip(prompts, replies)]
    assert ran[0] == whole[0] and ran[4] == whole[4]
    assert all(n == 12 + 6 + 20 + 12 + 6 for n in ran[1:4] + ran[5:])
    assert sum(ran) == whole[0] + whole[4] + 5 * 56 < sum(whole)  # 436 of 708 tokens; the gap grows as T²
    assert stats == {"run_tokens": sum(ran), "reused_tokens": sum(whole) - sum(ran)}


def test_a_lora_adapter_view_is_scored_as_a_model(tiny_model_dir):
    # SERL's teacher under LoRA is an adapter of the policy's PEFT model (serl.models.lora.AdapterView)
    from serl.config.model_env import ModelLoraConfig
    from serl.models.loading import load_causal_lm
    from serl.models.lora import AdapterView, apply_lora

    peft = apply_lora(load_causal_lm(str(tiny_model_dir), torch.float32, "cpu"), ModelLoraConfig(r=4))
    with torch.no_grad():  # an adapter that changes the outputs (PEFT starts lora_B at 0)
        for name, w in peft.named_parameters():
            if "lora_B" in name:
                w.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(2))
    view = AdapterView(peft, "default")
    g = torch.Generator().manual_seed(1)
    prompts, replies = _episode_rows(g, 3)
    batch = _batch(prompts, replies)
    stats: dict[str, int] = {}
    got = score_logprobs_reusing_prefixes(view, batch, stats=stats)
    for w, x in zip(score_logprobs(view, batch, 2, pad_id=0), got):
        torch.testing.assert_close(x, w, rtol=0, atol=2e-5)
    assert stats["reused_tokens"] > 0
    with pytest.raises(ValueError, match="prompts for"):
        score_logprobs_reusing_prefixes(view, batch, prompt_ids=prompts[:1])
