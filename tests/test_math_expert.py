"""Math cold start: GSM8K annotated solutions -> multi-turn tool-use rows (`serl data expert math`),
their token rendering and loss mask, and `serl sft` on them."""

from __future__ import annotations

import json
import re

import pytest
import torch

from serl.agent.tool_calls import CODE_INTERPRETER, CODE_INTERPRETER_SCHEMA, ToolCall, format_assistant_turn
from serl.agent.tool_chat import render_sft_conversation, start_conversation
from serl.cli import main
from serl.envs.math.data import ANSWER_FORMAT, MathProblem, user_prompt
from serl.envs.math.expert import (TOOL_NAME, ExpertOptions, SkipProblem, build_conversation, expert_conversations,
                                   plan_problem, results_agree)
from serl.envs.math.options import MATH_DEFAULTS
from serl.errors import SerlError
from serl.sandbox import ExecutionResult, make_sandbox, tool_response_text, truncate_tool_output
from serl.train.sft_data import SFTExample, collate_sft, encode_row, read_rows

NATALIA = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


def _problem(solution: str, answer: str, uid: str = "gsm8k-train-t") -> MathProblem:
    return MathProblem(uid=uid, dataset="gsm8k", split="train", question="How many?", ground_truth=answer,
                       data_source="gsm8k", solution=solution)


def _call(code: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}]


@pytest.fixture(scope="module")
def sandbox():
    sb = make_sandbox("local", timeout_s=5.0, prelude="math")
    yield sb
    sb.close()


def _convert(problem, sandbox, options=ExpertOptions()):
    plan = plan_problem(problem, options)
    return build_conversation(plan, sandbox.run_many(list(plan.codes)), options)


def test_two_annotations_become_two_real_calls(sandbox):
    msgs = _convert(_problem(NATALIA, "72"), sandbox)
    assert msgs == [
        {"role": "user", "content": "How many?" + ANSWER_FORMAT},
        {"role": "assistant", "content": "Natalia sold 48/2 =", "tool_calls": _call("print(48/2)")},
        {"role": "tool", "content": "24.0"},  # the real output, not the annotated 24
        {"role": "assistant", "content": "24 clips in May.\nNatalia sold 48+24 =", "tool_calls": _call("print(48+24)")},
        {"role": "tool", "content": "72"},
        {"role": "assistant", "content": "72 clips altogether in April and May.\nThe answer is \\boxed{72}."},
    ]
    assert TOOL_NAME == CODE_INTERPRETER


def test_one_annotation_moves_the_dollar_sign_and_plain_style(sandbox):
    sol = "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n#### 0.2"
    msgs = _convert(_problem(sol, "0.2"), sandbox, ExpertOptions(prompt_style="plain"))
    assert [m["content"] for m in msgs] == ["How many?", "Weng earns 12/60 =", "0.2",
                                            "$0.2 per minute.\nThe answer is \\boxed{0.2}."]


def test_three_annotations_and_the_call_limit(sandbox):
    sol = ("He buys 3*4 = <<3*4=12>>12 apples, eats 12-5 = <<12-5=7>>7 and splits them 7/2 = <<7/2=3.5>>3.5 each."
           "\n#### 3.5")
    msgs = _convert(_problem(sol, "3.5"), sandbox)
    calls = [m["tool_calls"][0]["function"]["arguments"]["code"] for m in msgs if m.get("tool_calls")]
    assert calls == ["print(3*4)", "print(12-5)", "print(7/2)"]
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ["12", "7", "3.5"]
    assert msgs[-1]["content"] == "3.5 each.\nThe answer is \\boxed{3.5}."
    with pytest.raises(SkipProblem) as e:
        plan_problem(_problem(sol, "3.5"), ExpertOptions(max_tool_calls=2))
    assert e.value.reason == "too_many_calls"


def test_results_agree_numerically():
    assert results_agree("24.0", "24") and results_agree("-4", "-4.0") and results_agree("1000", "1,000")
    assert results_agree("0.30000000000000004", "0.3")  # float noise
    assert results_agree("3.3333333333333335", "3.33")  # the annotator rounded to 2 decimals
    assert not results_agree("3.336", "3.33")  # 0.006 > 0.005
    assert not results_agree("3.5", "3") and not results_agree("2.6", "3")  # no rounding to integers
    assert not results_agree("(1, 0)", "1") and not results_agree("Errors occurred!", "1")


