"""SmartSpec's goodput rule: the draft length that maximises committed tokens per second, k = 0 allowed."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_bool, check_int
from decodekit.errors import ConfigError
from decodekit.policies.acceptance import AcceptanceTracker
from decodekit.policies.analytic import CostModel, cost_at, expected_tokens, speedups
from decodekit.policies.calibration import set_cost_policy
from decodekit.policies.lengths import check_tree_args, length_budget
from decodekit.registry import register
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget

if TYPE_CHECKING:
    from decodekit.spec.round import Round


@register("policy", "goodput")
class GoodputLength:
    """Goodput-maximising draft length (SmartSpec, Liu et al. 2024, "Optimizing Speculative Decoding for Serving
    Large Language Models Using Goodput"; vLLM's dynamic speculative decoding).

    Each round: per row, its expected tokens ``E_i(k)`` from its online acceptance estimate
    (:class:`~decodekit.policies.acceptance.AcceptanceTracker`, exponentially decayed; per-position rates by default,
    ``positional=False``: the i.i.d. ``1 + alpha_i + ... + alpha_i^k``), and the round time
    ``T(B, k)`` at the live batch size from the cost model. The batch length is
    ``k* = argmax_k min_i E_i(k) / T(B, k)`` over ``k = 0..max_len`` (``batch="sum"``: SmartSpec's
    ``sum_i E_i(k) / T(B, k)``) (``k* = 0``: plain decoding this round, which
    is never slower than plain decoding in the model). A batched round costs as its longest row (the verification
    forward is padded to it), so no row gains by drafting less than ``k*`` in the model; each row then takes its own
    best ``k_i = argmax_{k <= k*} E_i(k) / T(B, k)``, so rows the model says cannot gain draft nothing (fewer
    rejected tokens, same round time). A row held at 0 drafts one token after ``probe_every`` idle rounds, so its
    estimate can recover; each probe that leaves it at 0 doubles the wait (up to 64x), since a probe costs a
    verification position and, for a draft model, a catch-up forward; rows probe only while the batch would draft
    at the rows' optimistic rates (:meth:`~decodekit.policies.acceptance.AcceptanceTracker.upper`, as
    :func:`~decodekit.policies.analytic.could_pay`); and in a batch, where one row's probe makes every row verify a
    second position, rows probe only in rounds that draft anyway or together on the batch's own doubling schedule
    (per-row schedules drift apart: 8 rows probing on their own made one round in 5 a probe round at batch 8, 8%
    slower than plain decoding). That batch schedule, its clock and its wait, carries over to the next call of the
    same batch size and sampling settings, so probes that keep failing become rare across calls (each costs a draft
    model a catch-up over every token since its last draft); a round that drafts on the merits of the call's own
    evidence restarts it. A call's first round drafts on the prior alone; it counts as a probe round, and once
    probes of that kind of call have failed it waits for the schedule like any probe. Probes are priced by their
    measured time: a round of probes alone that took ``x`` plain rounds' time more than a plain round sets the wait
    to at least ``x / probe_share`` rounds, so failed probes cost at most about ``probe_share`` of the decoding time
    (the profile's ``T(1)`` misses a draft model's catch-up, over every token since it last drafted, the prompt
    included the first time: its prefill is lazy).

    ``calibrate=True`` corrects the cost model online by measured round times
    (:class:`~decodekit.policies.calibration.RoundClock`: the wall time between two ``plan`` calls over the model's
    ``T(B, k_max)``, for rounds that drafted and rounds that did not; the first round of each call drafts nothing,
    to measure the second). Costs the profile misses (verification at the workload's longer context, a batch whose
    rows accepted different lengths padding the verification, the draft model catching up after rounds without a
    draft) then count against drafting.

    Host syncs: one per round (the batch's longest length, read so that a round with every row at 0 does not call
    the drafter at all: a draft model would otherwise still run on the new tokens).

    Faithfulness: the goodput objective with ``k = 0`` allowed, a per-request moving acceptance estimate and a
    latency model in batch size and length follow the paper and vLLM's implementation (which, like the default
    here, uses per-position rates, but pooled over requests); ours: per-row rates shrunk towards the row's i.i.d.
    estimate (``policies.md`` section 0's unbiased MLE), the latency model is a
    measured table per batch size (:func:`~decodekit.policies.profile.profile_costs`) or the relative model
    ``CostModel.relative``, and the per-row trimming below ``k*`` is ours.

    Args:
        costs: a :class:`CostModel` or ``{batch size: CostModel}`` (measured: ``profile_costs``; ``"measured"``: the
            benchmark's profile of the drafter, with ``oracle=<max_len>``); None = the
            relative model from ``draft_step`` / ``verify_fixed`` / ``verify_step`` (units of one decoding step).
        max_len: the longest draft (``K``).
        prior, decay: the acceptance estimate's prior and per-round decay (``AcceptanceTracker``).
        probe_every: rounds a row stays at 0 before it drafts one token to re-measure (0 = never).
        probe_share, clock: the share of plain decoding time failed probes may cost in the long run, and the
            clock that times them (:class:`~decodekit.policies.calibration.ProbePrice`; read once per round, after
            the round's host read).
        positional: expected tokens from per-position rates (``AcceptanceTracker.expected``) rather than the
            i.i.d. rate.
        batch: ``"slowest"``: the batch length maximises the slowest row's speedup (a static batch, as
            :func:`~decodekit.generate` runs, ends when its slowest row does); ``"sum"``: SmartSpec's summed
            goodput (right for continuous batching, where finished rows are replaced).
        calibrate: correct the cost model by the measured round times (above).
        nodes_per_depth, width: tree budgets (:func:`~decodekit.policies.lengths.length_budget`).
    """

    needs = frozenset()

    def __init__(
        self,
        costs: CostModel | Mapping[int, CostModel] | str | None = None,
        max_len: int = 8,
        draft_step: float = 0.0,
        verify_fixed: float = 0.0,
        verify_step: float = 0.0,
        prior: float = 0.5,
        decay: float = 0.9,
        probe_every: int = 8,
        probe_share: float = 0.03,
        positional: bool = True,
        batch: str = "slowest",
        calibrate: bool = False,
        nodes_per_depth: int = 1,
        width: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.max_len = check_int("max_len", max_len, low=1, hint=" (the longest draft)")
        self.positional = check_bool("positional", positional)
        if batch not in ("slowest", "sum"):
            raise ConfigError(f"batch must be 'slowest' or 'sum', got {batch!r}")
        self.batch = batch
        # costs, and the batch's probe clock: its rounds without a draft (idle) and its probe wait, per kind of call
        steps = (draft_step, verify_fixed, verify_step)
        set_cost_policy(self, costs, self.max_len, steps, probe_every, probe_share, clock, calibrate)
        self.prior, self.decay = prior, decay
        self.nodes_per_depth, self.width = check_tree_args(nodes_per_depth, width)
        self.tracker = AcceptanceTracker(prior, decay=decay, positions=self.max_len)
        self.idle: torch.Tensor | None = None  # [B] rounds since each row last drafted
        self.wait: torch.Tensor | None = None  # [B] idle rounds before the next probe

    def begin(self, state: DecodeState) -> None:
        self.tracker.begin(state.batch_size, state.device)
        self.idle = torch.zeros(state.batch_size, dtype=torch.long, device=state.device)
        self.wait = torch.full_like(self.idle, self.probe_every)
        self.probes.begin(state.batch_size, state.sampling)

    def lengths(self, expected: torch.Tensor, batch_size: int) -> torch.Tensor:
        """``[B]`` long: each row's length for expected tokens ``expected [B, K + 1]`` (``E(0..K)``) at
        ``batch_size`` (no probing)."""
        s = speedups(expected, cost_at(self._costs, batch_size), self._scale())  # [B, K + 1]
        k_star = self._batch_length(s)
        allowed = torch.arange(self.max_len + 1, device=expected.device) <= k_star
        return s.masked_fill(~allowed, -1.0).argmax(-1)

    def _batch_length(self, s: torch.Tensor) -> torch.Tensor:
        """The batch's ``k*`` from the rows' speedups ``s [B, K + 1]``: goodput up to the constant ``T(0)``, summed
        over rows, or the slowest row's (which ends a static batch)."""
        return (s.sum(0) if self.batch == "sum" else s.min(0).values).argmax()

    def plan(self, state: DecodeState) -> DraftBudget:
        if self.idle is None or self.idle.shape[0] != state.batch_size:
            self.begin(state)
        timer = self.probes.timer
        if timer is not None:
            timer.lap(self._costs)
        t = self.tracker
        k = self.lengths(
            t.expected(self.max_len) if self.positional else expected_tokens(t.alpha, self.max_len), state.batch_size
        )
        if timer is not None and not timer.knows_plain:  # the first round of a call is plain: the reference
            k = torch.zeros_like(k)
        merit = k.where(t.tested.sum(1) > 0, 0)  # lengths from this call's evidence (a fresh row's: its prior's)
        if self.probe_every:
            if self.probes.wait > self.probe_every:  # probes of this kind of call failed: the prior's draft waits too
                k = merit
            k = self._probes(k, t, state.batch_size)
        # one host read: the lengths (the budget's mirrors; their maximum lets a round where every row is at 0 skip
        # the drafter entirely) and the longest length on merit
        *host, merit_longest = torch.cat([k, merit.max()[None]]).tolist()
        longest = max(host, default=0)
        if self.probe_every:
            priced = self.probes.price.lap(plain=longest == 0, probe=longest > 0 and merit_longest == 0)
            self.probes.wait = max(self.probes.wait, priced)  # the last probe's price
            self._count_quiet(longest, merit_longest)
        if self.probes.timer is not None:
            self.probes.timer.start(longest, state.batch_size)
        return length_budget(k, None, self.nodes_per_depth, self.width, host=host)

    def _probes(self, k: torch.Tensor, tracker: AcceptanceTracker, batch_size: int) -> torch.Tensor:
        """``k [B]`` with probes: a row held at 0 for its ``wait`` idle rounds drafts one token (doubling its wait),
        only while the batch would draft at the rows' optimistic rates (the
        :meth:`~decodekit.policies.acceptance.AcceptanceTracker.upper` bounds, under the batch objective: a probe that
        could not change the batch's length measures nothing useful), and only in a round that verifies a draft
        anyway or once the batch has gone ``probes.wait`` rounds without one: in a batch a probe costs every row a
        verification position, so the rows' probes are gathered into few rounds."""
        due = (k == 0) & (self.idle >= self.wait)
        if self.probes.idle < self.probes.wait:
            due &= k.max() > 0
        cost = cost_at(self._costs, batch_size)
        due &= self._batch_length(speedups(expected_tokens(tracker.upper(), self.max_len), cost, self._scale())) > 0
        self.wait = torch.where(due, (2 * self.wait).clamp(max=64 * self.probe_every), self.wait)
        self.wait = torch.where(k > 0, self.probe_every, self.wait)
        return torch.where(due, 1, k)

    def _count_quiet(self, longest: int, merit: int) -> None:
        """The batch's probe clock: rounds without a draft since the last probe round; a round drafting only probes
        (or rows without evidence yet, on their prior) doubles the wait (up to 64x), a round drafting on the merits
        of this call's evidence restarts it."""
        if merit > 0:
            self.probes.idle, self.probes.wait = 0, self.probe_every
        elif longest > 0:
            self.probes.idle, self.probes.wait = 0, min(2 * self.probes.wait, 64 * self.probe_every)
        else:
            self.probes.idle += 1

    def _scale(self) -> torch.Tensor | None:
        return None if self.probes.timer is None else self.probes.timer.scale(self.max_len)

    def observe(self, state: DecodeState, round: Round) -> None:
        drafted = round.draft.num_valid
        self.tracker.update(drafted, round.verdict.num_accepted)
        self.idle = torch.where(drafted > 0, 0, self.idle + 1)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.tracker.select_rows(rows)
        if self.idle is not None:
            self.idle, self.wait = self.idle[rows], self.wait[rows]
