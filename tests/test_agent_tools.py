"""The tool-call protocol of the math setting: Hermes parsing, fence stripping, the tools section,
and the SmolLM2 chat rendering with its loss mask (SFT == RL)."""

from __future__ import annotations

import copy
import json

import pytest

from serl.agent.tool_calls import (
    CODE_INTERPRETER_SCHEMA,
    ParseStatus,
    ToolArgumentsError,
    ToolCall,
    extract_code,
    format_assistant_turn,
    format_tool_call,
    hermes_tools_section,
    parse_tool_calls,
)
from serl.agent.tool_chat import (
    ConversationIds,
    assistant_turn_ids,
    default_system_text,
    encode,
    end_of_turn_ids,
    observation_ids,
    parse_turn,
    render_assistant_header,
    render_sft_conversation,
    render_system_block,
    render_tool_turn,
    render_user_turn,
    start_conversation,
)

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_START, IM_END, NL = 1, 2, 198  # SmolLM2 ids of <|im_start|>, <|im_end|>, "\n"

TOOLS_SECTION = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "code_interpreter", "description": "A tool for executing code.", '
    '"parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code to execute."}}, '
    '"required": ["code"]}}}\n'
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def call_text(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


# ---------------------------------------------------------------- parsing

def test_no_tags_is_no_calls_and_keeps_the_text():
    p = parse_tool_calls("The answer is \\boxed{4}.")
    assert p.status is ParseStatus.NO_CALLS
    assert (p.content, p.calls, p.malformed) == ("The answer is \\boxed{4}.", [], [])


def test_one_valid_call_content_is_not_stripped():
    p = parse_tool_calls("Let me compute.\n" + call_text("print(1)"))
    assert p.status is ParseStatus.CALLS
    assert p.calls == [ToolCall("code_interpreter", {"code": "print(1)"})]
    assert p.content == "Let me compute.\n"
    assert p.malformed == []


def test_two_calls_in_one_turn_are_both_parsed_in_order():
    p = parse_tool_calls("A\n" + call_text("x = 1") + "\n" + call_text("y = 2"))
    assert [c.arguments["code"] for c in p.calls] == ["x = 1", "y = 2"]
    assert p.content == "A\n\n"
    assert p.status == "calls"


def test_matching_is_non_greedy_and_spans_lines():
    pretty = '<tool_call>\n{\n  "name": "code_interpreter",\n  "arguments": {"code": "a"}\n}\n</tool_call>'
    p = parse_tool_calls(pretty + " mid " + call_text("b"))
    assert [c.arguments["code"] for c in p.calls] == ["a", "b"]
    assert p.content == " mid "


def test_malformed_json_is_dropped_and_recorded():
    text = "Try.\n<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"x\"}\n</tool_call>"
    p = parse_tool_calls(text)
    assert p.status is ParseStatus.MALFORMED
    assert p.calls == []
    assert p.malformed == ['\n{"name": "code_interpreter", "arguments": {"code": "x"}\n']
    assert p.content == "Try.\n"


@pytest.mark.parametrize("body", [
    '{"arguments": {"code": "x"}}',  # no name
    '{"name": "code_interpreter"}',  # no arguments
    '["code_interpreter", {"code": "x"}]',  # not an object
    '"code_interpreter"',
    '{"name": 3, "arguments": {"code": "x"}}',  # name not a string
    "",
])
def test_blocks_without_name_and_arguments_are_malformed(body):
    p = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert p.status is ParseStatus.MALFORMED
    assert p.malformed == [body]
    assert p.content == ""


def test_a_valid_call_beside_a_malformed_one_is_calls():
    p = parse_tool_calls("<tool_call>{oops}</tool_call>\n" + call_text("z"))
    assert p.status is ParseStatus.CALLS
    assert p.calls == [ToolCall("code_interpreter", {"code": "z"})]
    assert p.malformed == ["{oops}"]


@pytest.mark.parametrize("text", [
    "Let me run it.\n<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"x\"}}",  # only opening
    "{\"name\": \"code_interpreter\", \"arguments\": {}}\n</tool_call>",  # only closing
    "</tool_call> wrong order <tool_call>",  # both tags, no block
])
def test_without_a_complete_block_there_are_no_calls_and_the_text_is_kept(text):
    p = parse_tool_calls(text)
    assert p.status is ParseStatus.NO_CALLS
    assert (p.content, p.calls, p.malformed) == (text, [], [])


def test_text_after_the_closing_tag_stays_in_the_content():
    p = parse_tool_calls("Run.\n" + call_text("print(1)") + "\nI expect 1.")
    assert len(p.calls) == 1
    assert p.content == "Run.\n\nI expect 1."


def test_arguments_given_as_a_json_string_are_kept_and_fail_at_execution():
    inner = json.dumps({"code": "print(1)"})
    p = parse_tool_calls("<tool_call>" + json.dumps({"name": "code_interpreter", "arguments": inner}) + "</tool_call>")
    assert p.status is ParseStatus.CALLS
    assert p.calls[0].arguments == '{"code": "print(1)"}'
    with pytest.raises(ToolArgumentsError, match="JSON object"):
        extract_code(p.calls[0].arguments)


def test_formatted_turn_parses_back_to_its_calls():
    calls = [ToolCall("code_interpreter", {"code": 'print("é")\nx = 1'}), ToolCall("code_interpreter", {"code": "2"})]
    p = parse_tool_calls(format_assistant_turn("Two steps.", calls))
    assert p.calls == calls
    assert p.content == "Two steps.\n\n"


# ---------------------------------------------------------------- fence stripping

@pytest.mark.parametrize("code, expected", [
    ("x = 1\nprint(x)\n", "x = 1\nprint(x)\n"),  # no fence: unchanged, not stripped
    ("```python\nprint(1)\n```", "print(1)"),
    ("Here:\n```python\nprint(1)\n```\nDone.", "print(1)"),
    ("```python\na = 1\n```\n```python\nb = 2\n```", "a = 1"),  # two fences: the first
    ("```py\nprint(2)\n```", "print(2)"),
    ("```python print(3)```", "print(3)"),  # no newline after the fence
    ("```py print(3)```", "print(3)"),
    ("```py\na\n```\n```python\nb\n```", "b"),  # a python block wins over an earlier py block
    ("```python3\nprint(1)\n```", "3\nprint(1)"),  # as the original: the 3 stays
    ("```python\nprint(1)", "```python\nprint(1)"),  # unclosed: unchanged
    ("```\nprint(1)\n```", "```\nprint(1)\n```"),  # no language: unchanged
])
def test_extract_code_fence_stripping(code, expected):
    assert extract_code({"code": code}) == expected


def test_extract_code_missing_code_is_empty_and_bad_arguments_raise():
    assert extract_code({}) == ""
    assert extract_code({"code": "1", "timeout": 3}) == "1"
    for bad in (None, [], "print(1)", 3):
        with pytest.raises(ToolArgumentsError):
            extract_code(bad)
    for bad_code in (None, 3, ["print(1)"]):
        with pytest.raises(ToolArgumentsError, match="'code' must be a string"):
            extract_code({"code": bad_code})


# ---------------------------------------------------------------- tools section and call text

def test_tools_section_is_pinned():
    assert hermes_tools_section([CODE_INTERPRETER_SCHEMA]) == TOOLS_SECTION
    with pytest.raises(ValueError):
        hermes_tools_section([])


def test_schema_and_call_json_match_transformers_tojson(tokenizer):
    """The chat-template ``tojson`` filter (transformers' override) gives the same JSON as ours."""
    args = {"code": 'print("é → ü")\nx = [1, 2]', "z": None}
    template = ("{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
                "{% for m in messages %}{{ m.tool_calls[0].function.arguments | tojson }}{% endfor %}")
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "code_interpreter", "arguments": args}}]}
    rendered = tokenizer.apply_chat_template([msg], tools=[CODE_INTERPRETER_SCHEMA], chat_template=template,
                                             tokenize=False)
    schema_line, args_json = rendered.split("\n", 1)
    assert "<tools>\n" + schema_line + "\n</tools>" in TOOLS_SECTION
    assert format_tool_call("code_interpreter", args) == (
        '<tool_call>\n{"name": "code_interpreter", "arguments": ' + args_json + "}\n</tool_call>")
    assert args_json == '{"code": "print(\\"é → ü\\")\\nx = [1, 2]", "z": null}'


