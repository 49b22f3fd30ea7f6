"""The model-facing text of a sandbox run and its truncation, against hand-computed strings
(SPEAR's rules in ``serl.sandbox.messages``; no process is started here)."""

from __future__ import annotations

import pytest

from serl.sandbox import ExecutionResult, tool_response_text, truncate_tool_output
from serl.sandbox.base import _percentile

ERR = "Errors occurred! Check your code."
EMPTY = "Empty stdout! You might forget to print the answer."
API = "Tool API failed! Please try again."
TRACEBACK = ('Traceback (most recent call last):\n  File "main.py", line 3, in <module>\n    print(x/y)\n'
             '          ~^~\nZeroDivisionError: division by zero\n')


def r(status="ok", stdout="", stderr="", rc=0):
    return ExecutionResult(status, stdout, stderr, rc)


@pytest.mark.parametrize("result, text", [
    (r(stdout="  42\n"), "42"),
    (r(stdout=""), EMPTY),
    (r(stdout=" \n"), ""),  # the original tests len(stdout) == 0 before stripping
    (r("error", "", TRACEBACK, 1), "~^~\nZeroDivisionError: division by zero\n" + ERR),
    (r(stdout="7\n", stderr="  warn: a\n\n   b  \n\n"), "warn: a\nb\n" + ERR),  # stdout discarded
    (r(stderr="\n \n"), ERR),  # blank stderr is still "stderr not empty"
    (r(stderr="only line"), "only line\n" + ERR),
    (r("killed", "", "", -9), EMPTY),  # a Finished run with nothing printed
    (r("killed", "", "Traceback\nMemoryError\n", 1), "Traceback\nMemoryError\n" + ERR),
    (r("timeout", "partial", "", None), API),
    (r("api_error", "", "", None), API),
])
def test_original_rules(result, text):
    assert tool_response_text(result) == text
    assert tool_response_text(result, mode="original") == text


@pytest.mark.parametrize("result, text", [
    (r(stdout="  42\n"), "42"),
    (r(stdout=""), EMPTY),
    (r(stdout=" \n"), EMPTY),
    (r(stdout="7\n", stderr="DeprecationWarning: x\n  y\n"), "7\nDeprecationWarning: x\ny\n" + ERR),
    (r("error", "", TRACEBACK, 1), "~^~\nZeroDivisionError: division by zero\n" + ERR),
    (r("timeout", "", "", None), "Timeout! The code ran past the time limit."),
    (r("timeout", "1\n", "", None), "1\nTimeout! The code ran past the time limit."),
    (r("killed", "", "", -24), "Killed! The code hit a resource limit (memory, CPU time, file size or processes)."),
    (r("killed", "", "MemoryError\n", 1), "MemoryError\n" + ERR),
    (r("api_error", "", "", None), API),
])
def test_stdout_and_stderr_rules(result, text):
    assert tool_response_text(result, mode="stdout_and_stderr") == text


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="unknown tool response mode"):
        tool_response_text(r(), mode="verbose")


@pytest.mark.parametrize("text, n, side, out", [
    ("abcdefghij", 4, "middle", "ab...(truncated)...ij"),
    ("abcdefghij", 5, "middle", "ab...(truncated)...ij"),  # h = 5 // 2 = 2 on each side
    ("abcdefghij", 4, "left", "abcd...(truncated)"),
    ("abcdefghij", 4, "right", "(truncated)...ghij"),
    ("abcdefghij", 10, "middle", "abcdefghij"),  # not longer than L: unchanged
    ("abcdefghij", 10, "left", "abcdefghij"),
    ("abcdefghij", 1, "middle", "...(truncated)..."),  # the original would keep the whole text here
    ("", 3, "right", ""),
])
def test_truncation(text, n, side, out):
    assert truncate_tool_output(text, n, side) == out


def test_truncation_default_side_is_middle_and_bad_arguments_raise():
    assert truncate_tool_output("x" * 20 + "y" * 20, 8) == "xxxx...(truncated)...yyyy"
    with pytest.raises(ValueError, match="side"):
        truncate_tool_output("abc", 2, "top")
    with pytest.raises(ValueError, match="max_chars"):
        truncate_tool_output("abc", 0)


def test_finished_means_the_code_ran_to_an_exit():
    statuses = ("ok", "error", "killed", "timeout", "api_error")
    assert [r(s).finished for s in statuses] == [True, True, True, False, False]


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (_percentile(values, 0.5), _percentile(values, 0.99), _percentile([], 0.5)) == (50.0, 99.0, 0.0)
    assert _percentile([3.0], 0.99) == 3.0
