"""SERL's λ schedule, teacher sync rule, selective weights and the teacher
prompt truncation, on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from serl.algos.selective_weights import effective_lambda, serl_token_weights, teacher_needs_sync, teacher_rows
from serl.hindsight.rendering import SOLVE_LINE
from serl.models.teacher import TRUNCATION_MARK, teacher_prompt_ids


def test_effective_lambda_schedule():
    assert effective_lambda(0, 0.5, 50) == 0.5
    assert effective_lambda(25, 0.5, 50) == pytest.approx(0.25)
    assert effective_lambda(49, 0.5, 50) == pytest.approx(0.01)
    assert effective_lambda(50, 0.5, 50) == 0.0
    assert effective_lambda(80, 0.5, 50) == 0.0
    assert effective_lambda(1000, 0.3, 0) == 0.3  # D = 0: constant


def test_teacher_sync_every_interval():
    assert [u for u in range(0, 31) if teacher_needs_sync(u, 10)] == [10, 20, 30]
    assert not any(teacher_needs_sync(u, 0) for u in range(20))


def test_weights_hand_computed():
    # rows: A>0, A<0, A=0; three tokens each
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0], [0.0, 0.0, 0.0]])
    student = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    teacher = torch.log(torch.tensor([[0.55, 0.25, 0.5], [0.55, 0.25, 0.9], [0.9, 0.9, 0.9]]))
    selected = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    lam, c = 0.5, 0.2
    W, m = serl_token_weights(adv, student, teacher, selected, lam, c)
    # row 0 (A>0): Δ = log(1.1) -> w = 1.1 -> W = 0.5 + 0.55 = 1.05; Δ = log(0.5) -> w clipped 0.8 -> 0.9;
    # token 2 not selected -> 1
    # row 1 (A<0): s = -Δ: w = 1/1.1 = 0.90909 -> W = 0.954545; w = 2 -> clip 1.2 -> 1.1;
    # Δ = log 1.8 -> w = 1/1.8 -> clip 0.8 -> 0.9
    # row 2 (A=0): sign 0 -> w = 1 -> W = 1
    expected = torch.tensor([[1.05, 0.9, 1.0], [0.5 + 0.5 / 1.1, 1.1, 0.9], [1.0, 1.0, 1.0]])
    assert torch.allclose(W, expected, atol=1e-6)
    assert m["weight_max"] == pytest.approx(1.2)
    assert m["weight_min"] == pytest.approx(0.8)
    ws = [1.1, 0.8, 1 / 1.1, 1.2, 0.8, 1.0, 1.0, 1.0]  # clipped w of the 8 selected tokens
    assert m["clipped_fraction"] == pytest.approx(3 / 8)  # 0.8, 1.2, 0.8 sit at a bound
    assert m["weight_mean"] == pytest.approx(sum(ws) / 8, rel=1e-5)
    deltas = [math.log(1.1), math.log(0.5), math.log(1.1), math.log(0.5), math.log(1.8)] + [math.log(1.8)] * 3
    assert m["delta_abs_mean"] == pytest.approx(sum(abs(d) for d in deltas) / 8, rel=1e-5)
    assert m["empty_target_batch"] == 0.0


def test_teacher_rows_skip_rows_that_train_nothing():
    has_ctx = [True, True, False, True, True]
    adv = torch.tensor([0.5, 0.0, 1.0, -0.0, -2.0])
    row_mask = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    # row 1 and 3: A = 0 (also -0.0); row 2: no context; row 4: masked by a Dr.BoT filter
    assert teacher_rows(has_ctx, adv, row_mask) == [0]
    assert teacher_rows(has_ctx, adv, row_mask, skip_zero_advantage_rows=False) == [0, 1, 3, 4]
    assert teacher_rows(has_ctx, torch.tensor([1e-30, 0.0, 0.0, 0.0, 3.0]), torch.ones(5)) == [0, 4]  # no tolerance
    assert teacher_rows([], torch.zeros(0), torch.zeros(0)) == []
    with pytest.raises(ValueError, match="expected"):
        teacher_rows(has_ctx, adv[:4], row_mask)


def test_a_row_with_zero_advantage_has_weight_one_whatever_the_teacher_says():
    """Why :func:`teacher_rows` may skip it: W = 1 and A·W = 0 for any teacher log-probs."""
    g = torch.Generator().manual_seed(0)
    adv = torch.zeros(3, 6)
    for scale in (0.1, 5.0, 100.0):
        teacher = torch.randn(3, 6, generator=g) * scale
        W, _ = serl_token_weights(adv, torch.randn(3, 6, generator=g), teacher, torch.ones(3, 6, dtype=torch.bool), 0.7, 0.2)
        assert torch.equal(W, torch.ones(3, 6)) and torch.equal(adv * W, torch.zeros(3, 6))


def test_weights_bounds_and_empty_selection():
    adv = torch.randn(4, 7)
    W, m = serl_token_weights(adv, torch.randn(4, 7), torch.randn(4, 7) * 30, torch.ones(4, 7, dtype=torch.bool), 0.5, 0.2)
    assert float(W.min()) >= 0.9 - 1e-6 and float(W.max()) <= 1.1 + 1e-6
    W, m = serl_token_weights(adv, torch.zeros(4, 7), torch.zeros(4, 7), torch.zeros(4, 7, dtype=torch.bool), 0.5, 0.2)
    assert torch.equal(W, torch.ones(4, 7))
    assert m["empty_target_batch"] == 1.0


def test_teacher_prompt_fits_untouched(tokenizer):
    ids, ok = teacher_prompt_ids(tokenizer, "Your task is to: look.", "Feedback:\nNothing happens.", 512)
    text = tokenizer.decode(ids)
    assert ok and "Nothing happens." in text and SOLVE_LINE in text
    assert text.rstrip().endswith("assistant")


def test_teacher_prompt_truncation_cuts_oldest_hindsight_keeps_template_end(tokenizer):
    prompt = "Your task is to: put a clean apple in fridge."
    block = "Later steps:\n" + "\n".join(f"Step {k}: <action>go to cabinet {k}</action>" for k in range(200))
    cap = 300
    ids, ok = teacher_prompt_ids(tokenizer, prompt, block, cap, "privileged")
    text = tokenizer.decode(ids)
    assert ok and len(ids) <= cap
    assert prompt in text and SOLVE_LINE in text
    assert TRUNCATION_MARK.strip() in text
    assert "cabinet 199" in text and "cabinet 0<" not in text  # newest kept, oldest cut
    assert text.rstrip().endswith("assistant")  # generation prompt kept
    # the original's right truncation cuts the end of the chat instead
    ids_r, _ = teacher_prompt_ids(tokenizer, prompt, block, cap, "right")
    assert len(ids_r) == cap and SOLVE_LINE not in tokenizer.decode(ids_r)


def test_teacher_prompt_without_room_for_context(tokenizer):
    prompt = "word " * 400
    ids, ok = teacher_prompt_ids(tokenizer, prompt, "Feedback:\nYou pick up the apple 1.", 200)
    assert ok is False
