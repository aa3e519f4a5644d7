"""What every static-shape, compiled forward shares (:class:`StaticCall`): its inputs padded to a width bucket and to
the cache's whole buffer, one ``torch.compile`` of its step per mode kept across calls, the one-row graph compiled
up front, the weights a frozen step was compiled against, and eager from the first failure on. Two steps use it:
the target's decoder stack (:class:`~decodekit.models.compiled.StaticForward`) and a draft head's single layer
(:class:`~decodekit.drafters.lean_layer.StaticLayer`); :mod:`decodekit.models.compiled` describes the scheme."""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from decodekit.models.compile_support import freezes, frozen_weights, mark_dynamic, own_code, weight_versions
from decodekit.models.compile_switch import width_bucket

__all__ = ["CPU_AUTOTUNE", "RECOMPILE_LIMIT", "StaticCall", "StaticInputs"]

CPU_AUTOTUNE = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}  # inductor's options: "max-autotune"
RECOMPILE_LIMIT = 64
"""Graphs a step may compile (dynamo's ``recompile_limit``, 8 by default, past which it runs eager in silence): each
kind of forward (the hidden layers kept, logits or not, an exit's blocks) needs up to four (one row or more, one
token or more), so one model shared by a few drafters in a process would pass 8."""

StaticInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]
"""A step's padded inputs: ``inputs [B, W, ...]`` (token ids or hidden states), ``positions [B, W]``, the mask
``[B, 1, W, S_buf]`` over the whole buffer, the written ``slots [B, W]`` and the layers' key and value buffers."""


