"""Online correction of a cost model by measured round times, for the policies that choose lengths from one
(``goodput``, ``batch_aware``), and the measured price of their probes.

A profiled :class:`~decodekit.policies.analytic.CostModel` misses costs that only the workload has: verification
at the workload's (longer) context, a batch whose rows accepted different lengths padding the verification, a draft
model catching up after rounds without a draft. :class:`RoundClock` measures each round's wall time (from one
``plan`` to the next) and keeps its ratio to the model's ``T(B, k)``, smoothed separately for rounds that drafted
and rounds that did not; :meth:`RoundClock.scale` turns the two ratios into a correction of ``T(0..K)``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping

import torch

from decodekit.checks import check_bool, check_float, check_int
from decodekit.policies.analytic import CostModel, cost_at, set_costs


class RoundClock:
    """Measured over modelled round time, for rounds without a draft (``ratios[0]``) and with one (``ratios[1]``).

    Call :meth:`start` at the end of each ``plan`` with the round's longest length and batch size; the next
    :meth:`start` (or :meth:`lap`) closes that round. The time between two ``plan`` calls is the round's real
    time on a GPU too, as long as each ``plan`` reads its length on the host (both policies do, once per round).

    Args:
        smoothing: weight of the newest round in each ratio's exponential average.
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, smoothing: float = 0.3, clock: Callable[[], float] = time.perf_counter) -> None:
        self.smoothing = check_float("smoothing", smoothing, low=0.0, high=1.0, low_open=True)
        self.clock = clock
        self.ratios: list[float | None] = [None, None]
        self._last: tuple[float, int, int] | None = None  # (clock, longest length, batch size) at the last start

    def begin(self) -> None:
        """Forget the measurements (a new call: its context and batch differ)."""
        self.ratios, self._last = [None, None], None

    @property
    def knows_plain(self) -> bool:
        """Whether a round without a draft has been measured (the reference the drafting ratio is compared to)."""
        return self.ratios[0] is not None

    def lap(self, costs: CostModel | Mapping[int, CostModel] | None) -> None:
        """Close the round begun at the last :meth:`start`: fold its measured time into the ratio of its kind."""
        if self._last is None:
            return
        start, longest, batch_size = self._last
        self._last = None
        ratio = (self.clock() - start) / float(cost_at(costs, batch_size).round_time(longest))
        kind, old = int(longest > 0), self.ratios[int(longest > 0)]
        self.ratios[kind] = ratio if old is None else (1 - self.smoothing) * old + self.smoothing * ratio

    def start(self, longest: int, batch_size: int) -> None:
        """A round drafting at most ``longest`` tokens per row at ``batch_size`` rows begins now."""
        self._last = (self.clock(), longest, batch_size)

    def scale(self, max_len: int) -> torch.Tensor | None:
        """``[K + 1]`` float64: the factors of ``T(0), T(1..K)`` (None before any measurement). A kind not measured
        yet takes the other's ratio, so the correction changes no decision until both kinds have been timed."""
        plain, drafting = self.ratios
        if plain is None and drafting is None:
            return None
        plain = drafting if plain is None else plain
        drafting = plain if drafting is None else drafting
        return torch.tensor([plain] + [drafting] * max_len, dtype=torch.float64)


