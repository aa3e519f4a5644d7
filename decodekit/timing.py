"""Timing, one implementation for the loop and the benchmarks.

* :func:`timed_call` / :func:`median_time`: the benchmark protocol (warm-up, synchronise, ``perf_counter``,
  repeats, median).
* :class:`PhaseTimer`: the loop's per-phase times (prefill, draft, verify) at no extra host syncs. On the CPU it
  reads ``perf_counter`` at each mark. On CUDA it records events and reads them a round late, when the loop's own
  end-of-round sync has long completed them, so timing adds no ``synchronize`` per phase.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize(device)


def timed_call(fn: Callable[[], T], device: torch.device | str | None = None) -> tuple[T, float]:
    """Run ``fn`` once; return its result and its wall time in seconds (synchronised)."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


def median_time(
    fn: Callable[[], T],
    *,
    warmup: int = 1,
    repeats: int = 5,
    device: torch.device | str | None = None,
    budget_s: float | None = None,
    least: int = 1,
) -> tuple[T, float]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times; return the last result and the median time.
    With ``budget_s``, stop once the timed calls add up to it, after at least ``least`` of them (slow calls are
    timed fewer times, fast ones ``repeats`` times)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    result = None
    while len(times) < repeats and (budget_s is None or len(times) < least or sum(times) < budget_s):
        result, seconds = timed_call(fn, device)
        times.append(seconds)
    return result, statistics.median(times)


class PhaseTimer:
    """Adds up the time of named phases; each :meth:`mark` ends the phase that began at the previous mark.

    Args:
        device: where the timed work runs; CUDA devices are timed with events.
        exact: CUDA only: synchronise at :meth:`end_round` so this round's times are known at once (what a
            component that ``needs`` "timings" pays for); otherwise they are read one round late.
    """

    def __init__(self, device: torch.device, exact: bool = False) -> None:
        self.cuda = device.type == "cuda"
        self.exact = exact
        self.totals: dict[str, float] = {}
        self._marks: list[tuple[str | None, object]] = []
        self._late: list[tuple[str | None, object]] = []

    def _now(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        """Begin timing (the first phase starts here)."""
        self._marks = [(None, self._now())]

    def mark(self, phase: str) -> None:
        """End phase ``phase`` (it ran since the previous mark)."""
        self._marks.append((phase, self._now()))

    def end_round(self) -> dict[str, float] | None:
        """Close this round's marks; return its phase times if known now (CPU, or ``exact``), else None.

        On CUDA the previous round's events are read here and added to :attr:`totals`."""
        marks, self._marks = self._marks, []
        if not self.cuda:
            return self._add(marks)
        late, self._late = self._late, marks
        self._add(late)
        if not self.exact:
            return None
        marks[-1][1].synchronize()  # type: ignore[union-attr]
        self._late = []
        return self._add(marks)

    def finish(self) -> dict[str, float]:
        """Add what is still pending and return the totals (seconds per phase)."""
        if self._late:
            self._late[-1][1].synchronize()  # type: ignore[union-attr]
            self._add(self._late)
            self._late = []
        return self.totals

    def _add(self, marks: list[tuple[str | None, object]]) -> dict[str, float]:
        times: dict[str, float] = {}
        for (_, begin), (phase, end) in zip(marks, marks[1:]):
            seconds = begin.elapsed_time(end) / 1000.0 if self.cuda else end - begin  # type: ignore[union-attr]
            times[phase] = times.get(phase, 0.0) + seconds  # type: ignore[index]
            self.totals[phase] = self.totals.get(phase, 0.0) + seconds  # type: ignore[index]
        return times
