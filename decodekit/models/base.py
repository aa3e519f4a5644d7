"""The model interface every decodekit component runs models through.

A :class:`LanguageModel` exposes one primitive, :meth:`LanguageModel.forward`: run ``N`` tokens per row with
explicit positions and a 4-D boolean mask against a :class:`~decodekit.cache.CacheView` of a
:class:`~decodekit.cache.KVCache` (the keys it sees, the slots its K/V go to), returning a
:class:`ModelOutput` (logits, and hidden states on request). The two helpers built on it, :meth:`extend` (append a
ragged chain and commit it) and :meth:`score` (run the pending token plus a draft tree, staged but not committed),
are all the speculative loop and model drafters need. Feature-level and self-speculative drafters also use
``embed``, ``head``, ``norm`` and ``num_layers``, and ``forward(exit_layer=L)`` to stop after layer ``L``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from decodekit.cache import CacheView, KVCache
from decodekit.errors import ConfigError, IncompatibleDraftError
from decodekit.masks import add_root, chain_mask, tree_mask
from decodekit.types import Draft


def check_layer(value: object, low: int, high: int, what: str, where: str = "") -> None:
    """The one layer-index check: refuse ``value`` unless it is an integer (not a bool) in ``[low, high]``.

    Raises:
        ConfigError: ``"{what} in [low, high]{where}, got value"``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{what} in [{low}, {high}]{where}, got {value!r}")


@dataclass(frozen=True, eq=False)
class ModelOutput:
    """What a forward returns.

    Attributes:
        logits: ``[B, M, V]`` at the requested positions (:meth:`LanguageModel.extend`: ``[B, V]`` at each row's
            last real token), in the model's dtype.
        hidden: layer index -> ``[B, N, H]`` hidden states at every input position, for the layers asked for in
            ``hidden_layers``: ``0`` = the input embeddings, ``i`` = the output of decoder layer ``i`` (1-based,
            before the final norm).
        last_hidden: ``[B, N, H]`` the final (normed) hidden state, the output head's input, when asked for with
            ``return_hidden=True``; after an early exit at ``L`` it is ``norm(hidden after layer L)``.
    """

    logits: torch.Tensor
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    last_hidden: torch.Tensor | None = None


