"""The math env and its tool loop (serl.envs.math.env, serl.rollout.tool_loop): verl's tool agent
loop rules (a)-(f) on scripted replies, a real sandbox and real env workers; the row it records;
a training iteration on the tiny model; the config seams."""

from __future__ import annotations

import json

import pytest

from serl.agent.tool_calls import CODE_INTERPRETER_SCHEMA, format_tool_call
from serl.agent.tool_chat import render_sft_conversation, start_conversation
from serl.configure import load_config
from serl.envs.base import Task, get_env_class, row_layout
from serl.envs.math.env import MathEnv
from serl.envs.pool import EnvPool
from serl.errors import ConfigError, EnvError
from serl.rollout.engine import SamplingParams
from serl.rollout.tool_loop import MALFORMED_CALL_MESSAGE, ToolAgentLoop

PARAMS = SamplingParams(max_new_tokens=64, temperature=1.0, do_sample=True)
# GSM8K train row 0: 48 clips in April, half as many in May -> 72
TASK = Task(env_name="math", task_id="gsm8k-train-00000", task_type="gsm8k")


def call(code: str, name: str = "code_interpreter") -> str:
    return "Let me compute.\n" + format_tool_call(name, {"code": code})


class ScriptedMathEngine:
    """Replies ``script[k]`` at the k-th assistant turn (k = the tool responses already in the
    prompt; the last entry repeats), ``<|im_end|>`` appended unless the entry ends with ``...``."""

    def __init__(self, tokenizer, script):
        self.tok, self.script, self.calls = tokenizer, script, 0

    def generate(self, prompts, params):
        self.calls += 1
        out = []
        for p in prompts:
            k = self.tok.decode(p).count("<tool_response>")
            text = self.script[min(k, len(self.script) - 1)]
            ids = self.tok(text.removesuffix("..."), add_special_tokens=False).input_ids
            if not text.endswith("..."):
                ids = ids + [self.tok.convert_tokens_to_ids("<|im_end|>")]
            out.append(ids[: params.max_new_tokens])
        return out


@pytest.fixture(scope="module")
def pool():
    p = EnvPool("math", num_envs=2, num_workers=1, env_kwargs={"max_steps": 8, "sandbox": {
        "backend": "local", "timeout_s": 2.0, "cpu_s": 2, "prelude": "math"}})
    yield p
    p.close()


def run(pool, tokenizer, script, **kw):
    kw = {"max_turns": 4, "response_length": 256, **kw}
    loop = ToolAgentLoop(pool, ScriptedMathEngine(tokenizer, script), tokenizer, **kw)
    groups = loop.collect([TASK], 2, PARAMS)
    assert len(groups) == 1 and len(groups[0].trajectories) == 2
    traj = groups[0].trajectories[0]
    assert len(traj.steps) == 1  # one row per trajectory
    return loop, traj, traj.steps[0]


