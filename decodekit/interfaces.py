"""The Protocols a component implements. A notebook class satisfies them without inheriting anything.

Only the methods listed in each Protocol are required. Components may also define these optional hooks, which
:func:`decodekit.generate` calls when present:

* ``begin(state)`` -- once per call, after prefill (reset per-row state, prefill a draft model).
* ``observe(state, draft, verdict)`` -- after every round, once the state holds the new tokens.
* ``select_rows(rows)`` -- rows finished; keep only ``rows [B']`` of any per-row state.
* ``draft_kind(sampling) -> DraftKind`` (drafters) -- the kind of drafts it will produce, checked against the
  verifier before anything runs; ``vocab_size`` (drafters) -- checked against the target's.
* ``check(sampling)`` (verifiers) -- raise :class:`~decodekit.errors.ConfigError` for unsupported settings.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from decodekit.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, SamplingParams, Verdict


@runtime_checkable
class Drafter(Protocol):
    """Proposes a token tree (a chain is a tree) continuing each row's pending token."""

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        """Return a :class:`Draft` with at most ``budget.lengths[b]`` valid nodes in row ``b``."""
        ...


@runtime_checkable
class Verifier(Protocol):
    """Decides which path of a draft the target accepts, and the next pending token.

    Attributes:
        accepts: the draft kinds it verifies without bias.
        lossless: whether the output distribution equals the target's (greedy: equals greedy decoding).
    """

    accepts: frozenset[DraftKind]
    lossless: bool

    def verify(
        self,
        draft: Draft,
        logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Verdict:
        """``logits [B, N + 1, V]``: row 0 follows the pending token, row ``i + 1`` follows draft node ``i``."""
        ...


@runtime_checkable
class LengthPolicy(Protocol):
    """Decides how much each row drafts this round."""

    def plan(self, state: DecodeState) -> DraftBudget:
        """Return the per-row budget (the loop caps it by what each row may still generate)."""
        ...
