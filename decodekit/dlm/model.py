"""A decoder LM run as a masked diffusion LM: bidirectional attention over a token canvas, one mask token."""

from __future__ import annotations

import os
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_bool, check_choice, check_int, check_model_spec
from decodekit.errors import ConfigError, ConfigTypeError, ContextLengthError, UnsupportedModelError
from decodekit.masks import bidirectional_mask, block_causal_mask, staged_layout
from decodekit.models.base import LanguageModel

BLOCK_GRIDS = ("generation", "absolute")


class DLMModel:
    """A :class:`~decodekit.models.base.LanguageModel` run bidirectionally as a masked diffusion LM.

    Rows are laid out prompt first, then the generation region, then padding: ``[p_0 .. p_{P_b - 1}, x_0 .. x_{G -
    1}, pad ...]``, so every row keeps its true positions (RoPE distances are never changed by a batch mate's
    prompt length) and padding is invisible to every real query (a padded query sees only itself).

    Attributes:
        lm: the wrapped adapter (its ``forward`` takes decodekit's 4-D masks and explicit positions).
        mask_token_id: the id of the mask token (``[MASK]`` / ``<|mdm_mask|>``); must be inside the vocabulary.
        shift_logits: the logits for slot ``j`` are the model's output at ``j - 1`` (Dream, Fast-dLLM v2 and other
            models adapted from an autoregressive one); False = at ``j`` (LLaDA).
        vocab_size: ``V``.
        block_length: None = a bidirectional DLM; a block length = trained block-causally with blocks of that length
            (block diffusion: SDAR, BD3-LM, Fast-dLLM v2): :func:`~decodekit.dlm.generate` then attends block-causally
            (its default cache is ``Recompute(block_causal=True)``) and refuses another block length or a
            bidirectional cache strategy.
        block_grid: where a block-causal model's blocks lie: ``"generation"`` = counted from each row's generation
            start (the zoo's block-causal DLMs, BD3-LM's samplers); ``"absolute"`` = on the position grid from 0, as
            SDAR and Fast-dLLM v2 were trained and sample: block ``k`` covers positions ``[kL, (k + 1)L)``, so a
            prompt's last ``P mod L`` tokens share the first block with the generation
            (:func:`~decodekit.dlm.generate` places them there as committed slots).
    """

    def __init__(
        self,
        lm: LanguageModel,
        mask_token_id: int,
        shift_logits: bool = False,
        block_length: int | None = None,
        block_grid: str = "generation",
    ) -> None:
        self.lm = lm
        self.block_length = check_int("block_length", block_length, low=1, optional=True)
        self.block_grid = check_choice("block_grid", block_grid, BLOCK_GRIDS)
        self.vocab_size = int(lm.vocab_size)
        self.mask_token_id = check_int(
            "mask_token_id", mask_token_id, low=0, high=self.vocab_size - 1, hint=" (an id inside the vocabulary)"
        )
        self.shift_logits = check_bool("shift_logits", shift_logits)
        if not lm.full_attention:
            raise UnsupportedModelError(
                f"{lm!r} has sliding-window or chunked attention layers; a diffusion "
                "LM needs every layer to attend over the whole canvas. Use a model with full attention only."
            )

    @property
    def device(self) -> torch.device:
        return self.lm.device

    @property
    def tokenizer(self) -> Any:
        return self.lm.tokenizer

    def __repr__(self) -> str:
        block = "" if self.block_length is None else f", block_length={self.block_length}"
        if self.block_length is not None and self.block_grid != "generation":
            block += f", block_grid={self.block_grid!r}"
        return f"DLMModel({self.lm!r}, mask_token_id={self.mask_token_id}, shift_logits={self.shift_logits}{block})"

    @torch.no_grad()
    def forward(
        self,
        canvas: torch.Tensor,
        lengths: torch.Tensor,
        starts: torch.Tensor,
        width: int,
        block_causal: int | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """Run the whole canvas bidirectionally (or block-causally); return the generation region's logits and the
        staged cache.

        Args:
            canvas: ``[B, T]`` token ids, row ``b`` real in ``[0, lengths[b])``.
            lengths: ``[B]`` real tokens per row (prompt + generation region).
            starts: ``[B]`` where each row's generation region starts (its prompt length).
            width: ``G``, the generation region's length.
            block_causal: a block length: attention bidirectional within a block and causal across blocks, the
                blocks counted from each row's generation start (:func:`~decodekit.masks.block_causal_mask`);
                None = bidirectional over the whole canvas.

        Returns:
            ``[B, G, V]`` float32: for slot ``j`` of row ``b`` the logits at canvas position ``starts[b] + j``
            (``- 1`` with ``shift_logits``); and the :class:`~decodekit.cache.KVCache` holding every position's
            K/V, staged and not committed (a cache strategy keeps what it reuses).
        """
        batch, total = canvas.shape
        cache = self.lm.new_cache(batch, total)
        cache.set_host_lengths([0] * batch)
        view = cache.stage(total)
        keys = staged_layout(torch.zeros_like(lengths), total, view.kv_len, counts=lengths)
        if block_causal is None:
            mask, positions = bidirectional_mask(keys)
        else:
            mask, positions = block_causal_mask(keys, block_causal, origin=starts)
        at = starts[:, None] + torch.arange(width, device=canvas.device) - int(self.shift_logits)
        at = at.clamp(min=0)  # shifted slot 0 at position 0: a prompt token on an absolute grid, its logits unused
        return self.lm.forward(canvas, positions, mask, view, logits_at=at).logits.float(), cache


def load_model(
    spec: Any,
    mask_token_id: int | None = None,
    shift_logits: bool | None = None,
    block_length: int | None = None,
    **load_kwargs: Any,
) -> DLMModel:
    """Wrap a decoder LM for :func:`decodekit.dlm.generate`.

    Args:
        spec: a :class:`DLMModel` (returned as is, or a new one over the same adapter with the arguments given
            changed), a zoo diffusion LM (``"smollm2-135m-dlm"``: :data:`decodekit.dlm.zoo.DLM_ZOO`, its mask id, shift
            and block length built in), a local directory holding a released DLM in its authors' layout (LLaDA,
            Dream, SDAR, Fast-dLLM v2, LLaDA 2: :mod:`decodekit.dlm.families`; its mask id, shift, block length and
            block grid read from the checkpoint, its code files never imported), or anything
            :func:`decodekit.load_model` takes (a transformers causal LM, an adapter, a local path, a zoo name).
        mask_token_id: the mask token's id (required unless ``spec`` is a :class:`DLMModel`, a zoo DLM or a released
            checkpoint, whose own it replaces).
        shift_logits: read slot ``j``'s logits at position ``j - 1`` (AR-initialised models); None = the
            :class:`DLMModel`'s, zoo DLM's or released family's own (Dream, Fast-dLLM v2: True), else False.
        block_length: the block length a block-causally trained model was trained with (None = bidirectional, or the
            :class:`DLMModel`'s or zoo DLM's own).
        load_kwargs: passed on to :func:`decodekit.load_model` (``dtype``, ``device``, ``kernels``, ...; applied to a
            :class:`DLMModel`'s adapter as that function applies them to an adapter).

    Raises:
        ModelNotFoundError: a name that is neither a zoo DLM, a zoo model nor an existing path (the zoo's names).
    """
    if shift_logits is not None:
        shift_logits = check_bool("shift_logits", shift_logits)
    check_int("mask_token_id", mask_token_id, low=0, optional=True, hint=" (an id inside the vocabulary)")
    check_int("block_length", block_length, low=1, optional=True)  # both before any model loads
    if isinstance(spec, DLMModel):
        if mask_token_id is None and shift_logits is None and block_length is None and not load_kwargs:
            return spec
        from decodekit.models import load_model as load_lm

        return DLMModel(
            load_lm(spec.lm, **load_kwargs) if load_kwargs else spec.lm,
            spec.mask_token_id if mask_token_id is None else mask_token_id,
            spec.shift_logits if shift_logits is None else shift_logits,
            spec.block_length if block_length is None else block_length,
            spec.block_grid,
        )
    from decodekit.dlm.zoo import DLM_ZOO, check_dlm_name, load_zoo_dlm

    if isinstance(spec, type) and issubclass(spec, DLMModel):
        raise ConfigTypeError(
            "spec must be a model, got the class DLMModel; pass a zoo DLM's name (dk.dlm.load_model("
            "'smollm2-135m-dlm')) or a loaded model with its mask id (dk.dlm.load_model(hf_model, mask_token_id=...))"
        )
    check_model_spec("spec", spec)  # a class, or something no loader takes, before asking for a mask id
    if isinstance(spec, (str, os.PathLike)):
        check_dlm_name(os.fspath(spec))
    if isinstance(spec, str) and spec in DLM_ZOO:
        lm, entry, trained = load_zoo_dlm(spec, **load_kwargs)
        mask = entry.mask_token_id if mask_token_id is None else mask_token_id
        shift = entry.shift_logits if shift_logits is None else shift_logits
        return DLMModel(lm, mask, shift, trained if block_length is None else block_length)
    if isinstance(spec, (str, os.PathLike)):
        published = _published(spec, mask_token_id, shift_logits, block_length, load_kwargs)
        if published is not None:
            return published
    if mask_token_id is None:
        raise ConfigError(
            f"dk.dlm.load_model needs mask_token_id=<the id of the model's mask token> (e.g. LLaDA's 126336) for "
            f"{_what(spec)}; a causal LM has none of its own: add one to the vocabulary or reuse a token the model "
            "never emits"
        )
    from decodekit.models import load_model as load_lm

    return DLMModel(load_lm(spec, **load_kwargs), mask_token_id, bool(shift_logits), block_length)


def _what(spec: Any) -> str:
    """What ``spec`` is, as the missing-mask-id message says it: a path that is no published DLM family's, or a
    model."""
    if not isinstance(spec, (str, os.PathLike)):
        return type(spec).__name__
    from decodekit.dlm.families import known_families, read_config

    path = os.fspath(spec)
    if not os.path.isdir(path):
        return f"the file {path!r} (a published DLM is a directory with a config.json)"
    config = read_config(path)
    if config is None:
        return f"{path!r}, a directory without a config.json (is it a checkpoint directory?)"
    return (
        f"{path!r}, whose config.json (model_type {config.get('model_type')!r}, architectures "
        f"{config.get('architectures')}) is none of the published DLM families decodekit reads ({known_families()})"
    )


def _published(
    path: str | os.PathLike,
    mask_token_id: int | None,
    shift_logits: bool | None,
    block_length: int | None,
    load_kwargs: dict[str, Any],
) -> DLMModel | None:
    """A directory in a published DLM family's layout (:mod:`decodekit.dlm.families`) as a :class:`DLMModel` with
    the family's mask id, shift and block size (each argument given replaces its own); None for any other path."""
    from decodekit.dlm.families import family_of, read_checkpoint
    from decodekit.models import load_model as load_lm
    from decodekit.models.dtypes import parse_float_dtype

    if family_of(path) is None:
        return None
    options = dict(load_kwargs)
    dtype = options.pop("dtype", None)
    checkpoint = read_checkpoint(path, None if dtype in (None, "auto") else parse_float_dtype(dtype))
    options.setdefault("tokenizer", checkpoint.tokenizer)
    lm = load_lm(checkpoint.model, in_place=True, **options)
    if mask_token_id is None and not 0 <= checkpoint.mask_token_id < lm.vocab_size:
        raise ConfigError(
            f"{checkpoint.family.name} checkpoint {os.fspath(path)!r}: its mask id {checkpoint.mask_token_id} "
            f"({checkpoint.mask_source}) is outside its vocabulary of {lm.vocab_size}; add mask_token_id to its "
            "config.json or pass mask_token_id= to dk.dlm.load_model"
        )
    return DLMModel(
        lm,
        checkpoint.mask_token_id if mask_token_id is None else mask_token_id,
        checkpoint.shift_logits if shift_logits is None else shift_logits,
        checkpoint.block_length if block_length is None else block_length,
        checkpoint.family.block_grid,
    )


def check_context(
    dlm: DLMModel, rows: list[list[int]], gen_length: int, tails: list[list[int]] | None, block_length: int
) -> None:
    """Refuse a call whose rows would decode past the model's context: ``P_b + G`` positions, or on an absolute
    block grid, for a row whose prompt's tail opens the first block, to the end of its last block."""
    limit = dlm.lm.max_context
    if not limit:
        return
    ends = [
        len(r) + gen_length + ((block_length - len(t)) if t else 0) for r, t in zip(rows, tails or [[]] * len(rows))
    ]
    b = max(range(len(rows)), key=ends.__getitem__)
    if ends[b] > limit:
        grid = (
            f", and its last block runs {ends[b] - len(rows[b]) - gen_length} slots further (its prompt's last "
            f"{len(tails[b])} tokens open the first block of {block_length})"
            if tails and tails[b]
            else ""
        )
        raise ContextLengthError(
            f"the prompt of row {b} ({len(rows[b])} tokens) + gen_length ({gen_length}){grid} exceeds the model's "
            f"context ({limit}); shorten the prompt or lower gen_length"
        )
