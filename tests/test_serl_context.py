"""SERL privileged contexts (serl.hindsight): every sampling_mode on hand-made groups.

The fixture (``make_groups``) has three groups:

g1 (task game1): A fails (3 steps), B succeeds (2 steps), C fails (3 steps, revisits the start
    room at step 1). A2 and C2 both observe "Nothing happens." (two different true states that
    exact anchor matching merges, as in the original).
g2 (task game2): D and E, both fail; D0 has no feedback.
g3 (task game3): F succeeds alone in one step, H fails.

Batch (iter_steps) order: A0 A1 A2 B0 B1 C0 C1 C2 | D0 D1 E0 | F0 H0 H1.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from serl.hindsight.anchors import anchor_clusters
from serl.hindsight.builder import SerlContextBuilder, build_privileged_contexts
from serl.hindsight.judge import resolve_api_key
from serl.hindsight.modes import MODE_NAMES, SAMPLING_MODES, ContextInputs, canonical_mode, check_config, resolve_mode
from serl.hindsight.rendering import (
    ANCHOR_FEEDBACK_HEADER,
    ANCHOR_HEADER,
    EMPTY_ACTION,
    FAILED_CONTINUATION,
    FEEDBACK_HEADER,
    FUTURE_HEADER,
    JUDGE_HEADER,
    NEXT_OBS_HEADER,
    NO_CONTINUATION,
    SOLVE_LINE,
    SUCCESS_CONTINUATION,
    SUCCESS_HEADER,
    action_key,
    canonical_format,
    strip_thinking,
    teacher_user_message,
)
from serl.hindsight.success import SuccessBuffer
from serl.config import ConfigError, SerlConfig
from serl.envs.base import Task
from serl.trajectory import Group, Step, Trajectory, iter_steps

ROOM = "You are in the middle of a room."
NOTHING = "Nothing happens."


def mk_step(tid: str, k: int, obs: str, resp: str, fb: str = "", reward: float = 0.0, won: bool = False) -> Step:
    return Step(
        step_id=k,
        observation=obs,
        prompt=f"[{tid}{k}] obs: {obs}",
        prompt_ids=[],
        response_ids=[],
        response_text=resp,
        action_mask=[],
        action="",
        action_valid=True,
        reward=reward,
        feedback=fb,
        next_prompt=f"P{k + 1}-{tid}",
        done=won,
        won=won,
    )


def traj(uid: str, tid: str, task: Task, steps: list[Step]) -> Trajectory:
    return Trajectory(uid=uid, traj_uid=tid, task=task, task_text="find the key", steps=steps)


def make_groups() -> list[Group]:
    t1 = Task("alfworld", "game1", "pick", 0)
    t2 = Task("alfworld", "game2", "pick", 0)
    t3 = Task("alfworld", "game3", "pick", 0)
    A = traj("g1", "A", t1, [
        mk_step("A", 0, ROOM, "<think>maybe the desk</think> <action>go to desk 1</action>", "You arrive at desk 1."),
        mk_step("A", 1, "You arrive at desk 1.", "<think>open it</think>\n<action>open drawer 1</action>", NOTHING),
        mk_step("A", 2, NOTHING, "<action>take key 1</action>", NOTHING),
    ])
    B = traj("g1", "B", t1, [
        mk_step("B", 0, ROOM, "<think>shelf</think><action>go to shelf 1</action>", "You arrive at shelf 1."),
        mk_step("B", 1, "You arrive at shelf 1.", "<action>take key 1 from shelf 1</action>", "You pick up the key 1.",
                reward=10.0, won=True),
    ])
    C = traj("g1", "C", t1, [
        mk_step("C", 0, ROOM, "<action>go to desk 1</action>", "You arrive at desk 1."),
        mk_step("C", 1, ROOM, "<action>look</action>", NOTHING),
        mk_step("C", 2, NOTHING, "<think>hmm</think><action>inventory</action>", "You are carrying nothing."),
    ])
    D = traj("g2", "D", t2, [
        mk_step("D", 0, "Room two.", "<action>go to bed 1</action>", ""),
        mk_step("D", 1, "On the bed you see a pillow.", "<action>take pillow 1</action>", "You pick up the pillow 1."),
    ])
    E = traj("g2", "E", t2, [mk_step("E", 0, "Room two.", "<action>go to bed 1</action>", "You arrive at bed 1.")])
    F = traj("g3", "F", t3, [mk_step("F", 0, "Room three.", "<action>take apple 1</action>", "You pick up the apple 1.",
                                     reward=10.0, won=True)])
    H = traj("g3", "H", t3, [
        mk_step("H", 0, "Room three.", "<action>go to table 1</action>", "You arrive at table 1."),
        mk_step("H", 1, "You arrive at table 1.", "<action>take apple 1</action>", NOTHING),
    ])
    return [Group("g1", t1, [A, B, C]), Group("g2", t2, [D, E]), Group("g3", t3, [F, H])]


ROW = {name: i for i, name in enumerate("A0 A1 A2 B0 B1 C0 C1 C2 D0 D1 E0 F0 H0 H1".split())}

# Renderings (response format, thinking removed), written out by hand.
S_B = "Step 0\nResponse:\n<action>go to shelf 1</action>\n\nStep 1\nResponse:\n<action>take key 1 from shelf 1</action>"
S_F = "Step 0\nResponse:\n<action>take apple 1</action>"
U_A0 = "Step 1\nResponse:\n<action>open drawer 1</action>\n\nStep 2\nResponse:\n<action>take key 1</action>"
U_A1 = "Step 2\nResponse:\n<action>take key 1</action>"
U_C0 = "Step 1\nResponse:\n<action>look</action>\n\nStep 2\nResponse:\n<action>inventory</action>"
U_C1 = "Step 2\nResponse:\n<action>inventory</action>"
U_B0 = "Step 1\nResponse:\n<action>take key 1 from shelf 1</action>"


def cfg(mode: str, **kw) -> SerlConfig:
    return SerlConfig(sampling_mode=mode, **kw)


def validate(c: SerlConfig) -> None:
    """The whole ``algorithm.serl`` check of a loaded config: the section's ranges, then the mode
    registry's names (:func:`serl.hindsight.modes.check_config`)."""
    c.validate()
    check_config(c)


