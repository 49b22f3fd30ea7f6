"""Expert tool-use conversations for the math cold start, made from GSM8K's annotated solutions.

GSM8K's worked solutions (``openai/grade-school-math@3101c7d5072418e28b9008a6636bde82a006892c``,
``grade_school_math/data/train.jsonl``; Cobbe et al., arXiv 2110.14168, §2) mark every
calculation with a calculator annotation ``<<expression=result>>`` and end with ``#### answer``.
Each annotation becomes one ``code_interpreter`` call ``print(expression)`` whose output is the
**real** sandbox run of the expression (not the annotated result), rendered as the RL loop
renders a tool turn: ``truncate_tool_output(tool_response_text(result, mode), max_chars, side)``.
The conversation is in the schema of SPEAR's ``sft_preprocess.py``
(``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/sft_preprocess.py``)::

    [{"role": "user", "content": user_prompt(problem, style)},
     {"role": "assistant", "content": TEXT_0, "tool_calls": [{"type": "function", "function":
         {"name": "code_interpreter", "arguments": {"code": "print(EXPR_0)"}}}]},
     {"role": "tool", "content": OUTPUT_0},
     ...,
     {"role": "assistant", "content": FINAL_TEXT + "\\nThe answer is \\\\boxed{ANSWER}."}]

Text of each turn: the solution (before ``####``) is cut at the annotations; turn ``i`` says the
text between annotation ``i-1`` and annotation ``i`` (so it starts with the previous annotated
result, as the solution writes it after the calculation, and ends at the ``=`` before the next
one), stripped. A ``$`` right before an annotation moves to the next turn, in front of the
amount. The final turn is the text after the last annotation, then ``The answer is \\boxed{A}.``
with ``A`` the problem's ground truth (the ``####`` answer without thousands commas).

Rules (counted per reason in :class:`ExpertStats`; a problem is either kept whole or skipped):

* ``too_few_calls`` / ``too_many_calls``: fewer than ``min_tool_calls`` (default 1: a cold start
  for tool use) or more than ``max_tool_calls`` annotations (default 3 = ``env.math.max_turns - 1``
  of the ``cpu_math`` recipe, so every row fits the RL loop's turn limit). Such problems are
  **skipped**, not merged: a merged call would print several numbers, a shape the RL prompt does
  not otherwise show.
* ``bad_annotation``: an annotation without ``=``, with an empty expression, or whose result is
  not a number; or no ``####`` answer.
* ``tool_error``: a call did not finish cleanly (status not ``ok`` or anything on stderr).
* ``result_mismatch``: the printed output does not read as the annotated number. Compared
  numerically (:func:`results_agree`): ``print(48/2)`` prints ``24.0`` and agrees with
  ``<<48/2=24>>``; ``0.30000000000000004`` agrees with ``0.3`` (float noise, relative 1e-9); an
  annotation written with ``k >= 1`` decimals also agrees with an output that rounds to it
  (``3.3333333333333335`` with ``3.33``). Expert data must be correct, so the problem is skipped.
* ``answer_not_correct``: the final turn does not score correct with the ``normalized`` scorer.

This module imports no model code; the row's ``tools`` list and the token rendering come from
:mod:`serl.agent` in the caller (``serl data expert math``).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from typing import Any

from serl.envs.math.data import MathProblem, user_prompt
from serl.envs.math.scoring import as_number, get_scorer
from serl.sandbox import ExecutionResult, tool_response_text, truncate_tool_output

#: the tool name of the calls (``serl.agent.tool_calls.CODE_INTERPRETER``; this layer may not import it)
TOOL_NAME = "code_interpreter"
#: a GSM8K calculator annotation ``<<expression=result>>``
ANNOTATION_RE = re.compile(r"<<([^<>]*)>>")
#: why a problem is skipped, in the order the summary lists them
SKIP_REASONS = ("too_few_calls", "too_many_calls", "bad_annotation", "tool_error", "result_mismatch",
                "answer_not_correct")
#: relative tolerance of :func:`results_agree` for float noise in the printed output
FLOAT_NOISE = Fraction(1, 10**9)


@dataclasses.dataclass(frozen=True)
class ExpertOptions:
    """How :func:`expert_conversations` builds rows. The tool-output fields and ``prompt_style``
    must be the RL run's ``env.math`` values (:meth:`from_math_options`), so SFT rows and RL
    rollouts show the model the same text.

    Attributes:
        prompt_style: :func:`serl.envs.math.data.user_prompt` style.
        min_tool_calls, max_tool_calls: problems with fewer / more annotations are skipped.
        tool_message_mode, tool_response_max_chars, tool_response_truncate_side: the tool turn's
            text (:func:`serl.sandbox.tool_response_text`, :func:`serl.sandbox.truncate_tool_output`).
        scorer: the scorer the final turn must pass.
    """

    prompt_style: str = "spear"
    min_tool_calls: int = 1
    max_tool_calls: int = 3
    tool_message_mode: str = "original"
    tool_response_max_chars: int = 256
    tool_response_truncate_side: str = "middle"
    scorer: str = "normalized"

    def __post_init__(self):
        if self.min_tool_calls < 0 or self.max_tool_calls < self.min_tool_calls:
            raise ValueError(f"expert options: need 0 <= min_tool_calls <= max_tool_calls, got "
                             f"{self.min_tool_calls} and {self.max_tool_calls}")

    @classmethod
    def from_math_options(cls, opts: dict[str, Any], **overrides: Any) -> "ExpertOptions":
        """From ``serl.envs.math.options.math_options(env_cfg)``: ``max_tool_calls = max_turns - 1``
        (the RL loop's limit on executed calls), the prompt style and tool-output settings as RL."""
        kw = {"prompt_style": opts["prompt_style"], "max_tool_calls": max(0, int(opts["max_turns"]) - 1),
              "tool_message_mode": opts["tool_message_mode"],
              "tool_response_max_chars": int(opts["tool_response_max_chars"]),
              "tool_response_truncate_side": opts["tool_response_truncate_side"]}
        return cls(**{**kw, **overrides})

    def tool_text(self, result: ExecutionResult) -> str:
        """The tool turn's text for ``result``, exactly as the RL loop renders it."""
        return truncate_tool_output(tool_response_text(result, self.tool_message_mode),
                                    self.tool_response_max_chars, self.tool_response_truncate_side)


class SkipProblem(Exception):
    """A problem that yields no expert row; ``reason`` is one of :data:`SKIP_REASONS`."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


@dataclasses.dataclass(frozen=True)
class ExpertPlan:
    """A problem cut into turns before anything runs.

    Attributes:
        texts: assistant text before each call (``len(codes)`` entries).
        final_text: the text after the last annotation (may be empty).
        codes: ``print(expression)`` per call.
        results: the annotated result per call (as written).
        answer: the boxed answer (the ground truth).
    """

    problem: MathProblem
    texts: tuple[str, ...]
    final_text: str
    codes: tuple[str, ...]
    results: tuple[str, ...]
    answer: str


def _split_annotation(inner: str) -> tuple[str, str]:
    """``"48/2=24"`` -> ``("48/2", "24")`` (split at the last ``=``), or raise ``bad_annotation``."""
    expr, eq, result = inner.rpartition("=")
    expr, result = expr.strip(), result.strip()
    if not eq or not expr or as_number(result.replace(",", "")) is None:
        raise SkipProblem("bad_annotation", f"<<{inner}>>")
    return expr, result


def plan_problem(problem: MathProblem, options: ExpertOptions = ExpertOptions()) -> ExpertPlan:
    """Cut ``problem.solution`` into turns (module docstring); nothing runs.

    Raises:
        SkipProblem: ``too_few_calls``, ``too_many_calls`` or ``bad_annotation``.
        ValueError: the problem has no solution text (not a GSM8K problem).
    """
    if not problem.solution:
        raise ValueError(f"math problem {problem.uid}: no worked solution (expert rows need GSM8K's)")
    body, sep, _ = problem.solution.rpartition("####")
    if not sep:
        raise SkipProblem("bad_annotation", "no '####' answer line")
    matches = list(ANNOTATION_RE.finditer(body))
    if len(matches) < options.min_tool_calls:
        raise SkipProblem("too_few_calls", f"{len(matches)} annotations < {options.min_tool_calls}")
    if len(matches) > options.max_tool_calls:
        raise SkipProblem("too_many_calls", f"{len(matches)} annotations > {options.max_tool_calls}")
    pairs = [_split_annotation(m.group(1)) for m in matches]
    texts, pos, carry = [], 0, ""
    for m in matches:
        text = (carry + body[pos:m.start()]).strip()
        carry = ""
        if text.endswith("$"):
            text, carry = text[:-1].rstrip(), "$"
        texts.append(text)
        pos = m.end()
    return ExpertPlan(problem, tuple(texts), (carry + body[pos:]).strip(), tuple(f"print({e})" for e, _ in pairs),
                      tuple(r for _, r in pairs), problem.ground_truth)


def results_agree(output: str, annotated: str) -> bool:
    """Whether a printed output reads as the annotated result, numerically.

    Both are read as exact rationals (:func:`serl.envs.math.scoring.as_number`; thousands commas
    in the annotation dropped). They agree when ``|out - ann| <= 1e-9 * max(1, |ann|)``, or when
    ``ann`` is written with ``k >= 1`` decimals and ``|out - ann| <= 0.5 * 10**-k`` (the annotator
    rounded). ``("24.0", "24")`` and ``("3.3333333333333335", "3.33")`` agree; ``("3.5", "3")``,
    ``("2.6", "3")`` and an output that is not one number (``"(1, 0)"``, an error text) do not.
    """
    out, ann = as_number(output.strip()), as_number(annotated.strip().replace(",", ""))
    if out is None or ann is None:
        return False
    diff = abs(out - ann)
    if diff <= FLOAT_NOISE * max(1, abs(ann)):
        return True
    _, dot, decimals = annotated.strip().partition(".")
    return bool(dot) and len(decimals) >= 1 and diff <= Fraction(1, 2 * 10 ** len(decimals))


def tool_call(code: str) -> dict[str, Any]:
    """One ``tool_calls`` entry of SPEAR's SFT schema: ``{"type": "function", "function": {"name":
    "code_interpreter", "arguments": {"code": code}}}``."""
    return {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": code}}}


def final_turn(final_text: str, answer: str) -> str:
    """``"{final_text}\\nThe answer is \\\\boxed{answer}."`` (no leading newline when the text is empty)."""
    box = f"The answer is \\boxed{{{answer}}}."
    return f"{final_text}\n{box}" if final_text else box


def build_conversation(plan: ExpertPlan, results: Sequence[ExecutionResult],
                       options: ExpertOptions = ExpertOptions()) -> list[dict[str, Any]]:
    """The conversation of ``plan`` given the sandbox ``results`` of its codes (module docstring).

    Raises:
        SkipProblem: ``tool_error``, ``result_mismatch`` or ``answer_not_correct``.
        ValueError: ``results`` and ``plan.codes`` differ in length.
    """
    if len(results) != len(plan.codes):
        raise ValueError(f"{plan.problem.uid}: {len(results)} sandbox results for {len(plan.codes)} calls")
    messages: list[dict[str, Any]] = [{"role": "user", "content": user_prompt(plan.problem, options.prompt_style)}]
    for text, code, annotated, res in zip(plan.texts, plan.codes, plan.results, results):
        if res.status != "ok" or res.stderr:
            raise SkipProblem("tool_error", f"{code}: {res.status} {res.stderr.strip()[-200:]}")
        output = options.tool_text(res)
        if not results_agree(output, annotated):
            raise SkipProblem("result_mismatch", f"{code} printed {output[:80]!r}, annotated {annotated!r}")
        messages.append({"role": "assistant", "content": text, "tool_calls": [tool_call(code)]})
        messages.append({"role": "tool", "content": output})
    final = final_turn(plan.final_text, plan.answer)
    if not get_scorer(options.scorer)(final, plan.problem.ground_truth).correct:
        raise SkipProblem("answer_not_correct", f"{final[-80:]!r} vs {plan.problem.ground_truth!r}")
    messages.append({"role": "assistant", "content": final})
    return messages


@dataclasses.dataclass
class ExpertStats:
    """Counts of one :func:`expert_conversations` call: ``seen`` problems, ``kept`` rows,
    ``skipped`` by reason, ``calls`` = tool calls per kept row -> rows."""

    seen: int = 0
    kept: int = 0
    skipped: Counter = dataclasses.field(default_factory=Counter)
    calls: Counter = dataclasses.field(default_factory=Counter)
    #: the first few skips of each reason the sandbox decided: ``"uid: detail"``
    examples: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def skip(self, skip: SkipProblem, uid: str | None = None, keep_examples: int = 3) -> None:
        """Count ``skip``; keep its detail as an example when ``uid`` is given."""
        self.skipped[skip.reason] += 1
        if uid is not None and len(self.examples.setdefault(skip.reason, [])) < keep_examples:
            self.examples[skip.reason].append(f"{uid}: {skip.detail}")

    def as_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "kept": self.kept, "skipped": {r: self.skipped[r] for r in SKIP_REASONS},
                "calls_per_row": dict(sorted(self.calls.items()))}


@dataclasses.dataclass(frozen=True)
class ExpertRow:
    """A kept problem: its ``uid`` and ``messages``, and the number of tool calls."""

    uid: str
    messages: list[dict[str, Any]]
    num_calls: int


def expert_conversations(problems: Iterable[MathProblem], sandbox, options: ExpertOptions = ExpertOptions(),
                         batch_size: int = 32,
                         on_problem: Callable[[ExpertStats], None] | None = None) -> tuple[list[ExpertRow], ExpertStats]:
    """Expert rows for ``problems``, in order, skipping those a rule rejects (module docstring).

    The calls of ``batch_size`` problems at a time go to one ``sandbox.run_many`` (so a problem's
    calls run together and the sandbox's slots stay busy); ``on_problem(stats)`` is called after
    each problem (a progress bar).

    Args:
        problems: GSM8K problems (with ``solution``).
        sandbox: a :class:`serl.sandbox.Sandbox` (e.g. ``sandbox_from_config(cfg.env)``).

    Raises:
        ValueError: a problem without a solution, or ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rows, stats = [], ExpertStats()
    problems = list(problems)
    for k in range(0, len(problems), batch_size):
        plans: list[ExpertPlan | SkipProblem] = []
        for p in problems[k:k + batch_size]:
            try:
                plans.append(plan_problem(p, options))
            except SkipProblem as skip:
                plans.append(skip)
        results = sandbox.run_many([c for pl in plans if isinstance(pl, ExpertPlan) for c in pl.codes])
        pos = 0
        for pl in plans:
            stats.seen += 1
            if isinstance(pl, SkipProblem):
                stats.skip(pl)
            else:
                n = len(pl.codes)
                res, pos = results[pos:pos + n], pos + n
                try:
                    messages = build_conversation(pl, res, options)
                except SkipProblem as skip:
                    stats.skip(skip, pl.problem.uid)
                else:
                    rows.append(ExpertRow(pl.problem.uid, messages, n))
                    stats.kept += 1
                    stats.calls[n] += 1
            if on_problem is not None:
                on_problem(stats)
    return rows, stats
