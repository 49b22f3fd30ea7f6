"""The SERL teacher in checkpoints: stored in its own dtype, or rebuilt from the policy when it
equals the policy cast to that dtype."""

from __future__ import annotations

import torch

from serl.models.loading import load_causal_lm
from serl.models.teacher import Teacher
from serl.train.checkpoint import load_checkpoint, save_checkpoint


def _models(tiny_model_dir):
    policy = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu", False)
    return policy, Teacher(policy, torch.bfloat16)


def _perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.01)


def test_teacher_differing_from_policy_is_stored_in_its_dtype(tiny_model_dir, tmp_path):
    policy, teacher = _models(tiny_model_dir)
    _perturb(policy, 0)  # the policy moved on after the teacher's copy
    opt = torch.optim.AdamW(policy.parameters())
    ck = save_checkpoint(tmp_path, 1, policy, opt, {}, teacher=teacher.model)
    from safetensors.torch import load_file

    stored = load_file(str(ck / "teacher.safetensors"))
    assert {v.dtype for v in stored.values()} == {torch.bfloat16}
    fresh_policy, fresh_teacher = _models(tiny_model_dir)
    state = load_checkpoint(ck, fresh_policy, teacher=fresh_teacher.model)
    assert state["teacher_from_policy"] is False
    for (k, v), (_, w) in zip(teacher.model.state_dict().items(), fresh_teacher.model.state_dict().items()):
        assert torch.equal(v, w), k


def test_teacher_equal_to_cast_policy_is_rebuilt_from_it(tiny_model_dir, tmp_path):
    policy, teacher = _models(tiny_model_dir)
    _perturb(policy, 1)
    teacher.sync_from(policy)  # a teacher sync: teacher = policy in bf16
    opt = torch.optim.AdamW(policy.parameters())
    ck = save_checkpoint(tmp_path, 1, policy, opt, {}, teacher=teacher.model)
    assert not (ck / "teacher.safetensors").exists()
    fresh_policy, fresh_teacher = _models(tiny_model_dir)  # teacher = θ0 before loading
    state = load_checkpoint(ck, fresh_policy, teacher=fresh_teacher.model)
    assert state["teacher_from_policy"] is True
    for (k, v), (_, w) in zip(teacher.model.state_dict().items(), fresh_teacher.model.state_dict().items()):
        assert w.dtype == torch.bfloat16 and torch.equal(v, w), k