def build(mode: str, groups=None, **kw):
    groups = groups if groups is not None else make_groups()
    b = SerlContextBuilder(cfg(mode, **kw))
    return b.build(groups), b


def sections(ctx):
    return None if ctx is None else ctx.sections


# ---------------------------------------------------------------------------------------------
# registry


def test_all_twenty_modes_registered_with_the_originals_names():
    expected = [
        "immediate_feedback",
        "next_observation",
        "future_trajectory",
        "successful_sample_or_immediate_feedback",
        "successful_sample_immediate_feedback",
        "successful_sample_next_observation",
        "successful_sample_future_trajectory",
        "successful_sample_future_trajectory_immediate_feedback",
        "successful_sample_future_trajectory_next_observation",
        "anchor_immediate_feedback",
        "anchor_next_observation",
        "anchor_future_trajectory",
        "anchor_successful_sample_or_immediate_feedback",
        "anchor_successful_sample_immediate_feedback",
        "anchor_successful_sample_next_observation",
        "anchor_successful_sample_future_trajectory",
        "anchor_successful_sample_future_trajectory_immediate_feedback",
        "anchor_successful_sample_future_trajectory_next_observation",
        "judge_current_traj",
        "judge_current_traj_on_successful_sample",
    ]
    assert list(MODE_NAMES) == expected
    # plus serl's two modes for one-row-per-trajectory envs (docs/environments/math.md)
    assert set(SAMPLING_MODES) == set(expected) | {"successful_sample", "reference_solution"}


@pytest.mark.parametrize("mode", [m for m in MODE_NAMES if not m.startswith("judge")])
def test_every_non_judge_mode_builds_one_entry_per_row(mode):
    groups = make_groups()
    ctxs, b = build(mode, groups)
    assert len(ctxs) == len(list(iter_steps(groups))) == 14
    assert 0.0 < b.metrics()["serl/reprompt_sample_fraction"] <= 1.0


def test_aliases_and_unknown_names():
    assert canonical_mode("env_feedback") == "immediate_feedback"
    assert canonical_mode("successful_trajectory_future_trajectory") == "successful_sample_future_trajectory"
    assert canonical_mode("anchor_successful_trajectory_or_env_feedback") == "anchor_successful_sample_or_immediate_feedback"
    assert canonical_mode("next_state") == "next_observation"
    ctxs, _ = build("env_feedback")
    assert sections(ctxs[ROW["A1"]]) == [(FEEDBACK_HEADER, NOTHING)]
    with pytest.raises(ConfigError) as e:
        validate(cfg("legacy_thing"))
    assert str(e.value).startswith("algorithm.serl.sampling_mode: ")
    assert "unknown sampling_mode 'legacy_thing'" in str(e.value) and "anchor_future_trajectory" in str(e.value)
    with pytest.raises(ValueError, match="judge_current_traj"):
        resolve_mode("judge_all")


def test_bad_context_keys_are_named():
    with pytest.raises(ConfigError, match="trajectory_format"):
        validate(cfg("immediate_feedback", trajectory_format="xml"))
    with pytest.raises(ConfigError, match="anchor_similarity_thresh"):
        validate(cfg("anchor_next_observation", anchor_enable_similarity=True, anchor_similarity_thresh=1.0))
    with pytest.raises(ConfigError, match="success_source"):
        validate(cfg("immediate_feedback", success_source="replay"))
    with pytest.raises(ConfigError, match="max_future_context_steps"):
        validate(cfg("future_trajectory", max_future_context_steps=-1))
    validate(cfg("anchor_next_observation", anchor_enable_similarity=True, anchor_similarity_thresh=0.5))


