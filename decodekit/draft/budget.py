"""Draft budgets: how much each row may draft in a round (chains and trees), and the step record stop rules read."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from decodekit.checks import check_callable, check_int, describe, describe_on, tensor_fits
from decodekit.errors import ComponentOutputError, ConfigError


@dataclass(frozen=True, eq=False)
class DraftStep:
    """What a step-wise drafter reports after drafting one token per row (for stop rules).

    Attributes:
        index: 0-based position of the token in the chain.
        tokens: ``[B]`` the tokens just drafted.
        token_probs: ``[B]`` probability the drafter gave them.
        probs: ``[B, V]`` the drafter's full distribution, or None if it has none.
        hidden: ``[B, H]`` the draft model's final (normed) hidden state at the input that produced this step's
            logits: at the previous drafted token ``x_{index-1}``, or at the pending token for ``index == 0``.
            Only given to a stop rule that asks for it with ``needs_hidden = True`` (SpecDec++'s acceptance head);
            None otherwise, and from drafters without hidden states.
    """

    index: int
    tokens: torch.Tensor
    token_probs: torch.Tensor
    probs: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class DraftBudget:
    """How much each row may draft this round.

    Attributes:
        nodes: ``[B]`` the most valid nodes (tokens) row ``b`` may draft; 0 = do not draft.
        depth: ``[B]`` the deepest node row ``b`` may draft (a chain's depth is its length); None = ``nodes``.
            :func:`decodekit.generate` caps the depth, never the node count, by what each row may still generate.
        width: the most children any node (and the pending token) may have; None = no limit.
        stop: optional rule a step-wise drafter calls after each drafted token; returns ``[B]`` bool, True for
            rows that should stop drafting (the token just drafted is kept).
        node_bound, depth_bound: host-side upper bounds on ``max(nodes)`` / ``max(depth)`` when the policy knows
            them (a fixed length does); they spare drafters a host sync. None = read from the tensors when asked.
        host_nodes, host_depth: ``nodes`` / ``depth`` as host tuples, when the policy knows each row's values
            without reading the tensors (a fixed length does; :func:`decodekit.generate` caps ``host_depth`` as it
            caps ``depth``). With them :attr:`host_lengths` and the maxima are exact and cost no host sync, and a
            chain drafted to the budget knows its width; ``check(values=True)`` (``debug=True``) checks they agree
            with the tensors. None = unknown.
    """

    nodes: torch.Tensor
    depth: torch.Tensor | None = None
    width: int | None = None
    stop: Callable[[DraftStep], torch.Tensor] | None = None
    node_bound: int | None = None
    depth_bound: int | None = None
    host_nodes: tuple[int, ...] | None = None
    host_depth: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        """Types and shapes, and the host-side fields' values (no sync); :meth:`check` validates the tensors."""
        for name in ("nodes", "depth"):
            value = getattr(self, name)
            if name == "depth" and value is None:
                continue
            integer = isinstance(value, torch.Tensor) and not (value.dtype.is_floating_point or value.dtype.is_complex)
            if not integer or value.dtype == torch.bool or value.ndim != 1:
                raise ComponentOutputError(f"DraftBudget.{name} must be an integer tensor [B], got {describe(value)}")
        if self.depth is not None and self.depth.shape != self.nodes.shape:
            raise ComponentOutputError(
                f"DraftBudget.depth must have the shape of nodes {tuple(self.nodes.shape)}, "
                f"got {tuple(self.depth.shape)}"
            )
        try:
            for name in ("width", "node_bound", "depth_bound"):
                check_int(f"DraftBudget.{name}", getattr(self, name), low=0, optional=True)
            check_callable("DraftBudget.stop", self.stop)
        except ConfigError as error:  # a policy's output: say so
            raise ComponentOutputError(str(error)) from None
        for name, tensor in (("host_nodes", self.nodes), ("host_depth", self.depth)):
            mirror = getattr(self, name)
            if mirror is None:
                continue
            if tensor is None and name == "host_depth":
                raise ComponentOutputError("DraftBudget.host_depth mirrors depth: give depth too, or neither")
            if (
                not isinstance(mirror, tuple)
                or len(mirror) != tensor.shape[0]
                or not all(type(v) is int for v in mirror)
            ):
                raise ComponentOutputError(
                    f"DraftBudget.{name} must be a tuple of {tensor.shape[0]} ints (one a row), got {describe(mirror)}"
                )
        if self.host_depth is not None and self.host_nodes is None:
            raise ComponentOutputError("DraftBudget.host_depth needs host_nodes: give both host mirrors, or neither")

    @classmethod
    def uniform(cls, like: torch.Tensor, nodes: int, depth: int | None = None, **fields: Any) -> DraftBudget:
        """The same budget for every row of ``like [B]`` (its rows, dtype and device; e.g. ``state.lengths``):
        ``nodes`` (and ``depth``) with their host bounds and mirrors; ``fields``: ``width``, ``stop``."""
        rows = like.shape[0]
        if depth is None:
            return cls(torch.full_like(like, nodes), node_bound=nodes, host_nodes=(nodes,) * rows, **fields)
        return cls(
            torch.full_like(like, nodes), torch.full_like(like, depth), node_bound=nodes, depth_bound=depth,
            host_nodes=(nodes,) * rows, host_depth=(depth,) * rows, **fields,
        )  # fmt: skip

    def check(self, batch_size: int, device: torch.device, source: str = "the policy", values: bool = False) -> None:
        """Raise :class:`~decodekit.errors.ComponentOutputError` unless this budget is for ``batch_size`` rows on
        ``device``; with ``values`` (one host sync) also unless ``nodes`` and ``depth`` are >= 0 and within
        ``node_bound`` / ``depth_bound``. ``source`` names who returned it."""
        what = f"{source} returned a malformed DraftBudget"
        if self.nodes.shape[0] != batch_size:
            raise ComponentOutputError(f"{what}: nodes has {self.nodes.shape[0]} rows, the batch has {batch_size}")
        for name in ("nodes", "depth"):
            value = getattr(self, name)
            if value is not None and value.device != device:
                raise ComponentOutputError(f"{what}: {name} is on {value.device}, the batch on {device}")
        if not values or batch_size == 0:
            return
        depth = self.depth_or_nodes
        checks = [
            ((self.nodes >= 0).all(), "nodes must be >= 0 (0 = do not draft)"),
            ((depth >= 0).all(), "depth must be >= 0"),
        ]
        if self.node_bound is not None:
            checks.append(((self.nodes <= self.node_bound).all(), f"nodes exceed node_bound={self.node_bound}"))
        if self.depth_bound is not None:
            checks.append(((depth <= self.depth_bound).all(), f"depth exceeds depth_bound={self.depth_bound}"))
        for name, tensor, mirror in (("nodes", self.nodes, self.host_nodes), ("depth", self.depth, self.host_depth)):
            if mirror is not None and tensor is not None:
                same = (tensor == torch.tensor(mirror, device=tensor.device)).all()
                checks.append((same, f"host_{name} {list(mirror)} differs from {name}"))
        results = torch.stack([ok for ok, _ in checks]).tolist()
        for ok, (_, message) in zip(results, checks):
            if not ok:
                raise ComponentOutputError(f"{what}: {message}")

    def stops(self, step: DraftStep) -> torch.Tensor:
        """``[B]`` bool: the rows :attr:`stop` stops after ``step`` (all False without a rule); what a step-wise
        drafter calls after each token (:func:`call_stop`: the rule's output checked, no host sync)."""
        if self.stop is None:
            return torch.zeros_like(step.tokens, dtype=torch.bool)
        return call_stop(self.stop, step)

    @property
    def depth_or_nodes(self) -> torch.Tensor:
        """``[B]`` the depth budget (the node budget when no depth was given)."""
        return self.nodes if self.depth is None else self.depth

    @cached_property
    def lengths(self) -> torch.Tensor:
        """``[B]`` the longest chain row ``b`` may draft: ``min(nodes, depth)``."""
        return self.nodes if self.depth is None else torch.minimum(self.nodes, self.depth)

    @property
    def host_depth_or_nodes(self) -> tuple[int, ...] | None:
        """:attr:`depth_or_nodes` as its host mirror (None without mirrors)."""
        return self.host_nodes if self.host_depth is None else self.host_depth

    @cached_property
    def host_lengths(self) -> list[int] | None:
        """Each row's :attr:`lengths` as a host list when the host mirrors give them (no sync), else None."""
        if self.host_nodes is None:
            return None
        return [min(n, d) for n, d in zip(self.host_nodes, self.host_depth_or_nodes)]  # type: ignore[arg-type]

    def host_tree_width(self, level_sizes: Sequence[int]) -> int | None:
        """For a tree drafter whose shape offers ``level_sizes[d - 1]`` nodes at depth ``d``, listed level by level,
        of which each row keeps at most its ``nodes`` within its ``depth``: the most node columns any row can use,
        ``max_b min(nodes[b], nodes offered down to depth[b])``, from the host mirrors (None without them)."""
        if self.host_nodes is None:
            return None
        offered = list(itertools.accumulate(level_sizes, initial=0))
        depths = self.host_depth_or_nodes  # type: ignore[union-attr]
        return max((min(n, offered[min(d, len(offered) - 1)]) for n, d in zip(self.host_nodes, depths)), default=0)

    def host_values(self) -> tuple[list[int], list[int]]:
        """``(nodes, depth)`` per row as host lists: the mirrors when given (no sync), else one host sync."""
        if self.host_nodes is not None:
            return list(self.host_nodes), list(self.host_depth_or_nodes)  # type: ignore[arg-type]
        nodes, depth = torch.stack([self.nodes, self.depth_or_nodes]).tolist()
        return nodes, depth

    @cached_property
    def max_nodes(self) -> int:
        """Upper bound on ``max(nodes)``: exact from ``host_nodes``, else ``node_bound``, else the tensor's maximum
        (a host sync)."""
        if self.host_nodes is not None:
            return max(self.host_nodes, default=0)
        if self.node_bound is not None:
            return self.node_bound
        return int(self.nodes.max()) if self.nodes.numel() else 0

    @cached_property
    def max_depth(self) -> int:
        """Upper bound on ``max(depth)``: exact from the host mirrors, else ``depth_bound``, else the tensor's
        maximum (a host sync)."""
        if self.host_nodes is not None:
            return max(self.host_depth_or_nodes, default=0)  # type: ignore[arg-type]
        if self.depth_bound is not None:
            return self.depth_bound
        if self.depth is None:
            return self.max_nodes
        return int(self.depth.max()) if self.depth.numel() else 0

    @property
    def max_len(self) -> int:
        """Upper bound on ``max(lengths)``: the number of columns a chain drafter needs (exact, and then some row
        drafts that many, when the host mirrors are given)."""
        if self.host_lengths is not None:
            return max(self.host_lengths, default=0)
        return min(self.max_nodes, self.max_depth)

    @property
    def filled_width(self) -> int | None:
        """The used width of a chain that drafts every row to its full length (``valid = mask()``): ``max_len``
        when the host mirrors make it exact, else None (unknown without a read). ``draft.knowing_width(
        budget.filled_width)`` then spares the loop's trimming read."""
        return self.max_len if self.host_lengths is not None else None

    def mask(self, width: int | None = None) -> torch.Tensor:
        """``[B, width]`` bool, True where position j < lengths[b] (width defaults to ``max_len``)."""
        width = self.max_len if width is None else width
        return torch.arange(width, device=self.lengths.device) < self.lengths[:, None]

    def capped_at(self, depth: int) -> DraftBudget:
        """This budget with every row's depth capped at ``depth`` (a host int; the host mirrors stay exact)."""
        return self.capped(torch.full_like(self.nodes, depth), depth, [depth] * self.nodes.shape[0])

    def capped(self, depth: torch.Tensor, depth_bound: int, host_depth: list[int] | None = None) -> DraftBudget:
        """This budget with its depth capped at ``depth [B]`` (host bound ``depth_bound``; ``host_depth``: ``depth``
        as a host list, which keeps the host mirrors exact)."""
        capped = torch.minimum(self.depth_or_nodes, depth).clamp(min=0)
        bound = depth_bound if self.depth_bound is None else min(self.depth_bound, depth_bound)
        if self.depth is None and self.node_bound is not None:
            bound = min(bound, self.node_bound)
        mirrors: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)
        if self.host_nodes is not None and host_depth is not None:
            own = self.host_depth_or_nodes
            mirrors = (self.host_nodes, tuple(max(min(a, b), 0) for a, b in zip(own, host_depth)))  # type: ignore[arg-type]
        return DraftBudget(self.nodes, capped, self.width, self.stop, self.node_bound, max(bound, 0), *mirrors)


def call_stop(rule: Callable[[DraftStep], torch.Tensor], step: DraftStep) -> torch.Tensor:
    """``rule(step)``, refused unless it is a bool tensor ``[B]`` on the step's device (host metadata, no sync): a
    stop rule that returns None, a float or a batch of another size would otherwise fail deep inside the drafter,
    or stop the wrong rows.

    Raises:
        ComponentOutputError: naming the rule, what it returned and what a stop rule must return.
    """
    fired = rule(step)
    tokens = step.tokens
    if not tensor_fits(fired, [tuple(tokens.shape)], tokens.device, torch.bool):
        fix = "; use .bool()" if isinstance(fired, torch.Tensor) and fired.shape == tokens.shape else ""
        raise ComponentOutputError(
            f"the stop rule {_rule_name(rule)} (DraftBudget.stop) returned {describe_on(fired)}; a stop rule must "
            f"return a bool tensor [B] = {tuple(tokens.shape)} on {tokens.device}, True for the rows that stop "
            f"drafting{fix}"
        )
    return fired


def _rule_name(rule: Any) -> str:
    """A stop rule for a message: ``Class.method`` for a bound method, a function's name, else its class."""
    owner = getattr(rule, "__self__", None)
    if owner is not None and hasattr(rule, "__name__"):
        return f"{type(owner).__name__}.{rule.__name__}"
    return getattr(rule, "__qualname__", None) or type(rule).__qualname__


def stop_needs_hidden(stop: object) -> bool:
    """Whether a stop rule declared ``needs_hidden = True`` (it reads :attr:`DraftStep.hidden`: SpecDec++'s
    acceptance head); False for None and for a rule that declares nothing."""
    return stop is not None and bool(getattr(stop, "needs_hidden", False))
