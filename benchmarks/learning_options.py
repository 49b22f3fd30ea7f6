"""The command line of the learning experiment, shared by ``benchmarks/learning.py`` and
``benchmarks/learning_report.py``.

Holds the options (:func:`parse_args`, with the per-env defaults :data:`ENV_DEFAULTS`) and the
algorithms compared (:data:`ALGOS`). ``learning.py`` runs the experiment with them and
``learning_report.py`` rewrites the report of a work folder from the same options, so both import
this module and neither imports the other's command line. Not here: running the phases
(``learning.py``) and writing LEARNING.md / the plot (``learning_report.py``). Imports nothing
but the standard library.
"""

from __future__ import annotations

import argparse

#: the ``--help`` description (the first line of ``learning.py``'s docstring)
DESCRIPTION = "Does serl learn? Expert cold start, then GRPO vs SERL from the same SFT checkpoint, on real games."

#: the algorithms compared: name -> overrides on top of the recipe
ALGOS = {
    "grpo": ["algorithm.serl.enable=false"],
    "serl": ["algorithm.serl.enable=true", "algorithm.serl.sampling_mode=immediate_feedback"],
    "serl_anchor": ["algorithm.serl.enable=true", "algorithm.serl.sampling_mode=anchor_immediate_feedback"],
}

#: per env, the defaults of the options left unset (the ALFWorld ones are the script's original defaults)
ENV_DEFAULTS = {
    "alfworld": {"workdir": "runs/learning", "recipe": "cpu_learn", "expert_tasks": 60, "iterations": 10,
                 "eval_every": 5, "splits": ["valid_seen", "valid_unseen"]},
    "webshop": {"workdir": "runs/learning_webshop", "recipe": "cpu_learn_webshop", "expert_tasks": 40,
                "iterations": 3, "eval_every": 3, "splits": ["test"]},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of ``learning.py`` / ``learning_report.py`` (``argv``: default ``sys.argv[1:]``),
    the options left unset filled from :data:`ENV_DEFAULTS` for ``--env``."""
    p = argparse.ArgumentParser(description=DESCRIPTION)
    p.add_argument("--env", default="alfworld", choices=sorted(ENV_DEFAULTS),
                   help="which leg; sets the defaults of --workdir --recipe --expert-tasks --iterations "
                        "--eval-every --splits (ENV_DEFAULTS)")
    p.add_argument("--workdir", help="default: runs/learning (alfworld), runs/learning_webshop (webshop)")
    p.add_argument("--data-dir", help="env.data_dir (ALFWorld json_2.1.1/... or WebShop data); default: the "
                                      "recipe's / the data shipped with serl")
    p.add_argument("--recipe", help="default: cpu_learn (alfworld), cpu_learn_webshop (webshop)")
    p.add_argument("--expert-tasks", type=int, help="expert train tasks; default 60 (alfworld), 40 (webshop)")
    p.add_argument("--expert-seed", type=int, default=0)
    p.add_argument("--expert-min-score", type=float, default=1.0,
                   help="webshop: keep oracle episodes whose score is at least this (1.0 = won)")
    p.add_argument("--lora-r", type=int, default=8, help="LoRA rank of the SFT (0 = full fine-tuning)")
    p.add_argument("--algos", nargs="+", default=["grpo", "serl"], choices=sorted(ALGOS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, help="RL iterations per run; default 10 (alfworld), 3 (webshop)")
    p.add_argument("--eval-every", type=int, help="panel evaluation every this many iterations; default 5 / 3")
    p.add_argument("--panel-per-type", type=int, default=4, help="alfworld: panel tasks per task type and split")
    p.add_argument("--panel-size", type=int, default=12, help="webshop: the panel is test goals 0..N-1")
    p.add_argument("--splits", nargs="+", help="panel splits; default valid_seen valid_unseen (alfworld), test (webshop)")
    p.add_argument("--eval-seed", type=int, default=1000)
    p.add_argument("--report-md", help="where LEARNING.md goes (default: in --workdir)")
    p.add_argument("--report-png", help="where the plot goes (default: learning.png in --workdir)")
    p.add_argument("--override", nargs="*", default=[], help="key=value for every serl command")
    p.add_argument("--sft-override", nargs="*", default=[], help="key=value for serl sft only")
    p.add_argument("--train-override", nargs="*", default=[], help="key=value for serl train only")
    a = p.parse_args(argv)
    for k, v in ENV_DEFAULTS[a.env].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.panel_size < 1 or a.panel_per_type < 1:
        p.error("--panel-size and --panel-per-type must be >= 1")
    if not 0.0 <= a.expert_min_score <= 1.0:
        p.error("--expert-min-score must be in [0, 1]")
    if a.iterations < 1 or a.eval_every < 1 or a.iterations % a.eval_every:
        p.error("--iterations must be a positive multiple of --eval-every")
    return a