def test_teacher_message_wrapper():
    ctxs, _ = build("successful_sample_immediate_feedback")
    msg = teacher_user_message("PROMPT", ctxs[ROW["A1"]].block())
    assert msg == f"PROMPT\n\n{SUCCESS_HEADER}\n{S_B}\n\n{FEEDBACK_HEADER}\n{NOTHING}\n\n{SOLVE_LINE}"


# ---------------------------------------------------------------------------------------------
# step-level modes (conjunctive)


def test_immediate_feedback():
    ctxs, b = build("immediate_feedback")
    assert sections(ctxs[ROW["A1"]]) == [(FEEDBACK_HEADER, NOTHING)]
    assert sections(ctxs[ROW["B1"]]) == [(FEEDBACK_HEADER, "You pick up the key 1.")]
    assert ctxs[ROW["D0"]] is None  # no feedback -> no context
    assert ctxs[ROW["A1"]].sources == {"feedback"}
    m = b.metrics()
    assert m["serl/reprompt_sample_fraction"] == pytest.approx(13 / 14)
    assert m["serl/context_available_fraction"] == pytest.approx(13 / 14)
    assert m["serl/feedback_reference_fraction"] == pytest.approx(13 / 14)
    assert "serl/success_reference_fraction" not in m


def test_next_observation():
    ctxs, b = build("next_observation")
    assert sections(ctxs[ROW["A0"]]) == [(NEXT_OBS_HEADER, "P1-A")]
    assert sections(ctxs[ROW["H1"]]) == [(NEXT_OBS_HEADER, "P2-H")]  # terminal step keeps its next prompt
    m = b.metrics()
    assert m["serl/next_observation_reference_fraction"] == 1.0 == m["serl/next_state_reference_fraction"]


def test_future_trajectory_and_last_step_has_no_future():
    ctxs, b = build("future_trajectory")
    assert sections(ctxs[ROW["A0"]]) == [(FUTURE_HEADER, U_A0)]
    assert sections(ctxs[ROW["A1"]]) == [(FUTURE_HEADER, U_A1)]
    for last in ("A2", "B1", "C2", "D1", "E0", "F0", "H1"):
        assert ctxs[ROW[last]] is None, last
    # 7 of 14 rows have a future
    assert b.metrics()["serl/future_reference_fraction"] == pytest.approx(7 / 14)


def test_future_cap_adds_a_note():
    ctxs, _ = build("future_trajectory", max_future_context_steps=1)
    assert sections(ctxs[ROW["A0"]]) == [
        (FUTURE_HEADER, "Step 1\nResponse:\n<action>open drawer 1</action>\n\n(1 more step(s) not shown)")
    ]
    assert sections(ctxs[ROW["A1"]]) == [(FUTURE_HEADER, U_A1)]  # nothing dropped -> no note


def test_successful_sample_or_immediate_feedback():
    ctxs, b = build("successful_sample_or_immediate_feedback")
    # failures of g1 see B; B itself (no other success) falls back to its feedback
    assert sections(ctxs[ROW["A0"]]) == [(SUCCESS_HEADER, S_B)]
    assert sections(ctxs[ROW["C2"]]) == [(SUCCESS_HEADER, S_B)]
    assert sections(ctxs[ROW["B0"]]) == [(FEEDBACK_HEADER, "You arrive at shelf 1.")]
    # g2: no success anywhere -> feedback, or nothing when there is no feedback
    assert sections(ctxs[ROW["D1"]]) == [(FEEDBACK_HEADER, "You pick up the pillow 1.")]
    assert ctxs[ROW["D0"]] is None
    # g3: the lone success gets feedback; its failed peer sees it
    assert sections(ctxs[ROW["F0"]]) == [(FEEDBACK_HEADER, "You pick up the apple 1.")]
    assert sections(ctxs[ROW["H1"]]) == [(SUCCESS_HEADER, S_F)]
    m = b.metrics()
    assert m["serl/success_reference_fraction"] == pytest.approx(8 / 14)  # A*3, C*3, H*2
    assert m["serl/feedback_reference_fraction"] == pytest.approx(5 / 14)  # B*2, D1, E0, F0
    assert m["serl/reprompt_sample_fraction"] == pytest.approx(13 / 14)


def test_successful_sample_immediate_feedback_is_conjunctive():
    ctxs, b = build("successful_sample_immediate_feedback")
    assert sections(ctxs[ROW["A1"]]) == [(SUCCESS_HEADER, S_B), (FEEDBACK_HEADER, NOTHING)]
    assert ctxs[ROW["A1"]].sources == {"success", "feedback"}
    assert ctxs[ROW["B0"]] is None  # lone success of its group (self excluded)
    assert ctxs[ROW["F0"]] is None
    assert all(ctxs[ROW[r]] is None for r in ("D0", "D1", "E0"))  # group without success
    assert b.metrics()["serl/success_reference_fraction"] == pytest.approx(8 / 14)