class LanguageModel:
    """Base class of model adapters. Subclasses implement :meth:`forward` and set the attributes below.

    Attributes:
        vocab_size: size ``V`` of the logits.
        eos_token_ids: token ids that end a sequence by default.
        max_context: longest sequence the model supports (None = unknown).
        tokenizer: the matching tokenizer, if known.
        tree_refusal: why the model cannot score token trees (None = it can); :meth:`score` raises
            :class:`~decodekit.errors.IncompatibleDraftError` with it on a tree draft.
        full_attention: every layer attends over all keys the mask allows (no sliding-window or chunked layers): what
            a diffusion LM and the drafters that read the target's attention need.
        records_attention: whether ``record_attention(sink)`` works (PillarAttn's drafter needs it).
        generation_config: the transformers ``GenerationConfig`` the model came with (a checkpoint's
            ``generation_config.json``), if any: :func:`decodekit.generate` reads its EOS and pad ids and says once
            which other options it sets that ``model.generate`` would apply.
        compiles: whether its forward reads a call's ``compile=`` switch
            (:func:`~decodekit.models.compile_switch.compile_scope`); a call with ``compile=True`` on a model that
            does not says once that it runs eager.
    """

    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    max_context: int | None = None
    tokenizer: Any = None
    tree_refusal: str | None = None
    full_attention: bool = True
    records_attention: bool = False
    generation_config: Any = None
    compiles: bool = False

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    @property
    def num_layers(self) -> int:
        """Number of decoder layers (the largest ``exit_layer``)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its layers")

    @property
    def config(self) -> Any:
        """The decoder's transformers ``PretrainedConfig`` (``hidden_size``, attention heads, RoPE settings, ...): what
        a draft head built for this model (EAGLE, EAGLE-3, DFlash) takes its sizes from."""
        raise NotImplementedError(f"{type(self).__name__} does not expose a transformers config")

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        view: CacheView,
        logits_at: torch.Tensor | None = None,
        *,
        exit_layer: int | None = None,
        hidden_layers: Sequence[int] = (),
        return_hidden: bool = False,
        skip_layers: Sequence[int] = (),
    ) -> ModelOutput:
        """Run ``tokens [B, N]`` at ``positions [B, N]`` under ``mask [B, 1, N, S]`` (bool, True = attend).

        Called under ``torch.no_grad`` by :meth:`extend`, :meth:`score` and :func:`decodekit.generate`.
        ``view`` comes from the cache for this forward (``view = cache.stage(N)``, ``S = view.kv_len``); each layer
        hands its new K/V to ``view.update(k, v, layer)``, which writes them where the view says (its slots as a
        tensor: ``view.slots()``) and returns the keys and values ``[B, H, S, D]`` to attend. ``logits_at [B, M]``
        selects which of the ``N`` positions get logits (default: all).

        Args:
            exit_layer: stop after decoder layer ``L`` (1-based; early exit / self-speculation): only layers
                ``1..L`` run and write K/V, and the logits are ``head(norm(h_L))``. None = all layers.
            hidden_layers: layers whose outputs to return in :attr:`ModelOutput.hidden` (0 = embeddings).
            return_hidden: also return :attr:`ModelOutput.last_hidden`, the output head's input.
            skip_layers: decoder layers (1-based) to leave out (layer skipping / SWIFT); they write no K/V. Only
                for models whose layers all attend alike.
        """
        raise NotImplementedError

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Input embeddings ``[B, N, H]`` of ``tokens [B, N]``."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its embeddings")

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm applied to a layer's output ``[..., H]`` before the output head."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its final norm")

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., V]`` from final hidden states ``[..., H]`` (the output head, with logit softcapping)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its output head")

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        """An empty cache for ``batch_size`` rows with room for ``capacity`` tokens each (grows if needed)."""
        return KVCache(batch_size, capacity, device=self.device)

    @torch.no_grad()
    def extend(
        self,
        cache: KVCache,
        tokens: torch.Tensor,
        counts: torch.Tensor,
        *,
        host_counts: int | list[int] | None = None,
        **forward_kwargs: Any,
    ) -> ModelOutput:
        """Append a ragged chain and commit it.

        Args:
            cache: the model's cache; row ``b`` grows by ``counts[b]``.
            tokens: ``[B, N]`` new tokens, right-padded (row ``b`` uses the first ``counts[b] >= 1``).
            counts: ``[B]`` number of real tokens per row.
            host_counts: the same counts known on the host (an int = every row), which spares the cache a host
                sync at its next ``stage``; None = unknown.
            **forward_kwargs: ``exit_layer`` / ``hidden_layers`` / ``return_hidden`` (see :meth:`forward`).

        Returns:
            :class:`ModelOutput` with ``logits [B, V]`` at each row's last real token (the next-token
            distribution); hidden states, if asked for, at all ``N`` positions.
        """
        view = cache.stage(tokens.shape[1])
        mask, positions = chain_mask(cache.lengths, tokens.shape[1], view.kv_len)
        last = (counts - 1).clamp(min=0)[:, None]
        out = self.forward(tokens, positions, mask, view, logits_at=last, **forward_kwargs)
        cache.keep(counts, host_counts=host_counts)
        return ModelOutput(out.logits[:, 0], out.hidden, out.last_hidden)

    @torch.no_grad()
    def score(self, cache: KVCache, pending: torch.Tensor, draft: Draft, **forward_kwargs: Any) -> ModelOutput:
        """Run the pending token and a draft tree in one forward, staged (commit with ``cache.keep``).

        Args:
            cache: the target's cache, committed up to (not including) the pending token.
            pending: ``[B]`` the sampled token not yet in the cache (the tree's root).
            draft: ``N`` nodes per row.
            **forward_kwargs: ``hidden_layers`` / ``return_hidden`` (see :meth:`forward`).

        Returns:
            :class:`ModelOutput` with ``logits [B, N + 1, V]``: row 0 is the distribution after the pending token,
            row ``i + 1`` the distribution for the children of node ``i``. Staged slot ``j`` holds input ``j``
            (0 = pending).
        """
        if self.tree_refusal and not draft.is_chain:
            raise IncompatibleDraftError(
                f"{self!r} cannot score token trees ({self.tree_refusal}); use a chain drafter with this model"
            )
        tokens = pending[:, None]
        if draft.num_nodes:
            tokens = torch.cat([tokens, draft.tokens.where(draft.valid, 0)], 1)
        view = cache.stage(tokens.shape[1])
        if draft.is_chain:
            mask, positions = chain_mask(cache.lengths, tokens.shape[1], view.kv_len)
        else:
            mask, positions = tree_mask(cache.lengths, add_root(draft.ancestors), view.kv_len)
        return self.forward(tokens, positions, mask, view, **forward_kwargs)


TARGET_PARTS = {
    "embed": ("embed", "input embeddings [B, N, H] of tokens [B, N]"),
    "norm": ("norm", "the final norm before the output head"),
    "head": ("head", "the output head: logits [..., V] from final hidden states [..., H]"),
    "layers": ("num_layers", "the decoder layer count, with forward(exit_layer=L) stopping after layer L"),
    "config": ("config", "the decoder's transformers config: hidden size, heads and RoPE, which a head is built from"),
}
"""The optional parts of :class:`LanguageModel` a drafter may read of its target (a drafter's ``target_parts``):
name -> (the member a model implements, what it gives)."""


def num_layers_of(model: Any) -> int | None:
    """``model.num_layers`` (the target part ``layers``), or None for a model without a layer list (one that leaves
    it unimplemented, or an adapter whose decoder keeps no layer list it can find)."""
    try:
        return int(model.num_layers)
    except Exception:
        return None


def hidden_size_of(model: Any) -> int | None:
    """``model.config.hidden_size`` (the target part ``config``), or None for a model without a config."""
    try:
        config = model.config
    except NotImplementedError:
        return None
    size = getattr(config, "hidden_size", None)
    return None if size is None else int(size)


def missing_parts(model: LanguageModel, parts: Iterable[str], owner: str) -> list[str]:
    """Which of ``parts`` (names of :data:`TARGET_PARTS`) ``model`` leaves as :class:`LanguageModel`'s unimplemented
    default, sorted. ``owner`` (the declaring component's name) is named when ``parts`` is malformed.

    Raises:
        ConfigError: ``parts`` is a string, or names a part outside :data:`TARGET_PARTS` (a typo would check nothing).
    """
    if isinstance(parts, str):
        raise ConfigError(f"{owner}.target_parts must be a set of names, e.g. frozenset({{{parts!r}}})")
    unknown = sorted(set(parts) - set(TARGET_PARTS))
    if unknown:
        raise ConfigError(
            f"{owner}.target_parts names {', '.join(map(repr, unknown))}; known parts: {', '.join(TARGET_PARTS)}"
        )
    members = {p: TARGET_PARTS[p][0] for p in sorted(parts)}
    return [p for p, m in members.items() if getattr(type(model), m, None) is getattr(LanguageModel, m)]


@contextlib.contextmanager
def evaluating(*models: Any) -> Iterator[None]:
    """Every torch module behind ``models`` (a :class:`LanguageModel` that is one, or a transformers adapter's
    ``hf``) in eval mode within the block, and each submodule's own mode put back after: a generate call inside a
    training loop decodes without dropout and leaves the model training."""
    roots = [m if isinstance(m, torch.nn.Module) else getattr(m, "hf", None) for m in models]
    training = [sub for root in roots if isinstance(root, torch.nn.Module) for sub in root.modules() if sub.training]
    for sub in training:
        sub.training = False
    try:
        yield
    finally:
        for sub in training:
            sub.training = True
