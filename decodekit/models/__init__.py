"""Model adapters and :func:`load_model`."""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from decodekit.checks import check_bool, check_model_spec, describe, did_you_mean, parse_device
from decodekit.errors import ConfigError, ConfigTypeError, ModelNotFoundError, UnsupportedModelError
from decodekit.kernels.cpu import apply_kernels, check_kernels
from decodekit.models.base import LanguageModel, ModelOutput
from decodekit.models.dtypes import parse_float_dtype
from decodekit.models.hf import HFCausalLM
from decodekit.models.vocab_resize import ResizedVocab
from decodekit.models.zoo import ZOO, load_zoo_model, zoo_names

__all__ = ["ZOO", "HFCausalLM", "LanguageModel", "ModelOutput", "ResizedVocab", "load_model", "load_zoo_model"]

_ADAPTER_ATTR = "_decodekit_adapter"


def load_model(
    spec: Any,
    tokenizer: Any = None,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    kernels: str | None = None,
    in_place: bool = False,
) -> LanguageModel:
    """Return a :class:`LanguageModel` for ``spec``.

    The adapter of a transformers model is made once and reused: ``load_model(m) is load_model(m)``, and
    :func:`decodekit.generate` called with the same model does not rebuild it. (Build ``HFCausalLM(m)`` directly
    for a fresh one, e.g. after replacing the model's output head.)

    Every argument is checked before anything is loaded, converted or copied.

    Args:
        spec: a :class:`LanguageModel` (returned as is; with ``dtype`` / ``device`` / ``kernels``, an
            :class:`HFCausalLM`'s transformers model is loaded again with them), a loaded transformers causal LM, a
            zoo name (a key of :data:`~decodekit.models.zoo.ZOO`, e.g. ``"smollm2-135m-instruct"``), or a local
            directory holding a causal LM (``from_pretrained``, local files only: decodekit never downloads).
        tokenizer: the tokenizer object to attach (loaded from the path when ``spec`` is a path); given for a
            model that already has an adapter, it replaces that adapter's tokenizer. Not a name: load it first.
        dtype: optional floating-point dtype to cast the model to (a ``torch.dtype`` or its name).
        device: optional device to move the model to (``"cpu"``, ``"cuda:0"``, ...).
        kernels: optional CPU linear kernels, ``"onednn"`` (same float32 model, faster small-batch linears) or
            ``"int8"`` (lossy int8 linears, for draft models); see :mod:`decodekit.kernels.cpu`.
        in_place: how ``dtype`` / ``device`` / ``kernels`` treat a transformers model you pass. False (default):
            your model is left as it is and the adapter wraps a converted copy (``copy.deepcopy``, which costs the
            memory of a second model). True: your model itself is cast, moved and gets its ``nn.Linear`` layers
            replaced (no copy); its adapter is rebuilt.

    Wrapping puts the model in ``eval()`` mode, switches attention implementations that cannot take decodekit's
    masks to ``sdpa`` with a warning (see :class:`HFCausalLM`), and records the adapter on the model (attribute
    ``_decodekit_adapter``, so it is found again and freed with the model); without ``in_place=True`` nothing
    else about your model changes.

    Raises:
        ConfigTypeError: ``spec``, ``tokenizer`` or another argument of the wrong type (a class instead of an
            instance, a tokenizer given as a string, ...).
        ModelNotFoundError: a string that is neither a zoo name nor an existing path (the message lists the zoo).
        ConfigError: an unknown or non-floating ``dtype``, an unknown ``device`` or one this machine lacks,
            unknown ``kernels``.
    """
    check_model_spec("spec", spec)
    _check_tokenizer(tokenizer)
    resolved_dtype = None if dtype is None or dtype == "auto" else parse_float_dtype(dtype)
    resolved_device = None if device is None else parse_device("device", device)
    check_kernels(kernels)
    in_place = check_bool("in_place", in_place)
    options = dict(dtype=dtype, device=device, kernels=kernels)
    if isinstance(spec, LanguageModel):
        if dtype is None and device is None and kernels is None:
            if tokenizer is not None:
                spec.tokenizer = tokenizer
            return spec
        if not isinstance(spec, HFCausalLM):
            raise ConfigError(
                f"dtype, device and kernels apply to transformers models; {type(spec).__name__} is a LanguageModel "
                "decodekit did not build: convert it before passing it"
            )
        tokenizer = spec.tokenizer if tokenizer is None else tokenizer
        return load_model(spec.hf, tokenizer, **options, in_place=in_place)  # type: ignore[arg-type]
    fresh = False
    if isinstance(spec, (str, os.PathLike)):
        name = os.fspath(spec)
        if name in ZOO:
            model = load_zoo_model(name, **options)  # type: ignore[arg-type]
            model.tokenizer = model.tokenizer if tokenizer is None else tokenizer
            return model
        if not os.path.exists(name):
            raise ModelNotFoundError(
                f"model {name!r} is neither a zoo model{did_you_mean(name.lower(), ZOO)} (available: {zoo_names()}) "
                "nor an existing local path; decodekit does not download models: download it first (e.g. "
                "huggingface_hub.snapshot_download) and pass the local directory"
            )
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from decodekit.models.gguf_convert import loading_progress

        if tokenizer is None:
            try:
                tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True, trust_remote_code=False)
            except (OSError, ValueError) as err:  # a model directory without a (usable) tokenizer
                warnings.warn(
                    f"no tokenizer could be loaded from {name!r} ({str(err).splitlines()[0]}); the model runs on token "
                    "ids. Pass tokenizer= to load_model for string prompts and chat templates",
                    stacklevel=2,
                )
        with loading_progress(False), refusing_remote_code(name):  # no progress bar per load
            spec = AutoModelForCausalLM.from_pretrained(
                name, dtype=resolved_dtype or "auto", local_files_only=True, trust_remote_code=False
            )
        fresh = True  # ours: convert it without copying
    converts = kernels is not None or _needs_cast(spec, resolved_dtype, resolved_device)
    if converts and not (fresh or in_place):
        spec = _copy_without_adapter(spec)
    if resolved_dtype is not None:
        spec = spec.to(resolved_dtype)
    if resolved_device is not None:
        spec = spec.to(resolved_device)
    spec = apply_kernels(spec, kernels, in_place=True)  # spec is a copy here, unless the caller asked in_place
    adapter = spec.__dict__.get(_ADAPTER_ATTR)
    if adapter is None or converts:  # new kernels replace modules the old adapter captured
        adapter = HFCausalLM(spec, tokenizer=tokenizer)
        spec.__dict__[_ADAPTER_ATTR] = adapter
    elif tokenizer is not None:
        adapter.tokenizer = tokenizer
    return adapter


