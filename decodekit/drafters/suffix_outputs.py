"""The file of earlier outputs a :class:`~decodekit.drafters.suffix.SuffixDrafter`'s global cache can start with
(its ``preload``): :func:`load_outputs` reads token-id lists from lists, a safetensors file of ``tokens`` and
``offsets``, or a zoo model's shipped responses, and :func:`save_outputs` writes that file. Both are also importable
from :mod:`decodekit.drafters.suffix`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from decodekit.checks import describe
from decodekit.errors import ConfigError
from decodekit.resources import shipped_weights

__all__ = ["load_outputs", "save_outputs"]


def load_outputs(source: str | Path | Sequence[Sequence[int]]) -> list[list[int]]:
    """Token-id lists from ``source``: lists themselves; a zoo model's name (the responses shipped for it,
    ``decodekit/weights/suffix_responses_<name>.safetensors``); or a safetensors file holding ``tokens [T]`` (all
    outputs concatenated) and ``offsets [N + 1]`` (where each starts, then ``T``)."""
    if not isinstance(source, (str, Path)):
        return [list(tokens) for tokens in source]
    path = Path(source)
    if not path.is_file():
        shipped = shipped_weights(f"suffix_responses_{source}.safetensors")
        if not shipped.is_file():
            raise ConfigError(
                f"preload {str(source)!r} is neither a file nor a zoo model with shipped responses "
                f"({shipped.name} is missing); pass lists of token ids or a safetensors file with tokens and offsets"
            )
        path = shipped
    from safetensors.torch import load_file

    layout = (
        "a safetensors file with 'tokens' [T] (integer ids) and 'offsets' [N + 1] (0, ..., T), as save_outputs writes"
    )
    try:
        data = load_file(str(path))
    except Exception as error:  # not a safetensors file, truncated, unreadable
        raise ConfigError(f"preload file {path} could not be read ({error}); it must be {layout}") from None
    if set(data) != {"tokens", "offsets"}:
        raise ConfigError(f"{path} must hold exactly 'tokens' and 'offsets' tensors, found {sorted(data)}")
    tokens_t, offsets_t = data["tokens"], data["offsets"]
    if not all(t.ndim == 1 and not (t.dtype.is_floating_point or t.dtype == torch.bool) for t in (tokens_t, offsets_t)):
        got = f"tokens {describe(tokens_t)}, offsets {describe(offsets_t)}"
        raise ConfigError(f"preload file {path} is malformed ({got}); it must be {layout}")
    tokens, offsets = tokens_t.tolist(), offsets_t.tolist()
    ordered = bool(offsets) and offsets[0] == 0 and offsets[-1] == len(tokens)
    if not ordered or any(a > b for a, b in zip(offsets, offsets[1:])) or any(t < 0 for t in tokens):
        raise ConfigError(
            f"preload file {path} is malformed (offsets must rise from 0 to {len(tokens)}, the number of tokens, and "
            f"token ids be >= 0); it must be {layout}"
        )
    return [tokens[a:b] for a, b in zip(offsets, offsets[1:])]


def save_outputs(path: str | Path, outputs: Sequence[Sequence[int]], metadata: dict[str, str] | None = None) -> None:
    """Write token-id lists as :func:`load_outputs` reads them (``tokens`` int32, ``offsets`` int64), with
    ``metadata`` (where they came from, how many tokens) in the file's header."""
    from safetensors.torch import save_file

    lengths = torch.tensor([len(o) for o in outputs], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    tokens = torch.tensor([t for o in outputs for t in o], dtype=torch.int32)
    save_file({"tokens": tokens, "offsets": offsets}, str(path), metadata=metadata)