def test_format_assistant_turn_shapes():
    c = ToolCall("code_interpreter", {"code": "1+1"})
    one = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "1+1"}}\n</tool_call>'
    assert format_assistant_turn("Compute.", [c]) == "Compute.\n" + one
    assert format_assistant_turn("", [c]) == one  # empty content: no leading newline
    assert format_assistant_turn(None, [c, c]) == one + "\n" + one
    assert format_assistant_turn("\\boxed{2}") == "\\boxed{2}"
    with pytest.raises(TypeError):
        format_tool_call("code_interpreter", '{"code": "1"}')
    with pytest.raises(ValueError):
        format_tool_call('a"b', {})


# ---------------------------------------------------------------- chat rendering

class _StubTemplate:
    def __init__(self, text):
        self.text = text

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return self.text.replace("{u}", messages[0]["content"])


def test_default_system_text_is_read_from_the_template(tokenizer):
    assert default_system_text(tokenizer) == SMOL_SYSTEM
    assert default_system_text(_StubTemplate("<|im_start|>user\n{u}<|im_end|>\n")) is None
    with pytest.raises(ValueError):
        default_system_text(_StubTemplate("[INST] {u} [/INST]"))
    with pytest.raises(ValueError):
        default_system_text(_StubTemplate("SYS: hi\n<|im_start|>user\n{u}<|im_end|>\n"))


