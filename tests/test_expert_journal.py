"""``serl data expert`` resumes: the journal (serl.rollout.expert_journal) by hand, and the command
stopped after its first episode, then rerun."""

from __future__ import annotations

import json

import pytest

from serl.errors import ConfigError
from serl.rollout.expert import ExpertEpisode
from serl.rollout.expert_journal import ExpertJournal
from serl.trajectory import Task


def _ep(i: int, won: bool = True, steps: int = 3) -> ExpertEpisode:
    task = Task("alfworld", f"game{i}", "pick_and_place_simple")
    return ExpertEpisode(task=task, rows=[{"task_id": f"game{i}", "step": s} for s in range(steps)], won=won,
                         episode_reward=10.0 * won, task_score=float(won), steps=steps)


def test_journal_records_resumes_and_refuses_other_arguments(tmp_path):
    path = tmp_path / "x.jsonl.partial"
    j = ExpertJournal(path, {"seed": 0, "shard": (0, 1)})
    j.record(_ep(0), kept=True)
    j.record(_ep(1, won=False, steps=5), kept=False)
    with open(path, "a") as f:  # a line cut by a kill
        f.write('{"task_id": "game2", "ro')
    j2 = ExpertJournal(path, {"seed": 0, "shard": [0, 1]})
    assert j2.done() == {"game0", "game1"}
    j2.record(_ep(2, steps=2), kept=True)  # starts on a line of its own
    assert [json.loads(line)["task_id"] for line in path.read_text().splitlines()[1:]] == ["game0", "game1", "game2"]
    s = j2.summary()
    assert (s.tasks, s.won, s.kept, s.rows) == (3, 2, 2, 5)
    assert s.plan_lengths == {"pick_and_place_simple": [3, 5, 2]} and s.kept_by_type == {"pick_and_place_simple": 2}
    assert [(r["task_id"], r["step"]) for r in j2.rows(["game2", "game1", "game0"])] == \
        [("game2", 0), ("game2", 1), ("game0", 0), ("game0", 1), ("game0", 2)]
    with pytest.raises(KeyError, match="not played"):
        j2.rows(["game3"])
    with pytest.raises(ConfigError, match="other arguments"):
        ExpertJournal(path, {"seed": 1, "shard": [0, 1]})
    bad = tmp_path / "y.partial"
    bad.write_text('{"task_id": "g"}\n')
    with pytest.raises(ConfigError, match="not a serl data expert journal"):
        ExpertJournal(bad, {})
    j2.remove()
    assert not path.exists()


def test_a_journal_that_does_not_keep_still_writes_and_reads_back(tmp_path):
    # serl eval holds its trajectories itself: the journal writes them and forgets them
    from serl.utils import Journal

    j = Journal(tmp_path / "e.partial", {"split": "s"}, "serl eval", keep=False)
    j.append({"trajectory": 1}, {"trajectory": 2})
    assert j.entries == [] and len(j.path.read_text().splitlines()) == 3
    assert Journal(j.path, {"split": "s"}, "serl eval", keep=False).entries == [{"trajectory": 1}, {"trajectory": 2}]
    kept = Journal(tmp_path / "k.partial", {}, "x")
    kept.append({"a": (1, 2)})
    assert kept.entries == [{"a": [1, 2]}]  # as it reads back


def test_cli_resumes_after_a_stop(tmp_path, tiny_model_dir, monkeypatch, capsys):
    from serl.cli import main
    from serl.rollout import expert as expert_mod

    args = ["data", "expert", "alfworld", f"model.path={tiny_model_dir}", "--split", "train", "--num-tasks", "3",
            "--seed", "4"]
    full = tmp_path / "full.jsonl"
    assert main([*args, "--out", str(full)]) == 0
    out = tmp_path / "x.jsonl"
    play, calls = expert_mod.play_expert, []

    def stop_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return play(*a, **k)

    monkeypatch.setattr(expert_mod, "play_expert", stop_second)
    assert main([*args, "--out", str(out)]) != 0
    assert not out.exists() and len((tmp_path / "x.jsonl.partial").read_text().splitlines()) == 2  # header + 1
    monkeypatch.setattr(expert_mod, "play_expert", play)
    capsys.readouterr()
    assert main([*args, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "1 of 3 tasks done" in captured.err and "kept 3 episodes" in captured.out
    assert out.read_text() == full.read_text()  # same rows, same order, as one uninterrupted run
    assert not (tmp_path / "x.jsonl.partial").exists()
    # --shard: interleaved parts of the same draw
    parts = [tmp_path / f"s{i}.jsonl" for i in range(2)]
    for i, p in enumerate(parts):
        assert main([*args, "--shard", f"{i}/2", "--out", str(p)]) == 0
    ids = [list(dict.fromkeys(json.loads(x)["task_id"] for x in p.read_text().splitlines())) for p in parts]
    every = list(dict.fromkeys(json.loads(x)["task_id"] for x in full.read_text().splitlines()))
    assert ids == [every[0::2], every[1::2]]
    assert main([*args, "--shard", "2/2", "--out", str(tmp_path / "z.jsonl")]) == 2