def test_self_success_allowed_when_configured():
    ctxs, _ = build("successful_sample_immediate_feedback", dont_reprompt_on_self_success=False)
    assert sections(ctxs[ROW["B0"]]) == [(SUCCESS_HEADER, S_B), (FEEDBACK_HEADER, "You arrive at shelf 1.")]
    assert sections(ctxs[ROW["F0"]]) == [(SUCCESS_HEADER, S_F), (FEEDBACK_HEADER, "You pick up the apple 1.")]


def test_successful_sample_next_observation():
    ctxs, _ = build("successful_sample_next_observation")
    assert sections(ctxs[ROW["C1"]]) == [(SUCCESS_HEADER, S_B), (NEXT_OBS_HEADER, "P2-C")]
    assert ctxs[ROW["E0"]] is None


def test_successful_sample_future_trajectory():
    ctxs, _ = build("successful_sample_future_trajectory")
    assert sections(ctxs[ROW["C0"]]) == [(SUCCESS_HEADER, S_B), (FUTURE_HEADER, U_C0)]
    assert ctxs[ROW["C2"]] is None  # last step: no U
    assert sections(ctxs[ROW["H0"]]) == [(SUCCESS_HEADER, S_F), (FUTURE_HEADER, "Step 1\nResponse:\n<action>take apple 1</action>")]


def test_successful_sample_future_trajectory_immediate_feedback():
    ctxs, b = build("successful_sample_future_trajectory_immediate_feedback")
    assert sections(ctxs[ROW["A1"]]) == [(SUCCESS_HEADER, S_B), (FUTURE_HEADER, U_A1), (FEEDBACK_HEADER, NOTHING)]
    assert ctxs[ROW["A2"]] is None
    assert ctxs[ROW["B0"]] is None
    have = [k for k, c in zip(ROW, ctxs) if c is not None]
    assert have == ["A0", "A1", "C0", "C1", "H0"]
    assert b.metrics()["serl/future_reference_fraction"] == pytest.approx(5 / 14)


def test_successful_sample_future_trajectory_next_observation():
    ctxs, _ = build("successful_sample_future_trajectory_next_observation")
    assert sections(ctxs[ROW["C1"]]) == [(SUCCESS_HEADER, S_B), (FUTURE_HEADER, U_C1), (NEXT_OBS_HEADER, "P2-C")]
    assert [k for k, c in zip(ROW, ctxs) if c is not None] == ["A0", "A1", "C0", "C1", "H0"]


def test_observation_action_format_and_thinking_kept():
    ctxs, _ = build("successful_sample_future_trajectory", trajectory_format="obs_action",
                    remove_thinking_from_demonstration=False, max_traj_context_steps=1)
    s_text = dict(ctxs[ROW["A0"]].sections)[SUCCESS_HEADER]
    assert s_text == (
        f"Step 0\nObservation:\n[B0] obs: {ROOM}\nAction:\n<think>shelf</think><action>go to shelf 1</action>"
        "\n\n(1 more step(s) not shown)"
    )
    u_text = dict(ctxs[ROW["A0"]].sections)[FUTURE_HEADER]
    assert u_text.startswith(
        "Step 1\nObservation:\n[A1] obs: You arrive at desk 1.\nAction:\n<think>open it</think>\n<action>open drawer 1</action>"
    )


def test_helpers():
    assert strip_thinking("<think>a\nb</think>\n  <action>x</action>") == "<action>x</action>"
    assert action_key("<think>t</think><action>  Go  To\nDesk 1 </action>") == "go to desk 1"
    assert action_key("<think>only thinking</think>") == EMPTY_ACTION
    assert action_key("Go north") == "go north"
    assert canonical_format("action_series") == "response"
    assert canonical_format("observation-action") == "observation_action"


# ---------------------------------------------------------------------------------------------
# anchor modes (not conjunctive)

# The start-room anchor of g1 holds A0, B0, C0 and C1 (C revisits it): three distinct actions.
ROOM_HEAD = [
    "Action: go to desk 1\nTried 2 time(s); succeeded 0/2; mean return 0.0000.\n"
    "Best outcome: failure, reward 0.0000.\nWorst outcome: failure, reward 0.0000.",
    "Action: go to shelf 1\nTried 1 time(s); succeeded 1/1; mean return 10.0000.\n"
    "Best outcome: success, reward 10.0000.\nWorst outcome: success, reward 10.0000.",
    "Action: look\nTried 1 time(s); succeeded 0/1; mean return 0.0000.\n"
    "Best outcome: failure, reward 0.0000.\nWorst outcome: failure, reward 0.0000.",
]


