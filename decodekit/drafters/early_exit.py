"""Early-exit self-speculation (LayerSkip, Elhoushi et al., ACL'24, arXiv 2404.16710; Draft & Verify, Zhang et al.,
ACL'24): the target drafts with its own first ``L`` layers and its own final norm and output head, in its own KV
cache.

Draft step ``j`` runs one token through layers ``1..L`` at position ``c + j`` (``c``: the row's committed length;
step 0 runs the pending token), staged in the target's :class:`~decodekit.cache.KVCache` at offset ``j``. The
verification forward then stages ``[pending] + draft`` at offset 0 and overwrites those slots in every layer, so
nothing the drafter wrote survives into the committed cache and the output is exactly the target's. There is no
second model and no second cache; a draft step costs ``L / N`` of a target step.

Faithfulness: LayerSkip's self-speculative decoding without its training recipe (layer dropout and an early-exit
loss, which make shallow exits agree with the last layer) and without its reuse of the draft's first-``L``-layer
K/V entries in verification (here verification recomputes them). The exit is the target's own ``head(norm(h_L))``
untrained by default, as transformers' ``assistant_early_exit``: on a model not trained for early exit, shallow
layers agree with the last one rarely. With ``exit_head=`` a trained adapter
(:class:`~decodekit.drafters.exit_head.ExitHead`, Kangaroo-style but position-wise; see its module) maps layer
``L``'s state to the final one and scores a trimmed vocabulary; the output head's full width is then never computed
while drafting. Kangaroo's early stop on low draft confidence (its defaults: threshold 0.6, at most 6 steps) is a
policy here, ``ConfidenceStop(0.6, 6)``, not part of the drafter. DEL's per-context exit choice is
:class:`~decodekit.drafters.DynamicExitDrafter`. Chains only. Lossless with every lossless verifier (sampled drafts
carry ``q``; tokens outside a trimmed vocabulary have ``q = 0``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_float, check_int
from decodekit.draft import Draft
from decodekit.draft.budget import DraftBudget, stop_needs_hidden
from decodekit.drafters.chain import SamplesLikeTheTarget, draft_chain
from decodekit.drafters.exit_head import ExitHead, default_weights, load_exit_head
from decodekit.drafters.head_files import TrimmedHead
from decodekit.errors import ConfigError
from decodekit.masks import chain_mask
from decodekit.models.base import LanguageModel
from decodekit.registry import register
from decodekit.spec.component_checks import check_target_parts
from decodekit.spec.state import DecodeState


@register("drafter", "early_exit")
class EarlyExitDrafter(SamplesLikeTheTarget):
    """Draft with the target's first ``exit_layer`` layers and its own head (or a trained exit head), in the
    target's KV cache.

    Args:
        exit_layer: layers that draft, ``1 <= L < num_layers`` of the target (checked in ``begin``); None = half,
            or the exit head's layer.
        temperature: the drafter's sampling temperature; None = the call's.
        exit_head: None = the target's own norm and head (untrained exit); True = the exit head shipped for the zoo
            target ``smollm2-135m-instruct``; or a head file (:meth:`ExitHead.save`). Refused in ``begin`` on a
            target it was not trained for, or with another ``exit_layer``.
        target: optionally the target to load the exit head for now, so a head that does not fit it is refused
            here rather than at the first call.
    """

    shares_target = True
    target_parts = frozenset({"layers"})  # with an exit head also its input and output: embed, norm, head

    def __init__(
        self,
        exit_layer: int | None = None,
        temperature: float | None = None,
        exit_head: str | Path | bool | None = None,
        target: Any = None,
    ) -> None:
        self.exit_layer = check_int("exit_layer", exit_layer, low=1, optional=True, hint=" (None = half the layers)")
        self.temperature = check_float("temperature", temperature, low=0, optional=True, hint=" (None = the call's)")
        if exit_head is False:
            exit_head = None
        self.weights = default_weights() if exit_head is True else None if exit_head is None else Path(exit_head)
        if self.weights is not None:
            self.target_parts = frozenset({"layers", "embed", "norm", "head"})
        if self.weights is not None and not self.weights.is_file():
            from decodekit.drafters.exit_head import RETRAIN

            raise ConfigError(f"no exit head at {self.weights}; train one with {RETRAIN} and pass exit_head=<its file>")
        self.head: ExitHead | None = None
        self._head_for: int | None = None  # id of the target the head was loaded for
        if target is not None and self.weights is not None:
            from decodekit.models import load_model

            self._load(load_model(target))

    def _load(self, target: LanguageModel) -> None:
        """Load the exit head for ``target`` (once per target object) and check its layer."""
        if self._head_for != id(target):
            check_target_parts(self, target)
            self.head, self.metadata = load_exit_head(self.weights, target)  # type: ignore[arg-type]
            self.trimmed = TrimmedHead(target, self.head.vocab)
            self._head_for = id(target)
        if self.exit_layer not in (None, self.head.exit_layer):  # type: ignore[union-attr]
            raise ConfigError(
                f"exit_layer={self.exit_layer} but the exit head {self.weights} was trained on layer "
                f"{self.head.exit_layer}; drop exit_layer or train a head for that layer"  # type: ignore[union-attr]
            )

    def check_depth(self, layers: int) -> None:
        """Refuse a target of fewer than 2 layers (``layers``): its first layers are all of it."""
        if layers < 2:
            raise ConfigError(
                f"{type(self).__name__} drafts with the target's first layers, so it needs a target of 2 layers or "
                f"more; this one has {layers}"
            )

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache) -> None:
        layers = target.num_layers
        if self.weights is not None:
            self._load(target)
        default = layers // 2 if self.head is None else self.head.exit_layer
        self.layers = default if self.exit_layer is None else self.exit_layer
        self.check_depth(layers)
        if not 1 <= self.layers < layers:
            raise ConfigError(
                f"exit_layer={self.layers} must be below the target's {layers} layers (drafting with all of them "
                f"costs a full target step per token); pick 1..{layers - 1}"
            )
        self.target, self.cache = target, cache

    def layer_args(self) -> dict[str, Any]:
        """Which layers draft: ``target.forward``'s ``exit_layer`` (a subclass may skip layers instead)."""
        return {"exit_layer": self.layers}

    def _step(self, x: torch.Tensor, offset: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``x [B]`` at each row's position ``c + offset`` through the first layers -> (``[B, V]``, ``[B, H]``)."""
        view = self.cache.stage(1, offset=offset)
        mask, positions = chain_mask(self.cache.lengths + offset, 1, view.kv_len)
        trained = self.weights is not None
        skip = x.new_zeros(x.shape[0], 0) if trained else None  # a trained head scores its own rows only
        out = self.target.forward(
            x[:, None], positions, mask, view, skip, return_hidden=hidden or trained, **self.layer_args()
        )
        if trained:
            g = self.head(out.last_hidden[:, -1])  # type: ignore[misc]
            return self.trimmed.logits(g), (g if hidden else None)
        return out.logits[:, -1], (out.last_hidden[:, -1] if hidden else None)

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        """``budget.max_len`` early-exit steps (the first on the pending token); host syncs only for a stop rule."""
        if budget.max_len == 0:
            return Draft.empty(state.batch_size, state.device)
        hidden = stop_needs_hidden(budget.stop)
        logits, h = self._step(state.pending, 0, hidden)
        offset = iter(range(1, budget.max_len))
        return draft_chain(
            state, budget, self.sampling(state.sampling), logits, h, lambda x: self._step(x, next(offset), hidden)
        )