def test_system_block_pieces(tokenizer):
    assert render_system_block(tokenizer, [CODE_INTERPRETER_SCHEMA]) == (
        "<|im_start|>system\n" + SMOL_SYSTEM + "\n\n" + TOOLS_SECTION + "<|im_end|>\n")
    assert render_system_block(tokenizer, [CODE_INTERPRETER_SCHEMA], system_text="") == (
        "<|im_start|>system\n" + TOOLS_SECTION + "<|im_end|>\n")
    assert render_system_block(tokenizer, [], system_text="Be brief.") == "<|im_start|>system\nBe brief.<|im_end|>\n"
    assert render_system_block(tokenizer, [], system_text="") == ""
    assert render_user_turn("q") == "<|im_start|>user\nq<|im_end|>\n"
    assert render_assistant_header() == "<|im_start|>assistant\n"


def test_tool_turn_text():
    assert render_tool_turn("14\n") == (
        "<|im_start|>user\n<tool_response>\n14\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert render_tool_turn(["1", "2"]) == ("<|im_start|>user\n<tool_response>\n1\n</tool_response>"
                                            "\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError):
        render_tool_turn([])


def test_end_of_turn_appends_the_newline_or_closes_the_turn(tokenizer):
    assert end_of_turn_ids(tokenizer, [5, 6, IM_END]) == [NL]
    assert end_of_turn_ids(tokenizer, [5, 6]) == [IM_END, NL]
    assert end_of_turn_ids(tokenizer, []) == [IM_END, NL]


def test_conversation_ids_rejects_a_bad_mask():
    conv = ConversationIds()
    conv.append([1, 2], 1)
    assert (conv.input_ids, conv.loss_mask, len(conv)) == ([1, 2], [1, 1], 2)
    with pytest.raises(ValueError):
        conv.append([3], 2)


def _two_call_messages():
    call = lambda code: [{"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}]
    return [
        {"role": "user", "content": "What is 2+3*4?"},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": call("print(2+3*4)")},
        {"role": "tool", "content": "14"},
        {"role": "assistant", "content": "", "tool_calls": call("print(14 == 2+3*4)")},
        {"role": "tool", "content": "True"},
        {"role": "assistant", "content": "The answer is \\boxed{14}."},
    ]


A1 = 'Let me compute.\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(2+3*4)"}}\n</tool_call>'
A2 = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(14 == 2+3*4)"}}\n</tool_call>'
A3 = "The answer is \\boxed{14}."


def _expected_text():
    return ("<|im_start|>system\n" + SMOL_SYSTEM + "\n\n" + TOOLS_SECTION + "<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+3*4?<|im_end|>\n<|im_start|>assistant\n" + A1 + "<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n14\n</tool_response><|im_end|>\n<|im_start|>assistant\n" + A2
            + "<|im_end|>\n<|im_start|>user\n<tool_response>\nTrue\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n" + A3 + "<|im_end|>")


def _runs(mask):
    """``[start, end)`` of each run of 1s."""
    runs, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_two_call_conversation_text_and_masks(tokenizer):
    ids, mask = render_sft_conversation(tokenizer, _two_call_messages(), [CODE_INTERPRETER_SCHEMA])
    assert len(ids) == len(mask)
    assert tokenizer.decode(ids) == _expected_text()
    # piecewise tokenisation equals tokenising the whole text, for this conversation
    assert ids == encode(tokenizer, _expected_text())
    runs = _runs(mask)
    assert [tokenizer.decode(ids[s:e]) for s, e in runs] == [A1 + "<|im_end|>", A2 + "<|im_end|>", A3 + "<|im_end|>"]
    for k, (s, e) in enumerate(runs):
        assert ids[s - 4 : s] == [IM_START] + encode(tokenizer, "assistant\n")  # header, mask 0
        assert mask[s - 4 : s] == [0, 0, 0, 0]
        assert ids[e - 1] == IM_END and mask[e - 1] == 1
        assert e - s == len(encode(tokenizer, [A1, A2, A3][k])) + 1
        if k < 2:  # the appended newline and the tool turn: mask 0
            assert ids[e : e + 2] == [NL, IM_START] and mask[e : e + 2] == [0, 0]
            assert tokenizer.decode(ids[e + 1 : e + 4]) == "<|im_start|>user\n"
        else:
            assert e == len(ids)  # nothing after the final <|im_end|>
    system_len = len(encode(tokenizer, render_system_block(tokenizer, [CODE_INTERPRETER_SCHEMA])))
    assert set(mask[:system_len]) == {0} and ids[system_len - 2 : system_len] == [IM_END, NL]
    assert sum(mask) == sum(e - s for s, e in runs)


def _rl_rollout(tokenizer, messages):
    """An RL-like loop: the "sampled" ids of each assistant turn are the tokenised turn text plus
    <|im_end|>; tool outputs come from the messages; parsing decides whether the episode goes on."""
    conv = start_conversation(tokenizer, [CODE_INTERPRETER_SCHEMA], messages[0]["content"])
    prompt_len = len(conv)
    assistants = [m for m in messages if m["role"] == "assistant"]
    outputs = [m["content"] for m in messages if m["role"] == "tool"]
    for k, msg in enumerate(assistants):
        calls = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])]
        sampled = encode(tokenizer, format_assistant_turn(msg["content"], calls)) + [IM_END]
        conv.append_assistant(sampled)
        parsed = parse_turn(tokenizer, sampled)
        if parsed.status is not ParseStatus.CALLS:
            break
        assert extract_code(parsed.calls[0].arguments) == calls[0].arguments["code"]
        conv.append(observation_ids(tokenizer, sampled, outputs[k]), 0)
    return conv, prompt_len


