"""Value types shared by every component: drafts, verdicts, sampling parameters, budgets, outputs.

Shapes: ``B`` live rows, ``N`` draft nodes, ``V`` vocabulary size, ``D`` accepted path length.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from decodekit.errors import ConfigError, IncompatibleDraftError
from decodekit.masks import tree_ancestors

if TYPE_CHECKING:
    from decodekit.metrics import SpecStats


class DraftKind(str, enum.Enum):
    """How the tokens of a draft were produced; verifiers declare which kinds they can verify losslessly.

    * ``SAMPLED``: each node was drawn from ``Draft.q`` at that node (``q`` is required and exact).
    * ``DETERMINISTIC``: the tokens are a function of the context (lookup, argmax); verified as point masses.
    """

    SAMPLED = "sampled"
    DETERMINISTIC = "deterministic"


@dataclass(frozen=True)
class SamplingParams:
    """Sampling applied to the target distribution (and, by default, to the drafter's).

    ``temperature == 0`` means greedy decoding. ``top_k`` / ``top_p`` are applied after temperature, in that
    order, as transformers does.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be a positive integer or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, eq=False)
class Draft:
    """A proposed token tree in flat form, batched. A chain is the tree with ``parents[:, i] == i - 1``.

    Attributes:
        tokens: ``[B, N]`` proposed token ids (target vocabulary).
        parents: ``[B, N]`` index of each node's parent; ``-1`` means a child of the pending token.
            Parents come first: ``parents[:, i] < i``.
        valid: ``[B, N]`` which nodes exist (rows are ragged); a valid node's parent is valid.
        kind: how the tokens were produced (see :class:`DraftKind`).
        q: ``[B, N, V]`` the distribution each node was **actually sampled from** (``SAMPLED`` only).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    valid: torch.Tensor
    kind: DraftKind = DraftKind.DETERMINISTIC
    q: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.tokens.ndim != 2 or self.parents.shape != self.tokens.shape or self.valid.shape != self.tokens.shape:
            raise ConfigError(
                "Draft.tokens, parents and valid must all be [B, N]; got "
                f"{tuple(self.tokens.shape)}, {tuple(self.parents.shape)}, {tuple(self.valid.shape)}"
            )
        if self.kind == DraftKind.SAMPLED:
            if self.q is None:
                raise IncompatibleDraftError(
                    "a SAMPLED draft needs q, the [B, N, V] distributions its tokens were drawn from; "
                    "pass q=... or mark the draft DETERMINISTIC"
                )
            if self.q.shape[:2] != self.tokens.shape:
                raise ConfigError(f"Draft.q must be [B, N, V] with [B, N] = {tuple(self.tokens.shape)}")

    # ----------------------------------------------------------------------------------------------- builders
    @classmethod
    def chain(
        cls,
        tokens: torch.Tensor,
        valid: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
        kind: DraftKind | None = None,
    ) -> Draft:
        """A chain draft: ``tokens [B, N]``; ``valid [B, N]`` must be a prefix mask per row (default: all valid).

        ``kind`` defaults to ``SAMPLED`` when ``q`` is given, else ``DETERMINISTIC``.
        """
        batch, n = tokens.shape
        parents = (torch.arange(n, device=tokens.device) - 1).expand(batch, n)
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        if kind is None:
            kind = DraftKind.SAMPLED if q is not None else DraftKind.DETERMINISTIC
        draft = cls(tokens=tokens, parents=parents, valid=valid.bool(), kind=kind, q=q)
        draft.__dict__["is_chain"] = True  # known by construction; skips the check
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

    def trimmed(self) -> Draft:
        """This draft without the trailing node columns no row uses (each would cost a verified position)."""
        used = self.valid.any(0)
        width = int(used.nonzero().max()) + 1 if bool(used.any()) else 0
        if width == self.num_nodes:
            return self
        q = None if self.q is None else self.q[:, :width]
        out = Draft(self.tokens[:, :width], self.parents[:, :width], self.valid[:, :width], self.kind, q)
        if "is_chain" in self.__dict__:
            out.__dict__["is_chain"] = self.__dict__["is_chain"]
        return out

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

    def check(self, batch_size: int, vocab_size: int, budget: torch.Tensor) -> None:
        """Raise :class:`ConfigError` unless this draft is well formed for ``batch_size`` rows, token ids are in
        ``[0, vocab_size)``, parents come first and are valid, and row ``b`` has at most ``budget[b]`` nodes."""
        if self.batch_size != batch_size:
            raise ConfigError(f"draft has {self.batch_size} rows, the batch has {batch_size}")
        if self.num_nodes == 0:
            return
        ar = torch.arange(self.num_nodes, device=self.tokens.device)
        parent_valid = self.valid.gather(1, self.parents.clamp(min=0)) | (self.parents < 0)
        checks = torch.stack(
            [
                (~self.valid | ((self.parents < ar) & (self.parents >= -1) & parent_valid)).all(),
                (~self.valid | ((self.tokens >= 0) & (self.tokens < vocab_size))).all(),
                (self.num_valid <= budget.to(self.tokens.device)).all(),
            ]
        ).tolist()
        messages = (
            "every valid node needs -1 <= parents[i] < i and a valid parent (list nodes parents-first)",
            f"draft token ids must be in [0, {vocab_size}) (the target vocabulary)",
            "the drafter returned more nodes than its budget allows",
        )
        for ok, message in zip(checks, messages):
            if not ok:
                raise ConfigError(f"malformed Draft: {message}")


@dataclass(frozen=True, eq=False)
class Verdict:
    """A verifier's decision for one round.

    Attributes:
        accepted: ``[B, D]`` accepted node indices along one root-to-leaf path, in order; ``-1`` pads.
        num_accepted: ``[B]`` length of that path (0 = every draft token rejected).
        next_token: ``[B]`` the new pending token: a correction (after a rejection) or a bonus token.
    """

    accepted: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor


@dataclass(frozen=True, eq=False)
class DraftStep:
    """What a step-wise drafter reports after drafting one token per row (for stop rules).

    Attributes:
        index: 0-based position of the token in the chain.
        tokens: ``[B]`` the tokens just drafted.
        token_probs: ``[B]`` probability the drafter gave them.
        probs: ``[B, V]`` the drafter's full distribution, or None if it has none.
    """

    index: int
    tokens: torch.Tensor
    token_probs: torch.Tensor
    probs: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class DraftBudget:
    """How much to draft this round, per row.

    Attributes:
        lengths: ``[B]`` the maximum number of tokens (or tree nodes) each row may draft; 0 = do not draft.
        stop: optional rule a step-wise drafter calls after each drafted token; returns ``[B]`` bool, True for
            rows that should stop drafting (the token just drafted is kept).
    """

    lengths: torch.Tensor
    stop: Callable[[DraftStep], torch.Tensor] | None = None

    @cached_property
    def max_len(self) -> int:
        """The longest budget in the batch (a host sync)."""
        return int(self.lengths.max()) if self.lengths.numel() else 0

    def mask(self, width: int | None = None) -> torch.Tensor:
        """``[B, width]`` bool, True where position j < lengths[b] (width defaults to ``max_len``)."""
        width = self.max_len if width is None else width
        return torch.arange(width, device=self.lengths.device) < self.lengths[:, None]


@dataclass(frozen=True)
class GenerationOutput:
    """Result of :func:`decodekit.generate`.

    Attributes:
        sequences: generated tokens per row (prompt excluded), stopped at EOS (included) or max_new_tokens.
        finish_reasons: per row, ``"eos"`` or ``"length"``.
        stats: counters and timings of the run.
    """

    sequences: list[list[int]]
    finish_reasons: list[str]
    stats: SpecStats = field(repr=False)
