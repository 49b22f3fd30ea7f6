"""ALFWorld's conversation layout (env.prompt_layout=conversation): later turns, the collector's
chained prompts, context overflow, packing an episode's step rows into one update row (and back),
the teacher's conversation prompt, and the config switch."""

from __future__ import annotations

import pytest
import torch

from serl.agent.chat import chat_prompt_ids, conversation_head, user_turn_ids
from serl.agent.prompts.alfworld import build_prompt, build_turn, turn_action_list
from serl.configure import load_config
from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir, walkthrough
from serl.envs.alfworld_experts.walkthrough import ALFWORLD_THINK, task_phrase
from serl.envs.pool import EnvPool
from serl.errors import ConfigError
from serl.models.loading import load_causal_lm
from serl.models.teacher import teacher_prompt_ids
from serl.rollout.collector import Collector
from serl.rollout.engine import SamplingParams
from serl.rollout.expert import format_response
from serl.train.batch import UpdateBatch, collate, response_logprobs
from serl.train.packing import Span, pack_conversations, unpack_to_steps

ADM = ["go to bed 1", "go to desk 1", "help", "inventory", "look", "examine bed 1", "take pillow 1 from bed 1"]


def test_turn_action_list_keeps_what_each_mode_says():
    assert turn_action_list(ADM, "all") == [a for a in ADM if a != "help"]
    assert turn_action_list(ADM, "state") == ["examine bed 1", "take pillow 1 from bed 1"]
    assert turn_action_list(ADM, "none") == []
    with pytest.raises(ValueError, match="turn_actions"):
        turn_action_list(ADM, "some")


def test_build_turn_text():
    assert build_turn("You arrive at bed 1.", ADM, 3, "state") == (
        "Step 4. Observation: You arrive at bed 1.\nAdmissible actions besides go to, look and inventory: "
        "['examine bed 1'\n 'take pillow 1 from bed 1']")
    assert build_turn("Nothing happens.", ADM, 1, "none") == "Step 2. Observation: Nothing happens."


def test_conversation_head_strips_the_last_user_turn_and_rejects_other_prompts(tokenizer):
    ids = chat_prompt_ids(tokenizer, "hello there")
    head = conversation_head(tokenizer, ids, "hello there")
    assert head + user_turn_ids(tokenizer, "hello there") == ids
    assert tokenizer.decode(head).startswith("<|im_start|>system\n") and "hello" not in tokenizer.decode(head)
    with pytest.raises(ValueError, match="own user turn"):
        conversation_head(tokenizer, ids, "another text")


class ScriptedEngine:
    """Replies with given texts (plus <|im_end|>), one per prompt; records the prompts."""

    def __init__(self, tokenizer, replies):
        self.tok, self.replies, self.prompts = tokenizer, list(replies), []

    def generate(self, prompts, params):
        self.prompts.extend(list(p) for p in prompts)
        return [self.tok(self.replies.pop(0), add_special_tokens=False).input_ids + [self.tok.eos_token_id]
                for _ in prompts]


def _play(tokenizer, task, replies, max_prompt_length=4096, layout="conversation"):
    pool = EnvPool("alfworld", 1, 0, {"max_steps": 50, "data_dir": str(fixture_data_dir())})
    try:
        engine = ScriptedEngine(tokenizer, replies)
        col = Collector(pool, engine, tokenizer, "alfworld", 2, 50, max_prompt_length, layout, "state")
        groups = col.collect([task], 1, SamplingParams(max_new_tokens=64))
    finally:
        pool.close()
    return groups[0].trajectories[0], col.last_metrics


@pytest.fixture(scope="module")
def look_task():
    return next(t for t in AlfWorldEnv.list_tasks("train", fixture_data_dir()) if t.task_type == "look_at_obj_in_light")


def _replies(task, task_text="x"):
    return [format_response(ALFWORLD_THINK[0].format(task=task_phrase(task_text), action=a), a) for a in walkthrough(task)]