def test_sft_rendering_equals_an_rl_rollout_of_the_same_text(tokenizer):
    messages = _two_call_messages()
    sft_ids, sft_mask = render_sft_conversation(tokenizer, messages, [CODE_INTERPRETER_SCHEMA])
    conv, prompt_len = _rl_rollout(tokenizer, messages)
    assert conv.input_ids == sft_ids
    assert conv.loss_mask == sft_mask
    assert set(sft_mask[:prompt_len]) == {0} and sft_ids[prompt_len - 1] == NL


def test_sft_assistant_turn_ids_equal_the_tokenised_turn(tokenizer):
    c = ToolCall("code_interpreter", {"code": "print(1)"})
    assert assistant_turn_ids(tokenizer, "", [c]) == encode(tokenizer, format_tool_call(c.name, c.arguments)) + [IM_END]
    assert assistant_turn_ids(tokenizer, None) == [IM_END]


def test_a_leading_system_message_and_a_second_user_round(tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"}]
    ids, mask = render_sft_conversation(tokenizer, msgs, [CODE_INTERPRETER_SCHEMA])
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_SECTION + "<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n"
        "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>")
    assert [tokenizer.decode(ids[s:e]) for s, e in _runs(mask)] == ["2<|im_end|>", "4<|im_end|>"]


def test_consecutive_tool_messages_share_one_user_turn(tokenizer):
    msgs = _two_call_messages()[:3] + [{"role": "tool", "content": "extra"}] + _two_call_messages()[5:]
    ids, _ = render_sft_conversation(tokenizer, msgs, [CODE_INTERPRETER_SCHEMA])
    assert ("<|im_start|>user\n<tool_response>\n14\n</tool_response>\n<tool_response>\nextra\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\nThe answer") in tokenizer.decode(ids)


@pytest.mark.parametrize("cut", [
    lambda m: m[:3],  # ends with a tool message
    lambda m: m[:2],  # ends with a tool-calling assistant message
    lambda m: m[1:],  # starts with an assistant message
    lambda m: m[:2] + [{"role": "user", "content": "x"}] + m[5:],  # user answers a tool call
    lambda m: m[:1] + m[5:] + m[5:],  # two assistant messages in a row
    lambda m: m[:1] + [{"role": "tool", "content": "x"}] + m[5:],  # tool without a call
    lambda m: [],
])
def test_out_of_order_conversations_raise(tokenizer, cut):
    with pytest.raises(ValueError):
        render_sft_conversation(tokenizer, cut(copy.deepcopy(_two_call_messages())), [CODE_INTERPRETER_SCHEMA])


def test_malformed_sft_tool_calls_raise(tokenizer):
    msgs = _two_call_messages()
    msgs[1]["tool_calls"] = [{"type": "function", "function": {"arguments": {"code": "1"}}}]
    with pytest.raises(ValueError, match="malformed tool call"):
        render_sft_conversation(tokenizer, msgs, [CODE_INTERPRETER_SCHEMA])
    msgs[1]["tool_calls"] = [{"function": {"name": "code_interpreter", "arguments": '{"code": "1"}'}}]
    with pytest.raises(TypeError):
        render_sft_conversation(tokenizer, msgs, [CODE_INTERPRETER_SCHEMA])


def test_the_schema_constant_is_not_mutated_by_rendering(tokenizer):
    before = copy.deepcopy(CODE_INTERPRETER_SCHEMA)
    render_sft_conversation(tokenizer, _two_call_messages(), [CODE_INTERPRETER_SCHEMA])
    assert CODE_INTERPRETER_SCHEMA == before
