"""A fixed-seed tiny training run whose metrics are pinned in ``fixtures/fixed_seed_metrics.json``.

``tests/test_fixed_seed_run.py`` replays it and compares: a refactor of the train loop must leave
every metric of every iteration unchanged (timings excepted). Two runs cover the loop's paths:

* ``serl``: the default recipe (GRPO + SERL's teacher pass and weights) with the KL reference;
* ``spear_gigpo``: GiGPO with SPEAR's replay (a buffer small enough to replay in iteration 2),
  the tool-call bonus and a Dr.BoT filter.

Both run in float32 (no bf16 autocast) on the tiny random model and the shipped ALFWorld games,
with the scripted replies of ``report_run.ScriptedPolicyEngine`` (admissible actions, sometimes a
malformed reply), so the groups have non-zero advantages and the update, SERL's weights and the
replay all do something.

Regenerate the pinned file only when a change of results is intended, and say so in the commit:
``python tests/fixed_seed_run.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "fixed_seed_metrics.json"

COMMON = [
    "model.lora.r=0",  # pinned with full fine-tuning (the cpu recipe's default before it moved to LoRA)
    "env.task_types=[]",  # all six types (the cpu recipe's default before it kept the cold start's two)
    "model.dtype=float32", "model.train_dtype=float32",
    "env.max_steps=3", "env.rollout.n=4", "env.num_workers=1",
    "data.train_batch_size=2", "data.max_response_length=40",
    "actor.lr=1e-3", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=2",
    "trainer.total_training_steps=2", "trainer.save_freq=0", "trainer.progress=false",
    "trainer.logger=[jsonl]",
    # pinned under verl-agent's per-micro-batch token-mean (the cpu recipe's before it moved to
    # one row per micro-batch with the mini-batch token-mean)
    "actor.token_mean_scope=micro_batch",
]

VARIANTS = {
    "serl": ("cpu", ["actor.use_kl_loss=true", "actor.kl_loss_coef=0.01"]),
    "spear_gigpo": ("gigpo_spear", ["algorithm.spear.trajectory_buffer_size=1",
                                    "algorithm.use_toolcall_reward=constant",
                                    "algorithm.filter_repetitive_responses=true",
                                    "actor.use_invalid_action_penalty=true", "trainer.total_training_steps=3"]),
}

#: wall-clock and machine-dependent keys, left out of the comparison
VOLATILE_PREFIXES = ("timing/", "throughput/update_tokens_per_s", "memory/", "grad_ckpt/")


def stable(metrics: dict) -> dict:
    """``metrics`` without wall-clock keys."""
    return {k: v for k, v in metrics.items() if not k.startswith(VOLATILE_PREFIXES)}


def run_variant(model_dir: Path, out: Path, name: str) -> list[dict]:
    """Train ``VARIANTS[name]`` (2 or 3 iterations) in ``out/name``; its ``metrics.jsonl`` lines,
    stable keys only."""
    from serl.configure import load_config
    from serl.train.trainer import Trainer

    from report_run import ScriptedPolicyEngine

    recipe, extra = VARIANTS[name]
    cfg = load_config(recipe, COMMON + extra + [f"model.path={model_dir}", f"trainer.output_dir={out}",
                                                f"trainer.run_name={name}"])
    tr = Trainer(cfg)
    tr.engine = ScriptedPolicyEngine(tr.tokenizer)  # admissible or malformed replies: non-zero advantages
    tr.train()
    lines = (out / name / "metrics.jsonl").read_text().splitlines()
    return [stable(json.loads(x)) for x in lines]


sys.path.insert(0, str(Path(__file__).parent))


def machine() -> str:
    """The CPU model and torch's CPU capability (the kernels' ISA): :func:`serl.utils.cpu_kind`."""
    from serl.utils import cpu_kind

    return cpu_kind()


def main() -> None:
    import tempfile

    from conftest import TOKENIZER_DIR

    from serl.models.tiny import build_tiny_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model_dir(Path(tmp) / "model", TOKENIZER_DIR)
        runs = {name: run_variant(model_dir, Path(tmp) / "runs", name) for name in VARIANTS}
    GOLDEN.write_text(json.dumps({"machine": machine(), "runs": runs},
                                 indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
