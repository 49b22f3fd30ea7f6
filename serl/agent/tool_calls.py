"""Hermes tool calls as text: the ``code_interpreter`` schema, the tools section of the system
prompt, parsing ``<tool_call>`` blocks out of a sampled turn, fence stripping of the code, and
rendering calls back into an assistant turn.

This is the protocol of SPEAR's math setting (a model that calls a Python interpreter across
several assistant turns). Public sources, with
``S = TencentYoutuResearch/SPEAR@7e8431513165640b4b1f78d09ebaae8807ee4f85``:

* the schema: ``S:verl/recipe/spear/sandbox_fusion_tool_config.yaml`` (key order as
  ``S:verl/verl/tools/schemas.py`` dumps it with ``exclude_unset``);
* the parser: ``HermesToolParser`` in ``S:verl/verl/experimental/agent_loop/tool_parser.py``;
* how the call is executed (bad arguments raise, ending the episode):
  ``_call_tool`` in ``S:verl/verl/experimental/agent_loop/tool_agent_loop.py`` and
  ``CustomSandboxFusionTool.execute`` in ``S:verl/recipe/spear/retool.py``;
* the rendering of the tools section and of an assistant turn with calls: Qwen2.5-Instruct's chat
  template (``chat_template`` of ``huggingface.co/Qwen/Qwen2.5-7B-Instruct``'s
  ``tokenizer_config.json``), whose ``tojson`` filter is transformers' override
  (``huggingface/transformers: src/transformers/utils/chat_template_utils.py``), i.e.
  ``json.dumps(x, ensure_ascii=False)`` with the default separators ``", "`` and ``": "``.

Everything here is text in, text out; the token-level rendering is :mod:`serl.agent.tool_chat`.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from serl.errors import SerlError

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

#: The one tool of the math setting, as the model sees it in the system prompt
#: (``S:verl/recipe/spear/sandbox_fusion_tool_config.yaml``). Shared: do not mutate (deepcopy it).
CODE_INTERPRETER_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}
CODE_INTERPRETER = "code_interpreter"

# Qwen2.5-Instruct's tools section, split around the schema lines (verbatim text of the template)
_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# HermesToolParser's pattern: non-greedy, across lines
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# CustomSandboxFusionTool's fence patterns (retool.py): ``py`` also matches the start of ``python``
_PYTHON_FENCE_RE = re.compile(r"```python(.*?)```", re.DOTALL)
_PY_FENCE_RE = re.compile(r"```py(.*?)```", re.DOTALL)


class ToolArgumentsError(SerlError, ValueError):
    """A parsed tool call's arguments cannot be executed (not a JSON object, or ``code`` is not a
    string). SPEAR's loop ends the episode on it (termination rule (e))."""


def _tojson(value: Any) -> str:
    """transformers' chat-template ``tojson``: ``json.dumps(value, ensure_ascii=False)``, default
    separators, keys in insertion order.

    Raises:
        TypeError: ``value`` is not JSON-serialisable.
    """
    return json.dumps(value, ensure_ascii=False)


