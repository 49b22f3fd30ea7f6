"""A short tiny-model SERL run whose replies are scripted (real envs, teacher, update and trace),
so the report has action tokens with SERL weights; shared by tests/test_report*.py and used
once to make docs/assets/serl-report.png.

The tiny random model would write gibberish with no ``<action>`` tag, hence no action tokens;
the scripted engine plays admissible actions (and sometimes a malformed reply, so the
invalid-action penalty gives the groups non-zero advantages).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from serl.configure import load_config
from serl.train.trainer import Trainer

THINKS = ["I should look around for the object first.", "The task needs the object; try the nearest receptacle.",
          "Go to a place where the object may be.", "Check what this action gives."]


class ScriptedPolicyEngine:
    """Replies ``<think>..</think><action>A</action>`` with ``A`` an admissible action of the
    prompt (seeded), or a malformed reply with probability ``p_invalid``; EOS appended."""

    def __init__(self, tokenizer, seed: int = 0, p_invalid: float = 0.25):
        self.tok, self.rng, self.p_invalid = tokenizer, random.Random(seed), p_invalid

    def reply(self, prompt_text: str) -> str:
        m = re.search(r"admissible actions of the current situation are: \[(.*?)\]\.", prompt_text, re.S)
        actions = [a for a in re.findall(r"'([^']+)'", m.group(1)) if a != "look"] if m else []
        if not actions or self.rng.random() < self.p_invalid:
            return "I will just " + (self.rng.choice(actions) if actions else "wait") + "."
        return f"<think>{self.rng.choice(THINKS)}</think>\n<action>{self.rng.choice(actions)}</action>"

    def generate(self, prompts, params):
        return [self.tok(self.reply(self.tok.decode(p)), add_special_tokens=False).input_ids + [self.tok.eos_token_id]
                for p in prompts]


def scripted_serl_run(model_dir: Path, out: Path, name: str = "run", iterations: int = 2,
                      extra: tuple[str, ...] = ()) -> Path:
    """Train ``iterations`` iterations of the cpu recipe (SERL, immediate feedback) with the tiny
    model and scripted replies; returns the run folder."""
    cfg = load_config("cpu", [f"model.path={model_dir}", "env.max_steps=3", "env.rollout.n=2",
                              "data.train_batch_size=2", "data.max_response_length=40", "trainer.progress=false",
                              f"trainer.total_training_steps={iterations}", f"trainer.output_dir={out}",
                              f"trainer.run_name={name}", "trainer.logger=[jsonl]", "trainer.save_freq=0",
                              *extra])
    tr = Trainer(cfg)
    tr.engine = ScriptedPolicyEngine(tr.tokenizer)
    tr.train()
    return tr.run_dir
