"""A draft model whose output layer is padded to another size than its target's, seen at the target's size.

Released model families pad their output layer to a round number, and not the same one at every size: Qwen2.5-0.5B
has 151,936 rows, Qwen2.5-7B 152,064, while their shared tokenizer has 151,665 tokens. The rows past the tokenizer
are padding that no text ever uses, so a small model of the family drafts for a large one as well as if the sizes
matched. :class:`ResizedVocab` makes the draft's logits the target's size; :func:`fit_vocab` wraps a draft model
in it when the two tokenizers show the extra rows to be padding, and refuses otherwise.

Lossless either way: the draft samples from (and reports as ``q``) the distribution over the target's ``V`` rows
that the resized logits give, and the verifier corrects towards the target's own distribution.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.errors import VocabMismatchError
from decodekit.models.base import LanguageModel, ModelOutput


class ResizedVocab(LanguageModel):
    """``model`` with logits of ``vocab_size`` rows instead of its own ``V_d``.

    Past ``V_d`` (a larger target) the logits are ``-inf``: the draft never proposes those ids, and a committed id
    ``>= V_d`` (a padding id only the target could sample) is fed to ``model`` as id 0, which changes what it drafts
    next, never what is generated. Below ``V_d`` (a smaller target) the extra rows are dropped before any
    processing or sampling. Everything else (cache, layers, embeddings) is ``model``'s.

    Args:
        model: the draft model's adapter.
        vocab_size: the target's vocabulary size ``V``.
    """

    def __init__(self, model: LanguageModel, vocab_size: int) -> None:
        self.inner = model
        self.vocab_size = vocab_size
        self.eos_token_ids = model.eos_token_ids
        self.max_context = model.max_context
        self.tokenizer = model.tokenizer
        self.tree_refusal = model.tree_refusal
        self.full_attention = model.full_attention
        self.compiles = model.compiles

    def __repr__(self) -> str:
        return f"ResizedVocab({self.inner!r}, vocab={self.vocab_size})"

    @property
    def device(self) -> torch.device:
        return self.inner.device

    @property
    def num_layers(self) -> int:
        return self.inner.num_layers

    @property
    def config(self) -> Any:
        return self.inner.config

    def _ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` with ids the inner model has no row for replaced by 0."""
        if self.vocab_size <= self.inner.vocab_size:
            return tokens
        return tokens.where(tokens < self.inner.vocab_size, 0)

    def _resize(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [..., V_d]`` -> ``[..., V]``: cut, or padded with ``-inf``."""
        extra = self.vocab_size - logits.shape[-1]
        if extra <= 0:
            return logits[..., : self.vocab_size]
        return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))

    def forward(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> ModelOutput:
        """The inner model's :meth:`~decodekit.models.base.LanguageModel.forward` (same arguments), its ``tokens``
        mapped into its rows and its logits ``[..., V]`` resized."""
        out = self.inner.forward(self._ids(tokens), *args, **kwargs)
        return ModelOutput(self._resize(out.logits), out.hidden, out.last_hidden)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner.embed(self._ids(tokens))

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.inner.norm(hidden)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._resize(self.inner.head(hidden))

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        return self.inner.new_cache(batch_size, capacity)


def fit_vocab(draft: LanguageModel, target: LanguageModel, owner: str) -> LanguageModel:
    """``draft`` as it is when its vocabulary size is ``target``'s, else :class:`ResizedVocab` of it when the extra
    rows are padding: the tokenizers (the target's, or the draft's where the target has none) have no more tokens
    than the smaller output layer, and where both models carry one, the two map every token to the same id.

    Raises:
        VocabMismatchError: the extra rows may be real tokens (the sizes differ and neither model carries a
            tokenizer, or a tokenizer has more tokens than the smaller layer), or the tokenizers differ. The
            message names ``owner`` and says what to change.
    """
    if draft.vocab_size == target.vocab_size:
        warn_other_ids(draft, target, owner)
        return draft
    if isinstance(draft, ResizedVocab):  # fitted for another target before: fit the model itself
        return fit_vocab(draft.inner, target, owner)
    sizes = f"{owner}'s draft model has {draft.vocab_size} output rows but the target has {target.vocab_size}"
    tokenizers = [t for t in (target.tokenizer, draft.tokenizer) if t is not None]
    if not tokenizers:
        raise VocabMismatchError(
            f"{sizes}, and neither carries a tokenizer, so the extra rows cannot be told to be padding; load both "
            "with their tokenizers (dk.load_model(model, tokenizer)), or wrap the draft in "
            "decodekit.models.ResizedVocab(draft, target.vocab_size) if you know the extra rows are padding"
        )
    vocabulary = _vocab(tokenizers[0])
    tokens = len(vocabulary) if vocabulary is not None else None
    if tokens is None:
        raise VocabMismatchError(
            f"{sizes}, and its tokenizer ({type(tokenizers[0]).__name__}) lists no vocabulary (get_vocab), so the "
            "extra rows cannot be told to be padding; wrap the draft in decodekit.models.ResizedVocab(draft, "
            "target.vocab_size) if you know they are"
        )
    if tokens > min(draft.vocab_size, target.vocab_size):
        raise VocabMismatchError(
            f"{sizes}, and the tokenizer has {tokens} tokens: the smaller model lacks real tokens, so it was not "
            "trained with the target's tokenizer; use a draft model of the target's family"
        )
    if len(tokenizers) == 2 and other_ids(tokenizers[0], tokenizers[1]):
        raise VocabMismatchError(
            f"{sizes}, and their tokenizers map tokens to different ids; use a draft model trained with the "
            "target's tokenizer"
        )
    return ResizedVocab(draft, target.vocab_size)


_COMPARED: dict[tuple[int, int], tuple[Any, Any, int]] = {}  # ids -> (weak refs to the pair, tokens mapped elsewhere)


def other_ids(first: Any, second: Any) -> int:
    """How many of ``first``'s tokens ``second`` maps to another id (or lacks); 0 for the same object. Computed once
    per pair of tokenizer objects (a vocabulary of 150k tokens takes ~0.1 s); the pair is kept with the count, so a
    recycled ``id`` never returns another pair's."""
    if first is second:
        return 0
    key = (id(first), id(second))
    cached = _COMPARED.get(key)
    if cached is None or cached[0]() is not first or cached[1]() is not second:
        ours, theirs = _vocab(first), _vocab(second)
        if ours is None or theirs is None:  # a tokenizer that lists no vocabulary: nothing to compare
            return 0
        count = sum(theirs.get(t) != i for t, i in ours.items())
        try:
            cached = _COMPARED[key] = (weakref.ref(first), weakref.ref(second), count)
        except TypeError:  # an object without weak references: not cached
            return count
    return cached[2]


def warn_other_ids(draft: LanguageModel, target: LanguageModel, owner: str) -> None:
    """Warn when the draft model and the target, of one vocabulary size, carry tokenizers that map tokens to other
    ids: the drafts of those tokens are rejected (never wrong output: the target verifies every one)."""
    if draft.tokenizer is None or target.tokenizer is None:
        return
    differ = other_ids(target.tokenizer, draft.tokenizer)
    if differ:
        warnings.warn(
            f"{owner}'s draft model has a tokenizer that maps {differ} of the target's tokens to other ids: its drafts "
            "of them will be rejected; use a draft model trained with the target's tokenizer",
            stacklevel=4,
        )


def _vocab(tokenizer: Any) -> dict[str, int] | None:
    """``tokenizer.get_vocab()`` (token -> id), or None for a tokenizer object without one."""
    get = getattr(tokenizer, "get_vocab", None)
    return get() if callable(get) else None