def test_conversation_prompts_chain_and_the_expert_wins(tokenizer, look_task):
    plan = walkthrough(look_task)
    traj, metrics = _play(tokenizer, look_task, _replies(look_task))
    assert traj.won and [s.action for s in traj.steps] == plan
    first = traj.steps[0]
    # step 0 is the step layout's first prompt, exactly
    assert first.prompt_ids == chat_prompt_ids(tokenizer, build_prompt(traj.task_text, first.observation,
                                                                       first.admissible_actions, [], 0, 2))
    for prev, nxt in zip(traj.steps, traj.steps[1:]):
        n = len(prev.prompt_ids) + len(prev.response_ids)
        assert nxt.prompt_ids[:n] == prev.prompt_ids + prev.response_ids
        assert nxt.prompt == build_turn(prev.feedback, nxt.admissible_actions, nxt.step_id, "state")
        # the user turn sits between the reply and the next header: "\n" then the turn
        assert tokenizer.decode(nxt.prompt_ids[n:]) == f"\n<|im_start|>user\n{nxt.prompt}<|im_end|>\n<|im_start|>assistant\n"
        assert prev.next_prompt == nxt.prompt
    assert all(s.prompt_format == "conversation" for s in traj.steps)
    assert metrics["rollout/context_overflow_fraction"] == 0.0


def test_an_episode_ends_where_its_next_prompt_would_not_fit(tokenizer, look_task):
    replies = _replies(look_task)
    full, _ = _play(tokenizer, look_task, replies)
    cap = len(full.steps[1].prompt_ids)  # room for steps 0 and 1, not step 2
    traj, metrics = _play(tokenizer, look_task, replies, max_prompt_length=cap)
    assert len(traj.steps) == 2 and traj.steps[-1].done and not traj.won
    assert metrics["rollout/context_overflow_fraction"] == 1.0


def _hand_batch(teacher=True):
    # trajectory a: two chained steps; trajectory b: one step
    p0, r0 = [1, 2, 3], [4, 5]
    p1, r1 = p0 + r0 + [6, 7], [8, 9, 10]
    pb, rb = [1, 2], [11]
    b = UpdateBatch(prompt_ids=[p0, p1, pb], response_ids=[r0, r1, rb],
                    response_masks=[torch.ones(2), torch.tensor([1.0, 1.0, 0.0]), torch.ones(1)],
                    advantages=[torch.full((2,), 0.5), torch.full((3,), -1.0), torch.full((1,), 2.0)],
                    old_log_probs=[None] * 3, action_masks=[[0, 1], [1, 1, 0], [1]],
                    teacher_log_probs=[torch.tensor([-0.1, -0.2]), None, torch.tensor([-0.3])] if teacher else None,
                    has_context=[True, False, True] if teacher else None, serl_lambda=0.25)
    return b


def test_pack_conversations_on_a_hand_built_batch():
    b = _hand_batch()
    packed, spans = pack_conversations(b, ["a", "a", "b"])
    assert len(packed) == 2 and spans == [[Span(0, 0, 2), Span(1, 4, 3)], [Span(2, 0, 1)]]
    assert packed.prompt_ids == [[1, 2, 3], [1, 2]]
    assert packed.response_ids == [[4, 5, 6, 7, 8, 9, 10], [11]]
    assert packed.response_masks[0].tolist() == [1, 1, 0, 0, 1, 1, 0]
    assert packed.advantages[0].tolist() == [0.5, 0.5, 0, 0, -1, -1, -1]
    # step 1 has no teacher log-probs: its action tokens are not SERL's (weight 1, as a step row)
    assert packed.action_masks == [[0, 1, 0, 0, 0, 0, 0], [1]]
    assert packed.teacher_log_probs[0].tolist() == pytest.approx([-0.1, -0.2, 0, 0, 0, 0, 0])
    assert packed.has_context == [True, True] and packed.serl_lambda == 0.25
    assert packed.old_log_probs == [None, None] and packed.ref_log_probs is None
    # the update's behaviour log-probs go back onto the step rows
    packed.old_log_probs = [torch.arange(7.0), torch.tensor([9.0])]
    unpack_to_steps(packed, b, spans, "old_log_probs")
    assert [v.tolist() for v in b.old_log_probs] == [[0, 1], [4, 5, 6], [9]]


def test_rows_that_do_not_chain_stay_apart():
    b = _hand_batch(teacher=False)
    b.prompt_ids[1] = [1, 2, 3, 4, 99, 6, 7]  # not prompt 0 + reply 0
    packed, spans = pack_conversations(b, ["a", "a", "b"])
    assert len(packed) == 3 and packed.response_ids == b.response_ids and packed.action_masks == b.action_masks
    with pytest.raises(ValueError, match="trajectory ids"):
        pack_conversations(b, ["a"])
    b.old_log_probs = [torch.zeros(2), None, None]
    b.prompt_ids[1] = [1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="old_log_probs"):
        pack_conversations(b, ["a", "a", "b"])


