"""What a static-shape compiled step (:class:`~decodekit.models.static_call.StaticCall`) needs from dynamo and
inductor around it: the weights' identities and version counters a frozen step was compiled against
(:func:`weight_versions`), inductor's freezing for a CPU ``"max-autotune"`` step (:func:`freezes`,
:func:`frozen_weights`), the dynamic dimensions of the step's inputs (:func:`mark_dynamic`) and a private code object
per instance (:func:`own_code`)."""

from __future__ import annotations

import contextlib
import itertools
import types
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["freezes", "frozen_weights", "mark_dynamic", "own_code", "weight_versions"]


def weight_versions(weights: Iterable[torch.Tensor]) -> list[tuple[int, int, int]]:
    """Each weight's identity, in-place version counter and storage address: what a frozen compiled step was
    compiled against (the address moves when a parameter's ``.data`` is replaced, which keeps the other two)."""
    return [(id(w), _version(w), w.data_ptr()) for w in weights]


def _version(weight: torch.Tensor) -> int:
    try:
        return weight._version
    except RuntimeError:  # an inference tensor (made under torch.inference_mode) keeps no version counter
        return -1


def freezes(mode: str, device: torch.device) -> bool:
    """Whether ``mode``'s step on ``device`` folds the weights in as constants (CPU ``"max-autotune"``)."""
    return mode == "max-autotune" and device.type != "cuda"


def frozen_weights(mode: str, device: torch.device) -> Any:
    """Inductor's freezing (weights folded into the compiled code as constants, so its GEMM templates can pack
    them once) for a CPU ``"max-autotune"`` step; read when a graph compiles, so it is set around every call (a
    later call may compile another graph)."""
    if freezes(mode, device):
        import torch._inductor.config as inductor_config

        return inductor_config.patch(freezing=True)
    return contextlib.nullcontext()


def mark_dynamic(*inputs: Any) -> tuple[Any, ...]:
    """The step's inputs (``tokens`` or hidden states, ``positions``, ``mask``, ``slots``, ``keys``, ``values`` as
    :meth:`~decodekit.models.compiled.StaticForward._step` takes them) with their batch, width and key-length
    dimensions marked dynamic (one graph for every batch size, width bucket and cache capacity; dynamo still keeps a
    size of 1 apart)."""
    tokens, positions, mask, slots, keys, values = inputs
    for tensor in (tokens, positions, mask, slots, *keys, *values):
        torch._dynamo.maybe_mark_dynamic(tensor, 0)
    for tensor in (tokens, positions, slots):
        torch._dynamo.maybe_mark_dynamic(tensor, 1)
    torch._dynamo.maybe_mark_dynamic(mask, 2)
    for tensor in (mask, *keys, *values):
        torch._dynamo.maybe_mark_dynamic(tensor, 3 if tensor is mask else 2)
    return tokens, positions, mask, slots, keys, values


_COPIES = itertools.count()


def own_code(method: Any) -> Any:
    """``method`` (bound) on a copy of its code object. Dynamo keeps its graphs, guards and recompile limit (8 by
    default) per code object: a target and a draft model sharing one would share that limit (each needs a few
    graphs) and fall back to eager past it. Each :class:`~decodekit.models.static_call.StaticCall` compiles
    its own copy."""
    function = method.__func__
    code = function.__code__.replace(co_name=f"{function.__name__}_{next(_COPIES)}")
    copy = types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)
    return types.MethodType(copy, method.__self__)
