"""Other processes' CPU load during a timed call, and re-running the calls it disturbed.

A burst of load from elsewhere can slow one call several-fold (on a 2-core machine, one busy thread from another
process made decodekit's 2-thread forwards 5x slower), and interleaving alone cannot undo that when bursts are
shorter than a pass. So every timed call also measures how much of the CPUs it may run on (its affinity set) other
processes used meanwhile: Linux's ``/proc/stat`` per-CPU busy time minus this process's own (``/proc/self/stat``).
A call during which others used more than :data:`BUSY` of that capacity is re-run, up to :data:`RETRIES` times,
and the least disturbed attempt is kept; ``Call.others_cpu`` records its share and ``Call.attempts`` the tries.
Where ``/proc`` is missing (macOS, Windows), and for calls shorter than :data:`MIN_WALL_S` (``/proc/stat`` counts
in 10 ms ticks), nothing is measured and nothing re-run (``others_cpu`` is None); nor with several processes
(``accelerate launch``), where the other ranks are the load.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["BUSY", "MIN_WALL_S", "RETRIES", "disturbed_warning", "least_disturbed", "others_share"]

BUSY = 0.10  # other processes' share of this process's CPUs above which a call counts as disturbed
MIN_WALL_S = 0.2  # shorter calls are not judged: /proc/stat counts in ticks of 10 ms
RETRIES = 3  # re-runs of a disturbed call before the least disturbed attempt is kept
T = TypeVar("T")


def _cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


_CPUS = _cpus()
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _snapshot() -> tuple[int, int] | None:
    """(busy ticks of this process's CPUs, this process's ticks), or None where ``/proc`` is not readable."""
    if _CPUS is None:
        return None
    try:
        busy = 0
        for line in Path("/proc/stat").read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in _CPUS:
                user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
                busy += user + nice + system + irq + softirq + steal
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return busy, int(own[11]) + int(own[12])  # utime, stime (fields 14 and 15 of stat)
    except (OSError, ValueError, IndexError):
        return None


def others_share(call: Callable[[], T]) -> tuple[T, float | None]:
    """Run ``call``; return its result and the share of this process's CPUs other processes used meanwhile (None
    where it cannot be measured)."""
    before, start = _snapshot(), time.perf_counter()
    result = call()
    after, wall = _snapshot(), time.perf_counter() - start
    if before is None or after is None or wall < MIN_WALL_S:
        return result, None
    others = (after[0] - before[0]) - (after[1] - before[1])
    return result, max(others, 0) / (wall * _TICK * len(_CPUS or (0,)))


def least_disturbed(call: Callable[[], T], retries: int = RETRIES) -> tuple[T, float | None, int]:
    """Run ``call`` until other processes used at most :data:`BUSY` of the CPUs meanwhile, at most ``1 + retries``
    times; return the least disturbed attempt's result, its share, and the number of attempts."""
    best, best_share = others_share(call)
    attempts = 1
    while best_share is not None and best_share > BUSY and attempts <= retries:
        result, share = others_share(call)
        attempts += 1
        if share is not None and share < best_share:
            best, best_share = result, share
    return best, best_share, attempts


def disturbed_warning(shares: list[float | None], reruns: int = RETRIES) -> list[str]:
    """The warning for a method whose calls (their ``others_cpu`` shares) were still disturbed after up to
    ``reruns`` re-runs each."""
    busy = [s for s in shares if s is not None and s > BUSY]
    if not busy:
        return []
    after = f"even after {reruns} re-runs" if reruns else "not re-run (reruns=0)"
    return [
        f"{len(busy)} of {len(shares)} timed calls ran while other processes used up to {max(busy):.0%} of the "
        f"CPUs, {after}: its times are slowed by that load"
    ]
