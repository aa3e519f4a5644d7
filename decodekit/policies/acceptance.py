"""Online acceptance estimates for the length policies that choose a length from the analytic model
(:mod:`decodekit.policies.analytic`): per row or pooled, i.i.d. or per position, with an optimistic bound."""

from __future__ import annotations

import torch

from decodekit.checks import check_float, check_int
from decodekit.errors import ConfigError


class AcceptanceTracker:
    """Per-row acceptance estimated online, robust to rounds ending at the first rejection.

    A chain round that drafted ``k`` and accepted ``a`` tested draft positions ``1..min(a + 1, k)`` and passed
    ``1..a``. Per row and position ``j`` the tracker keeps those counts, exponentially decayed by ``decay`` per round
    the row drafted. Two estimates (``policies.md`` section 0):

    * :attr:`alpha`, the i.i.d. rate: ``(prior * w + sum passed) / (w + sum tested)`` over all positions (never
      ``sum a / sum k``, biased low);
    * :meth:`expected`, position by position: the conditional rate ``beta_j = (alpha * w + passed_j) /
      (w + tested_j)`` (shrunk towards the row's ``alpha`` where position ``j`` has few tests), and
      ``E(k) = 1 + sum_{j <= k} prod_{i <= j} beta_i``. Acceptance is bursty (a prompt-lookup match that starts
      right tends to go on), which the i.i.d. rate cannot express.

    Rows that drafted nothing keep their estimate. Shapes: ``R`` live rows, ``P = positions`` tracked positions
    (deeper ones use ``alpha``); :meth:`select_rows` follows the batch as rows finish.
    """

    def __init__(self, prior: float = 0.5, weight: float = 1.0, decay: float = 0.9, positions: int = 16) -> None:
        self.prior = check_float("prior", prior, low=0.0, high=1.0)
        self.weight = check_float("weight", weight, low=0.0, low_open=True, hint=" (pseudo-rounds of the prior)")
        self.decay = check_float("decay", decay, low=0.0, high=1.0, low_open=True)
        self.positions = check_int("positions", positions, low=1)
        self.passed: torch.Tensor | None = None  # [R, P]
        self.tested: torch.Tensor | None = None  # [R, P]

    def begin(self, rows: int, device: torch.device) -> None:
        self.passed = torch.zeros(rows, self.positions, dtype=torch.float64, device=device)
        self.tested = torch.zeros(rows, self.positions, dtype=torch.float64, device=device)

    def update(self, drafted: torch.Tensor, accepted: torch.Tensor, pooled: bool = False) -> None:
        """One round: ``drafted [R]`` valid draft tokens and ``accepted [R]`` of them, per row. ``pooled``: add the
        rows' counts into one estimate (a tracker begun with one row) instead of one per row."""
        drew = drafted > 0
        j = torch.arange(1, self.positions + 1, device=drafted.device)
        passed = ((j <= accepted[:, None]) & drew[:, None]).double()
        tested = ((j <= torch.minimum(accepted + 1, drafted)[:, None]) & drew[:, None]).double()
        if pooled:
            passed, tested, drew = passed.sum(0, keepdim=True), tested.sum(0, keepdim=True), drew.any()[None]
        if self.passed is None or self.tested is None:
            self.begin(passed.shape[0], passed.device)
        keep = torch.where(drew, self.decay, 1.0)[:, None]
        self.passed = self.passed * keep + passed
        self.tested = self.tested * keep + tested

    def _counts(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.passed is None or self.tested is None:
            raise ConfigError("AcceptanceTracker read before begin() or update()")
        return self.passed, self.tested

    @property
    def alpha(self) -> torch.Tensor:
        """``[R]`` float64 i.i.d. rate (the prior before any observation)."""
        passed, tested = self._counts()
        return (self.prior * self.weight + passed.sum(1)) / (self.weight + tested.sum(1))

    def expected(self, max_len: int) -> torch.Tensor:
        """``[R, K + 1]`` float64: ``E(0..max_len)`` from the per-position rates (``alpha`` past ``positions``)."""
        passed, tested = self._counts()
        alpha = self.alpha
        beta = (alpha[:, None] * self.weight + passed) / (self.weight + tested)  # [R, P]
        if max_len > self.positions:
            beta = torch.cat([beta, alpha[:, None].expand(-1, max_len - self.positions)], 1)
        survival = beta[:, :max_len].cumprod(1)
        return torch.cat([torch.ones_like(alpha)[:, None], 1.0 + survival.cumsum(1)], 1)

    def upper(self, z: float = 2.0) -> torch.Tensor:
        """``[R]`` float64: an optimistic :attr:`alpha`, the upper end of its Wilson score interval at ``z``
        standard deviations, counting the prior's ``weight`` and the decayed tests as trials (1 before any)."""
        _, tested = self._counts()
        n, p = self.weight + tested.sum(1), self.alpha
        centre, spread = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)).sqrt()
        return ((centre + spread) / (1 + z * z / n)).clamp(max=1.0)

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.passed is not None and self.tested is not None:
            self.passed, self.tested = self.passed[rows], self.tested[rows]
