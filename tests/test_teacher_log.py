"""The opt-in, sampled SERL teacher log."""

from __future__ import annotations

import json
import random

from serl.hindsight.builder import SerlContextBuilder
from serl.hindsight.rendering import FEEDBACK_HEADER, SOLVE_LINE
from serl.config import SerlConfig
from serl.train.teacher_log import TeacherLogWriter, teacher_log_row
from serl.trajectory import iter_steps
from test_serl_context import ROW, make_groups


def rows_for(mode: str = "immediate_feedback") -> list[dict]:
    groups = make_groups()
    ctxs = SerlContextBuilder(SerlConfig(sampling_mode=mode)).build(groups)
    return [teacher_log_row(g, t, s, c, mode=mode) for (g, t, s), c in zip(iter_steps(groups), ctxs)]


def read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_off_by_default(tmp_path):
    w = TeacherLogWriter(tmp_path, SerlConfig())
    assert w.write(0, rows_for()) is None
    assert not (tmp_path / "teacher").exists()


def test_row_contents():
    rows = rows_for()
    a1 = rows[ROW["A1"]]
    assert a1["student_prompt"] == "[A1] obs: You arrive at desk 1."
    assert a1["teacher_prompt"] == f"[A1] obs: You arrive at desk 1.\n\n{FEEDBACK_HEADER}\nNothing happens.\n\n{SOLVE_LINE}"
    assert a1["response"] == "<think>open it</think>\n<action>open drawer 1</action>"
    assert (a1["sources"], a1["section_headers"], a1["has_context"]) == (["feedback"], [FEEDBACK_HEADER], True)
    assert (a1["uid"], a1["traj_uid"], a1["task_id"], a1["step_id"], a1["mode"]) == ("g1", "A", "game1", 1, "immediate_feedback")
    d0 = rows[ROW["D0"]]  # no context: teacher prompt = student prompt
    assert d0["has_context"] is False and d0["teacher_prompt"] == d0["student_prompt"] and d0["sources"] == []


def test_all_rows_and_truncation(tmp_path):
    c = SerlConfig(dump_teacher_log=True, teacher_log_sample_rows=0, teacher_log_max_text_chars=10)
    path = TeacherLogWriter(tmp_path, c).write(3, rows_for())
    assert path == tmp_path / "teacher" / "3.jsonl"
    got = read(path)
    assert [r["row"] for r in got] == list(range(14)) and all(r["iteration"] == 3 for r in got)
    a1 = got[ROW["A1"]]
    assert a1["student_prompt"] == "[A1] obs: " + " [... 21 more chars cut]"
    assert a1["step_id"] == 1  # non-strings untouched
    assert not list((tmp_path / "teacher").glob(".*.tmp"))  # atomic write left no temp file


def test_sampling_is_seeded_and_ordered(tmp_path):
    c = SerlConfig(dump_teacher_log=True, teacher_log_sample_rows=5)
    w = TeacherLogWriter(tmp_path, c)
    first = [r["row"] for r in read(w.write(7, rows_for()))]
    again = [r["row"] for r in read(w.write(7, rows_for()))]
    other = [r["row"] for r in read(w.write(8, rows_for()))]
    assert len(first) == 5 and first == sorted(first) and first == again
    assert first == sorted(random.Random(7).sample(range(14), 5))  # seeded by the iteration
    assert other == sorted(random.Random(8).sample(range(14), 5)) and other != first


def test_every_n_steps(tmp_path):
    w = TeacherLogWriter(tmp_path, SerlConfig(dump_teacher_log=True, teacher_log_every_n_steps=5))
    assert w.write(3, rows_for()) is None
    assert w.write(10, rows_for()) is not None
    assert w.write(10, []) is None
    assert sorted(p.name for p in (tmp_path / "teacher").iterdir()) == ["10.jsonl"]
