"""Multi-process training (accelerate, DDP, gloo on CPU): a 2-process update on a fixed global batch
equals the 1-process update (and would not with a per-rank loss normaliser); `accelerate launch`
end to end with rank-0-only writes, reduced metrics and a resume with the same N; clear errors for
an indivisible batch and a mismatched N."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from serl.configure import load_config
from serl.errors import CheckpointError, ConfigError
from serl.train.distributed import (check_checkpoint_world_size, check_world_size, deal_micro_batches,
                                    merge_metric_means, micro_loss_scale)

REPO = Path(__file__).resolve().parents[1]


def _overrides(model_dir, out, **extra):
    return [
        f"model.path={model_dir}", "model.lora.r=0", "env.max_steps=2", "env.rollout.n=2", "env.num_workers=1",
        "data.train_batch_size=2", "data.max_response_length=12", "actor.lr=1e-3",
        "actor.ppo_mini_batch_size=6", "actor.ppo_micro_batch_size=2", "actor.entropy_coeff=0.01",
        "algorithm.serl.enable=false", "trainer.total_training_steps=1", f"trainer.output_dir={out}",
        "trainer.run_name=run", "trainer.progress=false", "trainer.num_threads=1",
    ] + [f"{k}={v}" for k, v in extra.items()]


def _fixed_batch(n_rows: int = 12):
    """The same rows on every process: random ids, lengths and advantages from a fixed seed."""
    from serl.train.batch import UpdateBatch

    g = torch.Generator().manual_seed(123)
    prompts, responses = [], []
    for _ in range(n_rows):
        p = int(torch.randint(3, 9, (1,), generator=g))
        r = int(torch.randint(2, 8, (1,), generator=g))
        prompts.append(torch.randint(10, 2000, (p,), generator=g).tolist())
        responses.append(torch.randint(10, 2000, (r,), generator=g).tolist())
    adv = torch.randn(n_rows, generator=g)
    return UpdateBatch(prompt_ids=prompts, response_ids=responses, response_masks=[torch.ones(len(r)) for r in responses],
                       advantages=[adv[i].expand(len(r)).clone() for i, r in enumerate(responses)],
                       old_log_probs=[None] * n_rows, action_masks=[[0] * len(r) for r in responses])


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _per_rank_normaliser(update_module, scope: str):
    """Patch the update to normalise each micro-batch by the rows (``scope`` mini_batch: the loss
    tokens) *this rank* runs in the mini-batch (no global count, no compensation of DDP's mean):
    the tempting mistake."""
    real_deal = update_module.deal_micro_batches
    rank_count = {}

    def deal(micros, rank, world):
        plan = real_deal(micros, rank, world)
        count = (lambda m: sum(m.loss_tokens())) if scope == "mini_batch" else len
        rank_count["n"] = sum(count(m) for m, w in plan if w) or 1
        return plan

    update_module.deal_micro_batches = deal
    update_module.micro_loss_scale = lambda micro_count, mini_count, world: micro_count / rank_count["n"]


def _ddp_worker(rank: int, world: int, port: int, model_dir: str, out: str, result: str, scope: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    import serl.train.update as update_module
    from serl.train.trainer import Trainer
    from serl.train.update import make_adamw

    tr = Trainer(load_config("cpu", _overrides(model_dir, out, **{"actor.token_mean_scope": scope})))
    try:
        assert tr.dist.world_size == world and tr.dist.rank == rank
        init = _params(tr.policy)
        metrics = tr.update.run(_fixed_batch())
        good = _params(tr.policy)
        # the same update again from the same start, with a per-rank normaliser
        with torch.no_grad():
            for k, p in tr.policy.named_parameters():
                p.copy_(init[k])
        tr.optimizer.load_state_dict(make_adamw(tr.policy.parameters(), 1e-3, 0.0).state_dict())
        _per_rank_normaliser(update_module, scope)
        tr.update.run(_fixed_batch())
        bad = _params(tr.policy)
        if rank == 0:
            torch.save({"good": good, "bad": bad, "metrics": metrics}, result)
    finally:
        tr.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("scope", ["micro_batch", "mini_batch"])
def test_two_process_update_equals_one_process_update(tiny_model_dir, tmp_path, scope):
    """Either ``actor.token_mean_scope``: rows of 2-7 response tokens, so the mini-batch's
    token-mean differs from the micro-batches' and a per-rank token count would be wrong."""
    import torch.multiprocessing as mp

    from serl.train.trainer import Trainer

    result = tmp_path / "ddp.pt"
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tiny_model_dir), str(tmp_path / "ddp"), str(result), scope),
             nprocs=2)
    got = torch.load(result)

    tr = Trainer(load_config("cpu", _overrides(tiny_model_dir, tmp_path / "one", **{"actor.token_mean_scope": scope})))
    try:
        assert not tr.dist.enabled
        init = _params(tr.policy)
        ref_metrics = tr.update.run(_fixed_batch())
        ref = _params(tr.policy)
    finally:
        tr.close()
    assert any(not torch.equal(init[k], ref[k]) for k in ref), "the update changed nothing"
    # Equal up to float rounding. AdamW's first steps are ≈ lr·sign(g): an element whose gradient
    # is ~eps (the tied embedding's rows of tokens never seen, reached only through the softmax)
    # can move by up to ~lr on a rounding difference; so: the update's difference relative to
    # the update itself is tiny for every tensor, and 99% of all elements agree to 1e-6.
    close = total = 0
    for k in ref:
        diff = got["good"][k] - ref[k]
        assert diff.norm() <= 1e-2 * (ref[k] - init[k]).norm(), k
        close += int((diff.abs() <= 1e-6).sum())
        total += diff.numel()
    assert close >= 0.99 * total, (close, total)
    # a per-rank normaliser (the mistake the global one avoids) moves every tensor elsewhere
    for k in ref:
        assert (got["bad"][k] - ref[k]).norm() > 0.1 * (ref[k] - init[k]).norm(), k
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl"):
        assert got["metrics"][key] == pytest.approx(ref_metrics[key], rel=1e-4, abs=1e-6), key


