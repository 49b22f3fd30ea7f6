"""FSDP (``trainer.strategy=fsdp``, torch's FSDP2 ``fully_shard``, gloo on CPU): a 2-process sharded
update of a fixed global batch with an uneven micro-batch count (3 micro-batches over 2 ranks)
equals the 1-process update, and would not with a per-rank normaliser, without the ×N of the loss
scale, or with a weighted padding micro-step; a checkpoint holds the full model and optimizer state
in the one-process format, and a resume loads them back into the shards."""

from __future__ import annotations

import copy
import logging
import os

import pytest
import torch

from serl.configure import load_config
from serl.errors import ConfigError
from serl.train.distributed import Distributed, _optim_state_by_index, _optim_state_by_name
from test_ddp import _fixed_batch, _free_port, _overrides, _params, _per_rank_normaliser

# float32: the update's equality with one process is a test of the sharding and the loss scales;
# in bf16 autocast, AdamW's first steps (≈ lr·sign(g)) turn the rounding of elements whose gradient
# is ~1e-10 into ±lr moves (5% of the elements with actor.token_mean_scope=mini_batch, 0.4% of the update)
FP32 = {"model.train_dtype": "float32", "model.dtype": "float32"}
FSDP = {**FP32, "trainer.strategy": "fsdp", "trainer.logger": "[jsonl]"}


def _full_optim_state(tr) -> dict:
    """The optimizer state in the one-process format (rank 0; {} on the others)."""
    return tr.dist.checkpoint_state(tr.policy, tr.optimizer)[1].state_dict()


def _reset(tr, init: dict) -> None:
    """Parameters back to ``init`` (full tensors, scattered into the shards), a fresh optimizer."""
    tr.dist.checkpoint_loaders(tr.policy, tr.optimizer)[0].load_state_dict(init, strict=False)
    tr.optimizer.state.clear()


