"""Checks of what a diffusion sampler's parts return (rule, cache strategy, region schedule, draft strategy), as
:mod:`decodekit.spec.components` checks a drafter's drafts and a verifier's verdicts: a user's component with a bug
fails at once with a :class:`~decodekit.errors.ComponentOutputError` naming it and the field, not deep in the loop or by
spinning forever.

The loop checks host metadata (type, shape, dtype, device) every step: free, no device read. Values are checked where
they cost no extra read (whether each row progressed rides on the step's one host read) and otherwise on a call's
first drafts and every step with ``debug=True`` (:func:`decodekit.dlm.generate`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from decodekit.checks import check_int, describe, describe_on, is_int, tensor_fits
from decodekit.dlm.state import DLMState, SlotLogits
from decodekit.errors import ComponentOutputError, ConfigError, ConfigTypeError


def check_commit(source: str, commit: Any, state: DLMState) -> torch.Tensor:
    """A rule's ``select`` output: a ``[B, G]`` bool tensor on the state's device (host metadata only)."""
    shape = (state.batch_size, state.gen_length)
    if not tensor_fits(commit, [shape], state.device, torch.bool):
        raise ComponentOutputError(
            f"{source} must return a [B, G] = {list(shape)} bool tensor on {state.device}, got {describe_on(commit)}"
        )
    return commit


def check_region(source: str, region: Any, state: DLMState) -> torch.Tensor:
    """A schedule's ``region`` output: a ``[G]`` or ``[B, G]`` bool tensor on the state's device."""
    shapes = ((state.gen_length,), (state.batch_size, state.gen_length))
    if not tensor_fits(region, shapes, state.device, torch.bool):
        raise ComponentOutputError(
            f"{source} must return a [G] = {list(shapes[0])} or [B, G] = {list(shapes[1])} bool tensor on "
            f"{state.device}, got {describe_on(region)}"
        )
    return region


def check_logits(source: str, logits: Any, state: DLMState, vocab_size: int, canvases: int | None = None) -> Any:
    """A cache strategy's logits: ``[B, G, V]`` floating point on the state's device, or a :class:`SlotLogits`
    window ``[B, W, V]`` from slot ``lo`` that covers the current block (``state.block``; and the block
    ``state.lookahead`` names, when set). ``canvases``: ``logits_many``'s, one ``[N, ...]`` more dimension of that
    many canvases. Host metadata only."""
    lead = () if canvases is None else (canvases,)
    dims = "[B, G, V]" if canvases is None else "[N, B, G, V]"
    window = logits.logits if isinstance(logits, SlotLogits) else logits
    if not isinstance(window, torch.Tensor):
        raise ComponentOutputError(
            f"{source} must return {dims} float logits or a SlotLogits window, got {describe(logits)}"
        )
    expected = (*lead, state.batch_size, state.gen_length, vocab_size)
    ok_type = window.dtype.is_floating_point and window.device == state.device
    if not isinstance(logits, SlotLogits):
        if not ok_type or tuple(window.shape) != expected:
            raise ComponentOutputError(
                f"{source} must return {dims} = {list(expected)} float logits on {state.device} (or a SlotLogits "
                f"window covering the current block), got {describe_on(window)}"
            )
        return logits
    lo, hi = state.block[0], (state.lookahead or state.block)[1]
    width = window.shape[-2] if window.ndim == len(expected) else None
    covers = is_int(logits.lo) and width is not None and 0 <= logits.lo <= lo and hi <= logits.lo + width
    fits = covers and logits.lo + width <= state.gen_length
    if not ok_type or width is None or tuple(window.shape) != (*expected[:-2], width, vocab_size) or not fits:
        what = f"slots {lo}..{hi - 1}" + (" (the current block and the next)" if state.lookahead else "")
        raise ComponentOutputError(
            f"{source} returned a SlotLogits window of {describe_on(window)} from slot lo="
            f"{logits.lo!r}; it must hold {dims.replace('G', 'W')} = {[*expected[:-2], 'W', vocab_size]} float "
            f"logits on {state.device} for slots lo .. lo + W - 1 within the {state.gen_length} generation slots, "
            f"covering {what}"
        )
    return logits


def check_variants(
    source: str, variants: Any, state: DLMState, vocab_size: int, values: bool = False
) -> torch.Tensor | None:
    """A draft strategy's ``variants``: None, or a ``[1 + N, B, T]`` tensor of the canvas's dtype on its device (host
    metadata); with ``values`` (one host read: a call's first drafts, and every time with ``debug``) also that the
    first is ``state.canvas`` and every token is inside the vocabulary."""
    if variants is None:
        return None
    canvas = state.canvas
    if not isinstance(variants, torch.Tensor):
        raise ComponentOutputError(f"{source} must return None or a [1 + N, B, T] tensor, got {describe(variants)}")
    if (
        variants.ndim != 3
        or variants.shape[0] < 1
        or tuple(variants.shape[1:]) != tuple(canvas.shape)
        or variants.dtype != canvas.dtype
        or variants.device != canvas.device
    ):
        raise ComponentOutputError(
            f"{source} must return None or a [1 + N, B, T] = [1 + N, {', '.join(map(str, canvas.shape))}] "
            f"{str(canvas.dtype).removeprefix('torch.')} tensor on {canvas.device} (the canvas, then N drafted "
            f"canvases), got {describe_on(variants)}"
        )
    if values:
        first, inside = torch.stack(
            [(variants[0] == canvas).all(), ((variants >= 0) & (variants < vocab_size)).all()]
        ).tolist()
        if not first:
            raise ComponentOutputError(
                f"{source} returned variants whose first canvas is not state.canvas; the first must be the canvas "
                "itself (the drafted canvases follow it)"
            )
        if not inside:
            raise ComponentOutputError(
                f"{source} returned variants with token ids outside the model's vocabulary [0, {vocab_size})"
            )
    return variants


def check_finite(source: str, logits: Any) -> None:
    """Refuse NaN or ``+inf`` logits, and a slot whose logits are all ``-inf`` (no distribution to propose from); a
    device read: ``debug`` only."""
    window = logits.logits if isinstance(logits, SlotLogits) else logits
    nan, posinf, empty = torch.stack(
        [window.isnan().any(), window.isposinf().any(), window.isneginf().all(-1).any()]
    ).tolist()
    if nan or posinf or empty:
        what = "NaN logits" if nan else "+inf logits" if posinf else "a slot whose logits are all -inf"
        raise ComponentOutputError(f"{source} returned {what}")


def token_ids(name: str, ids: Any, *, optional: bool = True) -> tuple[int, ...] | None:
    """``ids`` (a token id or a sequence of them, each an integer >= 0) as a tuple; at least one. The model's
    vocabulary is not known here: :func:`check_vocab` checks the upper end when a call starts."""
    if ids is None and optional:
        return None
    expected = f"{'None, ' if optional else ''}a token id or a non-empty list of token ids (integers >= 0)"
    if is_int(ids):
        ids = [ids]
    elif isinstance(ids, torch.Tensor) and ids.ndim <= 1 and not ids.dtype.is_floating_point:
        ids = ids.reshape(-1).tolist()
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable) or isinstance(ids, dict):
        raise ConfigTypeError(f"{name} must be {expected}, got {describe(ids)}")
    values = list(ids)
    if not values:
        raise ConfigError(f"{name} must be {expected}, got an empty list")
    for value in values:
        if not is_int(value):
            raise ConfigTypeError(f"{name} must be {expected}; it holds {describe(value)}")
        check_int(name, value, low=0, hint=" (a token id)")
    return tuple(int(v) for v in values)


def check_vocab(owner: str, name: str, ids: Iterable[int] | None, vocab_size: int) -> None:
    """Refuse token ids outside ``[0, vocab_size)`` (``owner``'s ``name``), when a call starts."""
    bad = [i for i in ids or () if not 0 <= i < vocab_size]
    if bad:
        raise ConfigError(
            f"{owner}({name}=...) holds token id(s) {bad[:8]} outside the model's vocabulary [0, {vocab_size}); "
            "pass ids of this model's tokenizer"
        )


def check_finished(state: DLMState, schedule: Any, tokens: list[list[int]]) -> None:
    """Refuse to return mask ids: a schedule whose rounds stopped before every slot was committed."""
    left = [b for b, row in enumerate(tokens) if state.mask_token_id in row]
    if left:
        raise ComponentOutputError(
            f"{type(schedule).__name__}.rounds ended with masked slots left in row(s) {left[:8]}; a schedule's rounds "
            "must take the block over the whole generation region (slots 0 .. state.gen_length - 1) before they stop"
        )


__all__ = [
    "check_commit",
    "check_finished",
    "check_finite",
    "check_logits",
    "check_region",
    "check_variants",
    "check_vocab",
    "token_ids",
]
