"""Fixed draft length, or a fixed tree budget (nodes, depth, width)."""

from __future__ import annotations

from decodekit.checks import check_int
from decodekit.errors import ConfigError
from decodekit.interfaces import HasDefaultPolicy, LengthPolicy
from decodekit.registry import register
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget


@register("policy", "fixed")
class FixedLength:
    """Draft ``k`` tokens every round (``k = 0`` turns speculation off).

    For tree drafters ``k`` is the node budget; ``depth`` caps the tree's depth (None = ``k``, which a chain
    reaches) and ``width`` the children of any node (None = no cap). ``FixedLength(12, depth=4)`` lets a tree
    drafter spend 12 verified positions on paths at most 4 tokens deep; a chain drafter then drafts 4.
    """

    def __init__(self, k: int = 4, depth: int | None = None, width: int | None = None) -> None:
        self.k = check_int("k", k, low=0, hint=" (the draft length or node budget; 0 = no speculation)")
        self.depth = check_int("depth", depth, low=0, optional=True, hint=" (None = k)")
        self.width = check_int("width", width, low=1, optional=True, hint=" (None = no cap)")
        if self.depth is not None and self.depth > self.k:
            raise ConfigError(f"depth={self.depth} exceeds the node budget k={self.k}: a tree of depth d has d nodes")

    def plan(self, state: DecodeState) -> DraftBudget:
        """The same budget for every row, with its host mirrors (a drafter reads no tensor to learn it)."""
        return DraftBudget.uniform(state.lengths, self.k, self.depth, width=self.width)


def policy_for(drafter: object) -> LengthPolicy:
    """The length policy of a :func:`decodekit.generate` call that names none: the drafter's own
    ``default_policy()`` (:class:`~decodekit.interfaces.HasDefaultPolicy`), else ``FixedLength(4)``."""
    return drafter.default_policy() if isinstance(drafter, HasDefaultPolicy) else FixedLength(4)
