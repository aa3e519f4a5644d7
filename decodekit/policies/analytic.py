"""The analytic model of speculative decoding speed (``policies.md`` section 0), in one place for the policies that
choose a length from it (``goodput``, ``batch_aware``, ``kld_stability``) and for the benchmark's oracle column.

Per row and round a chain of ``k`` drafted tokens commits ``E(k)`` tokens in expectation; a round costs ``T(k)``
seconds (draft, verify and the loop's own bookkeeping, at the batch size it runs at); plain decoding commits one
token per ``T(0)``. The speedup of length ``k`` is ``S(k) = E(k) * T(0) / T(k)``. With a per-token acceptance rate
``alpha`` (i.i.d.), ``E(k) = 1 + alpha + ... + alpha^k``; with per-position survival rates ``A_j`` (the probability
that the first ``j`` drafts all pass), ``E(k) = 1 + A_1 + ... + A_k``.

Shapes: ``R`` rows, ``K`` the longest length considered (lengths ``0..K``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from decodekit.checks import check_float, check_int, describe
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.policies.acceptance import AcceptanceTracker


def expected_tokens(alpha: torch.Tensor | float, max_len: int) -> torch.Tensor:
    """``[..., K + 1]`` float64: ``E(k) = sum_{j <= k} alpha^j`` for ``k = 0..max_len``, for each ``alpha [...]``
    (clamped to [0, 1]; exact at ``alpha = 1``, where ``E(k) = k + 1``)."""
    alpha = torch.as_tensor(alpha, dtype=torch.float64).clamp(0.0, 1.0)
    powers = alpha[..., None] ** torch.arange(max_len + 1, dtype=torch.float64, device=alpha.device)
    return powers.cumsum(-1)


def expected_tokens_positional(survival: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """``[K + 1]`` float64: ``E(k) = 1 + A_1 + ... + A_k`` from the survival rates ``A_1..A_K`` (``A_j``: the
    probability that the first ``j`` drafts all pass; vLLM's ``accepted_at_pos_j / drafted_at_pos_j``)."""
    a = torch.as_tensor(survival, dtype=torch.float64).clamp(0.0, 1.0)
    return torch.cat([a.new_ones(1), 1.0 + a.cumsum(0)])


@dataclass(frozen=True)
class CostModel:
    """Seconds per round as a function of the draft length, at one batch size.

    Attributes:
        draft: ``draft[k]``: the drafter's time in a round drafting ``k`` tokens per row (``draft[0]`` = 0 or the
            cost of looking, e.g. an n-gram search that found nothing).
        verify: ``verify[k]``: the target's time to score ``k + 1`` positions per row (``verify[0]``: one plain
            decoding step).
        overhead: the loop's own time per round (bookkeeping), the same for every ``k``.

    Lengths past the table extrapolate linearly from its last two entries.
    """

    draft: tuple[float, ...]
    verify: tuple[float, ...]
    overhead: float = 0.0

    def __post_init__(self) -> None:
        if len(self.verify) < 1 or len(self.draft) != len(self.verify):
            raise ConfigError(
                f"CostModel needs draft and verify times for k = 0..K, the same number of each; got "
                f"{len(self.draft)} and {len(self.verify)}"
            )
        for name in ("draft", "verify"):
            if any(not t >= 0 for t in getattr(self, name)):
                raise ConfigError(f"CostModel.{name} times must be >= 0 seconds, got {getattr(self, name)}")
        if not self.verify[0] + self.overhead > 0:
            raise ConfigError("CostModel.verify[0] + overhead (one plain decoding step) must be > 0 seconds")

    @classmethod
    def relative(
        cls, draft_step: float, max_len: int, verify_step: float = 0.0, verify_fixed: float = 0.0
    ) -> CostModel:
        """Costs in units of one plain decoding step: each drafted token costs ``draft_step`` to draft (``c``);
        verifying ``k > 0`` tokens costs ``v(k) = 1 + verify_fixed + verify_step * k`` (0, 0: memory-bound
        verification, the textbook model; on a CPU a second position costs ~0.2 more and each further one ~0.015,
        ``docs/benchmarks.md``)."""
        c = check_float("draft_step", draft_step, low=0.0)
        v = check_float("verify_step", verify_step, low=0.0)
        f = check_float("verify_fixed", verify_fixed, low=0.0)
        k = range(check_int("max_len", max_len, low=0) + 1)
        return cls(tuple(c * i for i in k), tuple(1.0 + (f + v * i if i else 0.0) for i in k))

    def scaled(self, other: CostModel, weight: float) -> CostModel:
        """``(1 - weight) * self + weight * other``, entry by entry (over the shorter table): interpolation
        between two batch sizes' costs."""
        n = min(len(self.verify), len(other.verify))

        def mix(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
            return tuple((1 - weight) * x + weight * y for x, y in zip(a[:n], b[:n]))

        overhead = (1 - weight) * self.overhead + weight * other.overhead
        return CostModel(mix(self.draft, other.draft), mix(self.verify, other.verify), overhead)

    @property
    def max_len(self) -> int:
        return len(self.verify) - 1

    def round_time(self, k: int | torch.Tensor) -> torch.Tensor:
        """``T(k)`` in seconds (float64, the shape of ``k``)."""
        k = torch.as_tensor(k, dtype=torch.float64)
        return self._at(self.draft, k) + self._at(self.verify, k) + self.overhead

    def times(self, max_len: int) -> torch.Tensor:
        """``[K + 1]`` float64: ``T(0), ..., T(max_len)`` (cached per table and length: policies read it every
        round; do not modify it in place)."""
        return _times(self, max_len)

    @staticmethod
    def _at(table: tuple[float, ...], k: torch.Tensor) -> torch.Tensor:
        t = torch.tensor(table, dtype=torch.float64)
        if len(table) == 1:
            return t[0].expand_as(k).clone()
        inside = t[k.long().clamp(0, len(table) - 1)]
        slope = t[-1] - t[-2]
        return torch.where(k > len(table) - 1, t[-1] + slope * (k - (len(table) - 1)), inside)


@functools.lru_cache(maxsize=256)
def _times(cost: CostModel, max_len: int) -> torch.Tensor:
    return cost.round_time(torch.arange(max_len + 1))


MEASURED = "measured"  # costs=MEASURED: filled in by the benchmark from its profile of the drafter


def set_costs(
    policy: object,
    costs: CostModel | Mapping[int, CostModel] | str | None,
    max_len: int,
    draft_step: float,
    verify_fixed: float,
    verify_step: float,
) -> None:
    """The cost arguments of a policy that chooses lengths from costs (``goodput``, ``batch_aware``), checked and
    set on it: ``costs``, ``draft_step``, ``verify_fixed``, ``verify_step`` as given, and ``_costs``, the model it
    uses (``costs``, or ``CostModel.relative`` from the three step costs when ``costs`` is None).

    ``costs="measured"`` leaves ``_costs`` unset until :func:`use_measured_costs` gives it a table (the benchmark
    does, from its profile of the method's drafter: ``python -m decodekit bench ... oracle=<max_len>``)."""
    policy.draft_step = check_float("draft_step", draft_step, low=0.0)  # type: ignore[attr-defined]
    policy.verify_fixed = check_float("verify_fixed", verify_fixed, low=0.0)  # type: ignore[attr-defined]
    policy.verify_step = check_float("verify_step", verify_step, low=0.0)  # type: ignore[attr-defined]
    if isinstance(costs, str) and costs != MEASURED:
        raise ConfigError(f"costs must be a CostModel, {{batch size: CostModel}}, None or {MEASURED!r}, got {costs!r}")
    given = [] if costs is None or isinstance(costs, str) else [costs]
    models = list(costs.values()) if isinstance(costs, Mapping) else given
    bad = next((c for c in models if not isinstance(c, CostModel)), None)
    if bad is not None:  # a class (CostModel itself) or another object would fail deep in plan()
        fix = "; pass an instance, e.g. CostModel.relative(...) or profile_costs(...)" if isinstance(bad, type) else ""
        raise ConfigTypeError(
            f"costs must be a CostModel, {{batch size: CostModel}}, None or {MEASURED!r}, got {describe(bad)}{fix}"
        )
    policy.costs = costs  # type: ignore[attr-defined]
    model = costs if costs is not None else CostModel.relative(draft_step, max_len, verify_step, verify_fixed)
    policy._costs = None if costs == MEASURED else model  # type: ignore[attr-defined]


def wants_measured_costs(policy: object) -> bool:
    """Whether ``policy`` (or a part of a :class:`~decodekit.policies.Stack`) was built with ``costs="measured"``."""
    parts = getattr(policy, "policies", (policy,))
    return any(getattr(p, "costs", None) == MEASURED for p in parts)


def use_measured_costs(policy: object, costs: CostModel | Mapping[int, CostModel]) -> None:
    """Give ``costs`` to ``policy`` and every part of it that was built with ``costs="measured"``."""
    for part in getattr(policy, "policies", (policy,)):
        if getattr(part, "costs", None) == MEASURED:
            part._costs = costs  # type: ignore[attr-defined]


def cost_at(costs: CostModel | Mapping[int, CostModel] | None, batch_size: int) -> CostModel:
    """The cost model at ``batch_size``: ``costs`` itself, or from a table ``{batch size: CostModel}`` the entry,
    linearly interpolated between the nearest measured batch sizes (the nearest one outside their range)."""
    if isinstance(costs, CostModel):
        return costs
    if costs is None:
        raise ConfigError(
            "this policy was built with costs='measured' and has no costs yet: run it in the benchmark with "
            "oracle=<max_len> (which profiles its drafter), or pass costs=profile_costs(model, drafter, prompts, "
            "batch_sizes=[...])"
        )
    if not costs:
        raise ConfigError("the cost table is empty: give a CostModel per measured batch size, e.g. {1: ..., 8: ...}")
    sizes = sorted(costs)
    if batch_size <= sizes[0] or batch_size >= sizes[-1]:
        return costs[sizes[0] if batch_size <= sizes[0] else sizes[-1]]
    high = next(b for b in sizes if b >= batch_size)
    low = max(b for b in sizes if b <= batch_size)
    if low == high:
        return costs[low]
    return costs[low].scaled(costs[high], (batch_size - low) / (high - low))


def speedups(expected: torch.Tensor, cost: CostModel, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``[..., K + 1]`` float64: ``S(k) = E(k) * T(0) / T(k)`` for the expected tokens ``expected [..., K + 1]``,
    the round times ``T`` multiplied by ``scale [K + 1]`` when given (a correction measured online)."""
    times = cost.times(expected.shape[-1] - 1).to(expected.device)
    if scale is not None:
        times = times * scale.to(times)
    return expected * times[0] / times


def best_length(
    expected: torch.Tensor, cost: CostModel, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The length maximising ``S(k)`` over ``k = 0..K`` (ties: the shorter) and its speedup, per row:
    ``(k* [...] long, S(k*) [...] float64)`` for ``expected [..., K + 1]`` (round times corrected by ``scale``
    as in :func:`speedups`). ``k* = 0`` means do not speculate."""
    s = speedups(expected, cost, scale)
    best = s.max(-1, keepdim=True).values
    k = (s >= best * (1 - 1e-12)).long().argmax(-1)  # the first (shortest) maximiser
    return k, best[..., 0]


def oracle_speedup(max_accepted: Sequence[int], plain_rounds: int, plain_steps: int, cost: CostModel) -> float:
    """The oracle-length bound of ``policies.md`` section 11: the speedup over plain decoding had every round
    drafted exactly the tokens it went on to accept (no wasted draft steps or verified positions), at the measured
    costs. Accept outcomes are the measured ones; only the lengths change.

    Args:
        max_accepted: per round that drafted, the most tokens any row accepted (a batched round costs as its
            longest row).
        plain_rounds: rounds that drafted nothing (each costs ``T(0)``).
        plain_steps: the rounds plain decoding needs for the same output (per call, the longest row's tokens
            after prefill).
        cost: the method's costs at its batch size.

    Returns ``plain_steps * T(0) / sum_r T(l_r)``.
    """
    total = cost.round_time(torch.tensor(list(max_accepted), dtype=torch.float64)).sum() + plain_rounds * float(
        cost.round_time(0)
    )
    return float(plain_steps * cost.round_time(0) / total) if total > 0 else 1.0


def could_pay(
    tracker: AcceptanceTracker, cost: CostModel, max_len: int, z: float = 2.0, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """``[R]`` bool: whether some length ``1..max_len`` would beat plain decoding at an optimistic acceptance, the
    upper end of each row's estimate (:meth:`AcceptanceTracker.upper`). A row held at ``k = 0`` is worth a probe
    only then: where even the optimistic rate cannot pay (a large batch whose plain step is already efficient, a
    drafter nearly as slow as the target), a probe measures nothing that could change the length and costs a
    round's draft and verification positions, plus a draft model's catch-up. ``scale``: the measured correction of
    the round times (:meth:`~decodekit.policies.calibration.RoundClock.scale`)."""
    return best_length(expected_tokens(tracker.upper(z), max_len), cost, scale)[0] > 0
