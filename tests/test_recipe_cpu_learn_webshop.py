"""The ``cpu_learn_webshop`` recipe fits the WebShop oracle's episodes on its evaluation panel:
every episode ends within ``env.max_steps``, no expert prompt is shrunk at
``data.max_prompt_length`` with ``env.history_length`` pairs, and every expert reply fits
``data.max_response_length`` (SmolLM2's tokenizer and chat template, as in RL)."""

from __future__ import annotations

from serl.agent.chat import chat_prompt_ids
from serl.configure import load_config
from serl.envs.base import get_env_class, list_tasks
from serl.rollout.expert import make_expert, play_expert


def test_cpu_learn_webshop_recipe_values():
    cfg = load_config("cpu_learn_webshop")
    assert cfg.env.name == "webshop" and cfg.env.eval_split == "test"
    assert (cfg.env.max_steps, cfg.env.history_length, cfg.env.eval_num_tasks) == (8, 2, 12)
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (3072, 96)
    assert cfg.model.path == "smollm2-135m-instruct" and cfg.algorithm.serl.enable
    assert cfg.algorithm.serl.sampling_mode == "immediate_feedback"


def test_cpu_learn_webshop_budgets_fit_the_oracle_on_the_panel(tokenizer):
    cfg = load_config("cpu_learn_webshop")
    cls = get_env_class("webshop")
    env = cls(**cls.config_kwargs(cfg.env))
    panel = list_tasks(cfg.env, cfg.env.eval_split)[: cfg.env.eval_num_tasks]
    assert [t.task_id for t in panel] == [str(i) for i in range(12)]
    try:
        episodes = [play_expert(env, t, make_expert(t, 0), tokenizer, cfg.env.history_length,
                                cfg.data.max_prompt_length, cfg.env.max_steps) for t in panel]
    finally:
        env.close()
    for ep in episodes:
        assert not ep.gave_up and ep.rows[-1]["action"] == "click[buy now]", ep.task.task_id  # bought in time
        assert not any(r["prompt_truncated"] for r in ep.rows), ep.task.task_id
        for r in ep.rows:
            assert len(tokenizer(r["response"], add_special_tokens=False).input_ids) + 1 <= cfg.data.max_response_length
    assert all(ep.won for ep in episodes)  # the oracle wins (score 1.0) every panel goal: success 1.0 is reachable
    # with two history pairs some prompts exceed 2048 tokens (ALFWorld's cap): the reason for 3072
    longest = max(len(chat_prompt_ids(tokenizer, r["messages"][0]["content"])) for ep in episodes for r in ep.rows)
    assert 2048 < longest <= cfg.data.max_prompt_length