def _fsdp_worker(rank: int, world: int, port: int, model_dir: str, out: str, result: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    import serl.train.update as update_module
    from serl.train.distributed import is_sharded
    from serl.train.trainer import Trainer

    real = {k: getattr(update_module, k) for k in ("deal_micro_batches", "micro_loss_scale")}
    tr = Trainer(load_config("cpu", _overrides(model_dir, out, **FSDP)))
    try:
        assert tr.dist.sharded and is_sharded(tr.policy) and not is_sharded(tr.rollout_model)
        full = lambda: {k: v.clone() for k, v in tr.dist.full_parameters(tr.policy).items()}  # noqa: E731
        init = full()
        res = {"metrics": tr.update.run(_fixed_batch())}
        res["good"] = full()
        # checkpoint round trip: save (full state on rank 0), move on, resume
        tr.state.iteration = 1
        folder = tr.save()
        saved_optim = copy.deepcopy(_full_optim_state(tr))  # AdamW steps its `step` tensors in place
        tr.update.run(_fixed_batch())
        moved = full()
        tr.resume()
        resumed, resumed_optim = full(), _full_optim_state(tr)
        res["resume_moved"] = any(not torch.equal(moved[k], res["good"][k]) for k in moved)
        res["resume_params_equal"] = all(torch.equal(resumed[k], res["good"][k]) for k in resumed)
        res["resume_optim_equal"] = rank != 0 or all(
            torch.equal(saved_optim["state"][i][n], resumed_optim["state"][i][n])
            for i in saved_optim["state"] for n in saved_optim["state"][i]) and all(
            {**g, "betas": tuple(g["betas"])} == {**h, "betas": tuple(h["betas"])}
            for g, h in zip(saved_optim["param_groups"], resumed_optim["param_groups"]))
        res["rollout_synced"] = all(torch.equal(p, resumed[k].to(p.dtype)) for k, p in tr.rollout_model.named_parameters())
        res["folder"] = str(folder)
        # three mistakes, each from the same start
        for name, patch in (("per_rank", lambda: _per_rank_normaliser(update_module, tr.cfg.actor.token_mean_scope)),
                            ("no_times_n", lambda: setattr(update_module, "micro_loss_scale", lambda b, B, n: b / B)),
                            ("weighted_padding", lambda: setattr(update_module, "deal_micro_batches", lambda m, r, n: [
                                (x, 1.0) for x, _ in real["deal_micro_batches"](m, r, n)]))):
            _reset(tr, init)
            patch()
            metrics = tr.update.run(_fixed_batch())
            res[name] = (full(), metrics)
            for k, v in real.items():
                setattr(update_module, k, v)
        if rank == 0:
            torch.save(res, result)
    finally:
        tr.close()


def _close(got: dict, ref: dict, init: dict) -> None:
    """The tolerance of tests/test_ddp.py (AdamW's first steps are ≈ lr·sign(g): an element of the
    tied embedding whose gradient is ~eps can move by ~lr on a rounding difference)."""
    close = total = 0
    for k in ref:
        diff = got[k] - ref[k]
        assert diff.norm() <= 1e-2 * (ref[k] - init[k]).norm(), k
        close += int((diff.abs() <= 1e-6).sum())
        total += diff.numel()
    assert close >= 0.99 * total, (close, total)


def test_fsdp_two_process_update_equals_one_process_and_checkpoint_round_trip(tiny_model_dir, tmp_path):
    import torch.multiprocessing as mp

    from serl.train.checkpoint import load_checkpoint
    from serl.train.trainer import Trainer

    result = tmp_path / "fsdp.pt"
    mp.spawn(_fsdp_worker, args=(2, _free_port(), str(tiny_model_dir), str(tmp_path / "fsdp"), str(result)), nprocs=2)
    got = torch.load(result, weights_only=False)

    tr = Trainer(load_config("cpu", _overrides(tiny_model_dir, tmp_path / "one", **FP32)))
    try:
        init = _params(tr.policy)
        ref_metrics = tr.update.run(_fixed_batch())
        ref = _params(tr.policy)
        ref_optim = tr.optimizer.state_dict()
        assert any(not torch.equal(init[k], ref[k]) for k in ref), "the update changed nothing"
        _close(got["good"], ref, init)
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl"):
            assert got["metrics"][key] == pytest.approx(ref_metrics[key], rel=1e-4, abs=1e-6), key
        # each mistake fails: parameters elsewhere, or (AdamW and clipping hide a global factor) the grad norm
        for name in ("per_rank", "weighted_padding"):
            params, _ = got[name]
            assert all((params[k] - ref[k]).norm() > 0.1 * (ref[k] - init[k]).norm() for k in ref), name
        assert got["no_times_n"][1]["actor/grad_norm"] == pytest.approx(ref_metrics["actor/grad_norm"] / 2, rel=1e-3)
        # resume: the same parameters and optimizer state; the rollout copy re-filled
        assert got["resume_moved"] and got["resume_params_equal"] and got["resume_optim_equal"]
        assert got["rollout_synced"]
        # the FSDP checkpoint is a one-process checkpoint: it loads into an unsharded policy and optimizer
        load_checkpoint(got["folder"], tr.policy, tr.optimizer)
        assert all(torch.equal(p, got["good"][k]) for k, p in tr.policy.named_parameters())
        loaded = tr.optimizer.state_dict()
        assert sorted(loaded["state"]) == sorted(ref_optim["state"])
        for i, st in ref_optim["state"].items():
            assert float(loaded["state"][i]["step"]) == float(st["step"]) == 2.0
            diff = loaded["state"][i]["exp_avg"] - st["exp_avg"]  # the same moments up to float rounding
            assert diff.norm() <= 1e-3 * st["exp_avg"].norm(), i
    finally:
        tr.close()


def test_optimizer_state_names_round_trip():
    names = ["a.weight", "b.weight", "c.bias"]
    by_name = {"state": {"b.weight": {"step": 1}, "a.weight": {"step": 2}},
               "param_groups": [{"lr": 0.1, "params": ["a.weight", "b.weight", "c.bias"]}]}
    by_index = _optim_state_by_index(by_name, names)
    assert by_index == {"state": {1: {"step": 1}, 0: {"step": 2}}, "param_groups": [{"lr": 0.1, "params": [0, 1, 2]}]}
    assert _optim_state_by_name(by_index, names) == by_name
    assert _optim_state_by_index({}, names) == {}  # the ranks other than 0 hold nothing
    from serl.errors import CheckpointError

    with pytest.raises(CheckpointError, match="3 parameters"):
        _optim_state_by_name({"state": {7: {}}, "param_groups": []}, names)


def test_fsdp_config(tiny_model_dir, tmp_path, caplog):
    cfg = load_config("cpu", _overrides(tiny_model_dir, tmp_path, **{"trainer.strategy": "fsdp"}))
    assert cfg.trainer.strategy == "fsdp"
    with pytest.raises(ConfigError, match="trainer.strategy.*fsdp does not support LoRA"):
        load_config("cpu", _overrides(tiny_model_dir, tmp_path, **{"trainer.strategy": "fsdp", "model.lora.r": 4}))
    # one process: a plain one-process run, with a warning
    os.environ.pop("WORLD_SIZE", None)
    with caplog.at_level(logging.WARNING, logger="serl.train.distributed"):
        dist = Distributed.setup(cfg, "cpu")
    assert not dist.enabled and not dist.sharded and dist.strategy == "ddp"
    assert "nothing to shard" in caplog.text


def test_accelerate_launch_fsdp_trains_and_checkpoints(tiny_model_dir, tmp_path):
    """One short `accelerate launch` with trainer.strategy=fsdp: 2 iterations (a teacher-free
    run; the rollout copy re-filled from the gathered shards in between), rank 0 writes once per
    iteration, and the checkpoint is a one-process one."""
    import json

    from serl.models.loading import load_causal_lm
    from serl.train.checkpoint import load_policy_weights
    from test_ddp import _launch

    out = tmp_path / "runs"
    p = _launch(_overrides(tiny_model_dir, out, **{**FSDP, "trainer.total_training_steps": 2, "trainer.trace_freq": 0}),
                2, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    run = out / "run"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1, 2] and all("actor/grad_norm" in x for x in lines)
    state = torch.load(run / "checkpoints" / "iter_000002" / "state.pt", weights_only=False)
    assert state["world_size"] == 2
    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu", False, None)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    load_policy_weights(run / "checkpoints" / "iter_000002", model)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
