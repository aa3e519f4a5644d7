"""Static token-tree templates, as data, for any tree drafter (Medusa, EAGLE-1, Token Recycling style).

A template is a choice list: each node is a tuple of child ranks from the root, e.g. ``(0, 1)`` is the
2nd-ranked child of the 1st-ranked child of the pending token. What "rank" means is the drafter's business (the
k-th most likely successor, the k-th head's top-k...). Shapes: ``N`` template nodes.

>>> t = TreeTemplate([(0,), (1,), (0, 0), (0, 1), (1, 0)])
>>> t.parents.tolist(), t.ranks.tolist(), t.depth.tolist()
([-1, -1, 0, 0, 1], [0, 1, 0, 1, 0], [1, 1, 2, 2, 2])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_int, describe
from decodekit.draft.kind import DraftKind
from decodekit.draft.tree import Draft
from decodekit.errors import ConfigError, ConfigTypeError

if TYPE_CHECKING:
    from decodekit.draft.budget import DraftBudget

Choice = tuple[int, ...]


@dataclass(frozen=True, eq=False)
class TreeTemplate:
    """A static tree, built from a choice list and validated (every prefix of a node must be a node).

    Nodes are stored parents-first, sorted by (depth, lexicographic ranks), whatever the order given.

    Attributes:
        choices: the nodes as rank tuples, in stored order.
        parents: ``[N]`` long, parent index of each node (``-1``: a child of the pending token); ``parents[i] < i``.
        ranks: ``[N]`` long, each node's rank among its siblings (its last tuple entry).
        depth: ``[N]`` long, 1 for children of the pending token.
    """

    choices: tuple[Choice, ...]
    parents: torch.Tensor = field(init=False, repr=False)
    ranks: torch.Tensor = field(init=False, repr=False)
    depth: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        choices = _validated(self.choices)
        index = {c: i for i, c in enumerate(choices)}
        object.__setattr__(self, "choices", choices)
        object.__setattr__(self, "parents", torch.tensor([index.get(c[:-1], -1) for c in choices], dtype=torch.long))
        object.__setattr__(self, "ranks", torch.tensor([c[-1] for c in choices], dtype=torch.long))
        object.__setattr__(self, "depth", torch.tensor([len(c) for c in choices], dtype=torch.long))

    @classmethod
    def from_branching(cls, branching: Sequence[int]) -> TreeTemplate:
        """The full tree with ``branching[d]`` children for every node at depth ``d`` (the pending token is at
        depth 0): ``from_branching((4, 2))`` has 4 + 8 nodes."""
        if isinstance(branching, (str, bytes)) or not isinstance(branching, Sequence):
            raise ConfigTypeError(f"branching must be a sequence of integers, got {describe(branching)}")
        level: list[Choice] = [()]
        choices: list[Choice] = []
        for d, b in enumerate(branching):
            b = check_int(f"branching[{d}]", b, low=1, hint=" (children per node at that depth)")
            level = [c + (r,) for c in level for r in range(b)]
            choices += level
        return cls(tuple(choices))

    # ------------------------------------------------------------------------------------------- shape
    @property
    def num_nodes(self) -> int:
        return len(self.choices)

    @property
    def max_depth(self) -> int:
        return max((len(c) for c in self.choices), default=0)

    @property
    def max_width(self) -> int:
        """The most children any node (or the pending token) has."""
        counts: dict[Choice, int] = {}
        for c in self.choices:
            counts[c[:-1]] = counts.get(c[:-1], 0) + 1
        return max(counts.values(), default=0)

    def levels(self) -> list[tuple[int, int]]:
        """``[(start, end), ...]``: the node index range of each depth 1, 2, ... (nodes are sorted by depth)."""
        bounds, start = [], 0
        for d in range(1, self.max_depth + 1):
            end = start + sum(1 for c in self.choices if len(c) == d)
            bounds.append((start, end))
            start = end
        return bounds

    # ------------------------------------------------------------------------------------------- budget
    def truncated(self, nodes: int, depth: int | None = None, width: int | None = None) -> TreeTemplate:
        """The first nodes (in stored order) that fit a budget: at most ``nodes`` nodes, none deeper than ``depth``,
        no node with more than ``width`` children (each node keeps its lowest-ranked children). Parents stay in."""
        nodes = check_int("nodes", nodes, low=0)
        depth = check_int("depth", depth, low=0, optional=True)
        width = check_int("width", width, low=1, optional=True)
        slot: dict[Choice, int] = {}  # a node's position among its kept siblings
        seen: dict[Choice, int] = {}
        kept: list[Choice] = []
        for c in self.choices:
            if len(kept) == nodes or (depth is not None and len(c) > depth):
                continue
            if c[:-1] and c[:-1] not in slot:  # its parent was dropped
                continue
            position = seen.get(c[:-1], 0)
            if width is not None and position >= width:
                continue
            seen[c[:-1]] = position + 1
            slot[c] = position
            kept.append(c)
        return TreeTemplate(tuple(kept))

    def __repr__(self) -> str:
        return f"TreeTemplate(num_nodes={self.num_nodes}, max_depth={self.max_depth}, max_width={self.max_width})"


def _validated(choices: Iterable[Sequence[int]]) -> tuple[Choice, ...]:
    """Rank tuples sorted by (depth, lexicographic), refusing malformed entries, duplicates and missing prefixes."""
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Iterable):
        raise ConfigTypeError(
            f"a tree template needs a list of rank tuples such as [(0,), (0, 0)], got {describe(choices)}"
        )
    out: list[Choice] = []
    for c in choices:
        if isinstance(c, (str, bytes)) or not isinstance(c, Sequence) or len(c) == 0:
            raise ConfigError(f"every tree template node must be a non-empty tuple of ranks, got {describe(c)}")
        out.append(tuple(check_int("a tree template rank", r, low=0) for r in c))  # type: ignore[misc]
    present = set(out)
    if len(present) != len(out):
        dup = next(c for c in out if out.count(c) > 1)
        raise ConfigError(f"tree template node {dup} is listed twice")
    for c in out:
        if len(c) > 1 and c[:-1] not in present:
            raise ConfigError(
                f"tree template node {c} needs its parent {c[:-1]}: every prefix of a node must be listed"
            )
    return tuple(sorted(out, key=lambda c: (len(c), c)))


def _levels(*per_depth: str) -> TreeTemplate:
    """A template written one depth per string, nodes as rank digits: ``_levels("0 1", "00")``."""
    return TreeTemplate(tuple(tuple(int(r) for r in node) for level in per_depth for node in level.split()))


TEMPLATES: dict[str, TreeTemplate] = {
    # the top-ranked successor, four deep
    "chain4": TreeTemplate.from_branching((1, 1, 1, 1)),
    # Nodes chosen greedily by measured acceptance (the way Token Recycling built its template): SmolLM2-135M-Instruct,
    # RecyclingDrafter over a (6, 3, 2, 2, 1, 1) tree, greedy, 12 mixed prompts (HumanEval, MT-Bench, stdlib code);
    # each node's rate of lying on the accepted path, the top 8 / 12 / 16 / 24 kept (expected tokens per round on
    # those prompts: 1.95 / 2.10 / 2.19 / 2.33). A model whose top-1 is more often right wants a deeper spine.
    "smollm2_8": _levels("0 1 2 3", "00 01", "000", "0000"),
    "smollm2_12": _levels("0 1 2 3 4 5", "00 01 10", "000", "0000", "00000"),
    "smollm2_16": _levels("0 1 2 3 4 5", "00 01 02 10 11 20", "000 001", "0000", "00000"),
    "smollm2_24": _levels(
        "0 1 2 3 4 5", "00 01 02 10 11 20 30 40 50", "000 001 010 100", "0000 1000", "00000 10000", "000000"
    ),
}
"""Named templates (our own; ``TreeTemplate.truncated`` fits one to a smaller budget, keeping its shallowest nodes)."""


def resolve_template(template: TreeTemplate | str) -> TreeTemplate:
    """``template`` itself, or the named one in :data:`TEMPLATES`; anything else is refused with the names."""
    if isinstance(template, str):
        if template not in TEMPLATES:
            raise ConfigError(f"unknown tree template {template!r}; named ones: {', '.join(sorted(TEMPLATES))}")
        return TEMPLATES[template]
    if not isinstance(template, TreeTemplate):
        raise ConfigError(f"template must be a TreeTemplate or a name in TEMPLATES, got {describe(template)}")
    return template


@dataclass(frozen=True, eq=False)
class FittedTemplate:
    """A template truncated to a budget's host bounds, with its index tensors on the drafting device.

    Attributes:
        tree: the truncated template (``N`` nodes).
        levels: the node index range of each depth (:meth:`TreeTemplate.levels`).
        parents, ranks, depth: ``[N]`` long on the device (as in :class:`TreeTemplate`).
    """

    tree: TreeTemplate
    levels: list[tuple[int, int]]
    parents: torch.Tensor
    ranks: torch.Tensor
    depth: torch.Tensor

    def host_width(self, budget: DraftBudget) -> int | None:
        """The most node columns a row of ``budget`` can fill (:meth:`DraftBudget.host_tree_width`; None without
        host mirrors): the bound a template drafter declares (``Draft.knowing_width(..., exact=False)``)."""
        return budget.host_tree_width([end - start for start, end in self.levels])

    def fits(self, budget: DraftBudget) -> torch.Tensor:
        """``[B, N]`` bool: the nodes within each row's budget (the shallowest ``nodes[b]`` of depth at most
        ``depth[b]``; the template's order is parents first, so the kept set is ancestor-closed). No host sync."""
        fits = self.depth[None, :] <= budget.depth_or_nodes[:, None]
        return fits & (fits.long().cumsum(1) <= budget.nodes[:, None])


