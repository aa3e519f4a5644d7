"""GGUF conversion: a zoo model's GGUF file, dequantized by transformers, saved as an ordinary checkpoint.

transformers dequantizes GGUF weights to float32 when it loads them (with the ``gguf`` reader), which takes tens of
seconds; :func:`convert_gguf` does it once and saves the result with ``save_pretrained`` (safetensors), for the
zoo's disk cache (:mod:`decodekit.models.disk_cache`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decodekit.errors import MissingDependencyError
from decodekit.resources import package_dirs, package_file

if TYPE_CHECKING:
    from decodekit.models.zoo import ZooModel

__all__ = ["GGUF_INSTALL", "convert_gguf", "gguf_source", "loading_progress"]

GGUF_INSTALL = "pip install gguf"
"""Installs the GGUF reader transformers uses."""


@contextmanager
def loading_progress(enabled: bool) -> Iterator[None]:
    """Within the block, transformers' (and huggingface_hub's) progress bars, such as ``from_pretrained``'s
    "Loading weights" bar, are shown only if ``enabled`` and not already switched off; the previous setting is
    restored on exit."""
    if enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def gguf_source(entry: ZooModel) -> Path:
    """Path of ``entry``'s GGUF file, after checking that it and the ``gguf`` reader are installed.

    Raises:
        MissingDependencyError: with the exact install command(s) for whatever is missing.
    """
    missing, commands = [], []
    if not package_dirs(entry.module):
        missing.append(f"the package that ships its weights ({entry.module})")
        commands.append(entry.install)
    if not package_dirs("gguf"):
        missing.append("the GGUF reader transformers uses (gguf)")
        commands.append(GGUF_INSTALL)
    if missing:
        raise MissingDependencyError(
            f"zoo model {entry.name!r} needs {' and '.join(missing)}; install with: {' && '.join(commands)}"
        )
    return package_file(entry.module, (entry.gguf_file,), install=entry.install, needed_by=f"zoo model {entry.name!r}")


def convert_gguf(entry: ZooModel, dest: Path) -> None:
    """Dequantize ``entry``'s GGUF file with transformers and save model + tokenizer into ``dest`` (safetensors).
    :func:`~decodekit.models.zoo.cached_model_dir` runs it inside :func:`loading_progress`.

    Raises:
        MissingDependencyError: when the weights' package or ``gguf`` is not installed.
    """
    source = gguf_source(entry)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": source.name, "local_files_only": True, "trust_remote_code": False}
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
