"""A clean console: ``serl train``, ``serl sft``, ``serl eval`` and ``serl report`` on the tiny model
raise no Python warning and log no warning through transformers', PEFT's, accelerate's or torch's
loggers (issue 26: serl's own use of those libraries must not trigger their deprecation notices,
e.g. transformers 5.24's ``past_key_values`` → ``cache`` and ``is_gradient_checkpointing`` →
``is_activation_checkpointing``).

Every warning is recorded (``simplefilter("always")``) rather than raised, so a warning inside a
library's ``try``/``except`` cannot slip through, and the test lists all of them at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import warnings

import pytest

from serl.cli import main

#: the libraries whose logged warnings count (transformers logs some deprecations instead of warning)
LIBRARY_LOGGERS = ("transformers", "peft", "accelerate", "torch")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"logged by {record.name} ({record.pathname}:{record.lineno}): {record.getMessage()}")


@contextlib.contextmanager
def recorded_warnings():
    """Within the block record every Python warning and every WARNING+ record of
    :data:`LIBRARY_LOGGERS`; yields the list of their descriptions (filled when the block ends)."""
    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()  # a warning logged once earlier in this process shows again
    handler = _Records()
    loggers = [logging.getLogger(n) for n in LIBRARY_LOGGERS]
    for lg in loggers:
        lg.addHandler(handler)
    found: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    found += [f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}" for w in caught]
    found += handler.lines


def test_the_recorder_sees_warnings_and_logged_library_warnings():
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers.serl_test").warning_once("a logged notice")
    with recorded_warnings() as found:
        warnings.warn("a deprecation", FutureWarning)
        hf_logging.get_logger("transformers.serl_test").warning_once("a logged notice")  # logged before: still seen
        logging.getLogger("peft.serl_test").warning("a peft notice")
        logging.getLogger("transformers.serl_test").info("not a warning")
    assert len(found) == 3, found
    assert "FutureWarning" in found[0] and "a deprecation" in found[0]
    assert "a logged notice" in found[1] and "a peft notice" in found[2]


def _rows(n: int = 4) -> list[dict]:
    objs = ["apple", "mug", "book", "key"]
    return [{"env": "alfworld", "task_id": f"t{i}", "task_type": "pick_and_place_simple", "step": i,
             "messages": [{"role": "user", "content": f"Your task is to: put a {objs[i % 4]} in fridge 1."}],
             "response": f"<think>find the {objs[i % 4]}</think><action>take {objs[i % 4]} {i}</action>",
             "action": f"take {objs[i % 4]} {i}", "won": True, "episode_reward": 10.0} for i in range(n)]


def _warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.search(r"warn", line, re.IGNORECASE)]


def test_train_sft_eval_report_print_no_warning(tiny_model_dir, tmp_path, capfd):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    common = [f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}", "trainer.progress=false",
              "trainer.logger=[jsonl]"]
    with recorded_warnings() as found:
        # RL: hf engine with the unpadded prefill (the KV cache handed to generate), LoRA (PEFT),
        # activation checkpointing, SERL's teacher adapter and the KL reference
        assert main(["train", *common, "trainer.run_name=rl", "env.max_steps=2", "env.rollout.n=2",
                     "env.num_workers=1", "data.train_batch_size=1", "data.max_response_length=8",
                     "rollout.micro_batch_size=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size=2",
                     "trainer.total_training_steps=1", "trainer.save_freq=1", "trainer.trace_freq=1",
                     "model.lora.r=2", "model.gradient_checkpointing=true", "actor.use_kl_loss=true"]) == 0
        assert main(["sft", *common, "trainer.run_name=sft", "sft.max_steps=1", "sft.batch_size=2",
                     "model.lora.r=2", "--data", str(rows)]) == 0
        # the sft adapter merged at load (PeftModel.from_pretrained), seeded sampling
        assert main(["eval", f"model.path={tiny_model_dir}", f"model.adapter={tmp_path / 'sft' / 'adapter'}",
                     "env.max_steps=1", "data.max_response_length=8", "rollout.micro_batch_size=2",
                     "--num-tasks", "2", "--out", str(tmp_path / "eval")]) == 0
        assert main(["report", str(tmp_path / "rl"), "--out", str(tmp_path / "report.html")]) == 0
    assert not found, "warnings:\n" + "\n".join(found)
    err = capfd.readouterr().err
    assert "Writing model shards" not in err  # transformers' bar at the sft export (and the merges)
    lines = _warning_lines(err)
    # serl's own end-of-run notice: the tiny random model wins nothing, so no group had an advantage
    assert len([x for x in lines if x.startswith("serl: warning: no group carried an advantage")]) == 1
    assert [x for x in lines if not x.startswith("serl: warning: no group carried an advantage")] == []


@pytest.mark.parametrize("stderr, bad", [("serl: run folder x\nLoading weights: 100%", 0),
                                         ("x.py:3: FutureWarning: `a` is deprecated", 1),
                                         ("[transformers] WARNING: something", 1)])
def test_the_stderr_check_finds_warning_lines(stderr, bad):
    assert len(_warning_lines(stderr)) == bad


def test_the_gguf_loaders_own_bar_is_off_inside_the_block(capfd):
    """transformers' GGUF loader draws a plain tqdm bar at a first run's conversion (not one of
    transformers' logging bars); serl.models.loading.gguf_progress_bar_off turns it off, then back."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from serl.models.loading import gguf_progress_bar_off

    capfd.readouterr()
    with gguf_progress_bar_off():
        list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "Converting" not in capfd.readouterr().err
    list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "Converting" in capfd.readouterr().err  # restored