class StaticCall:
    """A forward at static shapes through one compiled step per mode (module docstring). A subclass gives
    :meth:`_step`, which takes the :data:`StaticInputs` and then its own static arguments.

    Args:
        weights: the weights the step reads (a frozen ``"max-autotune"`` step compiles again when they change).
        name: what the one warning calls the forward when compiling fails.
    """

    def __init__(self, weights: Callable[[], Iterable[torch.Tensor]], name: str) -> None:
        self.weights, self.name = weights, name
        self.failed: str | None = None  # why compiling failed (then every forward runs eager)
        self._reset()
        self._lock = threading.Lock()  # dynamo's compiling is not thread-safe: one compiled forward at a time

    def _step(self, *args: Any) -> Any:
        raise NotImplementedError

    def _reset(self) -> None:
        """Forget every compiled step (each mode compiles its own again at its next forward)."""
        self._compiled: dict[str, Any] = {}  # mode -> its compiled step
        self._single: set[tuple[Any, ...]] = set()  # the kinds of forward whose one-row graph exists (run())
        self._frozen: dict[str, list[tuple[int, int, int]]] = {}  # mode -> the weights frozen into it

    def __deepcopy__(self, memo: dict) -> StaticCall:
        """A copy for a copied model (a deep copy of a model deep-copies its adapter): everything but the compiled
        steps, which are bound to this instance and so to the original model's modules; the copy compiles its
        own."""
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        for name, value in vars(self).items():
            if name not in ("_compiled", "_lock", "_single", "_frozen"):
                setattr(twin, name, copy.deepcopy(value, memo))
        twin._reset()
        twin._lock = threading.Lock()
        return twin

    def prepare(
        self,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        mask: Any,
        view: Any,
        buffers: tuple[int, int, int, torch.Tensor],
        canvas: bool = False,
        planes: int = 1,
    ) -> StaticInputs | None:
        """The step's inputs for a forward of ``inputs [B, N, ...]`` at ``positions [B, N]`` under ``mask [B, 1, N,
        S]`` (bool) writing ``view``'s slots, or None where it must run eager (nothing written): a per-layer,
        per-head or additive mask, an ``attend`` view, a width past the buckets, a prefill (an empty cache: its width
        is the prompt's; ``canvas``, a diffusion LM's call, compiles those too) or an earlier failure. ``planes``:
        the masks stacked along dim 1 (one per layer type: ``[B, T, N, S]``), not per-head masks.

        ``buffers``: ``(layers, kv_heads, head_dim, like)``, the cache buffers the step writes (allocated here).
        Padded queries repeat the last position, write to the scratch slot and attend only to it."""
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != planes:
            return None
        slots, cache = view.slots(), view.cache
        width = width_bucket(inputs.shape[1], canvas)
        if self.failed is not None or slots is None or width is None or (cache.get_seq_length() == 0 and not canvas):
            return None
        view.check()
        batch, num_new = inputs.shape[:2]
        layers, kv_heads, head_dim, like = buffers
        cache.allocate(layers, kv_heads, head_dim, like)
        scratch = cache.capacity
        if width > num_new:
            pad = width - num_new
            inputs = torch.cat([inputs, inputs.new_zeros(batch, pad, *inputs.shape[2:])], 1)
            positions = torch.cat([positions, positions[:, -1:].expand(batch, pad)], 1)
            slots = torch.cat([slots, slots.new_full((batch, pad), scratch)], 1)
        full = mask.new_zeros(batch, planes, width, scratch + 1)
        full[:, :, :num_new, : mask.shape[-1]] = mask
        full[:, :, num_new:, scratch] = True
        for kept in (cache.keys, cache.values):  # views (the cache's in-place compaction) would be other graphs
            kept[:layers] = [b.clone() if b._base is not None else b for b in kept[:layers]]
        keys, values = cache.keys[:layers], cache.values[:layers]
        if inputs.device.type == "cuda":  # CUDA graphs replay on these addresses
            for buf in (*keys, *values):
                torch._dynamo.mark_static_address(buf)
        return mark_dynamic(inputs, positions, full, slots.contiguous(), keys, values)

    def run(self, inputs: StaticInputs, args: tuple[Any, ...], mode: str) -> Any:
        """The compiled step of ``mode`` on ``inputs`` and its static ``args``, or None if compiling failed (one
        warning; eager from then on). The ``args`` (with ``mode`` and whether the width exceeds one) are what guards
        a graph besides the marked sizes: the first batched forward of each kind also runs a copy of its first row
        alone, so the one-row graph compiles up front, not when a batch later shrinks to one row."""
        device = inputs[0].device
        batch, width = inputs[0].shape[:2]
        try:
            limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            with self._lock, frozen_weights(mode, device), torch._dynamo.config.patch(recompile_limit=limit):
                step = self._step_for(mode, device)
                key = (mode, width > 1, *args)
                if key not in self._single and batch > 1:
                    row = [t[:1].clone() for t in inputs[:4]] + [[b[:1].clone() for b in bs] for bs in inputs[4:]]
                    step(mark_dynamic(*row), *args)
                self._single.add(key)
                return step(inputs, *args)
        except Exception as error:  # inductor without a compiler, an op it cannot trace: eager from now on
            self.failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
            warnings.warn(f"compile=True: compiling {self.name} failed ({self.failed}); it runs eager", stacklevel=5)
            return None

    def _step_for(self, mode: str, device: torch.device) -> Any:
        """The compiled step of ``mode``, compiled now if this is its first forward, or again if weights frozen
        into it have changed since (replaced, updated in place or given new ``.data``: :func:`weight_versions`)."""
        frozen = self._frozen.get(mode)
        if frozen is not None and frozen != weight_versions(self.weights()):
            self._compiled.pop(mode, None)
            self._single = {key for key in self._single if key[0] != mode}
        if mode not in self._compiled:
            if freezes(mode, device):
                self._compiled[mode] = torch.compile(own_code(self._step), dynamic=None, options=CPU_AUTOTUNE)
                self._frozen[mode] = weight_versions(self.weights())
            else:
                cuda_mode = "reduce-overhead" if mode == "default" else "max-autotune"
                compile_mode = cuda_mode if device.type == "cuda" else None
                self._compiled[mode] = torch.compile(own_code(self._step), dynamic=None, mode=compile_mode)
        return self._compiled[mode]