def test_anchor_immediate_feedback():
    ctxs, b = build("anchor_immediate_feedback")
    room = (ANCHOR_FEEDBACK_HEADER,
            "go to desk 1, You arrive at desk 1.\ngo to shelf 1, You arrive at shelf 1.\nlook, Nothing happens.")
    for r in ("A0", "B0", "C0", "C1"):
        assert sections(ctxs[ROW[r]]) == [room], r
    # "Nothing happens." merges A2 and C2, two different true states
    nothing = (ANCHOR_FEEDBACK_HEADER, "take key 1, Nothing happens.\ninventory, You are carrying nothing.")
    assert sections(ctxs[ROW["A2"]]) == [nothing] == sections(ctxs[ROW["C2"]])
    # D0's anchor (Room two.) = D0 (no feedback) + E0
    assert sections(ctxs[ROW["D0"]]) == [(ANCHOR_FEEDBACK_HEADER, "go to bed 1, You arrive at bed 1.")]
    m = b.metrics()
    assert m["serl/anchor_reference_fraction"] == 1.0
    # group sizes: room 4 rows x4, desk 1, nothing 2 x2, shelf 1, D0/E0 2 x2, D1 1, F0/H0 2 x2, H1 1
    assert m["serl/anchor_group_size_mean"] == pytest.approx((4 * 4 + 1 + 2 * 2 + 1 + 2 * 2 + 1 + 2 * 2 + 1) / 14)
    assert m["serl/anchor_action_count_mean"] == pytest.approx((3 * 4 + 1 + 2 * 2 + 1 + 1 * 2 + 1 + 2 * 2 + 1) / 14)


def test_anchor_next_observation():
    ctxs, b = build("anchor_next_observation")
    table = "\n\n".join([
        ROOM_HEAD[0] + "\nNext observation after the best outcome:\nP1-A\nNext observation after the worst outcome:\nP1-C",
        ROOM_HEAD[1] + "\nNext observation after the best outcome:\nP1-B",
        ROOM_HEAD[2] + "\nNext observation after the best outcome:\nP2-C",
    ])
    assert sections(ctxs[ROW["C1"]]) == [(ANCHOR_HEADER, table)]
    assert ctxs[ROW["C1"]].sources == {"anchor", "next_observation"}
    assert ctxs[ROW["C1"]].info == {"anchor_group_size": 4, "anchor_action_count": 3}
    m = b.metrics()
    assert m["serl/anchor_reference_fraction"] == 1.0 and m["serl/next_observation_reference_fraction"] == 1.0


def test_anchor_future_trajectory_with_placeholder_for_last_step():
    ctxs, _ = build("anchor_future_trajectory")
    table = "\n\n".join([
        ROOM_HEAD[0] + f"\n{FAILED_CONTINUATION}\n{U_C0}",  # worst failed try = C0 (later batch index)
        ROOM_HEAD[1] + f"\n{SUCCESS_CONTINUATION}\n{U_B0}",
        ROOM_HEAD[2] + f"\n{FAILED_CONTINUATION}\n{U_C1}",
    ])
    assert sections(ctxs[ROW["A0"]]) == [(ANCHOR_HEADER, table)]
    nothing = "\n\n".join([
        "Action: take key 1\nTried 1 time(s); succeeded 0/1; mean return 0.0000.\n"
        f"Best outcome: failure, reward 0.0000.\nWorst outcome: failure, reward 0.0000.\n{FAILED_CONTINUATION}\n{NO_CONTINUATION}",
        "Action: inventory\nTried 1 time(s); succeeded 0/1; mean return 0.0000.\n"
        f"Best outcome: failure, reward 0.0000.\nWorst outcome: failure, reward 0.0000.\n{FAILED_CONTINUATION}\n{NO_CONTINUATION}",
    ])
    assert sections(ctxs[ROW["C2"]]) == [(ANCHOR_HEADER, nothing)]
    assert ctxs[ROW["C2"]].sources == {"anchor"}  # only placeholders: no future reference
    # the winning step: its success continuation is the placeholder
    assert NO_CONTINUATION in ctxs[ROW["B1"]].sections[0][1]


def test_anchor_successful_sample_or_immediate_feedback():
    ctxs, b = build("anchor_successful_sample_or_immediate_feedback")
    # A0 has a success reference (B): table without feedback + S
    assert sections(ctxs[ROW["A0"]]) == [(ANCHOR_HEADER, "\n\n".join(ROOM_HEAD)), (SUCCESS_HEADER, S_B)]
    # B0 has no other success: table with feedback lines, no S
    assert sections(ctxs[ROW["B0"]]) == [(ANCHOR_HEADER, "\n\n".join([
        ROOM_HEAD[0] + "\nFeedback after the best outcome:\nYou arrive at desk 1.",  # worst identical -> omitted
        ROOM_HEAD[1] + "\nFeedback after the best outcome:\nYou arrive at shelf 1.",
        ROOM_HEAD[2] + "\nFeedback after the best outcome:\nNothing happens.",
    ]))]
    # group without any success: table with feedback, D0's own try has none
    assert sections(ctxs[ROW["D0"]]) == [(ANCHOR_HEADER,
        "Action: go to bed 1\nTried 2 time(s); succeeded 0/2; mean return 0.0000.\n"
        "Best outcome: failure, reward 0.0000.\nWorst outcome: failure, reward 0.0000.\n"
        "Feedback after the worst outcome:\nYou arrive at bed 1.")]
    m = b.metrics()
    assert m["serl/reprompt_sample_fraction"] == 1.0  # anchor modes always give context
    assert m["serl/success_reference_fraction"] == pytest.approx(8 / 14)


