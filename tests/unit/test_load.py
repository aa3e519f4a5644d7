"""The benchmark's disturbance check: other processes' CPU share during a call, and re-running disturbed calls."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from decodekit.bench import load


def test_the_least_disturbed_attempt_is_kept(monkeypatch):
    shares = iter([0.6, 0.3, 0.05, 0.01])
    attempts = []

    def fake(call):
        attempts.append(1)
        return f"run {len(attempts)}", next(shares)

    monkeypatch.setattr(load, "others_share", fake)
    assert load.least_disturbed(lambda: None) == ("run 3", 0.05, 3)  # stops at the first quiet attempt
    shares, attempts[:] = iter([0.6, 0.9, 0.5, 0.7]), []
    assert load.least_disturbed(lambda: None, retries=3) == ("run 3", 0.5, 4)  # all busy: the least busy, warned
    assert load.disturbed_warning([0.5, 0.01, None])[0].startswith("1 of 3 timed calls ran while other processes")
    assert load.disturbed_warning([0.01, None]) == []
    shares, attempts[:] = iter([0.6]), []
    assert load.least_disturbed(lambda: None, retries=0) == ("run 1", 0.6, 1)  # reruns=0: timed once, as it ran
    assert "not re-run (reruns=0)" in load.disturbed_warning([0.6], reruns=0)[0]


@pytest.mark.skipif(load._snapshot() is None, reason="needs Linux /proc")
def test_a_busy_process_is_seen():
    spin = "import time\nt = time.time()\nwhile time.time() - t < 3: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)
        _, share = load.others_share(lambda: time.sleep(1.0))
    finally:
        busy.kill()
    assert share is not None and share > load.BUSY  # one spinning process: about 1 / (number of CPUs)
    _, short = load.others_share(lambda: time.sleep(0.01))
    assert short is None  # too short to judge in 10 ms ticks
