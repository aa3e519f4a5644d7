"""DSDE (Yang et al. 2025): draft longer where the draft-target KL divergence has been stable, shorter where it has
been volatile, under a batch-level cap against stragglers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_float, check_int
from decodekit.errors import ConfigError
from decodekit.policies.analytic import AcceptanceTracker, CostModel, best_length, cost_at, expected_tokens, set_costs
from decodekit.policies.lengths import batch_cap, check_batch_cap, check_tree_args, length_budget
from decodekit.registry import register
from decodekit.state import DecodeState
from decodekit.types import DraftBudget

if TYPE_CHECKING:
    from decodekit.round import Round

_HISTORY = 1024  # variances kept for the running median (sigma0 = None)


@register("policy", "kld_stability")
class KLDStability:
    """DSDE's KL-stability length (Yang, Choi, Moon, Jang, Jeon 2025, arXiv 2509.01083).

    After each round, every drafted node's ``KL(p || q)`` (target against drafter over the whole vocabulary) is read
    from :attr:`Round.kl` (``needs = {"kl"}``: the loop computes it once, nobody recomputes it) into a per-row ring
    buffer of the last ``window`` values. Each round, per row:

    * ``base``: the best length ``k*`` of the analytic model (``policies.md`` section 0) at the row's acceptance
      estimate (:class:`~decodekit.policies.analytic.AcceptanceTracker`) and the cost model, at least 1;
    * ``g = 2 s0 / (s0 + var)``, ``var`` the buffer's sample variance and ``s0`` a reference variance (``sigma0``,
      or the running median of the variances seen so far): 1 at the reference, up to 2 when the KL is steady,
      towards 0 when it swings;
    * ``SL = clip(round(base * g), 1, max_len)`` (``initial`` until the buffer holds two values);

    then ``batch_cap`` caps every row at the batch's ``ceil(mean SL)`` (or a quantile): a chain round costs as many
    draft steps as its longest row, so one straggler would hold back the batch.

    Faithfulness: the signal (variance of the draft-target KL over recent positions) and the batch cap follow the
    paper's description; **the mapping from variance to length and the cap's aggregate are reconstructions**
    (``policies.md`` section 3).

    No host syncs: the buffer, the median and the cap stay on the device; the budget's bound is ``max_len``. The KL
    needs the drafter's distributions (``Draft.q`` or ``draft_probs``: ``ModelDrafter`` reports them); with a drafter
    that reports none (n-gram) the KL is NaN and every row stays at ``initial``.

    Args:
        window: KL values kept per row (``W``).
        max_len, initial: the longest draft and the length before there is any history (None = 4 or ``max_len``).
        sigma0: the reference variance ``s0``; None = the running median of the rows' variances in the call.
        batch_cap: ``"mean"`` (default), a quantile in ``[0, 1]``, or None / ``"max"`` for no cap.
        costs, draft_step, verify_fixed, verify_step: the cost model that sets ``base`` (as for
            :class:`~decodekit.policies.GoodputLength`).
        prior, decay: the acceptance estimate's prior and per-round decay.
        nodes_per_depth, width: tree budgets (:func:`~decodekit.policies.lengths.length_budget`).
    """

    needs = frozenset({"kl"})

    def __init__(
        self,
        window: int = 32,
        max_len: int = 8,
        initial: int | None = None,
        sigma0: float | None = None,
        batch_cap: str | float | None = "mean",
        costs: CostModel | Mapping[int, CostModel] | str | None = None,
        draft_step: float = 0.0,
        verify_fixed: float = 0.0,
        verify_step: float = 0.0,
        prior: float = 0.5,
        decay: float = 0.9,
        nodes_per_depth: int = 1,
        width: int | None = None,
    ) -> None:
        self.window = check_int("window", window, low=2, hint=" (a variance needs two values)")
        self.max_len = check_int("max_len", max_len, low=1)
        self.initial = min(4, self.max_len) if initial is None else check_int("initial", initial, low=1)
        if self.initial > self.max_len:
            raise ConfigError(f"initial={initial} exceeds max_len={max_len}")
        self.sigma0 = check_float("sigma0", sigma0, low=0.0, low_open=True, optional=True)
        self.batch_cap = check_batch_cap(batch_cap)
        set_costs(self, costs, self.max_len, draft_step, verify_fixed, verify_step)
        self.nodes_per_depth, self.width = check_tree_args(nodes_per_depth, width)
        self.tracker = AcceptanceTracker(prior, decay=decay, positions=self.max_len)
        self.kl: torch.Tensor | None = None  # [B, W] recent KL values, oldest first, NaN = empty
        self.history: torch.Tensor | None = None  # [_HISTORY] recent row variances (NaN = none), for sigma0=None

    def begin(self, state: DecodeState) -> None:
        self.tracker.begin(state.batch_size, state.device)
        self.kl = torch.full((state.batch_size, self.window), float("nan"), device=state.device)
        self.history = torch.full((_HISTORY,), float("nan"), device=state.device)

    def variance(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``([B] sample variance of each row's buffer, [B] bool: it holds at least two values)``."""
        seen = self.kl.isfinite()
        n = seen.sum(1)
        values = self.kl.nan_to_num(0.0)
        mean = values.sum(1) / n.clamp(min=1)
        var = (((values - mean[:, None]) ** 2) * seen).sum(1) / (n - 1).clamp(min=1)
        return var, n >= 2

    def lengths(self, batch_size: int) -> torch.Tensor:
        """``[B]`` long: each row's ``SL``, before the batch cap."""
        expected = expected_tokens(self.tracker.alpha, self.max_len)
        base = best_length(expected, cost_at(self._costs, batch_size))[0].clamp(min=1)
        var, ready = self.variance()
        s0 = torch.tensor(self.sigma0, device=var.device) if self.sigma0 is not None else self.history.nanmedian()
        gain = 2 * s0 / (s0 + var)
        scaled = (base * gain).round().nan_to_num(float(self.initial)).clamp(1, self.max_len).long()
        return torch.where(ready & gain.isfinite(), scaled, self.initial)

    def plan(self, state: DecodeState) -> DraftBudget:
        if self.kl is None or self.kl.shape[0] != state.batch_size:
            self.begin(state)
        k = self.lengths(state.batch_size)
        cap = batch_cap(k, self.batch_cap)
        if cap is not None:
            k = k.clamp(max=cap)
        return length_budget(k, self.max_len, self.nodes_per_depth, self.width)

    def observe(self, state: DecodeState, round: Round) -> None:
        self.tracker.update(round.draft.num_valid, round.verdict.num_accepted)
        if round.kl is None:
            raise ConfigError("kld_stability reads Round.kl, which the loop did not compute (needs = {'kl'})")
        values = torch.cat([self.kl, round.kl.float()], 1)  # [B, W + N]: old then new, NaN = no value
        seen = values.isfinite()
        newest = seen & (seen.flip(1).cumsum(1).flip(1) <= self.window)  # the last W values of each row
        order = (~newest).long().sort(dim=1, stable=True).indices[:, : self.window]  # kept ones first, in order
        self.kl = values.gather(1, order).masked_fill(~newest.gather(1, order), float("nan"))
        var, ready = self.variance()
        self.history = torch.cat([self.history, var.masked_fill(~ready, float("nan"))])[-_HISTORY:]

    def select_rows(self, rows: torch.Tensor) -> None:
        self.tracker.select_rows(rows)
        if self.kl is not None:
            self.kl = self.kl[rows]
