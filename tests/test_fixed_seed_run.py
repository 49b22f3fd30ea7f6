"""A fixed-seed tiny run gives the metrics pinned before the train loop was restructured.

The pinned file was written by ``python tests/fixed_seed_run.py`` on the code before the split of
``serl/train/trainer.py`` into concept modules; on that machine the restructured loop reproduced
every value bit for bit. Other CPU kinds round float32 kernels differently (the replies are
scripted, so only the update's arithmetic can differ), hence the tight tolerance rather than
equality. Integer-valued metrics (counts, flags) must match exactly.
"""

from __future__ import annotations

import json
import math

import pytest

from fixed_seed_run import GOLDEN, VARIANTS, machine, run_variant

REL, ABS = 1e-4, 1e-6


def _differences(got: list[dict], want: list[dict]) -> list[str]:
    out = [] if len(got) == len(want) else [f"{len(got)} metric lines, pinned {len(want)}"]
    for i, (g, w) in enumerate(zip(got, want)):
        if set(g) != set(w):
            out.append(f"line {i}: keys only in the run {sorted(set(g) - set(w))}, "
                       f"only pinned {sorted(set(w) - set(g))}")
        for k in sorted(set(g) & set(w)):
            a, b = g[k], w[k]
            exact = float(b).is_integer() and abs(b) < 2**31
            same = a == b if exact else math.isclose(a, b, rel_tol=REL, abs_tol=ABS)
            if not same:
                out.append(f"line {i} {k}: {a!r}, pinned {b!r}")
    return out


def test_the_comparison_catches_a_changed_metric():
    want = [{"actor/pg_loss": -0.25, "episode/num_trajectories": 8.0}]
    assert _differences([dict(want[0])], want) == []
    assert _differences([{"actor/pg_loss": -0.2501, "episode/num_trajectories": 8.0}], want)
    assert _differences([{"actor/pg_loss": -0.25, "episode/num_trajectories": 7.0}], want)
    assert _differences([{"actor/pg_loss": -0.25}], want)
    assert _differences([], want)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fixed_seed_run_metrics_are_unchanged(name, tiny_model_dir, tmp_path):
    pinned = json.loads(GOLDEN.read_text())
    got = run_variant(tiny_model_dir, tmp_path, name)
    diff = _differences(got, pinned["runs"][name])
    assert not diff, (f"{name}: metrics differ from {GOLDEN.name} (pinned on {pinned['machine']}; "
                      f"this machine {machine()}):\n" + "\n".join(diff[:20]))
