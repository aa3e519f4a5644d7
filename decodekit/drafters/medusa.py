"""Medusa (Cai et al., ICML'24, arXiv 2401.10774): ``K`` heads on the target's last hidden state, head ``k``
predicting the token ``k + 1`` places ahead, all from the one feature the verification forward already computed.

Head ``k`` is a residual block ``h_k = f + SiLU(W_k f + b_k)`` (``W_k`` starts at zero, so every head starts as the
target's own next-token head) read by the target's output head restricted to a draft vocabulary ``V_d`` (the
trimmed, most frequent tokens; ``-inf`` elsewhere). With ``f = f_{c-1}``, the target's feature of the last
committed token, the pending token ``x_c`` came from the target's head and head ``k`` proposes ``x_{c+k}``: the
draft is the chain of each head's argmax after the pending token. Drafting costs ``K`` small matrix products and no
sequential model call.

Faithfulness: Medusa-1's head architecture and loss (:mod:`decodekit.train.medusa`: soft cross-entropy to the
target's own distribution, weights ``0.8^k``), with the output matrix shared with the frozen target instead of a
trained copy per head (Medusa-1 initialises each head's ``W2`` from it). Trees: Medusa's static sparse tree
(``template=``): node ``(r1, ..., rd)`` is head ``d``'s ``rd``-th most likely token (the heads do not see the path,
so a node's token depends only on its depth and rank), fitted to each round's budget; our named templates, not
Medusa's calibrated ones. Drafts are deterministic (q-kind "none"), verified as point masses at any temperature:
lossless.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from decodekit.cache import KVCache
from decodekit.checks import check_int
from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.draft.templates import TreeTemplate, ranked_tree, resolve_template
from decodekit.drafters.head_files import TrimmedHead, load_tensors, on_target, read_head, save_head
from decodekit.drafters.medusa_release import ReleasedMedusaHeads, load_release, release_file
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel, ModelOutput
from decodekit.registry import register
from decodekit.resources import shipped_weights
from decodekit.spec.component_checks import check_target_parts
from decodekit.spec.round import Round
from decodekit.spec.state import DecodeState
from decodekit.types import SamplingParams

DEFAULT_WEIGHTS = "medusa_smollm2-135m-instruct.safetensors"
RETRAIN = "python -m decodekit train recipe=medusa (docs/training.md)"


def default_weights() -> Path:
    """The heads shipped for the zoo's ``smollm2-135m-instruct``."""
    return shipped_weights(DEFAULT_WEIGHTS)


class MedusaHeads(nn.Module):
    """``K`` residual blocks on the target's final hidden state.

    Args:
        hidden_size: ``H``.
        num_heads: ``K``.
        vocab: ``[V_d]`` the token ids the heads score (most frequent first).
    """

    def __init__(self, hidden_size: int, num_heads: int, vocab: torch.Tensor) -> None:
        super().__init__()
        check_int("num_heads", num_heads, low=1)
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.register_buffer("vocab", vocab.long())

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        """``f [..., H]`` -> ``[..., K, H]``: each head's feature (read by the output head)."""
        return torch.stack([f + nn.functional.silu(block(f)) for block in self.blocks], -2)

    def save(self, path: str | Path, metadata: dict[str, Any]) -> None:
        """Write the weights (float16) and ``metadata`` (:func:`~decodekit.drafters.head_files.head_metadata`)."""
        save_head(self, path, {"num_heads": len(self.blocks), **metadata})


def load_heads(path: str | Path, target: LanguageModel) -> MedusaHeads:
    """The heads in ``path`` for ``target`` (its device, dtype and CPU kernels); refuses heads trained for
    another target."""
    meta, tensors = read_head(path, target, "Medusa heads", RETRAIN)
    try:
        heads = MedusaHeads(int(meta["hidden_size"]), int(meta["num_heads"]), tensors["vocab"])
    except Exception as error:
        raise ConfigError(f"{path} does not match the Medusa heads' layout: {error}") from None
    load_tensors(heads, tensors, path, "Medusa heads", RETRAIN)
    return on_target(heads, target)