def test_anchor_successful_sample_immediate_feedback_lone_success():
    ctxs, _ = build("anchor_successful_sample_immediate_feedback")
    # F0 is the lone success of g3: table (with H0 in the same anchor) but no S
    assert sections(ctxs[ROW["F0"]]) == [(ANCHOR_HEADER, "\n\n".join([
        "Action: take apple 1\nTried 1 time(s); succeeded 1/1; mean return 10.0000.\n"
        "Best outcome: success, reward 10.0000.\nWorst outcome: success, reward 10.0000.\n"
        "Feedback after the best outcome:\nYou pick up the apple 1.",
        "Action: go to table 1\nTried 1 time(s); succeeded 0/1; mean return 0.0000.\n"
        "Best outcome: failure, reward 0.0000.\nWorst outcome: failure, reward 0.0000.\n"
        "Feedback after the best outcome:\nYou arrive at table 1.",
    ]))]
    h0 = sections(ctxs[ROW["H0"]])
    assert h0[0] == sections(ctxs[ROW["F0"]])[0] and h0[1] == (SUCCESS_HEADER, S_F)


def test_anchor_successful_sample_next_observation():
    ctxs, _ = build("anchor_successful_sample_next_observation")
    assert sections(ctxs[ROW["A1"]]) == [
        (ANCHOR_HEADER, "Action: open drawer 1\nTried 1 time(s); succeeded 0/1; mean return 0.0000.\n"
                        "Best outcome: failure, reward 0.0000.\nWorst outcome: failure, reward 0.0000.\n"
                        "Next observation after the best outcome:\nP2-A"),
        (SUCCESS_HEADER, S_B),
    ]


def test_anchor_successful_sample_future_trajectory():
    ctxs, _ = build("anchor_successful_sample_future_trajectory")
    assert sections(ctxs[ROW["C0"]]) == [
        (ANCHOR_HEADER, "\n\n".join([
            ROOM_HEAD[0] + f"\n{FAILED_CONTINUATION}\n{U_C0}",
            ROOM_HEAD[1] + f"\n{SUCCESS_CONTINUATION}\n{U_B0}",
            ROOM_HEAD[2] + f"\n{FAILED_CONTINUATION}\n{U_C1}",
        ])),
        (SUCCESS_HEADER, S_B),
    ]
    assert ctxs[ROW["C0"]].sources == {"anchor", "future", "success"}


def test_anchor_successful_sample_future_trajectory_immediate_feedback():
    ctxs, _ = build("anchor_successful_sample_future_trajectory_immediate_feedback", max_future_context_steps=1)
    table = sections(ctxs[ROW["A0"]])[0][1]
    assert table.split("\n\n")[0] == (
        ROOM_HEAD[0] + "\nFeedback after the best outcome:\nYou arrive at desk 1."
        f"\n{FAILED_CONTINUATION}\nStep 1\nResponse:\n<action>look</action>"
    )
    assert table.endswith("(1 more step(s) not shown)\n\n" + ROOM_HEAD[1] + "\nFeedback after the best outcome:\n"
                          f"You arrive at shelf 1.\n{SUCCESS_CONTINUATION}\n{U_B0}\n\n" + ROOM_HEAD[2] +
                          f"\nFeedback after the best outcome:\nNothing happens.\n{FAILED_CONTINUATION}\n{U_C1}")
    assert sections(ctxs[ROW["A0"]])[1] == (SUCCESS_HEADER, S_B)


def test_anchor_successful_sample_future_trajectory_next_observation():
    ctxs, _ = build("anchor_successful_sample_future_trajectory_next_observation")
    d1 = sections(ctxs[ROW["D1"]])
    assert d1 == [(ANCHOR_HEADER,
                   "Action: take pillow 1\nTried 1 time(s); succeeded 0/1; mean return 0.0000.\n"
                   "Best outcome: failure, reward 0.0000.\nWorst outcome: failure, reward 0.0000.\n"
                   "Next observation after the best outcome:\nP2-D\n"
                   f"{FAILED_CONTINUATION}\n{NO_CONTINUATION}")]


def test_anchor_tie_breaks_best_smallest_step_worst_largest_step():
    # two failed tries of the same action from the same observation at different steps
    t = Task("alfworld", "game9", "pick", 0)
    X = traj("g9", "X", t, [
        mk_step("X", 0, "Same.", "<action>wait</action>", "fb-x0"),
        mk_step("X", 1, "Same.", "<action>wait</action>", "fb-x1"),
    ])
    Y = traj("g9", "Y", t, [mk_step("Y", 0, "Same.", "<action>wait</action>", "fb-y0")])
    ctxs, _ = build("anchor_successful_sample_immediate_feedback", [Group("g9", t, [X, Y])])
    text = ctxs[0].sections[0][1]
    # best: smallest step id, then smallest batch index -> X0; worst: largest step id -> X1
    assert text.endswith("Feedback after the best outcome:\nfb-x0\nFeedback after the worst outcome:\nfb-x1")