@pytest.mark.parametrize("solution, answer, reason", [
    ("No calculation at all.\n#### 5", "5", "too_few_calls"),
    ("So 7/2 = <<7/2=3>>3 boxes.\n#### 3", "3", "result_mismatch"),  # prints 3.5
    ("So 5% = <<5%=5>>5.\n#### 5", "5", "tool_error"),  # a SyntaxError in the sandbox
    ("So <<abc>> things.\n#### 5", "5", "bad_annotation"),
    ("So 2+3 = <<2+3=5>>5.\n#### 5", "", "answer_not_correct"),  # \boxed{} scores nothing
])
def test_skipped_problems(sandbox, solution, answer, reason):
    with pytest.raises(SkipProblem) as e:
        _convert(_problem(solution, answer), sandbox)
    assert e.value.reason == reason


def test_batch_conversion_counts_every_problem(sandbox):
    problems = [_problem(NATALIA, "72", "a"), _problem("So 7/2 = <<7/2=3>>3.\n#### 3", "3", "b"),
                _problem("Nothing.\n#### 1", "1", "c"), _problem("So 1+1 = <<1+1=2>>2.\n#### 2", "2", "d")]
    seen = []
    rows, stats = expert_conversations(problems, sandbox, batch_size=3, on_problem=lambda s: seen.append(s.seen))
    assert [r.uid for r in rows] == ["a", "d"] and [r.num_calls for r in rows] == [2, 1]
    assert rows[0].messages == _convert(problems[0], sandbox)
    assert stats.as_dict()["skipped"] == {"too_few_calls": 1, "too_many_calls": 0, "bad_annotation": 0,
                                          "tool_error": 0, "result_mismatch": 1, "answer_not_correct": 0}
    assert stats.calls == {2: 1, 1: 1} and seen == [1, 2, 3, 4]
    assert stats.examples["result_mismatch"][0].startswith("b: print(7/2) printed '3.5'")


def test_tool_text_is_the_rl_loops():
    opts = ExpertOptions.from_math_options({**MATH_DEFAULTS, "max_turns": 4, "tool_response_max_chars": 6})
    assert opts.max_tool_calls == 3 and opts.prompt_style == "spear"
    res = ExecutionResult("ok", stdout="123456789\n")
    assert opts.tool_text(res) == truncate_tool_output(tool_response_text(res, "original"), 6, "middle") \
        == "123...(truncated)...789"


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_rendered_ids_and_mask(tokenizer, sandbox):
    problem = _problem(NATALIA, "72")
    row = {"messages": _convert(problem, sandbox), "tools": [CODE_INTERPRETER_SCHEMA], "uid": problem.uid,
           "env": "math"}
    ids, mask = render_sft_conversation(tokenizer, row["messages"], row["tools"])
    ex = encode_row(tokenizer, row, max_prompt_length=512, max_response_length=384)
    assert ex.prompt_ids + ex.target_ids == ids and [0] * len(ex.prompt_ids) + ex.target_mask == mask
    assert not ex.response_truncated and ex.target_mask[0] == 1
    # the prompt is the RL loop's: start_conversation with the code_interpreter tool and the user prompt
    assert ex.prompt_ids == start_conversation(tokenizer, [CODE_INTERPRETER_SCHEMA], user_prompt(problem)).input_ids
    # mask 1 exactly on the assistant bodies and their <|im_end|>
    want = [format_assistant_turn(m["content"], [ToolCall(CODE_INTERPRETER, c["function"]["arguments"])
                                                 for c in m.get("tool_calls", [])]) + "<|im_end|>"
            for m in row["messages"] if m["role"] == "assistant"]
    assert [tokenizer.decode(ids[a:b]) for a, b in _spans(mask)] == want
    tool_text = tokenizer.decode([i for i, m in zip(ids, mask) if m == 0])
    assert "<tool_response>\n24.0\n</tool_response>" in tool_text
    # cut from the right to the total budget, prompt kept
    cut = encode_row(tokenizer, row, max_prompt_length=len(ex.prompt_ids), max_response_length=5)
    assert cut.prompt_ids == ex.prompt_ids and cut.target_ids == ex.target_ids[:5] and cut.response_truncated
    with pytest.raises(ValueError, match="fills"):
        encode_row(tokenizer, row, max_prompt_length=len(ex.prompt_ids) - 1, max_response_length=1)