@contextlib.contextmanager
def refusing_remote_code(path: str) -> Iterator[None]:
    """Turn transformers' refusal of a checkpoint that needs the Python files shipped beside it (its ``auto_map``; we
    load with ``trust_remote_code=False``, never asking) into an :class:`UnsupportedModelError` naming ``path``."""
    try:
        yield
    except ValueError as err:
        if "trust_remote_code" not in str(err):
            raise
        raise UnsupportedModelError(
            f"{path!r} is a model transformers can only build by running the code shipped with it (its config's "
            "auto_map), which decodekit never executes. A published diffusion LM (LLaDA, Dream, SDAR, Fast-dLLM v2, "
            "LLaDA 2) loads with dk.dlm.load_model(path); otherwise load the model yourself and pass the object"
        ) from err


def _check_tokenizer(tokenizer: Any) -> None:
    """A tokenizer object (callable as ``tokenizer(text)``), not its name or class."""
    if tokenizer is None:
        return
    if isinstance(tokenizer, (str, bytes, os.PathLike)):
        raise ConfigTypeError(
            f"tokenizer must be a tokenizer object, got the string {tokenizer!r}; load it first, e.g. "
            f"AutoTokenizer.from_pretrained({tokenizer!r})"
        )
    if isinstance(tokenizer, type):
        raise ConfigTypeError(
            f"tokenizer must be an instance, got the class {tokenizer.__name__}; pass an instance, e.g. "
            f"{tokenizer.__name__}.from_pretrained(path)"
        )
    if not callable(tokenizer):
        raise ConfigTypeError(
            f"tokenizer must be callable as tokenizer(text) -> {{'input_ids': [...]}} (a transformers tokenizer), "
            f"got {describe(tokenizer)}"
        )


def _needs_cast(model: torch.nn.Module, dtype: torch.dtype | None, device: torch.device | None) -> bool:
    """Whether casting ``model`` to ``dtype`` / moving it to ``device`` would change any of its tensors."""
    tensors = [*model.parameters(), *model.buffers()]
    if dtype is not None and any(t.is_floating_point() and t.dtype != dtype for t in tensors):
        return True
    if device is None:
        return False
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return any(t.device.type != device.type or (index is not None and t.device.index != index) for t in tensors)


def _copy_without_adapter(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` without its cached adapter (which the copy must not share or duplicate)."""
    adapter = model.__dict__.get(_ADAPTER_ATTR)
    copied = copy.deepcopy(model, memo={} if adapter is None else {id(adapter): None})
    copied.__dict__.pop(_ADAPTER_ATTR, None)
    return copied
