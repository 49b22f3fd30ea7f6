"""The text the model sees for a sandbox run, and its truncation.

:func:`tool_response_text` with ``mode="original"`` reproduces, string for string, the rules of
SPEAR's code tool (``TencentYoutuResearch/SPEAR@7e8431513165640b4b1f78d09ebaae8807ee4f85:verl/verl/tools/sandbox_fusion_tools.py``,
``SandboxFusionTool.execute_code``). ``mode="stdout_and_stderr"`` is serl's fix of two of its
defects: any stderr output (a ``DeprecationWarning`` included) hides all of stdout, and a timeout
reads "Tool API failed! Please try again.", a misleading retry prompt.

:func:`truncate_tool_output` is verl's tool-response truncation (same repository,
``verl/verl/experimental/agent_loop/tool_agent_loop.py``, ``_call_tool``), driven by
``rollout.max_tool_response_length`` (in **characters**, default 16384) and
``rollout.tool_response_truncate_side`` (default ``middle``).
"""

from __future__ import annotations

from serl.sandbox.base import ExecutionResult

#: appended after the last stderr lines when the program wrote to stderr (original wording)
ERRORS_OCCURRED = "Errors occurred! Check your code."
#: the text when the program finished with empty stdout and empty stderr (original wording)
EMPTY_STDOUT = "Empty stdout! You might forget to print the answer."
#: the text when the code did not run to an end: time limit, backend failure (original wording)
TOOL_API_FAILED = "Tool API failed! Please try again."
#: serl's timeout text in ``stdout_and_stderr`` mode
TIMEOUT = "Timeout! The code ran past the time limit."
#: serl's text in ``stdout_and_stderr`` mode for a program ended by a limit with nothing on stderr
KILLED = "Killed! The code hit a resource limit (memory, CPU time, file size or processes)."
#: the truncation markers of verl's agent loop, per side
TRUNCATION_MARK = "...(truncated)..."
MODES = ("original", "stdout_and_stderr")
SIDES = ("middle", "left", "right")


def last_stderr_lines(stderr: str, n: int = 2) -> str:
    """The last ``n`` non-blank lines of ``stderr``, each stripped, joined by ``\\n``."""
    lines = [line.strip() for line in stderr.split("\n") if line.strip()]
    return "\n".join(lines[-n:]) if n > 0 else ""


def tool_response_text(result: ExecutionResult, mode: str = "original") -> str:
    """The model-facing text for ``result``, before truncation.

    ``mode="original"`` (SPEAR's rules, verbatim):

    - the code finished (status ``ok``, ``error`` or ``killed``) and ``stderr`` is not empty: the
      last 2 non-blank stderr lines, stripped, then ``"\\nErrors occurred! Check your code."``;
      stdout is discarded;
    - finished with empty stderr: ``stdout.strip()``; when stdout is empty (length 0 before the
      strip, as the original tests it) the text is ``"Empty stdout! You might forget to print the
      answer."`` (a whitespace-only stdout therefore gives ``""``);
    - anything else (``timeout``, ``api_error``): ``"Tool API failed! Please try again."``;
    - the whole text is then stripped.

    ``mode="stdout_and_stderr"`` (serl's fix): ``stdout.strip()``, then, if stderr is not empty,
    the last 2 non-blank stderr lines and ``"Errors occurred! Check your code."``, one part per
    line; a ``timeout`` gives the stdout so far and ``"Timeout! The code ran past the time
    limit."``; ``killed`` with empty stderr adds ``"Killed! The code hit a resource limit …"``;
    nothing at all gives the empty-stdout text; ``api_error`` stays ``"Tool API failed! Please
    try again."`` (then it is true).

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode == "original":
        return _original_text(result)
    if mode == "stdout_and_stderr":
        return _stdout_and_stderr_text(result)
    raise ValueError(f"unknown tool response mode {mode!r}; expected one of {MODES}")


def _original_text(result: ExecutionResult) -> str:
    if not result.finished:
        return TOOL_API_FAILED
    if len(result.stderr) != 0:
        text = last_stderr_lines(result.stderr).strip() + "\n" + ERRORS_OCCURRED
    else:
        text = result.stdout.strip()
        if len(result.stdout) == 0:
            text += "\n" + EMPTY_STDOUT
    return text.strip()


def _stdout_and_stderr_text(result: ExecutionResult) -> str:
    if result.status == "api_error":
        return TOOL_API_FAILED
    parts = [result.stdout.strip()] if result.stdout.strip() else []
    if result.stderr.strip():
        parts += [last_stderr_lines(result.stderr), ERRORS_OCCURRED]
    if result.status == "timeout":
        parts.append(TIMEOUT)
    elif result.status == "killed" and not result.stderr.strip():
        parts.append(KILLED)
    return "\n".join(parts).strip() or EMPTY_STDOUT


def truncate_tool_output(text: str, max_chars: int, side: str = "middle") -> str:
    """Cut ``text`` to about ``max_chars`` characters, as verl's agent loop does.

    Unchanged when ``len(text) <= max_chars``. Otherwise, with ``L = max_chars``:

    - ``"middle"``: with ``h = L // 2``, ``text[:h] + "...(truncated)..." + text[-h:]`` (head and
      tail of ``h`` characters each, so an odd ``L`` keeps ``L - 1``);
    - ``"left"``: keeps the head, ``text[:L] + "...(truncated)"``;
    - ``"right"``: keeps the tail, ``"(truncated)..." + text[-L:]``.

    The marker is added on top of ``L`` (the result is longer than ``L``), as in the original.
    One deviation: for ``L = 1`` the original's ``text[-0:]`` keeps the whole text; here the
    middle cut keeps no tail.

    Raises:
        ValueError: ``max_chars < 1`` or an unknown ``side``.
    """
    if side not in SIDES:
        raise ValueError(f"unknown truncation side {side!r}; expected one of {SIDES}")
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + TRUNCATION_MARK + text[len(text) - half:]
