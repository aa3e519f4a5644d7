"""Reading a published checkpoint's weight files without running anything shipped with them.

Safetensors files are read with ``safetensors``; pickled ``.bin`` / ``.pt`` state dicts only with
``torch.load(weights_only=True)``, so no pickled code runs. A file that cannot be read (truncated, not a state dict,
a shard index without its ``weight_map`` or naming files outside its directory) raises a
:class:`~decodekit.errors.ConfigError` that names the file. Used by the diffusion-LM families
(:mod:`decodekit.dlm.families`) and the released draft heads (:mod:`decodekit.drafters.eagle_release`,
:mod:`decodekit.drafters.medusa_release`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from decodekit.errors import ConfigError, ModelNotFoundError

__all__ = ["iter_tensors", "read_state", "weight_files"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def weight_files(root: Path) -> list[Path]:
    """The checkpoint directory ``root``'s weight files: one of :data:`WEIGHT_FILES`, or the shards its
    ``<name>.index.json`` names.

    Raises:
        ModelNotFoundError: no weights, or a shard the index names is missing.
        ConfigError: an index that is not JSON, has no ``weight_map``, or names a file outside ``root``.
    """
    for name in WEIGHT_FILES:
        index = root / f"{name}.index.json"
        if index.is_file():
            shards = sorted(set(_weight_map(index).values()))
            outside = [s for s in shards if not (root / s).resolve().is_relative_to(root.resolve())]
            if outside:
                raise ConfigError(f"{index} names shards outside {root}: {outside[:3]}; shards sit beside the index")
            missing = [s for s in shards if not (root / s).is_file()]
            if missing:
                raise ModelNotFoundError(f"{index} names shards that are not in {root}: {missing[:3]}")
            return [root / s for s in shards]
        if (root / name).is_file():
            return [root / name]
    raise ModelNotFoundError(
        f"no weights in {root}: expected model.safetensors, pytorch_model.bin, or the shards of a "
        "model.safetensors.index.json / pytorch_model.bin.index.json"
    )


def _weight_map(index: Path) -> dict[str, str]:
    """An index file's ``weight_map`` (tensor name -> shard file name)."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, json.JSONDecodeError, AttributeError) as error:
        raise ConfigError(f"{index} is not a readable JSON object ({error}); is the checkpoint complete?") from error
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError(f"{index} has no weight_map of tensor names to shard files; is the checkpoint complete?")
    return weight_map


def iter_tensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every ``(name, tensor)`` of one weights file (safetensors by its suffix, else a pickled state dict), one at a
    time for safetensors.

    Raises:
        ConfigError: the file cannot be read (truncated, another format) or holds no state dict; the file is named.
    """
    try:
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), "pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield key, f.get_tensor(key)
            return
        state = _load_pickled(file)
    except ConfigError:
        raise
    except Exception as error:  # safetensors' SafetensorError derives from Exception only
        raise ConfigError(f"cannot read {file} ({type(error).__name__}: {error}); is it complete?") from error
    if not isinstance(state, dict):
        raise ConfigError(f"{file} holds a {type(state).__name__}, not a state dict of tensors")
    yield from ((k, v) for k, v in state.items() if isinstance(v, torch.Tensor))


def _load_pickled(file: Path) -> object:
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as error:  # torch's legacy (non-zip) format cannot be memory-mapped
        if "mmap" not in str(error):
            raise
        return torch.load(file, map_location="cpu", weights_only=True)


def read_state(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one weights file (:func:`iter_tensors`) as a dict."""
    return dict(iter_tensors(Path(file)))