def test_a_packed_episode_gives_each_reply_its_step_rows_log_probs(tiny_model_dir, tokenizer, look_task):
    """The packed row sees each reply in the context it was sampled in: the same log-probs as the
    step rows (float32, up to reduction order)."""
    traj, _ = _play(tokenizer, look_task, _replies(look_task))
    steps = traj.steps
    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu", False)
    b = UpdateBatch(prompt_ids=[s.prompt_ids for s in steps], response_ids=[s.response_ids for s in steps],
                    response_masks=[torch.ones(len(s.response_ids)) for s in steps],
                    advantages=[torch.ones(len(s.response_ids)) for s in steps], old_log_probs=[None] * len(steps))
    packed, spans = pack_conversations(b, [traj.traj_uid] * len(steps))
    assert len(packed) == 1
    with torch.no_grad():
        step_lp, _ = response_logprobs(model, collate(b.prompt_ids, b.response_ids, tokenizer.pad_token_id))
        packed_lp, _ = response_logprobs(model, collate(packed.prompt_ids, packed.response_ids, tokenizer.pad_token_id))
    for s in spans[0]:
        assert torch.allclose(packed_lp[0, s.offset: s.offset + s.length], step_lp[s.row, : s.length], atol=1e-4)
    tokens = sum(len(p) + len(r) for p, r in zip(b.prompt_ids, b.response_ids))
    assert len(packed.prompt_ids[0]) + len(packed.response_ids[0]) < tokens


def test_teacher_prompt_of_a_conversation_row_keeps_the_chat_and_adds_the_block_to_its_turn(tokenizer, look_task):
    traj, _ = _play(tokenizer, look_task, _replies(look_task))
    s = traj.steps[1]
    ids, ok = teacher_prompt_ids(tokenizer, s.prompt, "Feedback:\nYou arrive.", 8192, "privileged", "conversation",
                                 s.prompt_ids)
    head = conversation_head(tokenizer, s.prompt_ids, s.prompt)
    assert ok and ids[: len(head)] == head
    text = tokenizer.decode(ids[len(head):])
    assert text.startswith(f"<|im_start|>user\n{s.prompt}\n\nFeedback:\nYou arrive.") and text.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="student_prompt_ids"):
        teacher_prompt_ids(tokenizer, s.prompt, "x", 8192, prompt_format="conversation")


def test_config_switch():
    cfg = load_config("cpu", ["env.prompt_layout=conversation", "env.turn_actions=none"])
    assert cfg.env.prompt_layout == "conversation" and cfg.env.turn_actions == "none"
    with pytest.raises(ConfigError, match="env.prompt_layout"):
        load_config("cpu", ["env.prompt_layout=chat"])
    with pytest.raises(ConfigError, match="env.turn_actions"):
        load_config("cpu", ["env.turn_actions=some"])
    assert load_config("webshop", ["env.prompt_layout=conversation"]).env.prompt_layout == "conversation"
    full = load_config("cpu_conversation")  # all six types, 50 steps, the chat within SmolLM2's context
    assert (full.env.prompt_layout, full.env.task_types, full.env.max_steps) == ("conversation", [], 50)
    assert full.data.max_prompt_length + full.data.max_response_length == 8192


def test_expert_conversation_row_renders_to_the_collectors_ids(tokenizer, look_task):
    """`serl data expert alfworld env.prompt_layout=conversation` writes one row per episode whose
    SFT rendering is, token for token, the RL collector's chat of the same replies."""
    from serl.agent.tool_chat import render_sft_conversation
    from serl.rollout.expert import make_expert, play_expert

    env = AlfWorldEnv(max_steps=50, data_dir=fixture_data_dir())
    try:
        ep = play_expert(env, look_task, make_expert(look_task, seed=0), tokenizer, 2, 4096, 50, "conversation", "state")
    finally:
        env.close()
    assert ep.won and ep.steps == len(walkthrough(look_task)) and len(ep.rows) == 1
    row = ep.rows[0]
    assert row["actions"] == walkthrough(look_task) and row["steps"] == ep.steps and "response" not in row
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"] * ep.steps
    replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    traj, _ = _play(tokenizer, look_task, replies)
    last = traj.steps[-1]
    ids, mask = render_sft_conversation(tokenizer, row["messages"], [])
    assert ids == last.prompt_ids + last.response_ids
    # the loss mask is 1 exactly on the replies the collector sampled
    sampled = [0] * len(ids)
    for s in traj.steps:
        sampled[len(s.prompt_ids): len(s.prompt_ids) + len(s.response_ids)] = [1] * len(s.response_ids)
    assert mask == sampled


