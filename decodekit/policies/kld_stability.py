"""DSDE (Yang et al. 2025): draft longer where the draft-target KL divergence is low and steady, shorter where it is
high or growing volatile, under a batch-level cap against stragglers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_float, check_int
from decodekit.errors import ConfigError
from decodekit.policies.lengths import batch_cap, check_batch_cap, check_tree_args, length_budget
from decodekit.registry import register
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget

if TYPE_CHECKING:
    from decodekit.spec.round import Round


@register("policy", "kld_stability")
class KLDStability:
    """DSDE's KL-stability length (Yang, Choi, Moon, Jang, Jeon 2025, arXiv 2509.01083).

    After each round, every drafted node's ``KL(p || q)`` (target against drafter, whole vocabulary) is read from
    :attr:`Round.kl` (``needs = {"kl"}``: the loop computes it once; nobody recomputes it) into a per-row buffer of
    the last ``long`` values. The first ``calibration`` rounds of a call draft ``initial`` tokens and set, pooled
    over the batch, ``SL_max = clip(round(A_max (1 + mean KL / (max KL + eps))), min_len, max_len)`` with ``A_max``
    the most tokens any round accepted. Then per row and round:

    * ``SF = exp(2 m) - 1``, ``m`` the mean KL of the last ``short`` values (how far apart the models are now);
    * ``WVIR = var_w(last short) / var_w(last long)``, exponentially weighted variances (``decay`` per value of age):
      above 1 when the KL has grown more volatile lately;
    * ``SL = round((1 - SF * WVIR) (SL_max - min_len) + min_len)`` if ``SF * WVIR <= 1``, else ``min_len``;

    and ``batch_cap`` (default the mean, rounded up) caps every row at the batch's typical ``SL``: a chain round
    costs as many draft steps as its longest row, so one straggler would hold back the batch.

    Faithfulness: **a reconstruction from secondary sources.** The paper's text could not be read; the formulas
    above (its Eqs. 1, 3, 4, 8 and the mean cap of Eqs. 9-11, with ``short = 10``, ``long = 30``,
    ``decay = 0.85``, ``min_len = 2``) follow two public accounts that agree with each other. Ours: the KL
    direction (not stated), the pooled per-call calibration (the paper profiles before serving), ``m`` over the
    short window, and the rounding (the cap is rounded up).

    Host syncs: one per round, the batch's longest length after the cap
    (:func:`~decodekit.policies.lengths.length_budget`): buffers and calibration stay on the device, and a draft
    model runs as many steps as the longest row needs rather than ``max_len``. The KL needs the drafter's
    distributions (``ModelDrafter`` reports them); with a drafter that reports none (n-gram) the KL is NaN and
    every row stays at ``initial``. Rows with fewer than two values draft ``initial``.

    Args:
        max_len, min_len: the bounds of ``SL`` (``SL_max <= max_len``; ``min_len``: the paper's ``SL_min``).
        initial: the length of the calibration rounds and of rows without history.
        calibration: rounds per call that set ``SL_max``.
        short, long, decay: the two windows (KL values per row) and the weight decay of the variances.
        batch_cap: ``"mean"`` (default), a quantile in ``[0, 1]``, or None / ``"max"`` for no cap.
        nodes_per_depth, width: tree budgets (:func:`~decodekit.policies.lengths.length_budget`).
    """

    needs = frozenset({"kl"})

    def __init__(
        self,
        max_len: int = 10,
        min_len: int = 2,
        initial: int = 4,
        calibration: int = 4,
        short: int = 10,
        long: int = 30,
        decay: float = 0.85,
        batch_cap: str | float | None = "mean",
        nodes_per_depth: int = 1,
        width: int | None = None,
    ) -> None:
        self.max_len = check_int("max_len", max_len, low=1)
        self.min_len = check_int("min_len", min_len, low=1, hint=" (SL_min)")
        self.initial = check_int("initial", initial, low=1)
        if not self.min_len <= self.initial <= self.max_len:
            raise ConfigError(f"need min_len <= initial <= max_len, got {min_len}, {initial}, {max_len}")
        self.calibration = check_int("calibration", calibration, low=1, hint=" (rounds that set SL_max)")
        self.short = check_int("short", short, low=2, hint=" (a variance needs two values)")
        self.long = check_int("long", long, low=self.short, hint=f" (at least short={self.short})")
        self.decay = check_float("decay", decay, low=0.0, high=1.0, low_open=True)
        self.batch_cap = check_batch_cap(batch_cap)
        self.nodes_per_depth, self.width = check_tree_args(nodes_per_depth, width)
        self.kl: torch.Tensor | None = None  # [B, long] recent KL values, oldest first, NaN = empty
        self.rounds = 0  # rounds observed in this call (host counter: no sync)
        self.calib: torch.Tensor | None = None  # [4] float64: most accepted, KL sum, KL count, largest KL
        self.sl_max: torch.Tensor | None = None  # 0-d long, after calibration

    def begin(self, state: DecodeState) -> None:
        self.kl = torch.full((state.batch_size, self.long), float("nan"), device=state.device)
        self.rounds, self.sl_max = 0, None
        self.calib = torch.zeros(4, dtype=torch.float64, device=state.device)

    def statistics(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``([B] SF, [B] WVIR, [B] bool: at least two values in the short window)``."""
        seen = self.kl.isfinite()
        age = seen.flip(1).cumsum(1).flip(1) - 1  # 0 for each row's newest value
        weights = torch.where(seen, self.decay ** age.double(), 0.0)
        values = self.kl.double().nan_to_num(0.0)
        short_w = weights * (age < self.short)
        mean, var_short = _weighted(values, short_w)
        var_long = _weighted(values, weights)[1]
        ready = (seen & (age < self.short)).sum(1) >= 2
        return torch.expm1(2 * mean), var_short / var_long, ready

    def lengths(self) -> torch.Tensor:
        """``[B]`` long: each row's ``SL`` this round, before the batch cap."""
        if self.sl_max is None:  # calibrating
            return torch.full((self.kl.shape[0],), self.initial, dtype=torch.long, device=self.kl.device)
        sf, wvir, ready = self.statistics()
        x = (sf * wvir).nan_to_num(0.0)  # a flat KL (0 / 0 variance ratio): fully stable
        sl = ((1 - x) * (self.sl_max - self.min_len) + self.min_len).round().long()
        sl = torch.where(x <= 1, sl, self.min_len)
        return torch.where(ready, sl, self.initial).clamp(self.min_len, self.max_len)

    def plan(self, state: DecodeState) -> DraftBudget:
        if self.kl is None or self.kl.shape[0] != state.batch_size:
            self.begin(state)
        k = self.lengths()
        cap = batch_cap(k, self.batch_cap)
        if cap is not None:
            k = k.clamp(max=cap)
        return length_budget(k, None, self.nodes_per_depth, self.width)

    def observe(self, state: DecodeState, round: Round) -> None:
        if round.kl is None:
            raise ConfigError("kld_stability reads Round.kl, which the loop did not compute (needs = {'kl'})")
        new = round.kl.float()
        values = torch.cat([self.kl, new], 1)  # [B, long + N]: old then new, NaN = no value
        seen = values.isfinite()
        newest = seen & (seen.flip(1).cumsum(1).flip(1) <= self.long)  # the last `long` values of each row
        order = (~newest).long().sort(dim=1, stable=True).indices[:, : self.long]  # kept ones first, in order
        self.kl = values.gather(1, order).masked_fill(~newest.gather(1, order), float("nan"))
        self.rounds += 1
        if self.sl_max is None:
            self._calibrate(new, round.verdict.num_accepted)

    def _calibrate(self, kl: torch.Tensor, accepted: torch.Tensor) -> None:
        """Pool a calibration round (``kl [B, N]``, ``accepted [B]``) into the most tokens accepted, the KL sum and
        count and the largest KL; after the last one, set ``SL_max``."""
        values = torch.cat([kl.double().nan_to_num(0.0), kl.new_zeros(kl.shape[0], 1, dtype=torch.float64)], 1)
        stats = torch.stack([accepted.double().amax(), values.sum(), kl.isfinite().sum().double(), values.amax()])
        summed = torch.tensor([False, True, True, False], device=stats.device)
        self.calib = torch.where(summed, self.calib + stats, torch.maximum(self.calib, stats))
        if self.rounds >= self.calibration:
            most, total, count, largest = self.calib
            sl_max = (most * (1 + total / count.clamp(min=1) / (largest + 1e-6))).round().long()
            self.sl_max = sl_max.clamp(self.min_len, self.max_len)

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.kl is not None:
            self.kl = self.kl[rows]


def _weighted(values: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the weighted mean and variance of ``values [B, W]`` under ``weights [B, W]`` (0 = not counted)."""
    total = weights.sum(1).clamp(min=1e-30)
    mean = (weights * values).sum(1) / total
    return mean, (weights * (values - mean[:, None]) ** 2).sum(1) / total
