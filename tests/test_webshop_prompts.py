"""WebShop step prompt (verl-agent's prompts/webshop.py): both variants, the action list, the 13,000-char fallback."""

from __future__ import annotations

from serl.agent.prompts import get_prompt_builder
from serl.agent.prompts.webshop import MAX_PROMPT_CHARS, build_prompt, format_admissible
from serl.envs.base import Task
from serl.envs.webshop import WebShopEnv


def test_registered():
    assert get_prompt_builder("webshop") is build_prompt


def test_admissible_actions_one_per_line_quoted_with_comma():
    assert format_admissible(["search[<your query>]", "click[next >]"]) == "'search[<your query>]',\n'click[next >]',"


def test_first_step_prompt_from_the_env():
    env = WebShopEnv()
    r = env.reset(Task("webshop", "0", "webshop", 0))
    p = build_prompt(r.task, r.observation, r.admissible_actions, [], 0, 2)
    assert "WebShop" in p.splitlines()[0]
    assert f"Your task is to: {r.task}." in p
    assert "Your current observation is: 'Search'." in p
    assert "[\n'search[<your query>]',\n]" in p
    assert "<think>" in p and "</think>" in p and "<action>" in p and "</action>" in p
    assert "Prior to this step" not in p


def test_history_variant_shows_the_last_pairs():
    history = [("'Search'", "search[a]"), ("'Back to Search' [SEP] 'x'", "click[next >]"), ("'obs 3'", "click[b0]")]
    p = build_prompt("buy a lamp", "'now'", ["click[buy now]"], history, 3, 2)
    assert "you have already taken 3 step(s)" in p
    assert "most recent 2 observations" in p
    assert "[Observation 2: ''Back to Search' [SEP] 'x'', Action 2: 'click[next >]']" in p
    assert "[Observation 3: ''obs 3'', Action 3: 'click[b0]']" in p
    assert "Observation 1" not in p
    assert "You are now at step 4 and your current observation is: 'now'." in p
    assert p.index("Your task is to: buy a lamp.") < p.index("Prior to this step") < p.index("You are now at step 4")
    # history_length 0 -> the no-history variant at every step
    assert "Prior to this step" not in build_prompt("t", "o", [], history, 3, 0)


def test_long_history_falls_back_to_the_no_history_variant():
    long_obs = "'" + "x" * 7000 + "'"
    history = [(long_obs, "click[a]"), (long_obs, "click[b]")]
    p = build_prompt("t", "'cur'", ["click[a]"], history, 2, 2)
    assert "Prior to this step" not in p and len(p) < MAX_PROMPT_CHARS
    assert p == build_prompt("t", "'cur'", ["click[a]"], [], 0, 2)
    short = build_prompt("t", "'cur'", ["click[a]"], [("'o'", "click[a]")], 1, 2)
    assert "Prior to this step" in short