@pytest.mark.slow
def test_one_training_iteration_in_the_conversation_layout(tiny_model_dir, tmp_path, monkeypatch):
    """GiGPO + SERL (serl_gigpo) on real ALFWorld fixture games: the update trains one row per
    episode, GiGPO still finds its step groups, SERL's teacher scores the steps, and the behaviour
    log-probs come back to every step row (what SPEAR's replay buffer is handed)."""
    import serl.train.trainer as trainer_mod
    from serl.train.trainer import Trainer

    handed = []
    real_store = trainer_mod.store_replay_rows

    def spy(buffer, table, adv, old_log_probs, *a, **k):
        handed.append((list(table.rows), list(old_log_probs)))
        return real_store(buffer, table, adv, old_log_probs, *a, **k)

    monkeypatch.setattr(trainer_mod, "store_replay_rows", spy)

    cfg = load_config("serl_gigpo", [
        f"model.path={tiny_model_dir}", "model.lora.r=0", "env.max_steps=3", "env.rollout.n=2", "env.num_workers=2",
        "data.train_batch_size=2", "data.max_response_length=12", "actor.ppo_mini_batch_size=64",
        "actor.ppo_micro_batch_size=2", "trainer.total_training_steps=1", f"trainer.output_dir={tmp_path}",
        "trainer.progress=false", "trainer.logger=[jsonl]", "env.prompt_layout=conversation",
        "algorithm.serl.skip_zero_advantage_rows=false"])
    tr = Trainer(cfg)
    try:
        m = tr.train_iteration()
        groups = tr.last_groups
    finally:
        tr.close()
    trajs = [t for g in groups for t in g.trajectories]
    steps = [s for t in trajs for s in t.steps]
    assert all(s.prompt_format == "conversation" for s in steps) and len(steps) > len(trajs)
    assert m["throughput/update_rows"] == len(trajs)
    assert m["throughput/update_tokens"] < sum(len(s.prompt_ids) + len(s.response_ids) for s in steps)
    assert "gigpo/step_groups" in m and m["serl/teacher_scored_fraction"] > 0
    assert torch.isfinite(torch.tensor(m["actor/pg_loss"]))
    (rows, old), = handed
    assert len(rows) == len(steps) and all(lp is not None and lp.numel() == len(s.response_ids)
                                           for s, lp in zip(rows, old))


def test_webshop_build_turn_text():
    from serl.agent.prompts.webshop import build_turn as webshop_turn

    acts = ["click[back to search]", "click[b09abc]"]
    assert webshop_turn("'Back to Search' [SEP] 'B09ABC'", acts, 1, "all") == (
        "Step 2. Observation: 'Back to Search' [SEP] 'B09ABC'\nAdmissible actions:\n[\n'click[back to search]',\n"
        "'click[b09abc]',\n]")
    assert webshop_turn("x", acts, 1, "state") == webshop_turn("x", acts, 1, "all")  # nothing every page admits
    assert webshop_turn("x", acts, 4, "none") == "Step 5. Observation: x"
    with pytest.raises(ValueError, match="turn_actions"):
        webshop_turn("x", acts, 1, "some")


def test_webshop_expert_conversation_row_is_the_collectors_chat(tokenizer):
    """WebShop in the conversation layout: the oracle's episode as one row (`serl data expert
    webshop env.prompt_layout=conversation`) renders, token for token, to the RL collector's chat
    of the same replies, which buys the same item (score 1)."""
    from serl.agent.tool_chat import render_sft_conversation
    from serl.envs.webshop.env import WebShopEnv
    from serl.rollout.expert import make_expert, play_expert

    task = WebShopEnv.list_tasks("test")[0]
    env = WebShopEnv()
    try:
        ep = play_expert(env, task, make_expert(task, seed=0), tokenizer, 2, 8000, 15, "conversation", "all")
    finally:
        env.close()
    assert ep.won and len(ep.rows) == 1 and ep.steps >= 3
    row = ep.rows[0]
    replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    pool = EnvPool("webshop", 1, 0, {})
    try:
        col = Collector(pool, ScriptedEngine(tokenizer, replies), tokenizer, "webshop", 2, 15, 8000, "conversation", "all")
        traj = col.collect([task], 1, SamplingParams(max_new_tokens=96))[0].trajectories[0]
    finally:
        pool.close()
    assert traj.won and [s.action for s in traj.steps] == row["actions"]
    last = traj.steps[-1]
    ids, _ = render_sft_conversation(tokenizer, row["messages"], [])
    assert ids == last.prompt_ids + last.response_ids
    assert all(s.prompt_format == "conversation" for s in traj.steps)
    assert traj.steps[1].prompt.startswith("Step 2. Observation: ") and "Admissible actions:" in traj.steps[1].prompt
