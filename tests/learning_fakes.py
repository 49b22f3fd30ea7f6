"""Shared fakes for the tests of experiments/learning.py: ``FakeSerl`` records each ``serl`` command
line the script would run and writes what that command would (``Experiment.serl`` replaced by it),
``run_experiment`` runs the script's ``Experiment`` with it, ``write_data`` writes synthetic result files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "experiments"))  # the scripts import their siblings by name

import learning  # noqa: E402
import learning_math_report as lmr  # noqa: E402


class FakeSerl:
    """Stands in for ``Experiment.serl``: records each argv and writes what the command would."""

    def __init__(self, stop_at=None, cap=None):
        self.calls, self.stop_at, self.cap, self.seconds = [], stop_at, cap, []

    def __call__(self, exp, *argv, seconds=0):
        argv = list(argv)
        self.seconds.append(seconds)
        if self.stop_at is not None and self.stop_at(argv, len(self.calls)):
            raise SystemExit("interrupted")
        self.calls.append(argv)
        opt = lambda flag: argv[argv.index(flag) + 1]  # noqa: E731
        kv = dict(x.split("=", 1) for x in argv if "=" in x and not x.startswith("-"))
        if argv[0] == "data":
            Path(opt("--out")).write_text("".join(json.dumps({"uid": f"p{i}"}) + "\n" for i in range(5)))
        elif argv[0] == "sft":
            run = (Path(opt("--resume")) if "--resume" in argv else
                   Path(kv["trainer.output_dir"]) / kv["trainer.run_name"] if "trainer.output_dir" in kv else exp.w / "sft")
            (run / "model").mkdir(parents=True)
            (run / "model" / "config.json").write_text("{}")
        elif argv[0] == "train":
            run = Path(opt("--resume")) if "--resume" in argv else Path(kv["trainer.output_dir"]) / kv["trainer.run_name"]
            steps = int(kv.get("trainer.total_training_steps", 0))
            reached = min(steps, self.cap) if self.cap is not None else steps  # a --train-seconds stop
            (run / "checkpoints" / f"iter_{reached:06d}").mkdir(parents=True, exist_ok=True)
            with open(run / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"iteration": int(kv["trainer.total_training_steps"]), "episode/success_rate": 0.5}) + "\n")
        elif argv[0] == "eval" and "--merge" in argv:  # the parts' task counts added up
            parts = argv[argv.index("--merge") + 1: argv.index("--out")]
            tasks = sum(json.loads((Path(d) / "metrics.json").read_text())["num_tasks"] for d in parts)
            Path(opt("--out")).mkdir(parents=True, exist_ok=True)
            (Path(opt("--out")) / "metrics.json").write_text(json.dumps({"success_rate": 0.5, "num_tasks": tasks}))
        elif argv[0] == "eval":
            out = Path(opt("--out"))
            out.mkdir(parents=True)
            (out / "metrics.json").write_text(json.dumps({"success_rate": 0.5, "num_tasks": int(opt("--num-tasks"))}))
            if "env.alfworld.expert=planner" in argv:  # a DAgger round's play
                (out / "trajectories.jsonl").write_text("")


def run_experiment(args, fake, monkeypatch):
    """Run experiments/learning.py's ``Experiment(args)`` with ``fake`` (a :class:`FakeSerl`) as its ``serl``."""
    monkeypatch.setattr(learning.Experiment, "serl", lambda exp, *argv, **kw: fake(exp, *argv, **kw))  # gets exp
    monkeypatch.setattr(lmr, "write_math_report", lambda *a: None)  # the math report has its own tests (test_learning_script.py)
    learning.Experiment(args).run()


def write_data(path: Path, obj) -> None:
    """Write ``obj`` to ``path`` (parents made): a list as JSON lines, anything else as one JSON document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in obj) if isinstance(obj, list) else json.dumps(obj))