def test_micro_loss_scale_and_dealing():
    assert micro_loss_scale(2, 6, 1) == pytest.approx(1 / 3)
    assert micro_loss_scale(7.0, 20.0, 2) == pytest.approx(0.7)  # loss tokens (token_mean_scope=mini_batch)
    assert micro_loss_scale(2, 6, 2) == pytest.approx(2 / 3)  # DDP's mean over 2 ranks undone
    with pytest.raises(ValueError):
        micro_loss_scale(2, 0, 2)
    micros = ["a", "b", "c"]
    assert deal_micro_batches(micros, 0, 2) == [("a", 1.0), ("c", 1.0)]
    assert deal_micro_batches(micros, 1, 2) == [("b", 1.0), ("a", 0.0)]  # padded: same number of backward passes
    assert deal_micro_batches(["a"], 1, 2) == [("a", 0.0)]
    # every micro-batch once, with weight 1, over the ranks
    for n in range(1, 7):
        real = [m for r in range(3) for m, w in deal_micro_batches(list(range(n)), r, 3) if w]
        assert sorted(real) == list(range(n))


def test_merge_metric_means_weights_by_counts():
    merged = merge_metric_means([({"a": 3.0, "b": 1.0}, {"a": 3, "b": 1}), ({"a": 5.0}, {"a": 1})])
    assert merged == {"a": pytest.approx(2.0), "b": pytest.approx(1.0)}
    # weighted means (micro-steps weighted by loss tokens): ranks' weighted sums and weights add
    from serl.train.metrics import MetricMeans

    r0, r1 = MetricMeans(), MetricMeans()
    r0.add({"a": 1.0}, 3.0)
    r0.add({"a": 100.0}, 0.0)  # no loss token: adds nothing
    r1.add({"a": 2.0}, 1.5)
    assert r0.result() == {"a": 1.0}
    assert merge_metric_means([r0.parts(), r1.parts()]) == {"a": pytest.approx((3.0 + 3.0) / 4.5)}


def test_clear_errors_for_indivisible_batch_and_mismatched_n(tiny_model_dir, tmp_path):
    cfg = load_config("cpu", _overrides(tiny_model_dir, tmp_path, **{"data.train_batch_size": 3}))
    with pytest.raises(ConfigError, match="data.train_batch_size.*multiple of 2"):
        check_world_size(cfg, 2)
    with pytest.raises(ConfigError, match="data.train_batch_size"):
        load_config("cpu", _overrides(tiny_model_dir, tmp_path, **{"data.train_batch_size": 3,
                                                                     "trainer.num_processes": 2}))
    with pytest.raises(ConfigError, match="trainer.num_processes"):
        check_world_size(load_config("cpu", _overrides(tiny_model_dir, tmp_path, **{"trainer.num_processes": 2})), 4)
    with pytest.raises(ConfigError, match="trainer.strategy"):
        load_config("cpu", _overrides(tiny_model_dir, tmp_path, **{"trainer.strategy": "zero3"}))
    check_world_size(cfg, 1)
    check_checkpoint_world_size({"world_size": 2}, 2)
    check_checkpoint_world_size({}, 1)  # a checkpoint of before multi-process training
    with pytest.raises(CheckpointError, match="written by 2 process.*has 1"):
        check_checkpoint_world_size({"world_size": 2}, 1)


def _launch(args: list[str], n: int, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               MASTER_PORT=str(_free_port()))
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "serl.cli", "train", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)


def test_accelerate_launch_two_processes_writes_once_and_resumes(tiny_model_dir, tmp_path):
    out = tmp_path / "runs"
    args = _overrides(tiny_model_dir, out, **{"trainer.logger": "[jsonl]", "trainer.trace_freq": 1})
    p = _launch(args, 2, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    run = out / "run"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1], "rank 0 alone writes one line per iteration"
    m = lines[0]
    # the rollout metrics cover all 2 x 2 episodes of both ranks; the update metrics are reduced
    assert m["episode/num_trajectories"] == 4 and "actor/pg_loss" in m and "actor/grad_norm" in m
    assert len(list((run / "trace").glob("*.jsonl"))) == 1
    state = torch.load(run / "checkpoints" / "iter_000001" / "state.pt", weights_only=False)
    assert state["world_size"] == 2 and len(state["rank_rng"]) == 2
    assert not torch.equal(state["rank_rng"][0]["torch"], state["rank_rng"][1]["torch"])  # own sampling seeds
    assert p.stdout.count("serl train finished") == 1

    p = _launch(["--resume", str(run), "trainer.total_training_steps=2"], 2, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1, 2]

    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("WORLD_SIZE", None)
    p = subprocess.run([sys.executable, "-m", "serl.cli", "train", "--resume", str(run),
                        "trainer.total_training_steps=3"], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2 and "written by 2 process(es) but this run has 1" in p.stderr, p.stderr[-2000:]


def test_malformed_world_size_is_a_clear_error(monkeypatch):
    from serl.errors import ConfigError
    from serl.train.distributed import launched_world_size

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert launched_world_size() == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launched_world_size() == 2
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE='two'"):
        launched_world_size()
