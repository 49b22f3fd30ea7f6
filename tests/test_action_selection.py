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
