"""``model.gradient_checkpointing=auto``: the activation-memory estimate is an upper bound of the
measured allocator peak within 2×, the per-micro-batch switch follows the budget, and the update's
parameters do not depend on it (tiny models)."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from serl.configure import load_config
from serl.errors import ConfigError
from serl.models.memory import (DEFAULT_ACTIVATION_MEMORY_FRACTION, LOGIT_BYTES_PER_ENTRY, activation_budget_bytes,
                                activation_bytes, available_memory_bytes, model_activation_bytes)
from serl.train.batch import UpdateBatch
from serl.train.grad_ckpt import GradCheckpointing, prepare_checkpointing, set_checkpointing
from serl.train.trainer import Trainer
from serl.trajectory import Step


def test_activation_bytes_hand_computed():
    # h=2, i=3, L=1, a=2, kv=1, e=2, f=4, b=1, s=4: per token and layer
    # 2·(2·4 + 5·2)·2 + 4·2·3 + 4·2 + 8 + 2·4 = 72 + 24 + 8 + 8 + 8 = 120; × (L+1) = 240; + 4·s = 256
    # per token → 4 tokens: 1024; + 24 · vocab 10 · 3 positions = 720
    assert activation_bytes(1, 4, 2, 3, 1, 2, 1, vocab=10, logit_positions=3, dtype_bytes=2) == 1024 + 720
    # linear in rows, super-linear in the sequence (the mask term)
    one = activation_bytes(1, 256, 64, 128, 2, 4, 2)
    assert activation_bytes(3, 256, 64, 128, 2, 4, 2) == 3 * one
    assert activation_bytes(1, 512, 64, 128, 2, 4, 2) > 2 * one
    with pytest.raises(ValueError, match="kv_heads"):
        activation_bytes(1, 4, 2, 3, 1, 3, 2)
    with pytest.raises(ValueError, match=">= 0"):
        activation_bytes(-1, 4, 2, 3, 1, 2, 1)
    assert LOGIT_BYTES_PER_ENTRY == 24


def _llama(layers=2, hidden=128, inter=384, vocab=512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    prepare_checkpointing(model, "auto")
    return model.train()


def _peak_activation_bytes(model, rows, seq, kept, autocast, tmp_path) -> int:
    """Allocator peak of one forward+backward minus what stays allocated after it (the
    gradients): the activations and the backward's working set. CPU allocations are read from
    the profiler's ``[memory]`` events (``Total Allocated``), which see PyTorch's allocator."""
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(3, 500, (rows, seq), generator=torch.Generator().manual_seed(seq))
    mask = torch.ones(rows, seq, dtype=torch.long)
    mask[0, :3] = 0  # left padding: the 4-D additive mask, as in real batches
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            lp = torch.log_softmax(model.lm_head(hidden[:, -kept:]).float(), -1)
        lp[..., 0].sum().backward()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = sorted((e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"),
                    key=lambda e: e["ts"])
    total = [e["args"]["Total Allocated"] for e in events if e["args"].get("Device Type", 0) == 0]
    assert len(total) > 50, "the profiler recorded no CPU allocations"
    model.zero_grad(set_to_none=True)
    return max(total) - total[-1]


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_estimate_bounds_the_measured_peak_within_2x(autocast, tmp_path):
    model = _llama()
    layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    for rows, seq in ((1, 256), (2, 512), (1, 1024)):
        kept = 16
        est = model_activation_bytes(model.config, rows, seq, logit_positions=rows * kept,
                                     dtype_bytes=2 if autocast else 4)
        set_checkpointing(layers, False)
        measured = _peak_activation_bytes(model, rows, seq, kept, autocast, tmp_path)
        assert measured <= est <= 2 * measured, (rows, seq, measured, est)
        # checkpointing (the same model, flags on) holds much less
        set_checkpointing(layers, True)
        assert _peak_activation_bytes(model, rows, seq, kept, autocast, tmp_path) < 0.8 * measured


def test_auto_switches_per_micro_batch_on_the_budget():
    model = _llama(layers=1, hidden=64, inter=128)
    layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    small = model_activation_bytes(model.config, 1, 64)
    big = model_activation_bytes(model.config, 4, 256)
    gc = GradCheckpointing(model, "auto", memory_gb=(small + big) / 2 / 2**30)
    assert gc.select(1, 64) is False and not any(m.gradient_checkpointing for m in layers)
    assert gc.select(4, 256) is True and all(m.gradient_checkpointing for m in layers)
    assert gc.select(1, 64) is False and not any(m.gradient_checkpointing for m in layers)
    assert gc.fraction() == pytest.approx(1 / 3)
    assert gc.metrics() == {"perf/grad_ckpt_fraction": pytest.approx(1 / 3)}
    assert gc.budget == int((small + big) / 2)
    gc.begin()
    assert gc.fraction() == 0.0
    always, never = GradCheckpointing(model, True), GradCheckpointing(model, False)
    assert always.select(1, 8) and not never.select(4096, 4096)
    assert always.metrics() == {"perf/grad_ckpt_fraction": 1.0}


def test_budget_from_the_key_or_the_available_memory(monkeypatch):
    assert activation_budget_bytes(2.0) == 2 * 2**30
    avail = available_memory_bytes("cpu")
    if avail is None:
        pytest.skip("no psutil and no /proc/meminfo here")
    assert avail > 0
    auto = activation_budget_bytes(None, "cpu", processes=2)
    assert auto == pytest.approx(DEFAULT_ACTIVATION_MEMORY_FRACTION * avail / 2, rel=0.2)
    import serl.models.memory as memory
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device="cpu": None)
    assert activation_budget_bytes(None) == 0  # unreadable: always checkpoint (the safe side)


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="Linux only")
def test_meminfo_fallback_without_psutil(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_psutil(name, *a, **k):
        if name == "psutil":
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    assert available_memory_bytes("cpu") > 0


@pytest.mark.parametrize("value,expected", [("auto", "auto"), ("true", True), ("false", False)])
def test_config_key_accepts_true_false_auto(value, expected):
    cfg = load_config("cpu", [f"model.gradient_checkpointing={value}", "trainer.activation_memory_gb=1.5"])
    assert cfg.model.gradient_checkpointing == expected and cfg.trainer.activation_memory_gb == 1.5
    assert load_config("cpu").model.gradient_checkpointing == "auto"


@pytest.mark.parametrize("override,key", [("model.gradient_checkpointing=sometimes", "model.gradient_checkpointing"),
                                          ("model.gradient_checkpointing=1", "model.gradient_checkpointing"),
                                          ("trainer.activation_memory_gb=0", "trainer.activation_memory_gb"),
                                          ("trainer.activation_memory_gb=-2", "trainer.activation_memory_gb")])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config("cpu", [override])


def _rows(n=4):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        p = torch.randint(3, 4000, (6 + 5 * i,), generator=g).tolist()
        r = torch.randint(3, 4000, (3 + i,), generator=g).tolist()
        out.append(Step(step_id=0, observation="o", prompt="p", prompt_ids=p, response_text="r", response_ids=r,
                        action="a", action_valid=True, reward=0.0, done=False, won=False, action_mask=[1] * len(r)))
    return out


def test_update_is_the_same_with_and_without_checkpointing(tiny_model_dir, tmp_path):
    """One update (2 micro-batches) under ``auto`` with a budget below every micro-batch (all
    checkpointed), above every one (none) and between them (one of two): the same parameters."""
    rows = _rows()
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0])
    small = None
    results = {}
    for label, gb in (("all", 1e-9), ("none", 100.0), ("half", None)):
        overrides = [f"model.path={tiny_model_dir}", "env.rollout.n=2", "data.train_batch_size=2", "actor.lr=1e-3",
                     "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=2", "actor.use_dynamic_bsz=false",
                     "algorithm.serl.enable=false", "model.train_dtype=float32", "model.dtype=float32",
                     f"trainer.output_dir={tmp_path / label}", "trainer.run_name=run", "trainer.progress=false",
                     "trainer.logger=[]", "model.gradient_checkpointing=auto"]
        if gb is None:  # between the two micro-batches' estimates (the second holds the longer rows)
            est = []
            for micro in UpdateBatch.from_steps(rows, adv, torch.ones(4)).split(2):
                b = micro.collate(0)
                est.append(model_activation_bytes(model_config, *b.input_ids.shape, int(b.response_mask.sum())))
            assert est[0] < est[1]
            gb = sum(est) / 2 / 2**30
        tr = Trainer(load_config("cpu", overrides + [f"trainer.activation_memory_gb={gb}"]))
        try:
            if small is None:
                small, model_config = copy.deepcopy(tr.policy.state_dict()), tr.policy.config
            tr.policy.load_state_dict(small)
            batch = UpdateBatch.from_steps(rows, adv, torch.ones(4))
            m = tr.update.run(batch, step=1)
            results[label] = ({k: v.detach().clone() for k, v in tr.policy.named_parameters()},
                              m["perf/grad_ckpt_fraction"])
        finally:
            tr.close()
    assert results["all"][1] == 1.0 and results["none"][1] == 0.0 and results["half"][1] == 0.5
    for label in ("none", "half"):
        for k, v in results["all"][0].items():
            torch.testing.assert_close(results[label][0][k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_sft_logs_the_checkpointed_share_and_learns_the_same(tiny_model_dir, tmp_path):
    """``serl sft``: one step with every micro-batch checkpointed (auto, tiny budget) and one with
    none (false): the fraction is logged and the loss and gradient norm agree."""
    from serl.train.sft import SFTTrainer

    rows = [{"env": "alfworld", "task_id": f"t{i}", "task_type": "pick_and_place_simple", "step": i,
             "messages": [{"role": "user", "content": f"Your task is to: put a mug {i} in fridge 1."}],
             "response": f"<think>go</think><action>take mug {i}</action>", "action": f"take mug {i}",
             "won": True, "episode_reward": 10.0} for i in range(4)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = {}
    for label, extra in (("auto", ["model.gradient_checkpointing=auto", "trainer.activation_memory_gb=1e-9"]),
                         ("off", ["model.gradient_checkpointing=false"])):
        cfg = load_config("cpu", [f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path / label}",
                                  "trainer.run_name=run", "trainer.progress=false", "trainer.logger=[]",
                                  "model.train_dtype=float32", "sft.batch_size=4", "sft.micro_batch_size=2", *extra])
        cfg.sft.data = str(data)
        tr = SFTTrainer(cfg)
        try:
            out[label] = tr.train_step()
        finally:
            tr.release_run_dir()
    assert out["auto"]["perf/grad_ckpt_fraction"] == 1.0 and out["off"]["perf/grad_ckpt_fraction"] == 0.0
    assert out["auto"]["sft/loss"] == pytest.approx(out["off"]["sft/loss"], rel=1e-6)
    assert out["auto"]["sft/grad_norm"] == pytest.approx(out["off"]["sft/grad_norm"], rel=1e-4)