class _FixedLogits(torch.nn.Module):
    """A stand-in LM whose logits are a given tensor (the last R+1 positions)."""

    def __init__(self, logits):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.logits = logits

    def forward(self, input_ids, attention_mask, position_ids, logits_to_keep, use_cache):
        assert self.logits.shape[1] == logits_to_keep
        return type("Out", (), {"logits": self.logits + self.w})()


def test_sft_loss_ignores_tool_tokens():
    from serl.train.sft import reply_token_nll

    # target: assistant a a | tool t t t | assistant a ; second row: a step row (mask None), shorter
    exs = [SFTExample([5, 6], [10, 11, 20, 21, 22, 12], target_mask=[1, 1, 0, 0, 0, 1]),
           SFTExample([7, 8, 9], [13, 2])]
    batch = collate_sft(exs, pad_id=0)
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 0, 1], [1, 1, 0, 0, 0, 0]]
    assert batch.attention_mask.sum(1).tolist() == [8, 5]
    logits = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(0))
    nll = reply_token_nll(_FixedLogits(logits), batch)
    assert torch.all(nll[0, 2:5] == 0) and torch.all(nll[0, [0, 1, 5]] > 0)
    # position j predicts target j: change only the logits predicting the tool tokens (j = 2, 3, 4)
    changed = logits.clone()
    changed[0, 2:5] += 100 * torch.randn(3, 32)
    assert torch.equal(reply_token_nll(_FixedLogits(changed), batch), nll)
    changed[0, 5] += 100 * torch.randn(32)  # an assistant token's logits do matter
    assert not torch.equal(reply_token_nll(_FixedLogits(changed), batch), nll)
    # a step row with target_mask=None collates exactly as one with an all-ones mask
    a = collate_sft([exs[1]], 0)
    b = collate_sft([SFTExample([7, 8, 9], [13, 2], target_mask=[1, 1])], 0)
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("input_ids", "position_ids", "response_mask"))
    assert exs[0].num_loss_tokens == 3 and exs[1].num_loss_tokens == 2


def test_read_rows_checks_conversations(tmp_path):
    conv = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "tools": [CODE_INTERPRETER_SCHEMA]}
    p = tmp_path / "rows.jsonl"
    p.write_text(json.dumps(conv) + "\n")
    assert read_rows(p) == [conv]
    for bad, msg in [({**conv, "response": "x"}, "not both"),
                     ({**conv, "messages": conv["messages"] + [{"role": "tool", "content": "1"}]}, "end with an assistant"),
                     ({**conv, "tools": "code"}, "'tools' must be a list")]:
        p.write_text(json.dumps(bad) + "\n")
        with pytest.raises(SerlError, match=msg):
            read_rows(p)


def test_cli_expert_math_then_sft(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "math.jsonl"
    rc = main(["data", "expert", "math", f"model.path={tiny_model_dir}", "--num-tasks", "8", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    kept = int(re.search(r"kept (\d+) rows", text).group(1))
    skipped = [int(n) for n in re.findall(r"(?:calls|annotation|error|mismatch|correct) (\d+)", text)]
    assert len(rows) == kept >= 1 and kept + sum(skipped) == 8 and len(skipped) == 6, text
    assert "tool calls per row:" in text and "longest row:" in text
    for r in rows:
        assert set(r) == {"messages", "tools", "uid", "env"} and r["env"] == "math"
        assert r["tools"] == [CODE_INTERPRETER_SCHEMA] and r["uid"].startswith("gsm8k-train-")
        n_calls = sum(1 for m in r["messages"] if m.get("tool_calls"))
        assert 1 <= n_calls <= 3 and r["messages"][-1]["content"].endswith("}.")
    rc = main(["sft", "--data", str(out), "recipe=cpu_math", f"model.path={tiny_model_dir}",
               f"trainer.output_dir={tmp_path}", "trainer.run_name=sft", "trainer.progress=false",
               "trainer.logger=[jsonl]", "sft.max_steps=2", "sft.batch_size=4", "model.gradient_checkpointing=false"])
    assert rc == 0
    lines = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1, 2] and all(x["sft/loss"] > 0 for x in lines)
    assert (tmp_path / "sft" / "model" / "model.safetensors").exists()


def test_cli_expert_math_rejects_other_sets(tmp_path, capsys):
    assert main(["data", "expert", "math", "--split", "math500", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "GSM8K" in capsys.readouterr().err
    assert main(["data", "expert", "math", "--min-score", "0.5", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--min-score" in capsys.readouterr().err
