"""Stack length policies: the elementwise minimum of their budgets, their stop rules combined, an optional batch cap."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from decodekit.checks import check_instance
from decodekit.draft.budget import DraftBudget, DraftStep, call_stop, stop_needs_hidden
from decodekit.errors import ConfigError
from decodekit.interfaces import LengthPolicy, SelectsRows, hidden_layers_of
from decodekit.policies.lengths import batch_cap, check_batch_cap, host_batch_cap
from decodekit.registry import register
from decodekit.spec.hooks import select_component_rows
from decodekit.spec.round import check_needs, needs_of
from decodekit.spec.state import DecodeState

if TYPE_CHECKING:
    from decodekit.spec.round import Round


@register("policy", "stack")
class Stack:
    """Several length policies at once: each row drafts the least any of them allows, and stops at the first stop
    rule that fires; ``batch_cap`` then caps every row at an aggregate of the rows' lengths (DSDE's straggler cap: a
    chain round costs as many draft steps as its longest row).

    ``Stack(GoodputLength(...), EntropyStop(...))`` is ``policies.md``'s suggested default (a length from the cost
    model, cut short when the drafter grows unsure). Every hook (``begin``, ``observe``, ``select_rows``) reaches
    every part; ``needs`` is their union.

    Budgets combine entry by entry: ``nodes`` and ``depth`` by minimum (a part without a depth limit counts as its
    node budget), ``width`` by minimum, the host bounds by minimum. When every part gives host mirrors the stack
    does too, taking the minima and the batch cap on the host (:func:`~decodekit.policies.lengths.host_batch_cap`),
    so it costs no read of its own.

    Args:
        *policies: the parts (at least one).
        batch_cap: None, ``"mean"`` (ceil of the mean over the live rows), ``"max"`` (no cap), or a quantile in
            ``[0, 1]`` of the rows' lengths.
    """

    def __init__(self, *policies: Any, batch_cap: str | float | None = None) -> None:
        if not policies:
            raise ConfigError("Stack needs at least one policy, e.g. Stack(GoodputLength(), EntropyStop())")
        for i, p in enumerate(policies):  # an instance each (a class has a plan attribute too)
            check_instance(f"Stack's part {i}", p, LengthPolicy, what="a plan(state) method", optional=False)
        self.policies, self.batch_cap = tuple(policies), check_batch_cap(batch_cap)
        self.needs = frozenset().union(*(check_needs(needs_of(p), p) for p in policies))
        self.hidden_layers = tuple(sorted({i for p in policies for i in hidden_layers_of(p)}))

    def __repr__(self) -> str:
        cap = "" if self.batch_cap is None else f", batch_cap={self.batch_cap!r}"
        return f"Stack({', '.join(map(repr, self.policies))}{cap})"

    def begin(self, state: DecodeState) -> None:
        self._each("begin", state)

    def observe(self, state: DecodeState, round: Round) -> None:
        self._each("observe", state, round)

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        """Each part's ``select_rows``, with ``host_rows`` where the part asks for them (its ``needs``)."""
        for p in self.policies:
            if isinstance(p, SelectsRows):
                select_component_rows(p, rows, host_rows)

    def _each(self, hook: str, *args: Any) -> None:
        for p in self.policies:
            if hasattr(p, hook):
                getattr(p, hook)(*args)

    def plan(self, state: DecodeState) -> DraftBudget:
        budgets = [p.plan(state) for p in self.policies]
        for p, b in zip(self.policies, budgets):
            b.check(state.batch_size, state.device, source=repr(p))
        trees = any(b.depth is not None for b in budgets)
        nodes = torch.stack([b.nodes for b in budgets]).amin(0)
        depth = torch.stack([b.depth_or_nodes for b in budgets]).amin(0) if trees else None
        host_nodes = host_depth = None
        if all(b.host_nodes is not None for b in budgets):  # every part mirrored: so is the stack, without a read
            host_nodes = tuple(map(min, zip(*(b.host_nodes for b in budgets))))
            host_depth = tuple(map(min, zip(*(b.host_depth_or_nodes for b in budgets)))) if trees else None
            cap: torch.Tensor | int | None = host_batch_cap(
                host_nodes if host_depth is None else host_depth, self.batch_cap
            )
        else:
            cap = batch_cap(nodes if depth is None else depth, self.batch_cap)
        if cap is not None:
            if depth is None:
                nodes = nodes.clamp(max=cap)
            else:
                nodes = torch.where(depth > cap, nodes * cap // depth.clamp(min=1), nodes)
                depth = depth.clamp(max=cap)
            if host_depth is not None:
                host_nodes = tuple(n * cap // max(d, 1) if d > cap else n for n, d in zip(host_nodes, host_depth))
                host_depth = tuple(min(d, cap) for d in host_depth)
            elif host_nodes is not None:
                host_nodes = tuple(min(n, cap) for n in host_nodes)
        return DraftBudget(
            nodes,
            depth,
            _least(b.width for b in budgets),
            _any_stop([b.stop for b in budgets if b.stop is not None]),
            _least(b.node_bound for b in budgets),
            _least(b.depth_bound for b in budgets) if trees else None,
            host_nodes,
            host_depth,
        )


def _least(values: Any) -> int | None:
    """The smallest of the values that are not None (None if all are)."""
    given = [v for v in values if v is not None]
    return min(given) if given else None


def _any_stop(
    rules: list[Callable[[DraftStep], torch.Tensor]],
) -> Callable[[DraftStep], torch.Tensor] | None:
    """One stop rule that fires when any of ``rules`` does (every rule sees every step, to keep its state); it asks
    for the drafter's hidden states (``needs_hidden``, see :class:`~decodekit.draft.budget.DraftStep`) if any rule
    does."""
    if len(rules) <= 1:
        return rules[0] if rules else None

    def stop(step: DraftStep) -> torch.Tensor:
        fired = [call_stop(rule, step) for rule in rules]  # each checked: a bool [B]
        return torch.stack(fired).any(0)

    stop.needs_hidden = any(stop_needs_hidden(r) for r in rules)  # type: ignore[attr-defined]
    return stop
