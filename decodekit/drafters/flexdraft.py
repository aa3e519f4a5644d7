"""FlexDraft (arXiv 2605.20022), its sequential mode: the target itself drafts a block through mask tokens, with
the attention projections of its last few layers tuned for the mask slots only.

Each round one forward of the target runs a block of ``block_size`` slots after each row's committed tokens: the
pending token, then mask slots. The target's first ``L - n`` layers run on the pending token alone (an early-exit
forward, staged in the target's own :class:`~decodekit.cache.KVCache`); the mask slots join at layer ``L - n`` as
the head's learned mask embedding, and the last ``n`` layers run over the block with the head's tuned attention
projections at the mask slots (:class:`~decodekit.drafters.flexdraft_head.FlexDraftHead`), reading the committed
context's keys and values from the same cache. Nothing the forward stages survives: verification stages
the pending token and the draft at the same slots in every layer, so the output is exactly the target's. Draft
``1`` comes from the pending token's output, which is the target's own next-token distribution (its path through
the model is the target's); drafts ``2 .. k`` come from mask slots ``1 .. k - 1``.

Lossless at any temperature. The whole block comes from one forward over committed tokens only, so each draft is
drawn from its own ``q_j`` independently of the others and its law given the tokens before it is exactly the
reported ``q_j`` (as for the ``dflash`` and ``diffusion`` drafters); greedy drafts are argmaxes, so greedy output
equals plain decoding.

Faithfulness ``[paper]``, and only its sequential mode: built from the paper's abstract (its method sections were not
reachable here) and read against its authors' inference release (Yaro1214/FlexDraft at d684800; no training code
there): the attention projections and query / key norms of the last layers tuned for mask slots only, full copies,
the mask slots entering at the first tuned layer as one learned vector, the autoregressive path exact, which is what
this drafter and ``train recipe=flexdraft`` do, and its verification length from the drafts' confidence
(``confidence``: the release's ``cumulative_product`` rule). Not here: the parallel mode (one group of mask slots
per possible accepted length riding in the verification forward, and the small MLP conditioned on the resolved bonus
token that recalibrates their logits), because decodekit's loop verifies with the target's own ``score`` forward
and a drafter cannot add positions to it; in the sequential mode the bonus token is the block's pending token,
which the mask slots attend to, so there is nothing for that calibration to correct. With it goes the batch-size
switch between the two modes. Ours: the shifted slots (the release's block puts a discarded slot at the bonus
token's place and mask slot ``p`` predicts the token at ``p``; here the pending token's own output is draft 1, so a
block of ``n`` drafts ``n``), the default block of 8 (the release's: 16), the whole training recipe. Trained by
``python -m decodekit train recipe=flexdraft`` (:mod:`decodekit.train.flexdraft`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_float
from decodekit.draft import Draft
from decodekit.draft.budget import DraftBudget
from decodekit.drafters.chain import ReadsAHeadPerTarget, draft_block
from decodekit.drafters.flexdraft_head import FlexDraftHead, block_slots_mask
from decodekit.drafters.head_files import head_path, load_tensors, on_target, read_head, read_metadata
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel
from decodekit.registry import register
from decodekit.spec.state import DecodeState

__all__ = ["FlexDraftDrafter", "block_logits", "load_flexdraft"]

RETRAIN = "python -m decodekit train recipe=flexdraft (docs/training.md)"


def load_flexdraft(path: str | Path, target: LanguageModel) -> tuple[FlexDraftHead, dict[str, Any]]:
    """The FlexDraft head in ``path`` (written by :meth:`FlexDraftHead.save`) for ``target``, and its metadata; a
    head trained for another target, or a file of another kind, is refused with what to do."""
    meta, tensors = read_head(path, target, "a FlexDraft head", RETRAIN)
    if meta.get("architecture") != "flexdraft":
        raise ConfigError(f"{path} is not a FlexDraft head file (architecture {meta.get('architecture')!r}); {RETRAIN}")
    head = FlexDraftHead(target, int(meta["tuned_layers"]), int(meta["block_size"]))
    load_tensors(head, tensors, path, "a FlexDraft head", RETRAIN)
    return on_target(head, target), meta


def block_logits(head: FlexDraftHead, target: Any, cache: KVCache, pending: torch.Tensor) -> torch.Tensor:
    """``[B, block_size, V]`` logits of one FlexDraft block after each row's cached tokens: slot 0 the pending
    tokens ``pending [B]`` (the target's own next-token logits), then the mask slots. Stages the block in ``cache``
    (the next forward's staging overwrites it)."""
    n, batch = head.block_size, len(pending)
    view = cache.stage(1)  # the pending token through the first L - n layers, as the target runs it
    mask, positions = block_slots_mask(cache.lengths, 1, view.kv_len)
    none = torch.zeros(batch, 0, dtype=torch.long, device=pending.device)  # no logits at the exit
    out = target.forward(pending[:, None], positions, mask, view, none, exit_layer=head.first,
                         hidden_layers=(head.first,))  # fmt: skip
    view = cache.stage(n)  # the block through the last n layers, the mask slots entering there
    mask, positions = block_slots_mask(cache.lengths, n, view.kv_len)
    x = torch.cat([out.hidden[head.first], head.mask_slots(batch, n - 1).to(out.hidden[head.first])], 1)
    return target.head(head(target, x, 1, positions, mask, view)).float()


@register("drafter", "flexdraft")
class FlexDraftDrafter(ReadsAHeadPerTarget):
    """Draft up to ``block_size`` tokens a round with the target itself through mask slots (module docstring).

    Args:
        weights: a FlexDraft head file (written by ``train recipe=flexdraft``); read when the call starts and
            refused if it was trained for another target.
        temperature: the drafter's sampling temperature; None = the call's. 0 = argmax drafts.
        target: optionally the target to load the head for now (refusals then come here, not at the first call).
        confidence: FlexDraft's verification length (its ``cumulative_product`` rule; the release's threshold is
            0.01): each row drafts the pending token's draft, then mask-slot drafts while the product of their top-1
            probabilities stays at least ``confidence``
            (:func:`~decodekit.drafters.chain.draft_block`); 0 = every draft the budget allows.

    Host syncs: none of its own (with ``confidence > 0`` the loop reads the draft's width: one a round).
    """

    shares_target = True
    target_parts = frozenset({"embed", "head", "layers"})

    def __init__(
        self, weights: str | Path, temperature: float | None = None, target: Any = None, confidence: float = 0.0
    ) -> None:
        self.weights = head_path(weights, "FlexDraft")
        self.confidence = check_float("confidence", confidence, low=0.0, high=1.0, hint=" (a probability; 0 = off)")
        meta = read_metadata(self.weights)
        if not self.weights.is_file() or meta.get("architecture") != "flexdraft":
            raise ConfigError(
                f"no FlexDraft head at {self.weights}; train one with {RETRAIN} and pass weights=<its file>"
            )
        self.block_size = int(meta["block_size"])
        self._start(temperature, target)

    def _read(self, target: LanguageModel) -> tuple[FlexDraftHead, dict[str, Any]]:
        return load_flexdraft(self.weights, target)

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache) -> None:
        self._load(target)
        self.cache = cache

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        if budget.max_len == 0 or budget.width == 0:
            return Draft.empty(state.batch_size, state.device)
        assert self.head is not None
        budget = budget.capped_at(self.block_size)
        return draft_block(state, budget, self.sampling(state.sampling), self._block(state), self.confidence)

    def _block(self, state: DecodeState) -> torch.Tensor:
        """``[B, block_size, V]``: the block's logits after each row's committed tokens (:func:`block_logits`)."""
        rows = torch.arange(state.batch_size, device=state.device)
        return block_logits(self.head, self.target, self.cache, state.tokens[rows, state.lengths - 1])  # type: ignore[arg-type]