def hermes_tools_section(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The Hermes tools section Qwen2.5-Instruct's template puts in the system prompt, verbatim:
    from ``# Tools`` to the closing ``</tool_call>`` of the format example, one schema per line
    (rendered with ``tojson``). The caller joins it to the system text with ``"\\n\\n"``.

    Args:
        schemas: OpenAI-style tool schemas, e.g. ``[CODE_INTERPRETER_SCHEMA]``.

    Raises:
        ValueError: ``schemas`` is empty (Qwen's template writes no tools section then).
        TypeError: a schema is not JSON-serialisable.
    """
    if not schemas:
        raise ValueError("hermes_tools_section needs at least one tool schema")
    return _TOOLS_HEAD + "".join("\n" + _tojson(dict(s)) for s in schemas) + _TOOLS_TAIL


@dataclass(frozen=True)
class ToolCall:
    """One parsed call. ``name`` is a string; ``arguments`` is the JSON value the model wrote
    under ``"arguments"``: a dict for a well-formed call, but a string, list, number or ``None``
    is kept too, as SPEAR's parser keeps it (executing such a call fails:
    :func:`extract_code` raises :class:`ToolArgumentsError`)."""

    name: str
    arguments: Any


class ParseStatus(str, enum.Enum):
    """Which case of the turn loop a parsed turn is (``tool_agent_loop.py``, rule (d) and on)."""

    #: no ``<tool_call>`` block at all: a final-answer turn, the episode ends normally
    NO_CALLS = "no_calls"
    #: at least one valid call: the loop runs the first one (``max_parallel_calls = 1``)
    CALLS = "calls"
    #: blocks were written but none parsed: SPEAR treats this as NO_CALLS (pitfall: the episode
    #: ends silently); a loop may instead feed back an error message
    MALFORMED = "malformed"


@dataclass(frozen=True)
class ToolCallParse:
    """The result of :func:`parse_tool_calls`.

    Attributes:
        content: the text with every ``<tool_call>…</tool_call>`` block removed (not stripped).
        calls: the valid calls, in order.
        malformed: the raw inner text of each block that did not parse, in order.
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)

    @property
    def status(self) -> ParseStatus:
        """CALLS if any call parsed (malformed blocks beside it are ignored, as SPEAR does), else
        MALFORMED if a block failed, else NO_CALLS."""
        if self.calls:
            return ParseStatus.CALLS
        return ParseStatus.MALFORMED if self.malformed else ParseStatus.NO_CALLS


def _parse_block(block: str) -> ToolCall | None:
    """One block's call, or ``None`` where SPEAR's parser drops it: the JSON does not load, is not
    an object, lacks ``name`` or ``arguments``, or its ``name`` is not a string (SPEAR's
    ``FunctionCall.name: str`` pydantic field rejects it)."""
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return None
    if not isinstance(obj["name"], str):
        return None
    return ToolCall(name=obj["name"], arguments=obj["arguments"])


def parse_tool_calls(text: str) -> ToolCallParse:
    """Parse a sampled assistant turn with the semantics of SPEAR's ``HermesToolParser``
    (``S:verl/verl/experimental/agent_loop/tool_parser.py``):

    * if ``<tool_call>`` or ``</tool_call>`` does not occur, there are no calls and the content is
      the whole text;
    * else every non-greedy ``<tool_call>(.*?)</tool_call>`` match (across lines) is loaded with
      ``json.loads`` and must be an object with a string ``name`` and an ``arguments`` key;
    * a block that fails is dropped from ``calls``: SPEAR drops it silently (only a log line), we
      also record its raw text in ``malformed`` so the loop can count it or answer it;
    * ``arguments`` is kept as written, even when it is a JSON *string* such as
      ``"{\\"code\\": \\"…\\"}"``: SPEAR's parser accepts that call (it re-dumps the value) and
      the failure comes at execution (``retool.py`` calls ``parameters.get``), which ends the
      episode; :func:`extract_code` raises there in the same way;
    * ``content`` is the text with all matched blocks removed. SPEAR decodes the turn with special
      tokens and removes them from the content by re-encoding; pass the turn decoded with
      ``skip_special_tokens=True`` and the content is the same. Whitespace is not stripped (SPEAR
      does not strip), so ``"Let me compute.\\n<tool_call>…</tool_call>"`` has content
      ``"Let me compute.\\n"``. Text after ``</tool_call>`` stays in the content.

    Args:
        text: one decoded assistant turn.

    Returns:
        :class:`ToolCallParse`; its ``status`` says which loop case applies.
    """
    if TOOL_CALL_OPEN not in text or TOOL_CALL_CLOSE not in text:
        return ToolCallParse(content=text)
    calls: list[ToolCall] = []
    malformed: list[str] = []
    for block in _TOOL_CALL_RE.findall(text):
        call = _parse_block(block)
        if call is None:
            malformed.append(block)
        else:
            calls.append(call)
    return ToolCallParse(content=_TOOL_CALL_RE.sub("", text), calls=calls, malformed=malformed)


