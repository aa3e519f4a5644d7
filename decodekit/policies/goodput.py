"""SmartSpec's goodput rule: the draft length that maximises committed tokens per second, k = 0 allowed."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_int
from decodekit.errors import ConfigError
from decodekit.policies.acceptance import AcceptanceTracker
from decodekit.policies.analytic import CostModel, cost_at, could_pay, expected_tokens, set_costs, speedups
from decodekit.policies.lengths import check_tree_args, length_budget
from decodekit.registry import register
from decodekit.state import DecodeState
from decodekit.types import DraftBudget

if TYPE_CHECKING:
    from decodekit.round import Round


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
    verification position and, for a draft model, a catch-up forward; and a row probes only while drafting could
    pay at its optimistic rate (:func:`~decodekit.policies.analytic.could_pay`).

    ``calibrate=True`` corrects the cost model online: the wall time between two ``plan`` calls is a round's real
    time (the host read below ends each plan, so this holds on a GPU too); its ratio to the model's ``T(B, k_max)``
    is smoothed separately for rounds that drafted and rounds that did not, and ``T(k > 0)`` is scaled by the first
    ratio, ``T(0)`` by the second (the first round of each call drafts nothing, to measure the second). Costs the
    profile misses (a batch whose rows accepted different lengths pads the verification; the draft model catching
    up after rounds without a draft) then count against drafting.

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
        positional: bool = True,
        batch: str = "slowest",
        calibrate: bool = False,
        nodes_per_depth: int = 1,
        width: int | None = None,
    ) -> None:
        self.max_len = check_int("max_len", max_len, low=1, hint=" (the longest draft)")
        self.positional = bool(positional)
        if batch not in ("slowest", "sum"):
            raise ConfigError(f"batch must be 'slowest' or 'sum', got {batch!r}")
        self.batch = batch
        set_costs(self, costs, self.max_len, draft_step, verify_fixed, verify_step)
        self.prior, self.decay = prior, decay
        self.probe_every = check_int("probe_every", probe_every, low=0, hint=" (0 = never probe)")
        self.nodes_per_depth, self.width = check_tree_args(nodes_per_depth, width)
        self.tracker = AcceptanceTracker(prior, decay=decay, positions=self.max_len)
        self.idle: torch.Tensor | None = None  # [B] rounds since each row last drafted
        self.wait: torch.Tensor | None = None  # [B] idle rounds before the next probe
        self.calibrate, self.clock = bool(calibrate), time.perf_counter
        self.ratios: list[float | None] = [None, None]  # measured / modelled round time, without and with a draft
        self._last: tuple[float, int, int] | None = None  # (clock, longest length, batch size) at the last plan

    def begin(self, state: DecodeState) -> None:
        self.tracker.begin(state.batch_size, state.device)
        self.idle = torch.zeros(state.batch_size, dtype=torch.long, device=state.device)
        self.wait = torch.full_like(self.idle, self.probe_every)
        self.ratios, self._last = [None, None], None

    def lengths(self, expected: torch.Tensor, batch_size: int) -> torch.Tensor:
        """``[B]`` long: each row's length for expected tokens ``expected [B, K + 1]`` (``E(0..K)``) at
        ``batch_size`` (no probing)."""
        s = speedups(expected, cost_at(self._costs, batch_size), self._scale())  # [B, K + 1]
        # goodput up to the constant T(0): summed over rows, or the slowest row's (which ends a static batch)
        k_star = (s.sum(0) if self.batch == "sum" else s.min(0).values).argmax()
        allowed = torch.arange(self.max_len + 1, device=expected.device) <= k_star
        return s.masked_fill(~allowed, -1.0).argmax(-1)

    def plan(self, state: DecodeState) -> DraftBudget:
        if self.idle is None or self.idle.shape[0] != state.batch_size:
            self.begin(state)
        if self.calibrate:
            self._time_last_round()
        t = self.tracker
        k = self.lengths(
            t.expected(self.max_len) if self.positional else expected_tokens(t.alpha, self.max_len), state.batch_size
        )
        if self.probe_every:  # a row held at 0 drafts one token after `wait` idle rounds; each probe doubles `wait`
            cost = cost_at(self._costs, state.batch_size)
            probe = (k == 0) & (self.idle >= self.wait) & could_pay(t, cost, self.max_len)
            self.wait = torch.where(probe, (2 * self.wait).clamp(max=64 * self.probe_every), self.wait)
            self.wait = torch.where(k > 0, self.probe_every, self.wait)
            k = torch.where(probe, 1, k)
        if self.calibrate and self.ratios[0] is None:  # the first round of a call is plain: the reference time
            k = torch.zeros_like(k)
        # one host read: the exact longest length, so a round where every row is at 0 skips the drafter entirely
        longest = int(k.max())
        if self.calibrate:
            self._last = (self.clock(), longest, state.batch_size)
        return length_budget(k, longest, self.nodes_per_depth, self.width)

    def _time_last_round(self) -> None:
        """Fold the last round's measured time into the ratio of its kind (drafted or not)."""
        if self._last is None:
            return
        start, longest, batch_size = self._last
        ratio = (self.clock() - start) / float(cost_at(self._costs, batch_size).round_time(longest))
        kind = int(longest > 0)
        old = self.ratios[kind]
        self.ratios[kind] = ratio if old is None else 0.7 * old + 0.3 * ratio

    def _scale(self) -> torch.Tensor | None:
        """``[K + 1]`` the measured correction of ``T(0..K)`` (None: no calibration or nothing measured yet)."""
        plain, drafting = self.ratios
        if not self.calibrate or (plain is None and drafting is None):
            return None
        plain = drafting if plain is None else plain
        drafting = plain if drafting is None else drafting
        return torch.tensor([plain] + [drafting] * self.max_len, dtype=torch.float64)

    def observe(self, state: DecodeState, round: Round) -> None:
        drafted = round.draft.num_valid
        self.tracker.update(drafted, round.verdict.num_accepted)
        self.idle = torch.where(drafted > 0, 0, self.idle + 1)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.tracker.select_rows(rows)
        if self.idle is not None:
            self.idle, self.wait = self.idle[rows], self.wait[rows]
