"""Diffusion LMs read from their authors' published checkpoint layouts, without running code shipped with them.

A released DLM repository ships its own modeling code (``modeling_llada.py``, ``modeling_dream.py``, ...) next to
its weights; decodekit never imports it. :func:`read_checkpoint` reads the directory's ``config.json``, recognises
the family by its ``model_type`` / ``architectures``, and builds decodekit's own equivalent: a transformers
decoder (Llama for LLaDA; Qwen2 for Dream and Fast-dLLM v2; Qwen3 for SDAR) holding the checkpoint's tensors under
their new names, plus the family's mask id, logit shift, block size and block grid. Each family's module says which
reference code it was checked against.

A family is one small module: a :class:`Family` whose ``convert`` maps the published config to a transformers config
(refusing, by name, any setting decodekit does not implement) and names each transformers parameter's source
tensor, or, where the layouts differ (LLaDA 2's fused q / k / v and per-expert weights), a :class:`Derived` one
computed from several.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decodekit.dlm.families.tokenizer import checkpoint_tokenizer
from decodekit.errors import ConfigError, UnsupportedModelError
from decodekit.models.checkpoint_files import iter_tensors, weight_files

__all__ = ["Checkpoint", "Derived", "Family", "family_of", "mask_from", "read_checkpoint"]


@dataclass(frozen=True)
class Derived:
    """A transformers parameter computed from checkpoint tensors: ``build(*tensors)`` of the ``sources`` (in that
    order; ``()``: built from nothing, e.g. a zero-width shared expert) -- a slice of a fused projection, experts
    stacked into one tensor."""

    sources: tuple[str, ...]
    build: Callable[..., torch.Tensor]


Source = str | Derived  # what Family.convert names for each parameter


@dataclass(frozen=True)
class Family:
    """One published DLM layout.

    Attributes:
        name: the family's name in messages (``"LLaDA"``).
        model_types: ``config.json``'s ``model_type`` values that name it (compared case-insensitively).
        architectures: ``config.json``'s ``architectures`` entries that name it.
        convert: ``config -> (transformers config, {transformers parameter name: checkpoint tensor name or
            Derived})``; raises :class:`~decodekit.errors.UnsupportedModelError` naming the setting it does not
            implement.
        mask_token_id: ``(config, tokenizer) -> the mask token's id`` (the tokenizer may be None).
        shift_logits: slot ``j``'s logits are read at position ``j - 1`` (AR-initialised families).
        block_length: ``config -> the block size it was trained with`` (None: bidirectional).
        block_grid: where its blocks lie (:class:`~decodekit.dlm.DLMModel`'s ``block_grid``): ``"absolute"`` for
            SDAR and Fast-dLLM v2.
        tokenizer: ``directory -> tokenizer`` for a checkpoint whose tokenizer files name a class of its own code
            (Dream's ``DreamTokenizer``): tried when transformers' ``AutoTokenizer`` cannot load them.
    """

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    convert: Callable[[dict[str, Any]], tuple[Any, dict[str, Source]]]
    mask_token_id: MaskFrom
    shift_logits: bool
    block_length: Callable[[dict[str, Any]], int | None] = lambda config: None
    block_grid: str = "generation"
    tokenizer: Callable[[Path], Any] | None = None


@dataclass
class Checkpoint:
    """What :func:`read_checkpoint` built: the transformers model and tokenizer, and the family's DLM settings."""

    family: Family
    model: torch.nn.Module
    tokenizer: Any
    mask_token_id: int
    shift_logits: bool
    block_length: int | None
    mask_source: str  # where mask_token_id came from, for messages


@dataclass(frozen=True)
class MaskFrom:
    """A family's mask-id rule (:func:`mask_from`), called as ``(config, tokenizer) -> id``."""

    default: int
    ask_tokenizer: bool = True
    token: str | None = None  # the mask token's text in the vocabulary, where the tokenizer does not name it

    def __call__(self, config: dict[str, Any], tokenizer: Any) -> int:
        if config.get("mask_token_id") is not None:
            return int(config["mask_token_id"])
        if self.ask_tokenizer and tokenizer is not None:
            found = tokenizer.get_vocab().get(self.token) if self.token else getattr(tokenizer, "mask_token_id", None)
            if found is not None:
                return int(found)
        return self.default

    def source(self, config: dict[str, Any], family: str) -> str:
        """Where the id comes from, for messages about it."""
        if config.get("mask_token_id") is not None:
            return "config.json's mask_token_id"
        asked = f"the tokenizer's {self.token or 'mask token'} or " if self.ask_tokenizer else ""
        return f"config.json names no mask_token_id: {asked}{family}'s default"


def mask_from(default: int, ask_tokenizer: bool = True, token: str | None = None) -> MaskFrom:
    """A family's mask-id rule: ``config.json``'s ``mask_token_id``, else the tokenizer's mask token (when
    ``ask_tokenizer``: LLaDA's and Dream's references read the config or their constant only; ``token``: the
    token's text in the vocabulary, where the tokenizer does not name it), else ``default`` (the id its reference
    ``generate`` uses)."""
    return MaskFrom(default, ask_tokenizer, token)


def _families() -> list[Family]:
    from decodekit.dlm.families.dream import DREAM
    from decodekit.dlm.families.fast_dllm_v2 import FAST_DLLM_V2
    from decodekit.dlm.families.llada import LLADA
    from decodekit.dlm.families.llada2 import LLADA2
    from decodekit.dlm.families.sdar import SDAR

    return [LLADA, LLADA2, DREAM, SDAR, FAST_DLLM_V2]


def known_families() -> str:
    """The published families' names, for messages."""
    return ", ".join(f.name for f in _families())


def read_config(path: str | os.PathLike) -> dict[str, Any] | None:
    """``path/config.json`` as a dict, or None when ``path`` is not a directory holding one."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    try:
        loaded = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"{config} is not readable JSON ({error}); is the checkpoint complete?") from error
    if not isinstance(loaded, dict):
        raise ConfigError(f"{config} holds a JSON {type(loaded).__name__}, not an object of config keys")
    return loaded


def family_of(path: str | os.PathLike) -> Family | None:
    """The published DLM family the directory ``path`` holds, or None (no ``config.json``, or another model: a
    transformers checkpoint that :func:`decodekit.load_model` reads itself)."""
    return _family(read_config(path))


def _family(config: dict[str, Any] | None) -> Family | None:
    """The family a ``config.json``'s ``model_type`` / ``architectures`` name, or None."""
    if config is None:
        return None
    model_type = str(config.get("model_type", "")).lower()
    architectures = set(config.get("architectures") or ())
    for family in _families():
        if model_type in {t.lower() for t in family.model_types} or architectures & set(family.architectures):
            return family
    return None


def read_checkpoint(path: str | os.PathLike, dtype: torch.dtype | None = None) -> Checkpoint:
    """Build the model a published DLM checkpoint directory describes.

    Args:
        path: a local directory in the family's released layout (``config.json``, weights as one file or shards,
            tokenizer files); code files in it are never imported.
        dtype: the parameters' dtype (None: the checkpoint's own).

    Raises:
        ModelNotFoundError: no weights, a missing shard.
        UnsupportedModelError: not a known family, or a setting its conversion does not implement (named).
        ConfigError: a tensor missing from the weights, or of another shape than the config implies (named).
    """
    from transformers import AutoModelForCausalLM

    root = Path(path)
    config = read_config(root)
    family = _family(config)
    if family is None or config is None:
        raise UnsupportedModelError(f"{root} is not a checkpoint of a known diffusion-LM family ({known_families()})")
    hf_config, sources = family.convert(config)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")  # zero-width shared experts
        model = AutoModelForCausalLM.from_config(hf_config)
    found = _cast(_gather(root, family, sources), dtype, model)
    expected = dict(model.state_dict())
    for target, tensor in found.items():
        if tuple(tensor.shape) != tuple(expected[target].shape):
            raise ConfigError(
                f"{family.name} checkpoint {root}: {_name(sources[target])} has shape {tuple(tensor.shape)}, its "
                f"config.json implies {tuple(expected[target].shape)}"
            )
    model.load_state_dict(found, strict=False, assign=True)
    if getattr(hf_config, "tie_word_embeddings", False):
        model.tie_weights()
    _materialise_buffers(model, hf_config)
    model.eval()
    tokenizer = checkpoint_tokenizer(root, family)
    return Checkpoint(
        family,
        model,
        tokenizer,
        family.mask_token_id(config, tokenizer),
        family.shift_logits,
        family.block_length(config),
        family.mask_token_id.source(config, family.name),
    )


def _name(source: Source) -> str:
    """A source as messages name it."""
    return repr(source) if isinstance(source, str) else " + ".join(map(repr, source.sources)) or "(computed)"


def _cast(found: dict[str, torch.Tensor], dtype: torch.dtype | None, model: Any) -> dict[str, torch.Tensor]:
    """The floating tensors of ``found`` in one dtype: ``dtype``, else the one most of the weights have on disk (a
    release storing its norms in float32 beside bfloat16 matrices would otherwise fail at its first forward); except
    what transformers keeps in float32 for the architecture (``_keep_in_fp32_modules(_strict)``: GLM-4 MoE's router,
    as LLaDA 2's own code computes it)."""
    sizes: Counter[torch.dtype] = Counter()
    for tensor in found.values():
        if tensor.is_floating_point():
            sizes[tensor.dtype] += tensor.numel()
    dtype = dtype or (sizes.most_common(1)[0][0] if sizes else None)
    keep = [
        *(getattr(model, "_keep_in_fp32_modules", None) or ()),
        *(getattr(model, "_keep_in_fp32_modules_strict", None) or ()),
    ]
    out = {}
    for name, tensor in found.items():
        fp32 = any(f".{k}." in f".{name}." or name.endswith(f".{k}") for k in keep)
        out[name] = tensor.to(torch.float32 if fp32 else dtype) if tensor.is_floating_point() and dtype else tensor
    return out


def _gather(root: Path, family: Family, sources: dict[str, Source]) -> dict[str, torch.Tensor]:
    """``{parameter: tensor}`` for every parameter ``sources`` names, read in one pass over the weight files (only the
    tensors named are kept); a tensor missing from the weights is named."""
    needed = {name for s in sources.values() for name in ((s,) if isinstance(s, str) else s.sources)}
    read, unused = {}, []
    for file in weight_files(root):
        for key, tensor in iter_tensors(file):
            if key in needed:
                read[key] = tensor
            else:
                unused.append(key)
    missing = sorted(needed - read.keys())
    if missing:
        raise ConfigError(f"{family.name} checkpoint {root}: tensor {missing[0]!r} is missing from its weights")
    if unused:  # a tensor its config.json gives no place (e.g. experts the config does not count): not silent
        warnings.warn(
            f"{family.name} checkpoint {root}: {len(unused)} tensor(s) its config.json gives no place in the model "
            f"were not loaded: {', '.join(map(repr, sorted(unused)[:4]))}; check the config against the weights",
            stacklevel=4,
        )
    found = {}
    for target, source in sources.items():
        if isinstance(source, str):
            tensor = read[source]
        else:
            try:
                tensor = source.build(*(read[n] for n in source.sources))
            except RuntimeError as error:  # e.g. a fused projection whose rows do not split as the config says
                shapes = [tuple(read[n].shape) for n in source.sources]
                raise ConfigError(
                    f"{family.name} checkpoint {root}: {_name(source)} (shapes {shapes}) do not make {target!r} as "
                    f"its config.json implies ({error})"
                ) from error
        found[target] = tensor
    return found


def _materialise_buffers(model: torch.nn.Module, hf_config: Any) -> None:
    """Rebuild the modules whose buffers are computed, not stored (the rotary embedding's inverse frequencies), on
    the CPU: built on the meta device they hold no values."""
    for name, module in list(model.named_modules()):
        if any(b.is_meta for b in module.buffers(recurse=False)):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, type(module)(config=hf_config))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ConfigError(f"no values for {left[:3]} after loading the checkpoint")