def test_anchor_similarity_clustering():
    t = Task("alfworld", "game8", "pick", 0)
    P = traj("g8", "P", t, [mk_step("P", 0, "You arrive at desk 1.", "<action>open drawer 1</action>", "It is empty.")])
    Q = traj("g8", "Q", t, [mk_step("Q", 0, "You arrive at desk 2.", "<action>open drawer 2</action>", "You see a key.")])
    R = traj("g8", "R", t, [mk_step("R", 0, "You arrive at shelf 1.", "<action>look</action>", "Nothing.")])
    g = lambda: [Group("g8", t, [P, Q, R])]  # noqa: E731
    exact, _ = build("anchor_immediate_feedback", g())
    assert exact[0].sections[0][1] == "open drawer 1, It is empty."
    sim, b = build("anchor_immediate_feedback", g(), anchor_enable_similarity=True, anchor_similarity_thresh=0.9)
    # fuzz.ratio("...desk 1.", "...desk 2.") = 0.952 >= 0.9; vs "...shelf 1." = 0.837 < 0.9
    assert sim[0].sections[0][1] == "open drawer 1, It is empty.\nopen drawer 2, You see a key."
    assert sim[2].sections[0][1] == "look, Nothing."
    strict, _ = build("anchor_immediate_feedback", g(), anchor_enable_similarity=True, anchor_similarity_thresh=0.96)
    assert strict[0].sections[0][1] == "open drawer 1, It is empty."
    assert anchor_clusters(["a", "b", "a"], [0, 0, 1]) == [0, 1, 0]
    # the original's difflib ratio is available too: desk 1 / desk 2 = 2*20/42 there as well
    dl, _ = build("anchor_immediate_feedback", g(), anchor_enable_similarity=True, anchor_similarity_thresh=0.9,
                  anchor_similarity_backend="difflib")
    assert dl[0].sections[0][1] == "open drawer 1, It is empty.\nopen drawer 2, You see a key."
    with pytest.raises(ConfigError, match="anchor_similarity_backend"):
        validate(cfg("anchor_immediate_feedback", anchor_enable_similarity=True, anchor_similarity_backend="jaro"))


def test_anchor_clusters_similarity_order_is_step_then_batch():
    ids = anchor_clusters(["abcdefghij", "abcdefghiX", "zzzz"], [1, 0, 0], 0.85)
    # visit order: row 1 (step 0), row 2 (step 0), row 0 (step 1) -> row 1 seeds 0, row 2 seeds 1,
    # row 0 joins row 1's cluster (ratio 0.9)
    assert ids == [0, 0, 1]


# ---------------------------------------------------------------------------------------------
# success buffer (our extension)


def _iteration0_group():
    t = Task("alfworld", "gameB", "pick", 0)
    W = traj("gb0", "W0", t, [mk_step("W", 0, "Start.", "<think>x</think><action>go to safe 1</action>", "ok",
                                      reward=10.0, won=True)])
    L = traj("gb0", "L0", t, [mk_step("L", 0, "Start.", "<action>look</action>", "Nothing happens.")])
    return Group("gb0", t, [W, L])


def _iteration1_group():
    t = Task("alfworld", "gameB", "pick", 0)
    L1 = traj("gb1", "L1", t, [mk_step("M", 0, "Start.", "<action>look</action>", "Nothing happens.")])
    L2 = traj("gb1", "L2", t, [mk_step("N", 0, "Start.", "<action>inventory</action>", "You carry nothing.")])
    return Group("gb1", t, [L1, L2])


def test_success_buffer_gives_failed_groups_a_reference_and_round_trips():
    b = SerlContextBuilder(cfg("successful_sample_immediate_feedback", success_source="buffer"))
    it0 = b.build([_iteration0_group()])
    assert it0[0] is None  # lone success: nothing in the group, buffer still empty
    assert sections(it0[1])[0] == (SUCCESS_HEADER, "Step 0\nResponse:\n<action>go to safe 1</action>")
    assert it0[1].info["success_source"] == "group"
    it1 = b.build([_iteration1_group()])
    assert sections(it1[0]) == [(SUCCESS_HEADER, "Step 0\nResponse:\n<action>go to safe 1</action>"),
                                (FEEDBACK_HEADER, "Nothing happens.")]
    assert it1[0].info["success_source"] == "buffer"
    m = b.metrics()
    assert m["serl/success_buffer_reference_fraction"] == 1.0 and m["serl/success_buffer_tasks"] == 1.0
    # checkpoint round trip through JSON
    state = json.loads(json.dumps(b.state_dict()))
    b2 = SerlContextBuilder(cfg("successful_sample_immediate_feedback", success_source="buffer"))
    assert b2.build([_iteration1_group()])[0] is None
    b2.load_state_dict(state)
    assert sections(b2.build([_iteration1_group()])[0]) == sections(it1[0])
    # default source=group ignores the saved buffer
    b3 = SerlContextBuilder(cfg("successful_sample_immediate_feedback"))
    b3.load_state_dict(state)
    assert b3.build([_iteration1_group()])[0] is None
    assert b3.state_dict() == {"version": 1, "success_buffer": None}


