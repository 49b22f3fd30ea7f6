"""Dynamic sampling (``algorithm.filter_groups``, serl.algos.dynamic_sampling) on hand-built groups,
its config checks, and one training iteration with it on."""

from __future__ import annotations

import pytest

from serl.algos.dynamic_sampling import dynamic_sampling, filter_groups, group_has_signal
from serl.configure import load_config
from serl.errors import ConfigError
from serl.trajectory import Group, Step, Task, Trajectory


def _traj(uid: str, reward: float, won: bool) -> Trajectory:
    step = Step(step_id=0, observation="", prompt="", prompt_ids=[1], response_ids=[2], response_text="",
                action_mask=[1], action="look", action_valid=True, reward=reward, won=won)
    return Trajectory(uid=uid, traj_uid=f"{uid}-{reward}-{won}", task=Task(task_id=uid, env_name="alfworld", task_type="pick_and_place_simple"), steps=[step])


def _group(uid: str, *episodes: tuple[float, bool]) -> Group:
    return Group(uid=uid, task=Task(task_id=uid, env_name="alfworld", task_type="pick_and_place_simple"), trajectories=[_traj(uid, r, w) for r, w in episodes])


WIN, LOSS, PARTIAL = (10.0, True), (0.0, False), (0.5, False)


def test_group_has_signal():
    assert group_has_signal([0.0, 10.0])
    assert not group_has_signal([0.0, 0.0, 0.0])
    assert not group_has_signal([10.0, 10.0])
    assert group_has_signal([3.0])  # one episode: kept (DAPO's len == 1)
    assert group_has_signal([])


def test_filter_groups_by_metric():
    groups = [_group("a", WIN, LOSS), _group("b", LOSS, LOSS), _group("c", LOSS, PARTIAL), _group("d", WIN, WIN)]
    kept, dropped = filter_groups(groups, "episode_reward")
    assert [g.uid for g in kept] == ["a", "c"] and [g.uid for g in dropped] == ["b", "d"]
    # by "won", c (0 vs 0.5 reward, both lost) has no spread
    kept, dropped = filter_groups(groups, "won")
    assert [g.uid for g in kept] == ["a"] and [g.uid for g in dropped] == ["b", "c", "d"]
    with pytest.raises(ConfigError, match="algorithm.filter_groups.metric"):
        filter_groups(groups, "acc")


def _batches(*batches: list[Group]):
    """A ``play_batch`` that hands out ``batches`` in order and records the batch numbers asked."""
    asked = []

    def play(k: int) -> list[Group]:
        asked.append(k)
        return batches[k - 1]

    return play, asked


def test_keeps_sampling_until_the_target_then_stops():
    b1 = [_group("a", WIN, LOSS), _group("b", LOSS, LOSS), _group("c", LOSS, LOSS)]
    b2 = [_group("d", LOSS, LOSS), _group("e", WIN, LOSS), _group("f", WIN, LOSS)]
    b3 = [_group("g", WIN, LOSS)] * 3
    play, asked = _batches(b1, b2, b3)
    groups, stats = dynamic_sampling(play, target_groups=3, max_num_gen_batches=5)
    assert asked == [1, 2]  # 1 + 2 kept after batch 2: b3 is never played
    assert [g.uid for g in groups] == ["a", "e", "f"]
    assert (stats.num_gen_batches, stats.dropped_groups, stats.capped, stats.trimmed_groups) == (2, 3, 0, 0)
    m = stats.as_metrics(len(groups))
    assert m["filter_groups/kept_groups"] == 3 and m["filter_groups/num_gen_batches"] == 2


def test_overshoot_is_kept_unless_trim():
    b1 = [_group("a", WIN, LOSS), _group("b", LOSS, LOSS)]
    b2 = [_group("c", WIN, LOSS), _group("d", WIN, LOSS)]
    groups, stats = dynamic_sampling(_batches(b1, b2)[0], target_groups=2, max_num_gen_batches=4)
    assert [g.uid for g in groups] == ["a", "c", "d"] and stats.trimmed_groups == 0  # verl-agent: no trim
    groups, stats = dynamic_sampling(_batches(b1, b2)[0], target_groups=2, max_num_gen_batches=4, trim=True)
    assert [g.uid for g in groups] == ["a", "c"] and stats.trimmed_groups == 1  # DAPO: batch[:traj_bsz]


def test_the_last_batch_goes_in_unfiltered():
    b1 = [_group("a", LOSS, LOSS), _group("b", WIN, LOSS)]
    b2 = [_group("c", LOSS, LOSS), _group("d", LOSS, LOSS)]
    groups, stats = dynamic_sampling(_batches(b1, b2)[0], target_groups=2, max_num_gen_batches=2)
    assert [g.uid for g in groups] == ["b", "c", "d"]
    assert (stats.capped, stats.unfiltered_groups, stats.dropped_groups) == (1, 2, 1)
    # one batch allowed: nothing is filtered at all
    groups, stats = dynamic_sampling(_batches(b2)[0], target_groups=2, max_num_gen_batches=1)
    assert [g.uid for g in groups] == ["c", "d"] and stats.capped == 1 and stats.dropped_groups == 0


def test_bad_arguments_raise():
    play = _batches([_group("a", WIN, LOSS)])[0]
    with pytest.raises(ConfigError, match="max_num_gen_batches"):
        dynamic_sampling(play, target_groups=1, max_num_gen_batches=0)
    with pytest.raises(ConfigError, match="metric"):
        dynamic_sampling(play, target_groups=1, max_num_gen_batches=1, metric="score")


@pytest.mark.parametrize("overrides, key", [
    (["env.rollout.n=1"], "algorithm.filter_groups.enable"),
    (["algorithm.filter_groups.max_num_gen_batches=0"], "algorithm.filter_groups.max_num_gen_batches"),
    (["algorithm.filter_groups.metric=acc"], "algorithm.filter_groups.metric"),
    (["trainer.num_processes=2", "data.train_batch_size=2"], "algorithm.filter_groups.trim"),
])
def test_config_errors_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load_config("cpu", ["algorithm.filter_groups.enable=true", *overrides])


def test_one_iteration_with_dynamic_sampling(tiny_model_dir, tmp_path):
    """A tiny random model loses every game: each group of batch 1 is dropped, batch 2 (the cap)
    goes in whole, and the update trains on its 2 groups; 4 tasks were drawn."""
    from test_train_e2e import _cfg

    from serl.train.trainer import Trainer

    cfg = _cfg(tiny_model_dir, tmp_path, **{"algorithm.serl.enable": "false", "algorithm.filter_groups.enable": "true",
                                            "algorithm.filter_groups.max_num_gen_batches": 2})
    tr = Trainer(cfg)
    try:
        played = []
        collect = tr.rollout.collector

        def spy_collector(pool, engine, tokenizer):
            loop = collect(pool, engine, tokenizer)
            inner = loop.collect

            def spy(tasks, *args, **kwargs):
                played.append([t.task_id for t in tasks])
                return inner(tasks, *args, **kwargs)

            loop.collect = spy
            return loop

        tr.rollout.collector = spy_collector
        m = tr.train_iteration()
    finally:
        tr.close()
    assert len(played) == 2 and all(len(p) == 2 for p in played)
    assert m["filter_groups/num_gen_batches"] == 2 and m["filter_groups/capped"] == 1
    # 2 steps cannot win a game: every episode scores 0
    assert (m["filter_groups/dropped_groups"], m["filter_groups/kept_groups"], m["filter_groups/unfiltered_groups"]) \
        == (2, 2, 2)
