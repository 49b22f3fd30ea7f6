"""experiments/alfworld_sft_size_report.py: loop detection and the table, on synthetic results checked
by hand (no model, no GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "experiments"))  # the scripts import their siblings by name

import alfworld_sft_size_report as rep  # noqa: E402


def test_loops_and_repeats():
    six = ["go to desk 1", "take pen 1", "go to desk 1", "take pen 1", "go to desk 1", "look"]
    assert rep.loops(six, won=False)                      # 6 steps, 3 distinct actions
    assert not rep.loops(six, won=True)                   # a win never loops
    assert not rep.loops(six[:5], won=False)              # too short to call a loop
    assert not rep.loops(six + ["go to bed 1"], won=False)  # 4 distinct actions
    assert not rep.repeats(six, won=False)                # alternating, never 3 in a row
    assert rep.repeats(["look", "take pen 1", "take pen 1", "take pen 1"], won=False)
    assert not rep.repeats(["take pen 1"] * 3, won=True)


def _panel(root: Path, name: str, won: dict[str, bool], actions: dict[str, list[str]], admissible: float) -> None:
    d = root / "eval" / name
    d.mkdir(parents=True)
    (d / "tasks.jsonl").write_text("".join(json.dumps({"task_id": t, "won": w}) + "\n" for t, w in won.items()))
    (d / "actions.jsonl").write_text("".join(
        json.dumps({"task_id": t, "won": won[t], "actions": a}) + "\n" for t, a in actions.items()))
    (d / "metrics.json").write_text(json.dumps({"admissible_action_ratio": admissible}))


def test_table_counts_wins_loops_and_the_paired_test(tmp_path):
    loop = ["look"] * 8
    fine = ["go to desk 1", "take pen 1", "use lamp 1"]
    # shipped: wins s1 only; games_60: wins s1, s2, u1 (gains s2 and u1, loses nothing)
    _panel(tmp_path, "shipped_greedy_valid_seen", {"s1": True, "s2": False}, {"s1": fine, "s2": loop}, 0.5)
    _panel(tmp_path, "shipped_greedy_valid_unseen", {"u1": False}, {"u1": loop}, 0.25)
    _panel(tmp_path, "games_60_greedy_valid_seen", {"s1": True, "s2": True}, {"s1": fine, "s2": fine}, 1.0)
    _panel(tmp_path, "games_60_greedy_valid_unseen", {"u1": True}, {"u1": fine}, 0.75)
    _panel(tmp_path, "games_60_sampled_valid_seen", {"s1": False, "s2": False}, {"s1": loop, "s2": fine * 2}, 0.5)
    # a panel whose unseen half did not finish is left out
    sft = tmp_path / "sft" / "games_60"
    (sft / "model").mkdir(parents=True)
    (sft / "metrics.jsonl").write_text('{"sft/loss": 1.5}\n{"sft/loss": 0.25}\n')
    (sft / "model" / "serl_sft.json").write_text('{"num_rows": 240, "optimizer_steps": 60}')
    lines = rep.table(rep.load_panels(tmp_path), tmp_path)
    assert lines[2:] == [
        "| shipped | — | — | greedy | 1/2 | 0/1 | **1/3** | 2/2 | 2/2 | 0.50/0.25 | — |",
        # McNemar: 2 discordant pairs, both for games_60 -> p = 2 * (1/4) = 0.5
        "| games_60 | 240 / 60 | 1.50 → 0.25 | greedy | 2/2 | 1/1 | **3/3** | 0/0 | 0/0 | 1.00/0.75 | 0.5 (+2 / −0) |",
    ]


def test_table_shows_no_loop_counts_without_actions(tmp_path):
    """A split without ``actions.jsonl`` (an eval run that kept no traces) gives "—", not 0/0."""
    _panel(tmp_path, "shipped_greedy_valid_seen", {"s1": True, "s2": False}, {"s1": ["look"], "s2": ["look"] * 8}, 0.5)
    _panel(tmp_path, "shipped_greedy_valid_unseen", {"u1": False}, {"u1": ["look"] * 8}, 0.25)
    (tmp_path / "eval" / "shipped_greedy_valid_unseen" / "actions.jsonl").unlink()
    lines = rep.table(rep.load_panels(tmp_path), tmp_path)
    assert lines[2:] == ["| shipped | — | — | greedy | 1/2 | 0/1 | **1/3** | — | — | 0.50/0.25 | — |"]
