"""Where a ``serl train`` run's memory goes, phase by phase, and how big its run folder ends up:
full fine-tuning and LoRA side by side, each on the recipe as it is.

Each mode runs ``Trainer(cfg).train()`` of the recipe (default ``default``: what ``serl train``
with no argument runs) in its own child process, so each peak is that mode's alone. A sampler thread reads,
every 20 ms, the resident memory of the trainer process and of its whole process tree (the env
workers and the sandbox children included; the tree sum counts pages shared after ``fork`` once per
process, so it is an upper bound, as a ``ps``/``top`` sum is). Each sample is charged to the phase
running at that moment:

* ``load``: building the trainer (tokenizer, models, env workers, optimizer);
* ``rollout``: ``RolloutCollector.collect`` (generation and env steps);
* ``scoring``: log-prob passes outside the update (SERL's teacher, the KL reference, and the
  old log-probs when the rollout model is a bf16 copy of an fp32 policy);
* ``update``: the policy update (forward, backward, optimizer);
* ``probe``: with ``--probe``, the two extra passes that score the update batch under the policy
  before and after the update (the policy-change figures below); not part of a normal run;
* ``checkpoint``: ``Trainer.save``; ``trace``: the per-iteration trace file;
* ``other``: the rest (row building, advantages, logging).

Reported per mode: the peak of each phase (trainer process / process tree, MiB), the process's
``ru_maxrss``, the bytes of every distinct model tensor, the trainable parameters with their
gradients and AdamW state, the wall time of each phase summed over the run, the size on disk of the
run folder and of its newest checkpoint, and the last iteration's update metrics (the learning
signal a few iterations can show: loss, gradient norm, clip fraction, success rate).

    python benchmarks/run_memory.py --probe                 # `serl train`'s recipe: full vs LoRA (r=8, lr x10)
    python benchmarks/run_memory.py recipe=cpu_math trainer.total_training_steps=2

Options: ``--probe`` (score each update batch under the policy before and after the update, the
same way, and report how far the update moved it: the learning signal of one update, comparable between the
modes; costs two scoring passes per iteration, charged to ``probe``), ``--modes full lora`` (default both; ``full`` forces ``model.lora.r=0``, ``lora`` sets
``model.lora.r=R model.lora.dropout=0 actor.lr=<full lr x --lora-lr-scale>``; the full lr is the
recipe's, or the recipe's / the scale when the recipe itself trains LoRA, as ``cpu`` and ``default`` do), ``--lora-r R``
(default 8), ``--lora-lr-scale S`` (default 10: "LoRA Without Regret", Schulman et al., Thinking
Machines Lab, 2025, finds LoRA's best learning rate about 10x full fine-tuning's), ``recipe=NAME``
and any ``key=value`` overrides (both modes). Prints the CPU model and the dtype with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lora_vs_full import MIB, _models, _tensor_bytes  # noqa: E402  (a sibling script)

from serl.config import DEFAULT_RECIPE  # noqa: E402  (imports no torch)

PHASES = ["load", "rollout", "scoring", "update", "trace", "checkpoint", "probe", "other"]
SIGNAL_KEYS = ["episode/success_rate", "actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl",
               "serl/weight_mean", "timing/iteration_s"]


class PhaseSampler:
    """A daemon thread that samples the RSS of this process and its process tree every ``period``
    seconds and keeps, per phase label, the peaks and the wall time spent."""

    def __init__(self, period: float = 0.02):
        import psutil

        self.proc, self.period, self.phase = psutil.Process(), period, "load"
        self.peak = {p: [0, 0] for p in PHASES}  # phase -> [process RSS, tree RSS] in bytes
        self.seconds = {p: 0.0 for p in PHASES}
        self._since, self._stop = time.perf_counter(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        own = self.proc.memory_info().rss
        tree = own
        for c in self.proc.children(recursive=True):
            try:
                tree += c.memory_info().rss
            except psutil.Error:  # a child that ended between the listing and the read
                pass
        pk = self.peak[self.phase]
        pk[0], pk[1] = max(pk[0], own), max(pk[1], tree)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def enter(self, phase: str) -> str:
        """Start charging samples to ``phase``; returns the phase it replaces."""
        self._sample()
        now = time.perf_counter()
        prev, self.seconds[self.phase] = self.phase, self.seconds[self.phase] + now - self._since
        self.phase, self._since = phase, now
        return prev

    def stop(self) -> None:
        self.enter("other")
        self._stop.set()
        self._thread.join()


def _label(sampler: PhaseSampler, obj, name: str, phase: str) -> None:
    """Wrap ``obj.name`` so that its calls are charged to ``phase``."""
    fn = getattr(obj, name)

    def wrapped(*a, **k):
        prev = sampler.enter(phase)
        try:
            return fn(*a, **k)
        finally:
            sampler.enter(prev if prev != "load" else "other")

    setattr(obj, name, wrapped)


def _probe_policy_change(sampler: PhaseSampler, tr, out: list[dict]) -> None:
    """Wrap ``tr.update.run`` so that the update batch is scored by the same pass (the update's
    autocast) under the policy before and after each update: per iteration, over the trained tokens (response mask > 0), the mean ``|log pi_new -
    log pi_old|`` and the KL(pi_old || pi_new) estimate ``mean(exp(d) - 1 - d)``, ``d = log pi_new -
    log pi_old`` (Schulman's k3, http://joschu.net/blog/kl-approx.html). The two extra scoring
    passes are charged to ``probe`` (not to any phase of the run)."""
    import torch

    fn = tr.update.run

    def score():  # the scorer's own method, not the phase-labelled attribute
        return type(tr.scorer).score(tr.scorer, tr.models.policy, batch_ref[0], autocast=True)

    batch_ref: list = [None]

    def wrapped(batch, replay, step):
        prev = sampler.enter("probe")
        batch_ref[0] = batch
        before = score()
        sampler.enter("update")
        try:
            res = fn(batch, replay, step)
        finally:
            sampler.enter("probe")
        after = score()
        d = []
        for lp, old, m in zip(after, before, batch.response_masks):
            keep = m[: len(lp)] > 0
            d.append((lp - old)[keep])
        d = torch.cat(d) if d else torch.zeros(0)
        n = int(d.numel())
        out.append({"tokens": n, "mean_abs_dlogp": float(d.abs().mean()) if n else 0.0,
                    "kl_k3": float((d.exp() - 1 - d).mean()) if n else 0.0})
        sampler.enter(prev)
        return res

    tr.update.run = wrapped


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink())


def measure(recipe: str, overrides: list[str], probe: bool = False) -> dict:
    """One mode in this process: train the recipe with ``overrides``, sampled phase by phase."""
    import serl.train.trainer as trainer_mod
    from serl.configure import load_config
    from serl.utils import cpu_model
    from serl.train.checkpoint import latest_checkpoint

    out_dir = tempfile.mkdtemp(prefix="serl-mem-bench-")
    cfg = load_config(recipe, overrides + ["trainer.logger=[jsonl]", "trainer.progress=false",
                                           f"trainer.output_dir={out_dir}", "trainer.run_name=bench"])
    sampler = PhaseSampler()
    _label(sampler, trainer_mod, "write_iteration_trace", "trace")
    t0 = time.perf_counter()
    tr = trainer_mod.Trainer(cfg)
    sampler.enter("other")
    _label(sampler, tr.rollout, "collect", "rollout")
    _label(sampler, tr.scorer, "score", "scoring")
    _label(sampler, tr.update, "run", "update")
    change: list[dict] = []
    if probe:
        _probe_policy_change(sampler, tr, change)
    _label(sampler, tr, "save", "checkpoint")
    last = tr.train()
    wall = time.perf_counter() - t0
    sampler.stop()
    tensors = [t for mod in _models(tr) for t in list(mod.parameters()) + list(mod.buffers())]
    trainable = [p for p in tr.policy.parameters() if p.requires_grad]
    opt = [v for s in tr.optimizer.state.values() for v in s.values() if hasattr(v, "data_ptr")]
    run_dir = tr.run_dir
    return {
        "mode": f"lora r={cfg.model.lora.r}" if cfg.model.lora.r else "full",
        "lr": cfg.actor.lr, "model": cfg.model.path, "cpu": cpu_model(),
        "dtype": str(tr.models.infer_dtype).replace("torch.", ""), "iterations": cfg.trainer.total_training_steps,
        "wall_s": round(wall, 1),
        "phase_s": {p: round(s, 1) for p, s in sampler.seconds.items()},
        "phase_peak_mib": {p: [round(v / MIB) for v in pk] for p, pk in sampler.peak.items()},
        "ru_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "model_mib": round(_tensor_bytes(tensors) / MIB, 1),
        "trainable_params": sum(p.numel() for p in trainable),
        "trainable_grad_adam_mib": [round(_tensor_bytes(x) / MIB, 1)
                                    for x in (trainable, [p.grad for p in trainable], opt)],
        "run_folder_mib": round(_du(run_dir) / MIB, 1),
        "checkpoint_mib": round(_du(latest_checkpoint(run_dir)) / MIB, 1),
        "checkpoint_files_mib": {f.name: round(f.stat().st_size / MIB, 1) for f in latest_checkpoint(run_dir).iterdir()},
        "signal": {k: last[k] for k in SIGNAL_KEYS if k in last},
        "policy_change": change,
    }


def main(argv: list[str]) -> list[dict]:
    from serl.configure import load_config

    p = argparse.ArgumentParser(description="serl train's memory phase by phase and its run folder: full vs LoRA "
                                            "(the module docstring has the details)")
    p.add_argument("--modes", nargs="+", choices=["full", "lora"], default=["full", "lora"],
                   help="which runs (default both); overrides go before it")
    p.add_argument("--probe", action="store_true", help="score each update batch before and after the update")
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--lora-lr-scale", type=float, default=10.0, help="LoRA lr = full fine-tuning lr x this")
    p.add_argument("overrides", nargs="*", help="recipe=NAME (default: serl train's) and key=value overrides for both modes")
    a = p.parse_intermixed_args(argv)  # options and overrides in any order
    modes, lora_r, scale, probe = a.modes, a.lora_r, a.lora_lr_scale, a.probe
    recipe = next((x.split("=", 1)[1] for x in a.overrides if x.startswith("recipe=")), DEFAULT_RECIPE)
    overrides = [x for x in a.overrides if not x.startswith("recipe=")]
    cfg = load_config(recipe, overrides)
    full_lr = cfg.actor.lr / scale if cfg.model.lora.r > 0 else cfg.actor.lr  # a LoRA recipe's lr is x scale
    per_mode = {"full": ["model.lora.r=0", f"actor.lr={full_lr:g}"],
                "lora": [f"model.lora.r={lora_r}", "model.lora.dropout=0", f"actor.lr={full_lr * scale:g}"]}
    results = []
    for mode in modes:
        args = [sys.executable, __file__, "--child" + ("-probe" if probe else ""), recipe, *overrides, *per_mode[mode]]
        res = subprocess.run(args, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            sys.stderr.write(res.stderr[-4000:])
            raise SystemExit(f"the {mode} run failed ({res.returncode})")
        results.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"recipe={recipe} {' '.join(overrides)}; CPU: {results[0]['cpu']}; dtype {results[0]['dtype']}")
    rows = [("lr", lambda r: r["lr"]), ("wall (s)", lambda r: r["wall_s"])]
    rows += [(f"{p} peak MiB proc/tree", lambda r, p=p: "{}/{}".format(*r["phase_peak_mib"][p])) for p in PHASES]
    rows += [(f"{p} (s)", lambda r, p=p: r["phase_s"][p]) for p in PHASES]
    rows += [(k, lambda r, k=k: r[k]) for k in ("ru_maxrss_mib", "model_mib", "trainable_params",
                                                 "trainable_grad_adam_mib", "run_folder_mib", "checkpoint_mib")]
    rows += [(k, lambda r, k=k: round(r["signal"].get(k, float("nan")), 4)) for k in SIGNAL_KEYS]
    if probe:
        rows += [("|dlogp| per iteration", lambda r: " ".join(f"{c['mean_abs_dlogp']:.2e}" for c in r["policy_change"])),
                 ("KL(old||new) per iteration", lambda r: " ".join(f"{c['kl_k3']:.2e}" for c in r["policy_change"]))]
    print(f"{'':<32}" + "".join(f"{r['mode']:>22}" for r in results))
    for name, get in rows:
        print(f"{name:<32}" + "".join(f"{get(r)!s:>22}" for r in results))
    for r in results:
        print(json.dumps(r))
    return results


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("--child"):
        print(json.dumps(measure(sys.argv[2], sys.argv[3:], probe=sys.argv[1] == "--child-probe")))
    else:
        main(sys.argv[1:])
