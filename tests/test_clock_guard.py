"""The suite's clock guard (``--monotonic-start``, tests/conftest.py) is in force: every test runs
with the process's monotonic clocks starting where the option says (0 by default, a machine that
has just booted), so a timer that starts at 0 fails here whatever the machine's uptime."""

from __future__ import annotations

import time

from conftest import CLOCK_START


def test_the_monotonic_clocks_start_where_the_option_says(pytestconfig):
    if pytestconfig.getoption("--monotonic-start") == "real":
        assert CLOCK_START not in pytestconfig.stash
        return
    start_s, wall0 = pytestconfig.stash[CLOCK_START]
    since_s = time.time() - wall0  # wall seconds since the shift; the shifted clocks count the same
    for clock in (time.monotonic, time.perf_counter):
        elapsed = clock() - start_s
        assert -0.5 <= elapsed <= since_s + 0.5, (clock.__name__, start_s, elapsed, since_s)
    assert abs(time.monotonic_ns() / 1e9 - time.monotonic()) < 0.5
    a = time.monotonic()
    time.sleep(0.01)
    assert 0.009 <= time.monotonic() - a < 5.0  # differences are real seconds
