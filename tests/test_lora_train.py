"""`serl train model.lora.r>0`: only adapter weights train, the teacher is a second adapter and the
KL reference the base with adapters disabled (one base in memory), adapter-only checkpoints, a
bit-identical resume, and a LoRA run folder usable as ``model.path`` (merged at load)."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

from serl.configure import load_config
from serl.models.loading import load_causal_lm, resolve_model_path
from serl.models.lora import (POLICY_ADAPTER, TEACHER_ADAPTER, AdapterView, adapter_parameters, adapter_scalings,
                              is_peft_model, merged_weights)
from serl.train.batch import UpdateBatch
from serl.train.checkpoint import latest_checkpoint
from serl.train.trainer import Trainer


def _cfg(model_dir, out, **extra):
    overrides = [
        f"model.path={model_dir}", "env.max_steps=2", "env.rollout.n=2", "env.num_workers=2",
        "data.train_batch_size=2", "data.max_response_length=12", "actor.lr=1e-3",
        "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=2", "trainer.total_training_steps=1",
        f"trainer.output_dir={out}", "trainer.run_name=run", "trainer.progress=false",
        "model.lora.r=4", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.1", "actor.entropy_coeff=0.01",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config("cpu", overrides)


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _is_adapter(name: str, adapter: str) -> bool:
    return ".lora_" in name and f".{adapter}." in name


def test_one_lora_iteration_changes_only_the_policy_adapter(tiny_model_dir, tmp_path):
    tr = Trainer(_cfg(tiny_model_dir, tmp_path))
    try:
        # one base model for training: the teacher and the reference share the policy's modules;
        # the hf engine samples from a plain copy with the adapter merged in (rollout.merge_lora)
        assert not is_peft_model(tr.rollout_model) and tr.rollout_model is not tr.policy
        assert tr.teacher.model.peft_model is tr.policy and tr.ref.model.peft_model is tr.policy
        trainable = {k for k, p in tr.policy.named_parameters() if p.requires_grad}
        assert trainable and all(_is_adapter(k, POLICY_ADAPTER) for k in trainable)
        assert sum(p.numel() for p in tr.optimizer.param_groups[0]["params"]) == \
            sum(p.numel() for p in adapter_parameters(tr.policy, POLICY_ADAPTER).values())
        before = _params(tr.policy)
        tr.train_iteration()
        after = _params(tr.policy)
        changed = {k for k in before if not torch.equal(before[k], after[k])}
        assert changed, "no parameter changed"
        assert all(_is_adapter(k, POLICY_ADAPTER) for k in changed), sorted(changed)[:5]
        # the merged rollout copy followed the update: W + s·B·A of the trained adapter
        merged = merged_weights(after, adapter_scalings(tr.policy))
        for name, p in tr.rollout_model.named_parameters():
            assert torch.equal(p, merged[name].to(p.dtype)), name
        # scoring with the teacher / the reference restored the trained adapter and its flags
        assert tr.policy.active_adapter == POLICY_ADAPTER
        assert {k for k, p in tr.policy.named_parameters() if p.requires_grad} == trainable

        ck = tr.save()
        pol = load_file(str(ck / "policy.safetensors"))
        assert set(pol) == set(adapter_parameters(tr.policy, POLICY_ADAPTER))
        assert set(load_file(str(ck / "teacher.safetensors"))) == set(pol)
    finally:
        tr.close()


def test_teacher_snapshot_and_reference_log_probs(tiny_model_dir, tmp_path):
    """The teacher adapter scores exactly as a deep copy of the policy taken at the sync; the
    reference (adapters disabled) exactly as the base model loaded afresh."""
    tr = Trainer(_cfg(tiny_model_dir, tmp_path))
    try:
        tr.train_iteration()
        groups = tr.last_groups
        rows = [s for g in groups for t in g.trajectories for s in t.steps]
        batch = UpdateBatch.from_steps(rows, torch.zeros(len(rows)), torch.ones(len(rows)))
        tr.policy.eval()
        snapshot = copy.deepcopy(tr.policy)  # the policy at the sync, its own copy of every weight
        tr.teacher.sync_from(tr.policy)
        with torch.no_grad():  # move the policy on: the teacher must keep the snapshot
            for p in adapter_parameters(tr.policy, POLICY_ADAPTER).values():
                p.add_(0.05)
        teacher = tr.scorer.score(tr.teacher.model, batch)
        # the same AdapterView wrapper, hence the same scoring path (views take the full-logits path)
        expected = tr.scorer.score(AdapterView(snapshot, POLICY_ADAPTER), batch)
        policy_now = tr.scorer.score(tr.policy, batch)
        for t, e, p in zip(teacher, expected, policy_now):
            assert torch.equal(t, e)
        assert any(not torch.equal(t, p) for t, p in zip(teacher, policy_now))

        base = load_causal_lm(str(tiny_model_dir), next(tr.policy.get_base_model().parameters()).dtype, "cpu")
        base.eval()
        ref = tr.scorer.score(tr.ref.model, batch)
        for r, b in zip(ref, tr.scorer.score(base, batch)):  # a plain model takes the response-only LM-head path
            torch.testing.assert_close(r, b, rtol=0, atol=1e-4)
        assert tr.policy.active_adapter == POLICY_ADAPTER
    finally:
        tr.close()


def _two_iterations(tr: Trainer) -> list[dict]:
    out = []
    for _ in range(2):
        m = tr.train_iteration()
        tr.logger.log(tr.iteration, m)
        out.append(m)
    return out


def _comparable(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.startswith(("timing/", "throughput/"))}


def test_lora_resume_is_bit_identical(tiny_model_dir, tmp_path):
    """2 LoRA iterations straight == 1 iteration, save, resume, 1 iteration (as the full
    fine-tuning test in test_train_e2e.py): same adapters, teacher adapter and metrics."""
    extra = {"trainer.total_training_steps": 2, "algorithm.serl.teacher_sync_interval": 1}
    straight = Trainer(_cfg(tiny_model_dir, tmp_path / "a", **extra))
    try:
        ms = _two_iterations(straight)
        p_straight = _params(straight.policy)
    finally:
        straight.close()

    first = Trainer(_cfg(tiny_model_dir, tmp_path / "b", **extra))
    try:
        m1 = first.train_iteration()
        first.logger.log(first.iteration, m1)
        first.save()
    finally:
        first.close()
    resumed = Trainer(_cfg(tiny_model_dir, tmp_path / "b", **extra), run_dir=tmp_path / "b" / "run", resume=True)
    try:
        m2 = resumed.train_iteration()
        p_resumed = _params(resumed.policy)
    finally:
        resumed.close()
    assert "serl/teacher_synced" in m1 and "actor/kl_loss" in m2
    assert _comparable(ms[0]) == _comparable(m1)
    assert _comparable(ms[1]) == _comparable(m2)
    assert p_straight.keys() == p_resumed.keys()
    for k, v in p_straight.items():
        assert torch.equal(v, p_resumed[k]), k
    # the teacher adapter (synced every update) is part of the parameters compared above
    assert any(_is_adapter(k, TEACHER_ADAPTER) for k in p_straight)


def test_lora_run_folder_as_model_path(tiny_model_dir, tmp_path, monkeypatch):
    """``model.path=RUN_DIR`` of a LoRA run: the latest adapter merged into the base (float32)."""
    monkeypatch.setenv("SERL_CACHE", str(tmp_path / "cache"))
    tr = Trainer(_cfg(tiny_model_dir, tmp_path, **{"algorithm.serl.enable": "false", "actor.use_kl_loss": "false"}))
    try:
        with torch.no_grad():
            for p in adapter_parameters(tr.policy, POLICY_ADAPTER).values():
                p.normal_(0, 0.05)
        tr.save()
        adapter = AdapterView(tr.policy, POLICY_ADAPTER).state_dict()
    finally:
        tr.close()
    folder = resolve_model_path(str(tmp_path / "run"))
    assert resolve_model_path(str(tmp_path / "run")) == folder  # built once
    merged = load_causal_lm(folder, torch.float32, "cpu").eval()
    # the same adapter on a float32 base, unmerged
    from serl.models.lora import apply_lora

    cfg = _cfg(tiny_model_dir, tmp_path)
    ref = apply_lora(load_causal_lm(str(tiny_model_dir), torch.float32, "cpu"), cfg.model.lora)
    AdapterView(ref, POLICY_ADAPTER).load_state_dict(adapter)
    ref.eval()
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        a, b = merged(input_ids=ids).logits, ref(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5)
    base = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu").eval()
    with torch.no_grad():
        assert not torch.allclose(base(input_ids=ids).logits, a, atol=1e-3)
    assert latest_checkpoint(tmp_path / "run").exists()


def test_merge_lora_off_samples_from_the_policy_itself(tiny_model_dir, tmp_path):
    tr = Trainer(_cfg(tiny_model_dir, tmp_path, **{"rollout.merge_lora": "false"}))
    try:
        assert tr.rollout_model is tr.policy and tr.models.lora_scalings is None
    finally:
        tr.close()


def test_merged_copy_computes_what_the_adapter_computes(tiny_model_dir):
    """W + s·B·A in float32 equals PEFT's forward with the adapter (float32 throughout)."""
    from serl.models.loading import load_causal_lm
    from serl.models.lora import apply_lora, merged_copy

    cfg = load_config("cpu", ["model.lora.r=4"])
    policy = apply_lora(load_causal_lm(str(tiny_model_dir), torch.float32, "cpu"), cfg.model.lora).eval()
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    plain = merged_copy(policy, torch.float32)
    assert not is_peft_model(plain) and not any(".lora_" in n for n, _ in plain.named_parameters())
    ids = torch.randint(5, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = policy(input_ids=ids).logits, plain(input_ids=ids).logits
        with policy.disable_adapter():
            base = policy(input_ids=ids).logits
    assert (want - base).abs().max() > 1e-3  # the adapter matters
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(KeyError):
        merged_weights({}, adapter_scalings(policy))