def test_answer_after_a_tool_call_is_one_row_with_tool_tokens_masked(pool, tokenizer):
    code = "print(48 + 48 // 2)"
    final = "April 48 and May 24, so \\boxed{72}"
    loop, traj, s = run(pool, tokenizer, [call(code), final])
    assert s.reward == 1.0 and s.won and traj.won
    assert s.info["tool_calls"] == 1 and traj.num_tool_calls == 1
    assert s.info["stop_reason"] == "answer" and s.info["tool_status"] == ["ok"]
    assert s.info["num_turns"] == 4  # SPEAR: user turns (1) + assistant turns (2) + 1
    # the row is exactly the SFT rendering of the same conversation (token in, token out)
    msgs = [{"role": "user", "content": s.prompt},
            {"role": "assistant", "content": "Let me compute.",
             "tool_calls": [{"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}]},
            {"role": "tool", "content": "72"}, {"role": "assistant", "content": final}]
    ids, mask = render_sft_conversation(tokenizer, msgs, [CODE_INTERPRETER_SCHEMA])
    assert s.prompt_ids + s.response_ids == ids
    assert [0] * len(s.prompt_ids) + s.loss_mask == mask
    assert s.action_mask == s.loss_mask and s.trained_mask() == s.loss_mask
    tool_text = tokenizer.decode([t for t, m in zip(s.response_ids, s.loss_mask) if m == 0])
    assert "<tool_response>\n72\n</tool_response>" in tool_text
    assert "72" not in tokenizer.decode([t for t, m in zip(s.response_ids, s.loss_mask) if m == 1]).split("\\boxed")[0]
    m = loop.last_metrics
    assert m["tool/executions"] == 2 and m["tool/status_ok"] == 2 and m["tool/trajectory_with_call_fraction"] == 1.0
    assert m["rollout/stop_answer_fraction"] == 1.0


def test_wrong_answer_and_no_box_score_minus_one(pool, tokenizer):
    _, _, s = run(pool, tokenizer, ["I think it is \\boxed{71}"])
    assert s.reward == -1.0 and not s.won and s.info["tool_calls"] == 0 and s.info["pred"] == "71"
    _, _, s = run(pool, tokenizer, ["seventy-two"])
    assert s.reward == -1.0 and s.info["pred"] is None
    assert s.loss_mask == [1] * len(s.response_ids)  # one turn, all sampled


def test_b_max_turns_stops_without_running_the_last_call(pool, tokenizer):
    loop, traj, s = run(pool, tokenizer, [call("print(1)")], max_turns=2)
    assert s.info["stop_reason"] == "max_turns"
    assert s.info["tool_calls"] == 1 and s.info["tool_status"] == ["ok"]  # the 2nd turn is not parsed
    assert s.info["assistant_turns"] == 2
    assert s.response_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")  # nothing after the last turn


def test_a_budget_cuts_the_turn_at_the_response_length(pool, tokenizer):
    loop, traj, s = run(pool, tokenizer, ["word " * 200 + "..."], response_length=50)
    assert s.info["stop_reason"] == "budget" and len(s.response_ids) == 50 and sum(s.loss_mask) == 50


# GSM8K train rows 0 and 2: their rendered prompts (system block, tools, user turn, header) are
# 262 and 284 tokens with the test tokenizer (checked in the test)
SHORT, LONG = TASK, Task(env_name="math", task_id="gsm8k-train-00002", task_type="gsm8k")


class WithLogProbs(ScriptedMathEngine):
    """The scripted engine, reporting -0.5 per sampled token (as vLLM reports log-probs)."""

    def generate_with_log_probs(self, prompts, params):
        outs = self.generate(prompts, params)
        return outs, [[-0.5] * len(o) for o in outs]


def test_overlong_prompt_gets_the_budget_less_its_overflow_and_the_others_are_unchanged(pool, tokenizer):
    """max_prompt_length 272: the 284-token prompt is 12 over, so its episode stops at 50 - 12 = 38
    response tokens (284 + 38 = 272 + 50, the vLLM engine's max_model_len); the 262-token one keeps
    its 50, its row identical to a run where no prompt is over."""
    def play(max_prompt_length, script, response_length=50):
        loop = ToolAgentLoop(pool, WithLogProbs(tokenizer, script), tokenizer, max_turns=4,
                             response_length=response_length,
                             max_prompt_length=max_prompt_length)
        rows = [g.trajectories[0].steps[0] for g in loop.collect([SHORT, LONG], 1, PARAMS)]
        return loop, rows

    loop, (short, long_) = play(272, ["word " * 200 + "..."])
    assert [len(short.prompt_ids), len(long_.prompt_ids)] == [262, 284]
    assert len(short.response_ids) == 50 and len(long_.response_ids) == 38
    assert len(long_.rollout_log_probs) == 38 and sum(long_.loss_mask) == 38
    assert [s.info["stop_reason"] for s in (short, long_)] == ["budget", "budget"]
    assert loop.last_metrics["rollout/prompt_over_limit_fraction"] == 0.5
    _, (short_ref, long_ref) = play(2048, ["word " * 200 + "..."])
    assert len(long_ref.response_ids) == 50
    for a, b in ((short, short_ref), (long_, long_ref)):
        assert a.prompt_ids == b.prompt_ids
    assert (short.response_ids, short.loss_mask, short.rollout_log_probs) == \
        (short_ref.response_ids, short_ref.loss_mask, short_ref.rollout_log_probs)
    assert long_.response_ids == long_ref.response_ids[:38]
    # rule (f) against the reduced budget, response_length 73: call turn 40 tokens (with <|im_end|>),
    # tool turn 24, answer turn 8. The short episode: 40 + 24 < 73, then 72 < 73 -> "answer"; the
    # long one's budget is 73 - 12 = 61 <= 40 + 24, so its tool turn is not appended
    script = [call("print(72)"), "\\boxed{72}"]
    _, (short, long_) = play(272, script, response_length=73)
    assert len(tokenizer(script[0], add_special_tokens=False).input_ids) + 1 == 40
    assert short.info["stop_reason"] == "answer" and short.reward == 1.0 and len(short.response_ids) == 72
    assert long_.info["stop_reason"] == "observation_overflow" and len(long_.response_ids) == 40
    assert long_.info["tool_status"] == ["ok"] and long_.loss_mask == [1] * 40


def test_prompt_with_no_room_for_a_response_is_an_error(pool, tokenizer):
    # 284 >= 234 + 50: no token fits; 235 + 50 leaves one
    loop = ToolAgentLoop(pool, ScriptedMathEngine(tokenizer, ["x"]), tokenizer, max_turns=2, response_length=50,
                         max_prompt_length=234)
    with pytest.raises(ValueError, match=r"gsm8k-train-00002.* has 284 tokens, .*no room.* = 234 \+ 50"):
        loop.collect([SHORT, LONG], 1, PARAMS)
    loop.max_prompt_length = 235
    rows = [g.trajectories[0].steps[0] for g in loop.collect([SHORT, LONG], 1, PARAMS)]
    assert len(rows[1].response_ids) == 1 and rows[1].info["stop_reason"] == "budget"


def test_max_turn_tokens_caps_each_turn(pool, tokenizer):
    eng_script = ["word " * 100 + "..."]
    loop = ToolAgentLoop(pool, ScriptedMathEngine(tokenizer, eng_script), tokenizer, max_turns=4,
                         response_length=256, max_turn_tokens=20)
    s = loop.collect([TASK], 2, PARAMS)[0].trajectories[0].steps[0]
    assert len(s.response_ids) == 20 and s.info["stop_reason"] == "answer"


def test_f_observation_that_does_not_fit_is_not_appended(pool, tokenizer):
    loop, traj, s = run(pool, tokenizer, [call("print('x' * 200)"), "\\boxed{72}"], response_length=60)
    assert s.info["stop_reason"] == "observation_overflow"
    assert s.info["tool_status"] == ["ok"] and all(m == 1 for m in s.loss_mask)
    assert s.info["num_turns"] == 2


def test_e_unknown_tool_or_bad_arguments_end_the_episode(pool, tokenizer):
    _, _, s = run(pool, tokenizer, [call("print(1)", name="web_search"), "\\boxed{72}"])
    assert s.info["stop_reason"] == "tool_error" and s.info["tool_calls"] == 1 and s.info["tool_status"] == []
    bad_args = '<tool_call>\n{"name": "code_interpreter", "arguments": "print(1)"}\n</tool_call>'
    _, _, s = run(pool, tokenizer, [bad_args, "\\boxed{72}"])
    assert s.info["stop_reason"] == "tool_error"


def test_malformed_call_ends_silently_or_gets_feedback(pool, tokenizer):
    broken = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"\n</tool_call>'
    _, _, s = run(pool, tokenizer, [broken, "\\boxed{72}"])
    assert s.info["stop_reason"] == "answer" and s.info["malformed_calls"] == 1 and not s.action_valid
    assert s.reward == -1.0 and s.info["tool_calls"] == 0
    _, _, s = run(pool, tokenizer, [broken, "\\boxed{72}"], malformed_call_feedback=True)
    assert s.reward == 1.0 and s.info["stop_reason"] == "answer" and s.info["tool_status"] == []
    assert MALFORMED_CALL_MESSAGE in tokenizer.decode(s.response_ids)


def test_hostile_code_is_a_tool_message_and_the_episode_goes_on(pool, tokenizer):
    loop, _, s = run(pool, tokenizer, [call("while True: pass"), "\\boxed{72}"])
    assert s.info["tool_status"] == ["timeout"] and s.reward == 1.0
    assert "Tool API failed! Please try again." in tokenizer.decode(s.response_ids)
    assert loop.last_metrics["tool/status_timeout"] == 2.0
    _, _, s = run(pool, tokenizer, [call("import os; print(open('/proc/self/environ').read())"), "\\boxed{72}"])
    assert "HOME" not in tokenizer.decode(s.response_ids) and s.info["tool_status"] == ["ok"]


def test_engine_log_probs_are_kept_on_sampled_tokens_and_zero_on_tool_tokens(pool, tokenizer):
    loop = ToolAgentLoop(pool, WithLogProbs(tokenizer, [call("print(72)"), "\\boxed{72}"]), tokenizer,
                         max_turns=4, response_length=256)
    s = loop.collect([TASK], 2, PARAMS)[0].trajectories[0].steps[0]
    assert len(s.rollout_log_probs) == len(s.response_ids)
    assert all((lp == -0.5) == bool(m) for lp, m in zip(s.rollout_log_probs, s.loss_mask))


def test_math_env_rejects_bad_actions_and_unknown_tasks():
    env = MathEnv(sandbox={"backend": "local", "timeout_s": 2.0})
    try:
        with pytest.raises(EnvError, match="step\\(\\) before reset"):
            env.step('{"code": "print(1)"}')
        env.reset(TASK)
        for bad in ("print(1)", '{"code": 1}', '{"shell": "ls"}', '{"code": "1", "answer": "2"}'):
            with pytest.raises(EnvError, match="an action must be"):
                env.step(bad)
        with pytest.raises(EnvError, match="no such problem"):
            env.reset(Task(env_name="math", task_id="gsm8k-train-99999", task_type="gsm8k"))
    finally:
        env.close()


def test_math_splits_and_config_checks():
    m500 = MathEnv.list_tasks("math500")
    assert len(m500) == 500 and m500[0] == Task("math", "math500-test/precalculus/807.json", "math500")
    assert len(MathEnv.list_tasks("dapo_math17k:fixture")) == 15
    assert len(MathEnv.list_tasks("gsm8k:test")) == 1319
    cfg = load_config("cpu_math")
    assert row_layout(cfg.env.name) == "trajectory" and row_layout("alfworld") == "step"
    assert get_env_class(cfg.env.name).rollout_loop == "serl.rollout.tool_loop:ToolAgentLoop"
    for bad, key in [(["algorithm.adv_estimator=gigpo"], "algorithm.adv_estimator: gigpo needs one row per env step"),
                     (["env.math.max_turn=3"], "env.math.max_turn: unknown option"),
                     (["algorithm.serl.enable=true", "algorithm.serl.sampling_mode=immediate_feedback"],
                      "algorithm.serl.sampling_mode: immediate_feedback needs one row per env step"),
                     (["env.math.max_turns=0"], "env.math.max_turns: must be >= 1"),
                     (["env.math.scorer=exact"], "env.math.scorer"),
                     (["env.sandbox.backend=docker"], "env.sandbox.backend"),
                     (["env.sandbox.backend=sandbox_fusion"], "env.sandbox.url"),
                     (["env.sandbox.timeout_s=0"], "env.sandbox.timeout_s"),
                     (["env.train_split=gsm8k:dev"], "env.train_split: unknown math split"),
                     (["env.eval_split=mmlu"], "env.eval_split: unknown math split"),
                     (["env.math.max_solution_steps=-1"], "env.math.max_solution_steps: must be >= 0"),
                     (["env.math.max_solution_steps=2", "env.train_split=dapo_math17k:fixture"],
                      "env.math.max_solution_steps: counts GSM8K's annotated solution steps")]:
        with pytest.raises(ConfigError, match=key):
            load_config("cpu_math", bad)


def test_max_solution_steps_filters_the_train_split_alone():
    """GSM8K train has 95 + 404 + 2,175 problems of 0, 1 and 2 calculator steps (counted by hand from
    the shipped file); the evaluation split stays whole."""
    from serl.envs.base import list_tasks
    from serl.envs.math.data import load_problems
    from serl.envs.math.env import solution_steps

    first = load_problems("gsm8k", "train")[0]  # Natalia: "48/2 = <<48/2=24>>24 ... 48+24 = <<48+24=72>>72"
    assert solution_steps(first) == 2 and solution_steps(load_problems("math500", "test")[0]) == 0
    cfg = load_config("cpu_math", ["env.math.max_solution_steps=2"])
    train = list_tasks(cfg.env, cfg.env.train_split)
    assert len(train) == 95 + 404 + 2175 and train[0].task_id == "gsm8k-train-00000"
    assert len(list_tasks(cfg.env, cfg.env.eval_split)) == 1319
    assert len(list_tasks(load_config("cpu_math").env, "gsm8k:train")) == 7473
    with pytest.raises(ConfigError, match="math500 has none"):
        MathEnv.list_tasks("math500", max_solution_steps=1)


def test_max_solution_steps_with_no_problem_short_enough_says_so(tmp_path):
    rows = [{"question": "q", "answer": "1+1=<<1+1=2>>2, 2*3=<<2*3=6>>6\n#### 6"}]
    (tmp_path / "math").mkdir()
    (tmp_path / "math" / "gsm8k_train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert len(MathEnv.list_tasks("gsm8k:train", str(tmp_path), max_solution_steps=2)) == 1
    with pytest.raises(EnvError, match="no problem of gsm8k:train has a worked solution of at most 1 calculator step "):
        MathEnv.list_tasks("gsm8k:train", str(tmp_path), max_solution_steps=1)


def test_a_math_training_iteration_on_the_tiny_model(tiny_model_dir, tmp_path, tokenizer):
    from serl.train.trainer import Trainer

    cfg = load_config("cpu_math", [f"model.path={tiny_model_dir}", "model.dtype=float32", "model.train_dtype=float32",
                                   "data.train_batch_size=2", "env.rollout.n=2", "env.num_workers=1",
                                   "rollout.rollout_filter_ratio=1.0", "trainer.total_training_steps=2",
                                   "algorithm.spear.trajectory_buffer_size=2", "trainer.progress=false",
                                   "trainer.logger=[jsonl]", "trainer.save_freq=0", f"trainer.output_dir={tmp_path}",
                                   "trainer.run_name=math", "data.max_response_length=128"])
    tr = Trainer(cfg)
    # half the episodes call the tool and answer right, half answer wrong without it: signal
    tr.engine = ScriptedMathEngine(tr.tokenizer, [call("print(48 + 24)"), "\\boxed{72}"])
    answers = iter(range(10**6))

    class Mixed(ScriptedMathEngine):
        def generate(self, prompts, params):
            return [super(Mixed, self).generate([p], params)[0] if next(answers) % 2 == 0
                    else self.tok("\\boxed{1}", add_special_tokens=False).input_ids
                    + [self.tok.convert_tokens_to_ids("<|im_end|>")] for p in prompts]

    tr.engine = Mixed(tr.tokenizer, [call("print(48 + 24)"), "\\boxed{72}"])
    try:
        tr.train()
    finally:
        tr.close()
    assert "isolat" in (tmp_path / "math" / "env_preflight.txt").read_text()  # the sandbox's start-up note
    lines = [json.loads(x) for x in (tmp_path / "math" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    m = lines[0]
    assert m["tool/executions"] >= 1 and 0 < m["tool/trajectory_with_call_fraction"] < 1
    assert m["critic/toolcall_bonus/mean"] > 0  # cosine bonus at step 1
    assert m["episode/num_trajectories"] == 4
    assert "rollout/engine_logprob_diff_mean" not in m  # the hf-like scripted engine reports none


def test_math_evaluation_with_several_samples_reports_verl_sample_metrics(tiny_model_dir, tokenizer):
    from serl.train.evaluate import evaluate_policy

    cfg = load_config("cpu_math", [f"model.path={tiny_model_dir}", "env.num_workers=1", "rollout.val_n=2",
                                   "rollout.micro_batch_size=4"])
    calls = iter(range(10**6))

    class EveryOtherRight(ScriptedMathEngine):  # samples alternate: tool call then right, wrong at once
        def generate(self, prompts, params):
            out = []
            for p in prompts:
                if self.tok.decode(p).count("<tool_response>") or next(calls) % 2 == 0:
                    out.append(super().generate([p], params)[0])
                else:
                    out.append(self.tok("\\boxed{0}", add_special_tokens=False).input_ids
                               + [self.tok.convert_tokens_to_ids("<|im_end|>")])
            return out

    engine = EveryOtherRight(tokenizer, [call("print(1)"), "\\boxed{72}"])
    res = evaluate_policy(cfg, engine, tokenizer, "gsm8k:train", num_tasks=3, progress=False)
    m, trajs = res["metrics"], res["trajectories"]
    assert len(trajs) == 6 and m["num_tasks"] == 3
    assert [t.task.task_id for t in trajs[:2]] == ["gsm8k-train-00000"] * 2
    assert m["success_rate"] == pytest.approx(sum(t.won for t in trajs) / 6)
    assert m["acc/mean@2"] == pytest.approx(m["success_rate"])
    assert m["acc/pass@2"] == pytest.approx(sum(any(t.won for t in trajs[i:i + 2]) for i in (0, 2, 4)) / 3)
    assert 0 < m["tool_call_rate"] < 1 and "acc/maj@2/mean" in m
    greedy = evaluate_policy(cfg, engine, tokenizer, "gsm8k:train", num_tasks=2, greedy=True, progress=False)
    assert len(greedy["trajectories"]) == 2 and "acc/mean@2" not in greedy["metrics"]


@pytest.mark.parametrize("recipe", ["cpu_math", "math_grpo", "math_drbot", "math_spear"])
def test_math_recipe_runs_one_iteration(recipe, tiny_model_dir, tmp_path):
    from serl.train.trainer import Trainer

    cfg = load_config(recipe, [f"model.path={tiny_model_dir}", "model.dtype=float32", "model.train_dtype=float32",
                               "data.train_batch_size=2", "env.rollout.n=2", "env.num_workers=1",
                               "data.max_response_length=128", "data.max_prompt_length=512",
                               "env.train_split=gsm8k:train", "trainer.val_before_train=false", "trainer.test_freq=0",
                               "actor.ppo_mini_batch_size=4", "trainer.progress=false", "trainer.logger=[jsonl]",
                               "trainer.save_freq=0", f"trainer.output_dir={tmp_path}", "trainer.total_training_steps=1"])
    tr = Trainer(cfg)
    answers = iter(range(10**6))
    right = ScriptedMathEngine(tr.tokenizer, [call("print(48 + 24)"), "\\boxed{72}"])

    class Mixed(ScriptedMathEngine):
        def generate(self, prompts, params):
            return [right.generate([p], params)[0] if (self.tok.decode(p).count("<tool_response>")
                                                       or next(answers) % 2 == 0)
                    else self.tok("\\boxed{1}", add_special_tokens=False).input_ids
                    + [self.tok.convert_tokens_to_ids("<|im_end|>")] for p in prompts]

    tr.engine = Mixed(tr.tokenizer, ["\\boxed{1}"])
    try:
        m = tr.train_iteration()
    finally:
        tr.close()
    assert tr.update_step == 1 and m["episode/num_trajectories"] == 4
    assert m["tool/executions"] >= 1
    a = cfg.algorithm
    assert ("critic/toolcall_bonus/mean" in m) == (a.use_toolcall_reward != "none")
    assert ("replay/rows_seen" in m) == a.spear.enable_trajectory_replay
    if a.spear.enable_trajectory_replay:  # admitted: positive advantage (the tool bonus) and a tool call
        admitted = [r for _, rows in tr.state.replay_buffer.entries for r in rows]
        assert admitted and all(r.extra["tool_calls"] >= 1 and r.row_advantage() > 0 for r in admitted)


def test_serl_on_math_rows_teacher_sees_the_reference_in_the_tool_chat_format(tiny_model_dir, tmp_path, tokenizer):
    from serl.models.teacher import teacher_prompt_ids
    from serl.train.trainer import Trainer

    # the teacher's prompt is the student's tool-chat prompt with the hindsight in its user turn
    student = start_conversation(tokenizer, [CODE_INTERPRETER_SCHEMA], "What is 6*7?").input_ids
    ids, ok = teacher_prompt_ids(tokenizer, "What is 6*7?", "REF", 4096, prompt_format="tool_chat")
    system_len = student.index(tokenizer.convert_tokens_to_ids("<|im_start|>"), 1)
    assert ok and ids[:system_len] == student[:system_len] and "REF" in tokenizer.decode(ids)
    assert ids[-3:] == student[-3:]  # ends with the assistant header, as the student's

    load_config("cpu_math", ["algorithm.serl.enable=true", "algorithm.serl.sampling_mode=successful_sample"])
    cfg = load_config("cpu_math", [
        f"model.path={tiny_model_dir}", "model.dtype=float32", "model.train_dtype=float32", "data.train_batch_size=2",
        "env.rollout.n=2", "env.num_workers=1", "data.max_response_length=128", "trainer.progress=false",
        "trainer.logger=[jsonl]", "trainer.save_freq=0", f"trainer.output_dir={tmp_path}", "trainer.run_name=serl",
        "trainer.total_training_steps=1", "rollout.rollout_filter_ratio=1.0", "algorithm.serl.enable=true",
        "algorithm.serl.sampling_mode=reference_solution"])
    tr = Trainer(cfg)
    answers = iter(range(10**6))

    class Mixed(ScriptedMathEngine):
        def generate(self, prompts, params):
            return [self.tok(("\\boxed{1}" if next(answers) % 2 else "\\boxed{2}"), add_special_tokens=False).input_ids
                    + [self.tok.convert_tokens_to_ids("<|im_end|>")] for p in prompts]

    tr.engine = Mixed(tr.tokenizer, ["x"])
    try:
        m = tr.train_iteration()
    finally:
        tr.close()
    assert m["serl/reference_solution_reference_fraction"] == 1.0 and m["serl/reprompt_sample_fraction"] == 1.0
    rows = tr.serl.row_contexts
    assert rows and all(c is not None and c.sources == {"reference"} for c in rows)
    assert all("The final answer is \\boxed{" in c.block() for c in rows)


def test_successful_sample_mode_on_math_rows_shows_a_winning_sibling(pool, tokenizer):
    from serl.config import SerlConfig
    from serl.hindsight.builder import build_privileged_contexts

    answers = iter(range(10**6))

    class OneRight(ScriptedMathEngine):
        def generate(self, prompts, params):
            return [self.tok("so \\boxed{72}" if next(answers) % 2 == 0 else "so \\boxed{5}",
                             add_special_tokens=False).input_ids + [self.tok.convert_tokens_to_ids("<|im_end|>")]
                    for p in prompts]

    loop = ToolAgentLoop(pool, OneRight(tokenizer, ["x"]), tokenizer, max_turns=4, response_length=64)
    groups = loop.collect([TASK], 2, PARAMS)
    won = [t.won for t in groups[0].trajectories]
    assert won == [True, False]
    ctxs = build_privileged_contexts(groups, SerlConfig(enable=True, sampling_mode="successful_sample"))
    assert ctxs[1] is not None and ctxs[1].sources == {"success"} and "\\boxed{72}" in ctxs[1].block()
    assert "\\boxed{5}" not in ctxs[1].block()


def test_two_calls_in_one_turn_run_only_the_first_and_fences_are_stripped(pool, tokenizer):
    two = ("Two calls.\n" + format_tool_call("code_interpreter", {"code": "```python\nprint(6*7)\n```"})
           + "\n" + format_tool_call("code_interpreter", {"code": "print(999)"}))
    _, _, s = run(pool, tokenizer, [two, "\\boxed{72}"])
    text = tokenizer.decode(s.response_ids)
    assert s.info["tool_status"] == ["ok"] and s.info["tool_calls"] == 1  # one message, its first call
    assert "<tool_response>\n42\n</tool_response>" in text and "<tool_response>\n999" not in text


def test_tool_output_is_cut_in_the_middle_at_tool_response_max_chars(tokenizer):
    p = EnvPool("math", num_envs=2, num_workers=1, env_kwargs={
        "tool_response_max_chars": 20, "sandbox": {"backend": "local", "timeout_s": 2.0}})
    try:
        _, _, s = run(p, tokenizer, [call("print('a' * 50 + 'b' * 50)"), "\\boxed{72}"])
    finally:
        p.close()
    assert "<tool_response>\n" + "a" * 10 + "...(truncated)..." + "b" * 10 + "\n</tool_response>" in \
        tokenizer.decode(s.response_ids)


def test_trace_row_of_a_math_row_marks_the_inserted_tokens(pool, tokenizer):
    from serl.train.teacher_log import token_char_spans, trace_row

    _, traj, s = run(pool, tokenizer, [call("print(72)"), "\\boxed{72}"])
    row = trace_row(traj, s, token_char_spans(tokenizer, s.response_ids), 0.5, True)
    assert row["loss_mask"] == s.loss_mask and 0 in row["loss_mask"]
    inserted = "".join(row["response"][a:b] for (a, b), m in zip(row["tokens"], row["loss_mask"]) if m == 0)
    assert "<tool_response>\n72\n</tool_response>" in inserted and "boxed" not in inserted


def test_math_std_filter_keeps_every_row_of_the_kept_groups(tiny_model_dir, tmp_path):
    from serl.train.trainer import Trainer

    # cpu_math: ratio 0.75 of 4 groups keeps 3, and (SPEAR's math tree) no power-of-two trim: 6 rows, not 4
    cfg = load_config("cpu_math", [f"model.path={tiny_model_dir}", "model.dtype=float32", "model.train_dtype=float32",
                                   "data.train_batch_size=4", "env.rollout.n=2", "env.num_workers=1",
                                   "data.max_response_length=64", "trainer.progress=false", "trainer.logger=[jsonl]",
                                   "trainer.save_freq=0", f"trainer.output_dir={tmp_path}", "trainer.total_training_steps=1"])
    tr = Trainer(cfg)
    tr.engine = ScriptedMathEngine(tr.tokenizer, ["\\boxed{1}"])
    try:
        m = tr.train_iteration()
    finally:
        tr.close()
    assert m["rollout/kept_groups"] == 3.0 and m["rollout/kept_rows"] == 6.0
