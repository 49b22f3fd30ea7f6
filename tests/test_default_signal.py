"""The default run carries learning signal: it plays the shipped train games chosen by its cold
start's wins, and ``serl train`` says at the end how many groups had an advantage (and warns when none did)."""

from __future__ import annotations

import collections
import json
import math

import pytest

from serl.cli import _print_signal
from serl.config import DEFAULT_RECIPE
from serl.configure import load_config
from serl.envs.alfworld import TASK_TYPES
from serl.train import env_pool
from serl.train.metrics import signal_summary


def test_signal_summary_counts_iterations_and_averages_the_group_fraction():
    recs = [{"iteration": 1, "critic/advantages/nonzero_group_fraction": 0.5},
            {"iteration": 2, "critic/advantages/nonzero_group_fraction": 0.0},
            {"iteration": 2, "val/success_rate": 0.3},  # an eval-only record: skipped
            {"iteration": 3, "critic/advantages/nonzero_group_fraction": 1.0}]
    assert signal_summary(recs) == {"iterations": 3.0, "iterations_with_signal": 2.0, "group_fraction": 0.5}
    empty = signal_summary([{"iteration": 1}])
    assert empty["iterations"] == 0 and math.isnan(empty["group_fraction"])


def _metrics(tmp_path, fractions):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"iteration": i + 1, "critic/advantages/nonzero_group_fraction": f})
             for i, f in enumerate(fractions)]
    path.write_text("\n".join(lines) + "\n{\"iteration\": 9, \"crit")  # a torn last line is skipped
    return path


def test_the_end_of_run_line_and_the_warning_when_nothing_was_learned(tmp_path, capsys):
    _print_signal(_metrics(tmp_path, [0.5, 0.25]))
    out, err = capsys.readouterr()
    assert "groups with an advantage: 0.38 (mean over 2 iterations; 2 had at least one)" in out
    assert err == ""
    _print_signal(_metrics(tmp_path, [0.0, 0.0]))
    out, err = capsys.readouterr()
    assert "groups with an advantage: 0.00 (mean over 2 iterations; 0 had at least one)" in out
    assert err.count("\n") == 1 and "warning" in err and "nothing was learned" in err
    _print_signal(tmp_path / "missing.jsonl")  # no metrics file: nothing printed
    assert capsys.readouterr() == ("", "")


def test_the_default_run_plays_all_six_types_in_the_conversation_layout_on_the_shipped_games(monkeypatch):
    monkeypatch.delenv("SERL_DATA", raising=False)
    assert DEFAULT_RECIPE == "default"
    cfg = load_config(DEFAULT_RECIPE, [])  # what `serl train` with no recipe runs
    assert cfg.model.path == "smollm2-135m-alfworld-conv-sft"
    assert cfg.env.prompt_layout == "conversation" and cfg.env.max_steps == 8 and cfg.env.task_types == []
    tasks = env_pool.list_tasks(cfg, cfg.env.train_split)
    # two games of each type, chosen by the conversation cold start's wins at T = 1 within 8 steps
    # (serl/data/alfworld/SOURCE.md)
    assert collections.Counter(t.task_type for t in tasks) == {t: 2 for t in TASK_TYPES}
    assert sorted(t.task_id.split("/")[-3] for t in tasks) == [
        "look_at_obj_in_light-AlarmClock-None-DeskLamp-314", "look_at_obj_in_light-Book-None-DeskLamp-306",
        "pick_and_place_simple-Book-None-CoffeeTable-229", "pick_and_place_simple-Book-None-Sofa-201",
        "pick_clean_then_place_in_recep-Bowl-None-Shelf-7", "pick_clean_then_place_in_recep-Mug-None-CoffeeMachine-15",
        "pick_cool_then_place_in_recep-Apple-None-DiningTable-15", "pick_cool_then_place_in_recep-Apple-None-GarbageCan-19",
        "pick_heat_then_place_in_recep-Apple-None-CounterTop-5", "pick_heat_then_place_in_recep-Apple-None-DiningTable-23",
        "pick_two_obj_and_place-AlarmClock-None-Desk-307", "pick_two_obj_and_place-Book-None-Bed-314"]
    # the step layout's recipe keeps its own cold start and its two task types
    step = load_config("cpu", [])
    assert step.env.prompt_layout == "step" and step.model.path == "smollm2-135m-alfworld-sft"
    assert {t.task_type for t in env_pool.list_tasks(step, step.env.train_split)} == {
        "look_at_obj_in_light", "pick_and_place_simple"}


@pytest.mark.slow
def test_a_tiny_default_run_prints_the_signal_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The README's command on the tiny model's path: the end-of-run summary names the signal."""
    from serl.cli import main

    monkeypatch.delenv("SERL_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    rc = main(["train", f"model.path={tiny_model_dir}", "trainer.total_training_steps=1", "env.max_steps=2",
               "data.max_response_length=8", "trainer.progress=false"])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "groups with an advantage: " in out and "(mean over 1 iterations;" in out
    # the random tiny model wins nothing: its groups carry no advantage, and the run says so
    assert "nothing was learned" in err