@register("drafter", "medusa")
class MedusaDrafter:
    """Draft a chain of each Medusa head's argmax after the pending token, or a static tree of their top-ranked
    tokens (see the module docstring).

    Host syncs: none of its own.

    Args:
        weights: a heads file (:meth:`MedusaHeads.save`), or a Medusa-1 release directory (its own output layers:
            :mod:`decodekit.drafters.medusa_release`); None = the heads shipped for ``smollm2-135m-instruct``.
        target: optionally the target to load the heads for now (a mismatch is refused here, not at the first call).
        template: None = chains; a :class:`~decodekit.draft.templates.TreeTemplate` or a name in
            ``decodekit.draft.templates.TEMPLATES`` = trees (depth capped at the number of heads; give the policy a
            node budget).
    """

    shares_target = True
    needs = frozenset({"hidden", "prefill"})
    target_parts = frozenset({"embed", "head"})

    def __init__(
        self, weights: str | Path | None = None, target: Any = None, template: TreeTemplate | str | None = None
    ) -> None:
        self.template = template
        self._template = None if template is None else resolve_template(template)
        self.weights = default_weights() if weights is None else Path(weights)
        self.release = release_file(self.weights) is not None  # a Medusa-1 release (its own output layers)
        if not self.release and not self.weights.is_file():
            raise ConfigError(
                f"no Medusa heads at {self.weights}; train them with {RETRAIN} and pass weights=, or pass a Medusa-1 "
                "release directory (config.json and medusa_lm_head.pt / .safetensors)"
            )
        self.heads: MedusaHeads | ReleasedMedusaHeads | None = None
        self._for: int | None = None
        if target is not None:
            from decodekit.models import load_model

            self._load(load_model(target))

    def _load(self, target: LanguageModel) -> None:
        if self._for != id(target):
            check_target_parts(self, target)
            self._for = id(target)
            if self.release:
                self.heads = load_release(self.weights, target)
                self.scores, self.dtype = self.heads.scores, self.heads.out.dtype
            else:
                self.heads = load_heads(self.weights, target)
                self.trimmed = TrimmedHead(target, self.heads.vocab)
                if self.trimmed.proj is None:
                    raise ConfigError(f"the medusa drafter needs a target with a linear output head; got {target!r}")
                self.scores, self.dtype = self.trimmed.scores, self.trimmed.dtype
        self.target = target

    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        return DraftKind.DETERMINISTIC

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache, prefill: ModelOutput) -> None:
        self._load(target)
        last = (state.lengths - 2).clamp(min=0)  # the last prompt token (the pending one follows it)
        self.f = prefill.last_hidden.gather(1, last[:, None, None].expand(-1, 1, prefill.last_hidden.shape[-1]))[:, 0]

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        k = min(budget.max_len, self.heads.num_heads)  # type: ignore[union-attr]
        if k == 0:
            return Draft.empty(state.batch_size, state.device)
        h = self.heads(self.f.to(self.dtype))[:, :k]  # type: ignore[misc]  # [B, k, H]
        scores = self.scores(h)  # [B, k, V_d]
        if self._template is not None:
            return ranked_tree(self._template, scores, budget, self.heads.vocab)  # type: ignore[union-attr]
        tokens = self.heads.vocab[scores.argmax(-1)]  # type: ignore[union-attr]
        valid = torch.arange(k, device=state.device)[None] < budget.lengths[:, None]
        filled = budget.filled_width  # a row's length is max_len >= k: the chain's width is k
        return Draft.chain(tokens, valid=valid).knowing_width(None if filled is None else k)

    def observe(self, state: DecodeState, round: Round) -> None:
        """Keep the target's feature of each row's last committed token."""
        hidden = round.hidden  # [B, 1 + D, H]
        last = (round.counts - 1).clamp(min=0)[:, None, None].expand(-1, 1, hidden.shape[-1])  # type: ignore[union-attr]
        self.f = hidden.gather(1, last)[:, 0]  # type: ignore[union-attr]

    def select_rows(self, rows: torch.Tensor) -> None:
        self.f = self.f.index_select(0, rows)
