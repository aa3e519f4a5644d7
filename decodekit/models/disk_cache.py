"""decodekit's on-disk cache of converted checkpoints: where it lives and how a checkpoint gets there safely.

A cached checkpoint is an ordinary ``save_pretrained`` directory (safetensors weights + config + tokenizer) that
also holds a manifest, written last. The manifest records the cache format, what the checkpoint was converted
from, every file with its size, and the tensor names of every safetensors file. A directory is used only when its
manifest matches: a deleted or truncated file, a weights file whose header no longer parses or names other tensors,
an older cache format or another source all count as "not cached", and the checkpoint is converted again.

Writes are atomic: the conversion fills a fresh temporary directory next to the final one, which is renamed into
place once its manifest is written, so a reader never sees a half-written checkpoint and a killed conversion
leaves only a temporary directory (removed by a later conversion once it is an hour old).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError, safe_open

from decodekit.errors import DecodeKitError

log = logging.getLogger(__name__)

__all__ = ["CACHE_ENV", "CACHE_FORMAT", "MANIFEST", "cache_root", "cached_checkpoint", "is_complete"]

CACHE_ENV = "DECODEKIT_CACHE"
"""Environment variable that overrides the cache root (see :func:`cache_root`)."""

MANIFEST = "decodekit-zoo.json"
"""File written last into a cached checkpoint; a directory without a valid one is not a cache."""

CACHE_FORMAT = 2
"""Version of the cached layout and manifest; a cache of another version is converted again."""

_STALE_PARTIAL_S = 3600.0  # a temporary directory older than this belongs to no live conversion


def cache_root() -> Path:
    """Root of decodekit's cache: ``$DECODEKIT_CACHE``, else ``$XDG_CACHE_HOME/decodekit``, else
    ``~/.cache/decodekit``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "decodekit"
    return Path.home() / ".cache" / "decodekit"


def _tensor_names(weights: Path) -> list[str]:
    """Sorted tensor names in the header of the safetensors file ``weights`` (reads the header only)."""
    with safe_open(str(weights), framework="pt") as f:
        return sorted(f.keys())


def is_complete(path: Path, source: str) -> bool:
    """Whether ``path`` holds a finished checkpoint converted from ``source``: a manifest of this format and source
    whose files all exist with the recorded sizes and whose safetensors headers name the recorded tensors."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        if manifest.get("format") != CACHE_FORMAT or manifest.get("source") != source:
            return False
        files, tensors = manifest["files"], manifest["tensors"]
        if not tensors or not all((path / f).stat().st_size == size for f, size in files.items()):
            return False
        return all(_tensor_names(path / f) == names for f, names in tensors.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SafetensorError):
        return False


def _write_manifest(path: Path, source: str) -> None:
    """Record the files of the finished checkpoint in ``path``; refuses a checkpoint without readable weights."""
    files = {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file() and p.name != MANIFEST}
    try:
        tensors = {name: _tensor_names(path / name) for name in files if name.endswith(".safetensors")}
    except SafetensorError as e:
        raise DecodeKitError(f"the checkpoint converted from {source} into {path} has unreadable weights: {e}") from e
    if not any(tensors.values()):
        raise DecodeKitError(
            f"converting {source} wrote no safetensors weights into {path}; the converter must save the model with "
            "save_pretrained (safetensors is its default format)"
        )
    manifest = {"format": CACHE_FORMAT, "source": source, "files": files, "tensors": tensors}
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, path / MANIFEST)


def _partial_prefix(final: Path) -> str:
    return f".{final.name}.partial-"


def _remove_stale_partials(final: Path) -> None:
    """Delete temporary directories that a killed conversion into ``final`` left behind."""
    now = time.time()
    for path in final.parent.glob(_partial_prefix(final) + "*"):
        try:
            if now - path.stat().st_mtime > _STALE_PARTIAL_S:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def cached_checkpoint(final: Path, source: str, convert: Callable[[Path], None]) -> Path:
    """``final``, holding the checkpoint converted from ``source``; runs ``convert`` first unless it is cached.

    ``convert(directory)`` writes the checkpoint (``save_pretrained`` model + tokenizer) into an empty temporary
    directory, which is renamed to ``final`` once complete. An existing ``final`` that is not a complete cache of
    ``source`` (see :func:`is_complete`) is replaced. When two processes convert at once, the first rename wins
    and the other uses its result.

    Args:
        final: the checkpoint's directory, usually under :func:`cache_root`.
        source: what the checkpoint is converted from (a file name); recorded in the manifest and checked on reuse.
        convert: writes the checkpoint into the directory it is given.

    Raises:
        DecodeKitError: ``convert`` wrote no readable safetensors weights.
    """
    if is_complete(final, source):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(final)
    tmp = Path(tempfile.mkdtemp(prefix=_partial_prefix(final), dir=final.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it owner-only; the cache gets ordinary directory permissions
        log.warning("converting %s once (this takes a while); caching it in %s", source, final)
        convert(tmp)
        _write_manifest(tmp, source)
        if final.exists() and not is_complete(final, source):
            log.warning("replacing the incomplete or outdated cache %s", final)
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not is_complete(final, source):  # not a concurrent conversion that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
