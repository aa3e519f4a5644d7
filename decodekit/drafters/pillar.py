"""PillarAttn (SparseSpec, arXiv 2512.01278): self-speculation where the target drafts with sparse attention over
the context tokens its own last verification attended to most.

Each verification forward runs full attention over the pending token and the draft; the drafter arms the target
to record, per layer and key/value head, the attention probabilities of those queries summed over queries and
each head's query group (:meth:`~decodekit.models.hf.HFCausalLM.record_attention`). After the round it keeps, per
row, layer and key/value head, the ``max(keep, ceil(fraction * context))`` committed slots with the most attention
(the "pillars"; every slot when the context is shorter), and the next draft steps attend only to those plus
everything written since that verification (the newly committed tokens and the draft itself). The target's
weights, its KV cache and all its layers draft: a draft step costs what a target step costs, less the attention
it skips, so it pays only where attention over a long context dominates (long reasoning outputs on a large
model); on a 135M model on a CPU the weights dominate and it cannot.

Faithfulness: the selection rule (verification's attention, summed over its queries and the query-head group,
top-K per layer and key/value head with ``K = max(128, ceil(0.05 * context))``, reused until the next
verification) follows the paper's description; the scores are recomputed by one extra product per layer beside
SDPA (the paper re-materialises them in its kernel from the saved log-sum-exp), and the sparse attention is a
mask over the dense cache (the paper gathers the selected K/V, which is where its savings come from; here the
draft computes as much as a full step). Before the first verification, the first draft step runs dense and its
own attention (one query) chooses the pillars for the steps after it. Rows that skip a verification keep theirs.
Lossless with every lossless verifier (a drafter only proposes).
"""

from __future__ import annotations

import math

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_float, check_int
from decodekit.draft import Draft
from decodekit.draft.budget import DraftBudget
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel
from decodekit.registry import register
from decodekit.spec.round import Round
from decodekit.spec.state import DecodeState


@register("drafter", "pillar")
class PillarDrafter(EarlyExitDrafter):
    """Draft with the whole target, attending only to the slots its last verification attended to most.

    Args:
        keep: the least slots kept per layer and key/value head (the paper's 128).
        fraction: the share of the context kept when that is more (the paper's 0.05).
        temperature: the drafter's sampling temperature; None = the call's.

    Attributes:
        attend: ``[L, B, Hkv, S0]`` bool, the slots each row may attend to per layer and key/value head (slots
            ``>= S0`` all may); None before the first verification.
    """

    def __init__(self, keep: int = 128, fraction: float = 0.05, temperature: float | None = None) -> None:
        super().__init__(None, temperature)
        self.keep = check_int("keep", keep, low=1, hint=" (slots kept per layer and head)")
        self.fraction = check_float("fraction", fraction, low=0, high=1)

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache) -> None:
        if not target.records_attention or not target.full_attention:
            raise ConfigError(
                f"pillar drafts with the target's own attention scores; {target!r} cannot record them (it needs a "
                "transformers model running sdpa attention, with every layer attending alike: no sliding windows)"
            )
        self.target, self.cache = target, cache
        self.attend: torch.Tensor | None = None
        self.scores: dict[int, torch.Tensor] = {}
        self.context: torch.Tensor | None = None  # [B] committed slots when the scores were recorded

    def layer_args(self) -> dict[str, torch.Tensor]:
        return {} if self.attend is None else {"attend": self.attend}

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        draft = super().propose(state, budget)
        self._record()  # the next forward is the verification
        return draft

    def _record(self) -> None:
        """Have the target's next forward record its attention, over the rows' current committed slots."""
        self.scores, self.context = {}, self.cache.lengths.clone()
        self.target.record_attention(self.scores)  # type: ignore[attr-defined]

    def _step(self, x: torch.Tensor, offset: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A draft step; before any verification, the first step runs dense and its own attention picks the
        pillars for the steps after it."""
        if self.attend is not None or offset > 0:
            return super()._step(x, offset, hidden)
        self._record()
        out = super()._step(x, offset, hidden)
        self._choose(None)
        return out

    def observe(self, state: DecodeState, round: Round) -> None:
        """Choose the pillars from the verification's attention (rows keep theirs when it recorded nothing)."""
        self._choose(max(state.host_lengths) if state.host_lengths else None)

    def _choose(self, context: int | None) -> None:
        """Keep, per row, layer and key/value head, the ``max(keep, ceil(fraction * context))`` committed slots
        with the most recorded attention, and every slot past the row's committed length."""
        if not self.scores or self.context is None:
            return
        mass = torch.stack([self.scores[i] for i in sorted(self.scores)])  # [L, B, Hkv, S]
        slots = torch.arange(mass.shape[-1], device=mass.device)
        committed = slots < self.context[:, None]  # [B, S]: the context the recorded queries saw
        context = mass.shape[-1] if context is None else context
        k = min(mass.shape[-1], max(self.keep, math.ceil(self.fraction * context)))
        top = mass.masked_fill(~committed[None, :, None], -1.0).topk(k, dim=-1).indices
        chosen = torch.zeros_like(mass, dtype=torch.bool).scatter_(-1, top, True)
        self.attend = chosen | ~committed[None, :, None]  # every slot past the context: new tokens, the draft
        self.scores = {}

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.attend is not None:
            self.attend = self.attend[:, rows]
        if self.context is not None:
            self.context = self.context[rows]