class ProbePrice:
    """The measured price of probe rounds (rounds that draft only to re-measure acceptance), in plain rounds.

    A policy holding a row at ``k = 0`` drafts one token now and then to see whether drafting pays again. The cost
    profile prices that round at ``T(B, 1)``, but a draft model that has not drafted since the call began (its
    prefill is lazy) or for many rounds first catches up over every token it has not seen, which can cost many plain
    rounds. :meth:`lap` times the rounds between two ``plan`` host reads (a whole round, on a GPU too) and returns the
    wait that keeps failed probes at about ``share`` of the decoding time: ``excess / share`` rounds, ``excess`` the
    last probe round's time over a plain round's, in plain rounds.

    Args:
        share: the share of plain decoding time that failed probes may cost in the long run.
        clock: seconds, monotonic (tests pass a fake one).
        cap: the longest wait it asks for (rounds; None = no cap).
    """

    def __init__(
        self, share: float = 0.03, clock: Callable[[], float] = time.perf_counter, cap: int | None = None
    ) -> None:
        self.share = check_float("probe_share", share, low=0.0, low_open=True)
        self.clock, self.cap = clock, cap
        self.plains: dict[Hashable, float] = {}  # a plain round's measured seconds, smoothed, per call kind
        self.kind: Hashable = None  # this call's kind
        self._timed: tuple[float, bool] | None = None  # the last timed round: (clock at its start, was it a probe)

    @property
    def plain_s(self) -> float | None:
        """A plain round's measured seconds (smoothed) for this call's kind; None before one was timed."""
        return self.plains.get(self.kind)

    def begin(self, kind: Hashable) -> None:
        """A new call of ``kind`` (e.g. its batch size and sampling settings, whose plain rounds take the same time):
        it goes on with the plain time earlier calls of that kind measured; the open round is forgotten (the time to
        the next ``plan`` spans the call's end)."""
        self.kind, self._timed = kind, None

    def lap(self, plain: bool, probe: bool) -> int:
        """Close the last timed round and time this one if it is ``plain`` or a ``probe`` round (drafting rounds are
        not timed). Returns the wait (rounds, at most ``cap``) the closed round asks for: its price if it was a
        probe round and a plain round has been timed, else 0."""
        now, wait, plain_s = self.clock(), 0, self.plain_s
        if self._timed is not None:
            start, probed = self._timed
            seconds = now - start
            if not probed:
                self.plains[self.kind] = seconds if plain_s is None else 0.7 * plain_s + 0.3 * seconds
            elif plain_s is not None and plain_s > 0:
                wait = math.ceil(max(seconds / plain_s - 1.0, 0.0) / self.share)
        self._timed = (now, probe) if plain or probe else None
        return wait if self.cap is None else min(wait, self.cap)


class BatchProbes:
    """A batch's probe clock, kept per kind of call: ``idle`` rounds without a draft and the ``wait`` before the next
    probe round, with the probes' measured :class:`ProbePrice` and, with ``calibrate``, the :class:`RoundClock`.

    :meth:`begin` saves the ending call's ``(idle, wait)`` under its kind (first batch size, sampling settings) and
    restores those of an earlier call of the new call's kind, so failed probes keep their longer wait across calls
    that would fail them again; a new kind starts at ``(0, every)``.

    Args:
        every: rounds without a draft before the first probe (0 = never probe); ``share``, ``clock``: the
            :class:`ProbePrice`'s (its longest wait is ``64 * every``); ``calibrate``: time rounds against the
            cost model (:class:`RoundClock`).
    """

    def __init__(self, every: int, share: float, clock: Callable[[], float], calibrate: bool) -> None:
        self.every, self.idle, self.wait = every, 0, every
        self.price = ProbePrice(share, clock, cap=64 * every)
        self.timer = RoundClock() if calibrate else None
        self.saved: dict[Hashable, tuple[int, int]] = {}  # (idle, wait) per call kind
        self.call: Hashable = None  # this call's kind: (first batch size, sampling)

    def begin(self, batch_size: int, sampling: Hashable) -> None:
        """A new call of ``batch_size`` rows at ``sampling``: restore its kind's clock and begin the price and timer."""
        if self.call is not None:
            self.saved[self.call] = (self.idle, self.wait)
        self.call = (batch_size, sampling)
        self.idle, self.wait = self.saved.get(self.call, (0, self.every))
        self.price.begin(self.call)
        if self.timer is not None:
            self.timer.begin()


def set_cost_policy(
    policy: object,
    costs: CostModel | Mapping[int, CostModel] | str | None,
    max_len: int,
    steps: tuple[float, float, float],
    probe_every: int,
    probe_share: float,
    clock: Callable[[], float],
    calibrate: bool,
) -> None:
    """What every policy that chooses lengths from a cost model and probes idle batches (``goodput``,
    ``batch_aware``) sets up, checked: its costs (:func:`~decodekit.policies.analytic.set_costs`, ``steps`` =
    ``(draft_step, verify_fixed, verify_step)``), ``probe_every``, ``calibrate`` and ``probes``, the batch's
    :class:`BatchProbes` clock."""
    set_costs(policy, costs, max_len, *steps)
    policy.probe_every = check_int("probe_every", probe_every, low=0, hint=" (0 = never probe)")  # type: ignore[attr-defined]
    policy.calibrate = check_bool("calibrate", calibrate)  # type: ignore[attr-defined]
    policy.probes = BatchProbes(policy.probe_every, probe_share, clock, policy.calibrate)  # type: ignore[attr-defined]
