"""Action selection by likelihood (rollout.action_selection=score): the token tree's log-probs
against one forward per candidate, where a reply's reasoning ends, the choice, the free-text rule,
the collector on a real ALFWorld game, and the config checks."""

from __future__ import annotations

import pytest
import torch

from serl.configure import load_config
from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir
from serl.envs.pool import EnvPool
from serl.errors import ConfigError
from serl.rollout.action_selection import ActionSelector, candidate_ids, choose, split_reply
from serl.rollout.candidate_scoring import continuation_log_probs, token_trie
from serl.rollout.collector import Collector
from serl.rollout.engine import HFEngine, SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from serl.models.loading import load_causal_lm

    return load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")


def _one_by_one(model, context, continuation):
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([context + continuation])).logits[0].float(), -1)
    return [logp[len(context) - 1 + i, t].item() for i, t in enumerate(continuation)]


def test_token_trie_by_hand():
    tokens, parents, depths, paths = token_trie([[7, 8, 9], [7, 8, 10], [7, 12], [13]])
    assert tokens == [7, 8, 9, 10, 12, 13]
    assert parents == [-1, 0, 1, 1, 0, -1] and depths == [0, 1, 2, 2, 1, 0]
    assert paths == [[0, 1, 2], [0, 1, 3], [0, 4], [5]]
    with pytest.raises(ValueError, match="empty"):
        token_trie([[1], []])


def test_the_tree_gives_each_candidates_own_log_probs(tiny):
    context = list(range(5, 60))
    conts = [[7, 8, 9], [7, 8, 10, 11], [7, 12], [13], [7, 8, 9, 14], [13]]
    got = continuation_log_probs(tiny, context, conts)
    for c, g in zip(conts, got):
        assert len(g) == len(c)
        assert g == pytest.approx(_one_by_one(tiny, context, c), abs=1e-5)
    assert got[0] != got[2]  # distinct tokens, distinct numbers (the check can fail)


def test_the_tree_reads_the_context_from_the_engines_turn_cache(tiny, tokenizer):
    engine = HFEngine(tiny, tokenizer, micro_batch_size=4)
    context = list(range(5, 60))
    reply = engine.generate([context], SamplingParams(max_new_tokens=8, do_sample=False))[0]
    ctx = context + reply[:4]
    conts = [[7, 8], [7, 9, 3], [11]]
    assert engine.turn_cache.match(ctx)[0] == len(ctx)
    cached = engine.score_continuations([ctx], [conts])[0]
    for c, g in zip(conts, cached):
        assert g == pytest.approx(_one_by_one(tiny, ctx, c), abs=1e-4)
    with pytest.raises(ValueError, match="context"):
        continuation_log_probs(tiny, [], conts)


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]


@pytest.mark.parametrize("reply, reasoning, bridge_end", [
    ("<think>The mug is here.</think><action>take mug 1</action>", "<think>The mug is here.</think>", ""),
    ("<think>Go.</think>\n<action>go to desk 1</action> trailing", "<think>Go.</think>\n", ""),
    ("<think>No tag follows.</think> go to desk 1", "<think>No tag follows.</think>", ""),
    ("<think>cut inside the reasoning", "<think>cut inside the reasoning", "</think>"),
    ("take mug 1", "take mug 1", ""),
])
def test_split_reply_keeps_the_reasoning_as_sampled(tokenizer, reply, reasoning, bridge_end):
    ids = _ids(tokenizer, reply)
    split = split_reply(ids, tokenizer, [tokenizer.eos_token_id])
    assert ids[: len(split.prefix_ids)] == split.prefix_ids  # the sampled tokens, unchanged
    assert tokenizer.decode(split.prefix_ids) + split.bridge == reasoning + bridge_end
    assert split.bridge.endswith(bridge_end)
    full = split.prefix_ids + candidate_ids(tokenizer, split, "look", tokenizer.eos_token_id)
    assert tokenizer.decode(full) == f"{reasoning}{bridge_end}<action>look</action><|im_end|>"


