"""Per-row lengths to a draft budget: the one conversion every adaptive policy uses, for chains and tree budgets."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from decodekit.checks import check_float, check_int
from decodekit.draft import Draft
from decodekit.draft.budget import DraftBudget, DraftStep
from decodekit.errors import ConfigError

BATCH_CAPS = ("mean", "max")


def check_tree_args(nodes_per_depth: int, width: int | None) -> tuple[int, int | None]:
    """Validated ``(nodes_per_depth, width)`` of an adaptive policy's tree budget."""
    nodes_per_depth = check_int(
        "nodes_per_depth", nodes_per_depth, low=1, hint=" (1 = chains; r > 1: a tree of r nodes per depth level)"
    )
    return nodes_per_depth, check_int("width", width, low=1, optional=True, hint=" (None = no cap)")


def length_budget(
    lengths: torch.Tensor,
    bound: int | None = None,
    nodes_per_depth: int = 1,
    width: int | None = None,
    stop: Callable[[DraftStep], torch.Tensor] | None = None,
    host: Sequence[int] | None = None,
) -> DraftBudget:
    """The budget for per-row lengths ``lengths [B]`` (long, within ``[0, bound]``; 0 = do not draft).

    Chains (``nodes_per_depth = 1``): row ``b`` drafts ``lengths[b]`` tokens. Trees: ``lengths[b]`` is the depth
    and the row gets ``nodes_per_depth * lengths[b]`` nodes (``width`` caps any node's children), so a policy that
    adapts a chain length adapts a tree's depth and size together.

    ``bound``: a host-side ``max(lengths)`` or more, the number of steps a step-wise drafter runs (rows past their
    length are masked, not skipped). None reads the lengths: one host sync, taken while the device is idle (the
    loop synced at the end of the last round), so it costs a copy rather than a stall, and the budget carries them
    as its host mirrors (exact maxima; a chain drafted to it declares its width, which spares the loop's trimming
    read). A loose bound costs ``bound - max(lengths)`` wasted draft-model steps every round, far more on any device.
    ``host``: the lengths as the policy already has them on the host (chosen there, or read together with something
    else); they become the mirrors and the bound without a read.
    """
    if host is None and bound is None:
        host = lengths.tolist()
    if host is not None:
        host = tuple(host)
        bound = max(host, default=0)
    if nodes_per_depth == 1:
        return DraftBudget(lengths, width=width, stop=stop, node_bound=bound, host_nodes=host)
    host_nodes = None if host is None else tuple(n * nodes_per_depth for n in host)
    return DraftBudget(
        lengths * nodes_per_depth, lengths, width, stop, bound * nodes_per_depth, bound, host_nodes, host
    )


def drafted_depth(draft: Draft) -> torch.Tensor:
    """``[B]`` the depth of each row's deepest valid node (a chain's length; 0 = drafted nothing): the length a
    round accepted in full when ``verdict.num_accepted`` reaches it."""
    if draft.num_nodes == 0:
        return torch.zeros(draft.batch_size, dtype=torch.long, device=draft.tokens.device)
    return draft.depth.amax(-1)


def check_batch_cap(batch_cap: str | float | None) -> str | float | None:
    """A validated batch cap: None, ``"mean"``, ``"max"`` or a quantile in ``[0, 1]``."""
    if batch_cap is None or batch_cap in BATCH_CAPS:
        return batch_cap
    if isinstance(batch_cap, str):
        raise ConfigError(f"batch_cap must be None, {' or '.join(map(repr, BATCH_CAPS))}, or a quantile in [0, 1]")
    return check_float("batch_cap", batch_cap, low=0.0, high=1.0, hint=" (a quantile of the lengths)")


def batch_cap(lengths: torch.Tensor, how: str | float | None) -> torch.Tensor | None:
    """DSDE's straggler cap for per-row ``lengths [B]``: ``ceil`` of their mean (``"mean"``) or of a quantile, as a
    0-d long tensor (no host sync); None for no cap (``None``, ``"max"``, or a single row). A chain round costs as
    many draft steps as its longest row, so capping every row near the typical length bounds the waste."""
    if how is None or how == "max" or lengths.numel() <= 1:
        return None
    values = lengths.double()
    agg = values.mean() if how == "mean" else torch.quantile(values, float(how))
    return agg.ceil().long()


def host_batch_cap(lengths: Sequence[int], how: str | float | None) -> int | None:
    """:func:`batch_cap` of host-side lengths, computed on the host (no tensors): the mean, or the quantile with
    torch's linear interpolation and its ``lerp`` rounding, so the two give the same cap."""
    if how is None or how == "max" or len(lengths) <= 1:
        return None
    if how == "mean":
        return math.ceil(sum(lengths) / len(lengths))
    ordered = sorted(lengths)
    pos = float(how) * (len(ordered) - 1)
    low = math.floor(pos)
    a, b, weight = ordered[low], ordered[min(low + 1, len(ordered) - 1)], pos - low
    return math.ceil(a + weight * (b - a) if weight < 0.5 else b - (b - a) * (1 - weight))
