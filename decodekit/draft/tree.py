"""Drafts: the token tree a drafter proposes and how its tokens were drawn.

Shapes: ``B`` live rows, ``N`` draft nodes, ``V`` vocabulary size, ``D`` accepted path length.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from decodekit.draft.kind import DraftKind
from decodekit.draft.validate import check_draft, check_fields, check_rows
from decodekit.errors import IncompatibleDraftError
from decodekit.masks import tree_ancestors

if TYPE_CHECKING:
    from decodekit.draft.budget import DraftBudget


@dataclass(frozen=True, eq=False)
class Draft:
    """A proposed token tree in flat form, batched. A chain is the tree with ``parents[:, i] == i - 1``.

    Attributes:
        tokens: ``[B, N]`` proposed token ids (target vocabulary).
        parents: ``[B, N]`` index of each node's parent; ``-1`` means a child of the pending token.
            Parents come first: ``parents[:, i] < i``; siblings are listed in the order they were drawn.
        valid: ``[B, N]`` which nodes exist (rows are ragged); a valid node's parent is valid.
        kind: how the tokens were produced (see :class:`DraftKind`).
        q: for sampled kinds, the distribution at each node's parent that the node was **actually drawn from**
            (before removing earlier siblings): ``[B, N, V]``, or ``[B, P, V]`` with ``q_index``.
        q_index: ``[B, N]`` optional, the memory-light form for wide trees: node ``i`` was drawn from
            ``q[b, q_index[b, i]]`` (e.g. one row of ``q`` per parent, shared by its children).
        draft_probs: ``[B, N, V]`` optional, the drafter's own distribution at each node's parent, for
            diagnostics (KL, entropy) only; verifiers never read it. A greedy drafter reports it here while its
            tokens are verified as point masses. Defaults to the per-node ``q`` of sampled drafts.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    valid: torch.Tensor
    kind: DraftKind = DraftKind.DETERMINISTIC
    q: torch.Tensor | None = None
    q_index: torch.Tensor | None = None
    draft_probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def chain(
        cls,
        tokens: torch.Tensor,
        valid: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
        kind: DraftKind | None = None,
        draft_probs: torch.Tensor | None = None,
    ) -> Draft:
        """A chain draft: ``tokens [B, N]``; ``valid [B, N]`` must be a prefix mask per row (default: all valid).

        ``kind`` defaults to ``SAMPLED`` when ``q`` is given, else ``DETERMINISTIC``.

        Raises:
            ComponentOutputError: ``tokens`` is not a 2-D tensor, or ``valid`` not a tensor (shapes, dtypes and
                devices are checked as for every draft; host metadata, no sync).
        """
        check_rows("Draft.chain", tokens=tokens, valid=valid)
        batch, n = tokens.shape
        parents = (torch.arange(n, device=tokens.device) - 1).expand(batch, n)
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        if kind is None:
            kind = DraftKind.SAMPLED if q is not None else DraftKind.DETERMINISTIC
        draft = cls(tokens=tokens, parents=parents, valid=valid.bool(), kind=kind, q=q, draft_probs=draft_probs)
        draft.__dict__["is_chain"] = True  # known by construction; skips the check
        return draft

    @classmethod
    def tree(cls, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, **fields: object) -> Draft:
        """A tree draft (``fields``: ``kind``, ``q``, ``q_index``, ``draft_probs``). Declaring it a tree spares
        the host sync that deciding whether it happens to be a chain would cost.

        Raises:
            ComponentOutputError: ``tokens``, ``parents`` or ``valid`` is not a 2-D tensor ``[B, N]`` (shapes,
                dtypes and devices are checked as for every draft; host metadata, no sync).
        """
        check_rows("Draft.tree", tokens=tokens, parents=parents, valid=valid)
        draft = cls(tokens=tokens, parents=parents, valid=valid.bool(), **fields)  # type: ignore[arg-type]
        draft.__dict__["is_chain"] = False
        return draft

    @classmethod
    def empty(cls, batch_size: int, device: torch.device | str = "cpu") -> Draft:
        """A draft with no nodes: the round is one step of plain autoregressive decoding."""
        z = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        draft = cls(tokens=z, parents=z.clone(), valid=z.bool())
        draft.__dict__["is_chain"] = True
        return draft

    # ---------------------------------------------------------------------------------------------- structure
    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @cached_property
    def num_valid(self) -> torch.Tensor:
        """``[B]`` number of valid nodes per row."""
        return self.valid.sum(-1)

    @cached_property
    def is_chain(self) -> bool:
        """True when every row is a chain (valid nodes form a prefix and each node's parent is its predecessor)."""
        n = self.num_nodes
        ar = torch.arange(n, device=self.tokens.device)
        prefix = self.valid == (ar < self.num_valid[:, None])
        linked = (self.parents == ar - 1) | ~self.valid
        return bool((prefix & linked).all())

    @cached_property
    def ancestors(self) -> torch.Tensor:
        """``[B, N, N]`` bool: ``ancestors[b, i, j]`` iff node j is node i or one of its ancestors (valid nodes)."""
        return tree_ancestors(self.parents, self.valid)

    @cached_property
    def depth(self) -> torch.Tensor:
        """``[B, N]`` depth of each node; children of the pending token have depth 1 (0 for invalid nodes)."""
        return self.ancestors.sum(-1) * self.valid

    @cached_property
    def used_width(self) -> int:
        """The node columns some row uses: one past the last column with a valid node (a host sync), unless the
        drafter that built this draft knew it, or a bound on it, and said so with :meth:`knowing_width`."""
        return int(self._valid_width()) if self.num_nodes else 0

    def _valid_width(self) -> torch.Tensor:
        """0-d: one past the last node column with a valid node in some row, as the valid nodes say (no sync)."""
        columns = torch.arange(1, self.num_nodes + 1, device=self.valid.device)
        return torch.where(self.valid.any(0), columns, 0).max()

    def knowing_width(self, width: int | None, exact: bool = True) -> Draft:
        """This draft, told on the host that its used width is ``width`` (a drafter that built it on the host, or
        drafted every row to a budget whose lengths it knows): :meth:`trimmed` then costs no host sync. With
        ``exact=False``, ``width`` is only a bound (no valid node at or past it; a tree drafter knows how many nodes
        its shape offers each row, not which of them a zero probability leaves out): trimming cuts there, and a
        column no row uses may stay, costing a verified position. :meth:`check` (every round with
        ``generate(..., debug=True)``) refuses a width the valid nodes do not have, or exceed. None: nothing known
        (this draft as it is)."""
        if width is None:
            return self
        self.__dict__["used_width"] = int(width)
        self.__dict__["_width_exact"] = exact
        return self

    def knowing_counts(self, counts: list[int]) -> Draft:
        """This draft, told on the host how many valid nodes each row has (``counts [B]``, a drafter that built it
        on the host): :attr:`host_counts`, which a drafter combining drafts reads instead of the device (the
        fallback drafter skips its fallback when every row drafted). :meth:`check` refuses counts the valid nodes do
        not have."""
        self.__dict__["host_counts"] = tuple(int(c) for c in counts)
        return self

    @property
    def host_counts(self) -> tuple[int, ...] | None:
        """Each row's number of valid nodes as the drafter declared it on the host (:meth:`knowing_counts`), or
        None (then only :attr:`num_valid`, on the device, says it)."""
        return self.__dict__.get("host_counts")

    def trimmed(self) -> Draft:
        """This draft without the trailing node columns no row uses (each would cost a verified position).

        One host sync (the used width), none when the drafter declared it (:meth:`knowing_width`)."""
        width = self.used_width
        if width == self.num_nodes:
            return self
        q = self.q if self.q is None or self.q_index is not None else self.q[:, :width]
        q_index = None if self.q_index is None else self.q_index[:, :width]
        probs = None if self.draft_probs is None else self.draft_probs[:, :width]
        cut = self.tokens[:, :width], self.parents[:, :width], self.valid[:, :width]
        out = Draft(*cut, kind=self.kind, q=q, q_index=q_index, draft_probs=probs)
        if width == 0:  # no nodes left: an empty draft, which every verifier takes as one plain step
            out.__dict__["is_chain"] = True
        elif "is_chain" in self.__dict__:
            out.__dict__["is_chain"] = self.__dict__["is_chain"]
        return out

    def where(self, rows: torch.Tensor, other: Draft) -> Draft:
        """Row ``b`` of this draft where ``rows[b]``, else row ``b`` of ``other``: ``[B, max(N, N')]``, the
        narrower draft padded with invalid nodes. No host sync.

        Both drafts must be of one kind (a verifier verifies one kind a round). ``q`` is merged per node (a
        ``q_index`` form is expanded first); ``draft_probs`` is kept only when both carry it (diagnostics).

        Raises:
            IncompatibleDraftError: the kinds differ.
        """
        if self.kind != other.kind:
            raise IncompatibleDraftError(
                f"cannot merge a {self.kind.value} draft with a {other.kind.value} one row by row: a round is "
                "verified as one kind; combine drafters of the same kind"
            )
        n = max(self.num_nodes, other.num_nodes)
        a, b = self._padded(n), other._padded(n)
        pick = rows.to(device=self.tokens.device, dtype=torch.bool)[:, None]

        def merge(x: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor | None:
            if x is None or y is None:
                return None
            return torch.where(pick[..., None] if x.ndim == 3 else pick, x, y)

        q = merge(a.node_q(), b.node_q()) if self.kind.needs_q else None
        out = Draft(
            tokens=merge(a.tokens, b.tokens),  # type: ignore[arg-type]
            parents=merge(a.parents, b.parents),  # type: ignore[arg-type]
            valid=merge(a.valid, b.valid),  # type: ignore[arg-type]
            kind=self.kind,
            q=q,
            draft_probs=merge(a.draft_probs, b.draft_probs),
        )
        chains = self.__dict__.get("is_chain") is True and other.__dict__.get("is_chain") is True
        out.__dict__["is_chain"] = chains  # both chains: a chain; else declared a tree (no sync to decide)
        widths = [d.__dict__.get("used_width") for d in (self, other)]
        if None not in widths:  # each row's valid nodes end within its draft's width: a bound, no sync
            out.knowing_width(max(widths), exact=False)  # type: ignore[type-var]
        return out

    def _padded(self, n: int) -> Draft:
        """This draft with invalid nodes appended up to ``n`` columns (``q`` and ``draft_probs`` per node, the
        padding uniform)."""
        extra = n - self.num_nodes
        if extra == 0:
            return self
        batch, device = self.batch_size, self.tokens.device

        def pad(x: torch.Tensor | None, value: float) -> torch.Tensor | None:
            if x is None:
                return None
            fill = torch.full((batch, extra, *x.shape[2:]), value, dtype=x.dtype, device=device)
            return torch.cat([x, fill], 1)

        q, probs = self.node_q(), self.draft_probs
        vocab = None if q is None else q.shape[-1]
        return Draft(
            tokens=pad(self.tokens, 0),  # type: ignore[arg-type]
            parents=pad(self.parents, -1),  # type: ignore[arg-type]
            valid=pad(self.valid, False),  # type: ignore[arg-type]
            kind=self.kind,
            q=pad(q, 1.0 / vocab) if vocab else None,
            draft_probs=pad(probs, 1.0 / probs.shape[-1]) if probs is not None else None,
        )

    # ---------------------------------------------------------------------------------------- distributions
    def node_q(self) -> torch.Tensor | None:
        """``[B, N, V]`` the distribution each node was drawn from (``q`` expanded through ``q_index``)."""
        if self.q is None or self.q_index is None:
            return self.q
        index = self.q_index.clamp(0, self.q.shape[1] - 1)  # invalid nodes' entries may be anything
        return self.q.gather(1, index[..., None].expand(-1, -1, self.q.shape[-1]))

    def q_of_tokens(self) -> torch.Tensor:
        """``[B, N]`` float32 probability each node's token had under the distribution it was drawn from
        (1 for deterministic drafts: point masses); meaningless at invalid nodes, whose ids may be anything."""
        q = self.node_q()
        if q is None:
            return torch.ones(self.tokens.shape, dtype=torch.float32, device=self.tokens.device)
        return q.float().gather(-1, self.tokens.where(self.valid, 0)[..., None])[..., 0]

    def reported_probs(self) -> torch.Tensor | None:
        """``[B, N, V]`` the drafter's distribution at each node's parent, for diagnostics: ``draft_probs`` if
        given, else ``q`` of a sampled draft, else None."""
        return self.draft_probs if self.draft_probs is not None else self.node_q()

    def path(self, leaf: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """Root-to-leaf node indices ending at ``leaf [B]``, for rows with ``length [B] > 0``.

        Returns:
            ``[B, N]`` node indices in root-to-leaf order, ``-1`` after the first ``length[b]`` entries.
        """
        n = self.num_nodes
        ar = torch.arange(n, device=self.tokens.device)
        if self.is_chain:
            return torch.where(ar < length[:, None], ar, -1)
        on_path = self.ancestors[torch.arange(self.batch_size, device=ar.device), leaf.clamp(min=0)]
        on_path &= (length > 0)[:, None]
        order = torch.where(on_path, ar, n + ar).sort(-1).values  # path nodes first, in index = depth order
        return torch.where(order < n, order, -1)

    def check(self, batch_size: int, vocab_size: int, budget: DraftBudget, source: str = "the drafter") -> None:
        """Raise :class:`~decodekit.errors.ComponentOutputError` (a :class:`ConfigError`) unless this draft is well
        formed for ``batch_size`` rows: token ids in ``[0, vocab_size)``, parents first and valid, a chain built
        with :meth:`chain` really a chain, and row ``b`` within ``budget`` (nodes, depth, width). One host sync;
        :func:`decodekit.generate` runs it on the first round and, with ``debug=True``, on every round. ``source``
        names who returned it."""
        check_draft(self, batch_size, vocab_size, budget, source)