def test_choose_greedy_and_sampled():
    lp = torch.tensor([-2.0, -0.5, -0.5, -4.0], dtype=torch.float64)
    assert choose(lp, greedy=True) == 1  # the first of equal maxima
    torch.manual_seed(0)
    draws = torch.tensor([choose(lp, greedy=False, temperature=2.0) for _ in range(4000)])
    want = torch.softmax(lp / 2.0, 0)
    got = torch.bincount(draws, minlength=4).double() / 4000
    assert torch.allclose(got, want, atol=0.03), (got, want)
    with pytest.raises(ValueError, match="temperature"):
        choose(lp, greedy=False, temperature=0.0)
    with pytest.raises(ValueError, match="no candidate"):
        choose(torch.tensor([]), greedy=True)


class TableEngine:
    """Scores a continuation by a table of its decoded text; records what it was asked."""

    def __init__(self, tokenizer, table):
        self.tok, self.table, self.asked = tokenizer, table, []

    def score_continuations(self, contexts, continuations):
        self.asked.append((contexts, continuations))
        return [[[self.table.get(self.tok.decode(c[:-1]).split("<action>")[-1].split("</action>")[0], -9.0)]
                 for c in conts] for conts in continuations]


def test_selector_takes_the_best_command_and_leaves_free_text_to_the_policy(tokenizer):
    engine = TableEngine(tokenizer, {"click[b01]": -0.1, "click[next >]": -3.0})
    sel = ActionSelector(engine, tokenizer, free_text_actions=("search[",))
    reply = _ids(tokenizer, "<think>t</think><action>click[b09]</action>")
    search = _ids(tokenizer, "<think>t</think><action>search[red shoes]</action>")
    out = sel.select([[1, 2], [1, 2], [1, 2], [1, 2]], [reply, search, search, reply],
                     ["click[b09]", "search[red shoes]", "search[red shoes]", "click[b09]"],
                     [["click[next >]", "click[b01]"], ["search[<your query>]"],
                      ["search[<your query>]", "click[b01]"], ["click[b09]", "click[b01]"]],
                     greedy=True, temperature=1.0)
    assert tokenizer.decode(out[0]) == "<think>t</think><action>click[b01]</action><|im_end|>"
    assert out[1] is None and out[2] is None  # the search page; a sampled search where search is admitted
    assert tokenizer.decode(out[3]).endswith("<action>click[b01]</action><|im_end|>")
    assert [c[:2] for c in engine.asked[0][0]] == [[1, 2], [1, 2]]
    m = sel.metrics()
    assert m == {"rollout/scored_action_fraction": 0.5, "rollout/score_kept_sampled_fraction": 0.0,
                 "rollout/score_candidates_mean": 2.0}
    assert sel.metrics() == {}


def test_selector_needs_an_engine_that_scores(tokenizer):
    with pytest.raises(ConfigError, match="rollout.engine=hf"):
        ActionSelector(object(), tokenizer)


class ReasoningEngine(HFEngine):
    """Writes a fixed reasoning and an inadmissible action; scores with the real (tiny) model."""

    def generate(self, prompts, params):
        text = "<think>I look around.</think><action>take the moon</action>"
        return [self.tokenizer(text, add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]
                for _ in prompts]


@pytest.mark.parametrize("layout", ["step", "conversation"])
def test_the_collector_plays_only_admissible_commands(tokenizer, tiny, layout):
    task = AlfWorldEnv.list_tasks("train", fixture_data_dir())[0]
    pool = EnvPool("alfworld", 2, 0, {"max_steps": 50, "data_dir": str(fixture_data_dir())})
    try:
        col = Collector(pool, ReasoningEngine(tiny, tokenizer), tokenizer, "alfworld", 2, 3, 4096, layout, "state",
                        action_selection="score")
        torch.manual_seed(0)
        traj = col.collect([task], 2, SamplingParams(max_new_tokens=32, temperature=1.0))[0].trajectories
    finally:
        pool.close()
    steps = [s for t in traj for s in t.steps]
    assert len(steps) == 6
    for s in steps:
        assert s.action in s.admissible_actions and s.action_valid
        assert s.response_text.startswith("<think>I look around.</think><action>")
        assert s.response_ids[-1] == tokenizer.eos_token_id
        acted = tokenizer.decode([t for t, m in zip(s.response_ids, s.action_mask) if m])
        assert acted.strip() == s.action  # the action tokens are the chosen command's
        assert s.info["sampled_action"] == "take the moon"  # what the policy wrote, kept beside it
    assert col.last_metrics["rollout/scored_action_fraction"] == 1.0
    assert col.last_metrics["rollout/score_kept_sampled_fraction"] == 0.0
    if layout == "conversation":
        for prev, nxt in zip(traj[0].steps, traj[0].steps[1:]):
            assert nxt.prompt_ids[: len(prev.prompt_ids) + len(prev.response_ids)] == prev.prompt_ids + prev.response_ids


