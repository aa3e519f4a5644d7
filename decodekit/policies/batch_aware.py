"""The batch-size table of "The Synergy of Speculative Decoding and Batching": one draft length per batch size."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_float, check_int
from decodekit.policies.acceptance import AcceptanceTracker
from decodekit.policies.analytic import CostModel, best_length, cost_at, could_pay, expected_tokens
from decodekit.policies.calibration import set_cost_policy
from decodekit.policies.lengths import check_tree_args, length_budget
from decodekit.registry import register
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget, SamplingParams

if TYPE_CHECKING:
    from decodekit.spec.round import Round


@register("policy", "batch_aware")
class BatchAwareLength:
    """The draft length as a function of the live batch size (Su, Giannoula, Pekhimenko 2023, "The Synergy of
    Speculative Decoding and Batching"): ``k*(B) = argmax_k E(k) T(B, 0) / T(B, k)`` over ``k = 0..max_len`` from
    the cost model at batch size ``B`` and one acceptance rate ``alpha`` for the workload; ``k*(B) = 0`` (no
    speculation) wherever no length beats plain decoding in the model. Every row of the batch gets ``k*(B)``.

    ``alpha`` is fixed (the paper's offline table: :meth:`table`) or, with ``alpha=None``, estimated online over all
    rows pooled (one :class:`~decodekit.policies.acceptance.AcceptanceTracker` row for the whole batch, carried from
    call to call, one per sampling setting: greedy and sampled acceptance differ), so the table follows the
    workload; at ``k* = 0`` it drafts one token after ``probe_every`` idle rounds to keep measuring
    (each probe that changes nothing doubles the wait, up to 64x, and raises it to the probe's measured price,
    :class:`~decodekit.policies.calibration.ProbePrice`, which counts a draft model's catch-up; the schedule
    carries over to the next call of the same batch size and sampling settings), but only while drafting could
    pay at an optimistic rate (:func:`~decodekit.policies.analytic.could_pay`): at a batch size where the estimate
    is confidently below break-even, probes stop, so the policy costs plain decoding nothing but its bookkeeping.

    ``calibrate=True`` corrects the cost model by measured round times as ``goodput`` does
    (:class:`~decodekit.policies.calibration.RoundClock`; each call's first round drafts nothing, to time a plain
    round): a table profiled at short contexts underrates verification at the workload's longer ones.

    Host syncs: one per round (the length, read so that a round at 0 does not call the drafter at all); none with a
    fixed ``alpha`` on a CPU tracker.

    Faithfulness: the per-batch-size optimum from profiled draft and verify times with a position-independent
    acceptance rate, and switching speculation off where it cannot win, follow the paper; the online pooled
    estimate and the gated probe are ours. It is :class:`~decodekit.policies.goodput.GoodputLength` with one acceptance
    rate for all rows.

    Args:
        costs: a :class:`CostModel` or ``{batch size: CostModel}`` (measured: ``profile_costs``; ``"measured"``: the
            benchmark's profile of the drafter, with ``oracle=<max_len>``); None = the
            relative model from ``draft_step`` / ``verify_fixed`` / ``verify_step`` (units of one decoding step).
        alpha: the workload's acceptance rate; None = estimated online.
        max_len: the longest draft.
        calibrate: correct the cost model by the measured round times (above).
        probe_every, probe_share, clock, nodes_per_depth, width: as :class:`~decodekit.policies.goodput.GoodputLength`.
    """

    def __init__(
        self,
        costs: CostModel | Mapping[int, CostModel] | str | None = None,
        alpha: float | None = None,
        max_len: int = 8,
        draft_step: float = 0.0,
        verify_fixed: float = 0.0,
        verify_step: float = 0.0,
        probe_every: int = 8,
        probe_share: float = 0.03,
        calibrate: bool = False,
        nodes_per_depth: int = 1,
        width: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.max_len = check_int("max_len", max_len, low=1, hint=" (the longest draft)")
        self.alpha = check_float("alpha", alpha, low=0.0, high=1.0, optional=True, hint=" (None = measured online)")
        steps = (draft_step, verify_fixed, verify_step)
        set_cost_policy(self, costs, self.max_len, steps, probe_every, probe_share, clock, calibrate)
        self.nodes_per_depth, self.width = check_tree_args(nodes_per_depth, width)
        self.trackers: dict[SamplingParams, AcceptanceTracker] = {}  # the pooled estimate, per sampling setting
        self.tracker = AcceptanceTracker()  # the current call's (one of trackers)

    def table(self, alpha: float, batch_sizes: list[int]) -> dict[int, int]:
        """``{B: k*(B)}`` for acceptance rate ``alpha`` (the paper's offline table)."""
        rate = torch.tensor(alpha, dtype=torch.float64)
        return {
            b: int(best_length(expected_tokens(rate, self.max_len), cost_at(self._costs, b))[0]) for b in batch_sizes
        }

    def begin(self, state: DecodeState) -> None:
        self.probes.begin(state.batch_size, state.sampling)
        if state.sampling not in self.trackers:  # the pooled estimate carries over to calls with the same sampling
            self.trackers[state.sampling] = AcceptanceTracker()
            self.trackers[state.sampling].begin(1, state.device)
        self.tracker = self.trackers[state.sampling]

    def plan(self, state: DecodeState) -> DraftBudget:
        if self.tracker.passed is None:
            self.begin(state)
        scale, probes, timer = None, self.probes, self.probes.timer
        if timer is not None:
            timer.lap(self._costs)
            scale = timer.scale(self.max_len)
        rate = torch.tensor(self.alpha, dtype=torch.float64) if self.alpha is not None else self.tracker.alpha[0]
        cost = cost_at(self._costs, state.batch_size)
        k = int(best_length(expected_tokens(rate, self.max_len), cost, scale)[0])
        merit = k > 0
        probe = k == 0 and self.alpha is None and self.probe_every and probes.idle >= probes.wait
        if probe and bool(could_pay(self.tracker, cost, self.max_len, scale=scale)[0]):
            k, probes.wait = 1, min(2 * probes.wait, 64 * self.probe_every)  # re-measure; each probe doubles the wait
        elif merit:
            probes.wait = self.probe_every
        if timer is not None:
            k = k if timer.knows_plain else 0  # the first round of a call is plain: the reference time
            timer.start(k, state.batch_size)
        if self.probe_every:
            priced = probes.price.lap(plain=k == 0, probe=k > 0 and not merit)  # the last probe round's price
            if not merit:
                probes.wait = max(probes.wait, priced)
        lengths = torch.full_like(state.lengths, k)
        return length_budget(lengths, None, self.nodes_per_depth, self.width, host=(k,) * state.batch_size)

    def observe(self, state: DecodeState, round: Round) -> None:
        drafted = round.draft.num_valid
        self.probes.idle = 0 if round.draft.num_nodes else self.probes.idle + 1
        if self.alpha is None:
            self.tracker.update(drafted, round.verdict.num_accepted, pooled=True)
