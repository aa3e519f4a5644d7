"""DFlash (Chen, Liang, Liu 2026, "DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036): a
block-diffusion head on the target's fused hidden states drafts a whole block in one forward.

Each round the head (:class:`~decodekit.drafters.dflash_head.DFlashHead`) takes the target's layer outputs of the
tokens committed since its last round (the prefill's, then each verification forward's ``Round.layer_hidden``),
fuses them and writes each head layer's keys and values of those positions into its own
:class:`~decodekit.cache.KVCache` (KV injection: written once, never recomputed). It then runs one bidirectional
forward over a block of ``block_size`` slots, the pending token and ``block_size - 1`` mask slots, against that
cache; slot ``j``'s output, scored by the target's output head (over the head's draft vocabulary), is the draft
distribution ``q_j`` of the token ``j`` after the pending one. The block's keys and values are not kept.

Lossless at any temperature. All slots come from the one forward, which sees only committed tokens, so the ``k``
drafts are drawn independently, token ``j`` from ``q_j`` after the call's logits processors: the law of token ``j``
given the tokens before it is exactly the reported ``q_j``, which rejection and SpecInfer verification need (as for
the ``diffusion`` drafter's single step). Greedy: argmax drafts, so greedy output equals plain decoding.

Faithfulness: the reference's drafting loop (z-lab/dflash ``dflash_generate`` at 44947fb: a block of the pending
token and mask slots at the next positions, the context's keys and values cached, the block's dropped, drafts from
one forward; its greedy acceptance lengths are reproduced in ``tests/unit/test_dflash.py`` on a tiny target).
Ours: any verifier and length policy of decodekit (the reference verifies by matching the target's samples, which
for argmax drafts is what the ``greedy`` / ``rejection`` verifiers do), ragged batches, drafts shorter than the
block (a policy's ``k``; the block keeps its trained size), the head's learned mask embedding. The head is trained
by ``python -m decodekit train recipe=dflash`` (:mod:`decodekit.train.dflash`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.draft import Draft
from decodekit.draft.budget import DraftBudget
from decodekit.drafters.chain import ReadsAHeadPerTarget, draft_block
from decodekit.drafters.dflash_head import DFlashHead
from decodekit.drafters.dflash_release import is_release, load_dflash_release, release_fields
from decodekit.drafters.feature_queue import requeue
from decodekit.drafters.head_files import (
    TrimmedHead,
    head_path,
    load_tensors,
    on_target,
    read_head,
    read_metadata,
    target_config,
)
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel, ModelOutput
from decodekit.registry import register
from decodekit.spec.round import Round
from decodekit.spec.state import DecodeState

__all__ = ["DFlashDrafter", "load_dflash"]

RETRAIN = "python -m decodekit train recipe=dflash (docs/training.md)"


def load_dflash(path: str | Path, target: LanguageModel) -> tuple[DFlashHead, dict[str, Any]]:
    """The DFlash head in ``path`` (a file :meth:`DFlashHead.save` wrote) for ``target``, and its metadata; a head
    trained for another target, or a file of another kind, is refused with what to do."""
    config = target_config(target, "dflash")
    meta, tensors = read_head(path, target, "a DFlash head", RETRAIN)
    if meta.get("architecture") != "dflash":
        raise ConfigError(f"{path} is not a DFlash head file (architecture {meta.get('architecture')!r}); {RETRAIN}")
    layers = [int(i) for i in meta["layers"]]
    if not all(1 <= i <= target.num_layers for i in layers):
        raise ConfigError(
            f"the DFlash head {Path(path).name} reads target layers {layers}, and this target has "
            f"{target.num_layers}: it was trained for another target; {RETRAIN} base=<your target>"
        )
    head = DFlashHead(config, layers, int(meta["head_layers"]), int(meta["block_size"]), tensors["vocab"])
    load_tensors(head, tensors, path, "a DFlash head", RETRAIN)
    return on_target(head, target, bf16=False), meta  # its norms take float32 (bfloat16 linears would mix dtypes)


@register("drafter", "dflash")
class DFlashDrafter(ReadsAHeadPerTarget):
    """Draft up to ``block_size - 1`` tokens a round with a DFlash head, in one head forward (module docstring).

    Args:
        weights: a DFlash head file (:meth:`~decodekit.drafters.dflash_head.DFlashHead.save`, written by
            ``train recipe=dflash``), or a directory in the layout z-lab releases and vLLM serves
            (:mod:`~decodekit.drafters.dflash_release`); read when the call starts and refused if it was made for
            another target.
        temperature: the drafter's sampling temperature; None = the call's. 0 = argmax drafts.
        target: optionally the target to load the head for now (refusals then come here, not at the first call).

    Host syncs: none of its own (the host mirrors of the lengths size the context writes and the block's keys).
    """

    needs = frozenset({"prefill", "host_rows"})
    shares_target = True
    target_parts = frozenset({"embed", "head", "layers", "config"})

    def __init__(self, weights: str | Path, temperature: float | None = None, target: Any = None) -> None:
        self.weights = head_path(weights, "DFlash")
        meta = release_fields(self.weights) if is_release(self.weights) else read_metadata(self.weights)
        if not meta.get("layers") or not (self.weights.is_dir() or meta.get("architecture") == "dflash"):
            raise ConfigError(
                f"no DFlash head at {self.weights}; train one with {RETRAIN} and pass weights=<its file> (or a "
                "directory in the released layout: decodekit.drafters.dflash_release)"
            )
        self.hidden_layers = tuple(int(i) for i in meta["layers"])
        self.block_size = int(meta["block_size"])
        self._start(temperature, target)

    def _read(self, target: LanguageModel) -> tuple[DFlashHead, dict[str, Any]]:
        head, meta = (load_dflash_release if self.weights.is_dir() else load_dflash)(self.weights, target)
        self.trimmed = TrimmedHead(target, head.vocab)
        return head, meta

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache, prefill: ModelOutput) -> None:
        """Load the head (once per target), start its cache and queue the prompt's features."""
        self._load(target)
        self.cache = target.new_cache(state.batch_size, state.tokens.shape[1])
        self.feats = self._features(prefill.hidden)  # [B, T, H]: positions cache.lengths ..
        self._drafted = False

    def _features(self, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        return self.head.context(torch.cat([layers[i] for i in self.hidden_layers], -1))  # type: ignore[union-attr]

    def _write_context(self, state: DecodeState) -> None:
        """Write the head's context keys and values of the committed positions it has not seen (all but the
        pending token's), from the queued features."""
        seen = self.cache.host_lengths()
        unseen = [n - 1 - s for n, s in zip(state.host_lengths, seen)]
        width = max(unseen)
        if width == 0:
            return
        positions = self.cache.lengths[:, None] + torch.arange(width, device=state.device)
        view = self.cache.stage(width)
        for i, (k, v) in enumerate(self.head.context_kv(self.feats[:, :width], positions)):  # type: ignore[union-attr]
            view.update(k, v, i)
        self.cache.keep(state.lengths - 1 - self.cache.lengths, host_counts=unseen)

    def _block_logits(self, state: DecodeState) -> torch.Tensor:
        """``[B, block_size - 1, V]`` float32 draft logits of the slots after each row's pending token."""
        head, cache, n = self.head, self.cache, self.block_size
        assert head is not None
        rows = torch.arange(state.batch_size, device=state.device)
        pending = state.tokens[rows, state.lengths - 1]
        x = head.block_inputs(self.target.embed(pending[:, None])[:, 0], n)
        cached = max(cache.host_lengths())  # every row has a context: a prompt is never empty
        past = [(cache.keys[i][:, :, :cached], cache.values[i][:, :, :cached]) for i in range(len(head.layers))]
        keys = torch.arange(cached, device=state.device)[None] < cache.lengths[:, None]  # [B, S]
        mask = torch.cat([keys, keys.new_ones(state.batch_size, n)], 1)[:, None, None].expand(-1, 1, n, -1)
        positions = cache.lengths[:, None] + torch.arange(n, device=state.device)
        return self.trimmed.logits(head(x, positions, past, mask)[:, 1:])

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        self._write_context(state)
        self._drafted = True
        if budget.max_len == 0 or budget.width == 0:
            return Draft.empty(state.batch_size, state.device)
        budget = budget.capped_at(self.block_size - 1)  # a block drafts at most its mask slots
        return draft_block(state, budget, self.sampling(state.sampling), self._block_logits(state))

    def observe(self, state: DecodeState, round: Round) -> None:
        """Queue the target's features of the tokens this round committed (after those still queued when the
        loop did not ask for a draft this round)."""
        new = self._features(round.layer_hidden)
        if self._drafted:
            self.feats, self._drafted = new, False
            return
        unseen = state.lengths - 1 - round.counts - self.cache.lengths  # [B]: still queued from before the round
        self.feats = requeue(self.feats, unseen, new)

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        self.cache.select_rows(rows, host_rows=host_rows)
        self.feats = self.feats.index_select(0, rows)
