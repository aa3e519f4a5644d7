"""The timing protocol every decodekit benchmark uses: warm-up runs, device synchronisation, ``perf_counter``,
several repeats, the median."""

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
    fn: Callable[[], T], *, warmup: int = 1, repeats: int = 5, device: torch.device | str | None = None
) -> tuple[T, float]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times; return the last result and the median time."""
    for _ in range(warmup):
        fn()
    times = []
    result = None
    for _ in range(repeats):
        result, seconds = timed_call(fn, device)
        times.append(seconds)
    return result, statistics.median(times)