def fit_template(template: TreeTemplate, budget: DraftBudget, device: torch.device) -> FittedTemplate:
    """``template`` fitted to ``budget``'s host bounds (``max_nodes``, ``max_depth``, ``width``); cached per
    template, bounds and device, so a drafter pays for it once per budget shape."""
    nodes, depth = min(budget.max_nodes, template.num_nodes), min(budget.max_depth, template.max_depth)
    return _fit(template, nodes, depth, budget.width, device)


@lru_cache(maxsize=256)
def _fit(template: TreeTemplate, nodes: int, depth: int, width: int | None, device: torch.device) -> FittedTemplate:
    tree = template.truncated(nodes, depth, width)
    parents, ranks, depths = (t.to(device) for t in (tree.parents, tree.ranks, tree.depth))
    return FittedTemplate(tree, tree.levels(), parents, ranks, depths)


def ranked_tree(
    template: TreeTemplate, scores: torch.Tensor, budget: DraftBudget, vocab: torch.Tensor | None = None
) -> Draft:
    """A deterministic tree whose node ``(r1, ..., rd)`` is the ``rd``-th best token at depth ``d`` whatever its
    path: Medusa's static sparse tree from its heads, or a block drafter's from one forward's slots (each depth's
    candidates do not see the path). ``scores [B, k, V']``: row ``d - 1`` ranks depth ``d``'s candidates; the
    template is fitted to ``budget`` capped at ``k`` deep; ``vocab [V']`` maps the columns to token ids (None: they
    are the ids). A rank past ``V'`` drafts nothing, nor does anything under an undrafted node; the draft declares
    its width bound (no host sync)."""
    batch, k = scores.shape[:2]
    capped = budget.capped_at(k)
    fitted = fit_template(template, capped, scores.device)
    n = fitted.tree.num_nodes
    if n == 0:
        return Draft.empty(batch, scores.device)
    deepest = max(c[-1] for c in fitted.tree.choices)  # on the host: no sync
    top = scores.topk(min(deepest + 1, scores.shape[-1]), -1).indices  # [B, k, r]
    inside = fitted.ranks < top.shape[-1]  # a rank past a tiny draft vocabulary drafts nothing
    picked = top[:, fitted.depth - 1, torch.where(inside, fitted.ranks, 0)]  # [B, N]
    valid = fitted.fits(capped) & inside
    for start, end in fitted.levels[1:]:  # under a node that is not drafted, nothing is
        valid[:, start:end] &= valid.gather(1, fitted.parents[start:end].expand(batch, -1))
    tokens = picked if vocab is None else vocab[picked]
    draft = Draft.tree(tokens, fitted.parents.expand(batch, n), valid, kind=DraftKind.DETERMINISTIC)
    return draft.knowing_width(fitted.host_width(capped), exact=False)
