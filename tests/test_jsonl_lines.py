"""serl.utils.jsonl_lines: the one JSON-lines reader behind the data loaders (strict) and the run-log
readers (lenient)."""

from __future__ import annotations

import pytest

from serl.envs.math.data import parse_jsonl
from serl.errors import EnvError
from serl.utils import jsonl_lines


def test_numbers_every_line_skips_blank_ones_and_reports_bad_ones():
    text = '{"a": 1}\n\n  \n[2]\n{"cut": \nnull\n'
    got = list(jsonl_lines(text.splitlines()))
    assert [(n, v) for n, _, v, _ in got] == [(1, {"a": 1}), (4, [2]), (5, None), (6, None)]
    assert [e is None for *_, e in got] == [True, True, False, True]  # line 6 is a valid JSON null
    assert got[2][1] == '{"cut": ' and "Expecting value" in got[2][3]


def test_a_file_object_keeps_its_newlines():
    import io

    assert [line for _, line, _, _ in jsonl_lines(io.StringIO('{"a": 1}\n{"b": 2}'))] == ['{"a": 1}\n', '{"b": 2}']


def test_a_raw_line_separator_inside_a_string_does_not_cut_the_record():
    import json

    text = json.dumps({"q": "a\u2028b\x85c"}, ensure_ascii=False) + "\n" + json.dumps({"q": 2}) + "\n"
    assert len(text.splitlines()) == 4  # what str.splitlines would have made of it
    assert [v for _, _, v, _ in jsonl_lines(text)] == [{"q": "a\u2028b\x85c"}, {"q": 2}]
    assert parse_jsonl(text.encode(), "x.jsonl") == [{"q": "a\u2028b\x85c"}, {"q": 2}]


def test_strict_loader_names_the_line():
    assert parse_jsonl(b'{"q": 1}\n\n{"q": 2}\n', "x.jsonl") == [{"q": 1}, {"q": 2}]
    with pytest.raises(EnvError, match=r"x\.jsonl line 3 is not valid JSON"):
        parse_jsonl(b'{"q": 1}\n\n{"q": \n', "x.jsonl")
    with pytest.raises(EnvError, match=r"x\.jsonl line 1 is not a JSON object"):
        parse_jsonl(b'[1]\n', "x.jsonl")