def test_success_buffer_bounds_and_evaluation_does_not_fill_it():
    buf = SuccessBuffer(per_task=1, max_tasks=2)
    for i in range(3):
        t = Task("alfworld", f"t{i}", "pick", 0)
        buf.add(traj("u", f"s{i}", t, [mk_step("S", 0, "o", "<action>a</action>", won=True, reward=10.0)]))
    assert len(buf) == 2 and buf.newest("alfworld/t0") is None and buf.newest("alfworld/t2").traj_uid == "s2"
    b = SerlContextBuilder(cfg("successful_sample_immediate_feedback", success_source="buffer"))
    b.build([_iteration0_group()], evaluation=True)
    assert b.state_dict()["success_buffer"] == {"tasks": []}


def test_stateless_wrapper_matches_builder():
    c = cfg("successful_sample_future_trajectory")
    a = build_privileged_contexts(make_groups(), c)
    b = SerlContextBuilder(c).build(make_groups())
    assert [sections(x) for x in a] == [sections(x) for x in b]


def test_judge_modes_on_evaluation_make_no_call_and_no_context():
    # judge_api_url points at a closed port: evaluation must not even try
    ctxs, b = build("judge_current_traj", judge_api_url="http://127.0.0.1:9/v1", judge_model="m",
                    judge_request_retries=0)
    assert ctxs and all(c is None for c in ctxs)  # non-strict fallback: no context
    assert b.metrics()["serl/judge_failure_fraction"] == 1.0
    b2 = SerlContextBuilder(cfg("judge_current_traj", judge_api_url="http://127.0.0.1:9/v1", judge_model="m"))
    assert all(c is None for c in b2.build(make_groups(), evaluation=True))
    assert "serl/judge_requests" not in b2.metrics()


def test_judge_context_shape():
    x = ContextInputs(*next(iter_steps(make_groups())), cfg("judge_current_traj"), judge_text="It failed.")
    ctx = SAMPLING_MODES["judge_current_traj"](x)
    assert ctx.sections == [(JUDGE_HEADER, "It failed.")] and ctx.sources == {"judge"}


def test_config_key_is_redacted_from_dumps(monkeypatch):
    from omegaconf import OmegaConf

    monkeypatch.setattr(SerlConfig, "_secret_store", {})
    c = SerlConfig(judge_api_key="sk-secret-123")
    assert c.judge_api_key == "<redacted>"
    assert "sk-secret-123" not in OmegaConf.to_yaml(OmegaConf.structured(c))
    assert "sk-secret-123" not in repr(c)
    assert c.configured_judge_api_key() == "sk-secret-123"
    assert resolve_api_key(c.configured_judge_api_key()) == "sk-secret-123"
    assert dataclasses.replace(c).judge_api_key == "<redacted>"


# ---------------------------------------------------------------------------------------------
# launch scripts (recipes/run_*.sh): the original's environment variables -> serl train overrides


def _dry_run(script: str, env: dict, *args: str) -> str:
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "PYENV_ROOT", "PYENV_VERSION")}
    out = subprocess.run(["bash", str(root / "recipes" / script), *args], env={**keep, **env, "SERL_DRY_RUN": "1"},
                         capture_output=True, text=True, timeout=30, check=True)
    return out.stdout


def test_launch_scripts_map_the_originals_variables():
    out = _dry_run("run_alfworld.sh", {"MODEL_PATH": "/models/qwen", "SAMPLING_MODE": "anchor_future_trajectory",
                                       "TRAJECTORY_FORMAT": "observation_action", "OUTPUT_ROOT": "/tmp/o",
                                       "GROUP_SIZE": "4", "SAVE_FREQ": "-1", "JUDGE_API_KEY": "sk-hidden"},
                   "vllm", "trainer.total_training_steps=3")
    assert " train recipe=cpu rollout.engine=vllm algorithm.serl.sampling_mode=anchor_future_trajectory " \
           "algorithm.serl.trajectory_format=observation_action model.path=/models/qwen trainer.output_dir=/tmp/o " \
           "env.rollout.n=4 trainer.save_freq=0 trainer.total_training_steps=3" in out
    assert "sk-hidden" not in out  # exported as SERL_JUDGE_API_KEY, never on the command line
    web = _dry_run("run_webshop.sh", {}, "env.max_steps=3")
    assert web.rstrip().endswith("train recipe=webshop algorithm.serl.sampling_mode=immediate_feedback "
                                 "algorithm.serl.trajectory_format=response env.max_steps=3")