def extract_code(arguments: Any) -> str:
    """The code to run for a ``code_interpreter`` call, as ``CustomSandboxFusionTool.execute``
    (``S:verl/recipe/spear/retool.py``) takes it from the arguments:

    * ``arguments["code"]``, or ``""`` when the key is missing (SPEAR then runs an empty script);
    * if the code holds a `````python … ````` block, only the body of the first one is kept,
      stripped; then, on the result, if it holds a `````py … ````` block, only that body, stripped.
      So a `````python````` block wins over an earlier `````py````` one, a fence needs no newline
      (`````python print(1)`````` gives ``print(1)``), and a `````python3````` fence keeps the
      ``3`` (``"3\\nprint(1)"``) as the original does. Code without a closed fence is returned
      unchanged (not stripped).

    Args:
        arguments: :attr:`ToolCall.arguments`.

    Raises:
        ToolArgumentsError: ``arguments`` is not a JSON object, or its ``code`` is not a string
            (SPEAR's tool raises there, and the loop ends the episode: rule (e)).
    """
    if not isinstance(arguments, Mapping):
        raise ToolArgumentsError(
            f"tool arguments must be a JSON object, got {type(arguments).__name__}: {arguments!r:.200}")
    code = arguments.get("code", "")
    if not isinstance(code, str):
        raise ToolArgumentsError(f"tool argument 'code' must be a string, got {type(code).__name__}")
    if m := _PYTHON_FENCE_RE.findall(code):
        code = m[0].strip()
    if m := _PY_FENCE_RE.findall(code):
        code = m[0].strip()
    return code


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call as Qwen2.5-Instruct's template renders it, from ``<tool_call>`` to
    ``</tool_call>``: ``<tool_call>\\n{"name": "NAME", "arguments": JSON}\\n</tool_call>``, the
    name written as is and the arguments with ``tojson`` (non-ASCII kept, ``", "``/``": "``
    separators, key order kept; a newline in the code is the two characters ``\\n``).

    Args:
        name: the tool name.
        arguments: the arguments object, e.g. ``{"code": "print(1)"}``.

    Raises:
        TypeError: ``arguments`` is not a mapping (Qwen2.5's template would render a string as a
            quoted JSON string, teaching the model a call SPEAR cannot execute), or is not
            JSON-serialisable.
        ValueError: ``name`` contains a double quote (the template does not escape it).
    """
    if not isinstance(arguments, Mapping):
        raise TypeError(f"tool-call arguments must be a mapping, got {type(arguments).__name__}")
    if '"' in name:
        raise ValueError(f"tool name {name!r} contains a double quote")
    return f'{TOOL_CALL_OPEN}\n{{"name": "{name}", "arguments": {_tojson(dict(arguments))}}}\n{TOOL_CALL_CLOSE}'


def format_assistant_turn(content: str | None, calls: Sequence[ToolCall] = ()) -> str:
    """The body of an assistant turn (between ``<|im_start|>assistant\\n`` and ``<|im_end|>``) as
    Qwen2.5-Instruct's template renders it: the content, then each call on a new line. With empty
    content the body starts directly with ``<tool_call>`` (no leading newline): the template
    writes ``"\\n" + content`` only when the content is non-empty and ``"\\n<tool_call>…"`` for
    each call, after a header without newline; with serl's header ``…assistant\\n`` that is the
    same text.

    ``"Let me compute.", [call]`` gives ``"Let me compute.\\n<tool_call>\\n{…}\\n</tool_call>"``;
    ``"", [call]`` gives ``"<tool_call>\\n{…}\\n</tool_call>"``; ``"42", []`` gives ``"42"``.

    Raises:
        TypeError, ValueError: as :func:`format_tool_call`.
    """
    parts = [content] if content else []
    parts += [format_tool_call(c.name, c.arguments) for c in calls]
    return "\n".join(parts)