def test_config_checks():
    assert load_config(None, ["rollout.action_selection=score"]).rollout.action_selection == "score"
    with pytest.raises(ConfigError, match="rollout.action_selection: unknown"):
        load_config(None, ["rollout.action_selection=best"])
    with pytest.raises(ConfigError, match="rollout.action_selection: score chooses"):
        load_config("math_grpo", ["rollout.action_selection=score"])
    with pytest.raises(ConfigError, match="rollout.action_selection: score needs rollout.engine=hf"):
        from serl.rollout.action_selection import check_config

        check_config("score", "vllm")


def test_auto_engine_resolves_to_one_that_scores(monkeypatch):
    import dataclasses

    from serl.rollout import engine as eng

    # vLLM as if installed and auto-eligible here: auto prefers it, unless the run scores actions
    monkeypatch.setitem(eng.ENGINE_REGISTRY, "vllm", dataclasses.replace(
        eng.ENGINE_REGISTRY["vllm"], available=lambda device: True, auto_when=lambda device: True))
    assert eng.resolve_engine_name("auto", "cpu") == "vllm"
    assert eng.resolve_engine_name("auto", "cpu", scores_continuations=True) == "hf"
    assert eng.resolve_engine_name("hf", "cpu", scores_continuations=True) == "hf"
    with pytest.raises(ConfigError, match="rollout.action_selection: score needs an engine that scores"):
        eng.resolve_engine_name("vllm", "cpu", scores_continuations=True)
    from serl.rollout.action_selection import check_config

    check_config("score", "auto")  # auto is fine: it resolves to hf
    check_config("generate", "vllm")


def test_written_and_chosen_actions_against_the_planner(tmp_path, capsys):
    from serl.cli import main as serl_main
    from serl.envs.base import Task
    from serl.rollout.dagger import DaggerSummary, selection_labels
    from serl.trajectory import Step, Trajectory, write_jsonl

    fetch = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 1"]
    adm = ["go to desk 1", "go to shelf 1", "take pen 1 from desk 1"]
    steps = [  # (chosen, written, plan from the next state)
        ("go to desk 1", "go to desk 1", fetch[1:]),  # both the planner's
        ("take pen 1 from desk 1", "take pen from desk", fetch[2:]),  # only the chosen (written inadmissible)
        ("go to desk 1", "go to shelf 1", fetch[2:]),  # only the written
        ("go to shelf 1", None, fetch[2:]),  # not scored (kept as written): not counted
    ]
    t = Trajectory(uid="g", traj_uid="t", task=Task("alfworld", "game-1", "pick_and_place_simple"), task_text="put a pen")
    t.extra["expert_plan0"] = fetch
    t.steps = [Step(step_id=i, observation="", prompt=f"p{i}", prompt_ids=[1], response_ids=[2], response_text="r",
                    action_mask=[1], action=a, action_valid=True, admissible_actions=adm,
                    info={"expert_plan": nxt, **({"sampled_action": w} if w else {})})
               for i, (a, w, nxt) in enumerate(steps)]
    assert selection_labels(t) == [(True, True, True), (False, True, False), (True, False, True)]
    s = DaggerSummary()
    s.add(t, [])
    assert (s.scored, s.written_planner, s.chosen_planner, s.only_chosen, s.only_written, s.written_admissible) == \
        (3, 2, 2, 1, 1, 2)
    src = tmp_path / "trajectories.jsonl"
    write_jsonl(src, [t])
    assert serl_main(["data", "dagger", str(src), "--out", str(tmp_path / "rows.jsonl")]) == 0
    assert ("at 3 scored states the planner's next action was the written one 2 times (66.7%), the chosen one 2 "
            "(66.7%): only chosen 1, only written 1; written admissible 2 (66.7%)") in capsys.readouterr().out
