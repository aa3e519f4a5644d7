"""Static-shape, compiled forwards: ``dk.generate(..., compile=True)``.

The eager adapter runs a forward at whatever shape the ragged state has: ``N`` tokens per row (the pending token and
this round's draft), ``S = max(L) + N`` keys, its K/V written where :meth:`KVCache.stage` planned. Compiled code (and
a CUDA graph above all) wants a forward whose shapes take few values and that reads nothing from the host. Under
:func:`~decodekit.models.compile_switch.compiling`, a covered family's forward (Llama, Mistral, Qwen2, Qwen3 through
:class:`~decodekit.models.lean.LeanDecoder`'s arithmetic) runs as :class:`StaticForward` instead:

- **explicit slots**: the forward gets the slots it writes as a ``[B, N]`` tensor (:meth:`KVCache.staged_slots`,
  gpt-fast's ``input_pos``) and scatters its K/V into the cache's buffers itself;
- **a fixed key length**: attention always reads the whole buffer, ``capacity + 1`` slots (the last is scratch),
  under the caller's mask padded with False; under ``compiling`` new caches get a capacity rounded up to a
  multiple of ``compile_switch.CAPACITY_STEP`` (with room for a padded draft), so calls with other prompt lengths
  see the same key length;
- **width buckets**: ``N`` is padded to the next of ``compile_switch.WIDTHS`` (1, 2, 4, 8, 16, 32, 64); padded
  queries write to the scratch slot and attend only to it, and their outputs are dropped. Wider forwards and
  prefills (a forward into an empty cache, whose width is the prompt's) run eager.

The step is one ``torch.compile`` per adapter (inductor; ``mode="reduce-overhead"``, i.e. CUDA graphs, on CUDA),
kept across calls. The batch, width and key-length dimensions are marked dynamic (one graph serves every batch size
after compaction, every width bucket and every capacity; dynamo keeps a size of 1 apart, and CUDA graphs record one
graph per shape). Dynamo compiles a batch of one apart from larger ones, and a batch shrinks to one row as rows
finish, so the first batched forward of each width class (one token; more) also runs a copy of its first row alone:
the one-row graph compiles up front, not in the middle of a later call. A cache compacted in place (its buffers then
views of the larger ones, which dynamo would trace as other graphs) is copied once at the next compiled forward.
A first batched call compiles four graphs, a later call with other prompt lengths or batch sizes none
(``tests/unit/test_compiled.py`` counts dynamo's compiles).

Where a forward cannot run this way it runs eager: silently for prefills and the diffusion half's cache plans
(``write_at`` / ``attend``), with one warning a call naming why for a model outside the covered families, an
early-exit or layer-skipping forward, a restricted attention (``attend=``, attention recording), and once per
adapter when compiling itself fails (no C++ compiler for inductor, an unsupported op in a custom kernel).

Measured on a 2-core CPU (docs/benchmarks.md, "Compiled forwards on the CPU"): the same tokens, 0.99-1.04x plain
decoding over eager with the same stock kernels (the n-gram drafter equal at batch 1, slower at batch 4 with its
widths padded), while the eager loop with the oneDNN kernels (which inductor cannot lower) stays faster: a SmolLM2
token is bound by the matrix-vector kernels there, not by dispatch. The switch is for GPUs, where the eager loop is
dispatch-bound (``tests/gpu`` runs it there).

Not covered yet: ``dk.dlm.generate`` (its forwards are canvas-wide, and the dual / dKV caches plan with
``write_at`` / ``attend``), the early-exit family's partial forwards, and CUDA itself (written, not yet run).
"""

from __future__ import annotations

import itertools
import threading
import types
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from decodekit.models.compile_switch import width_bucket
from decodekit.models.lean import LeanDecoder, attention_inputs

__all__ = ["StaticForward", "eager_reason"]


def eager_reason(adapter: Any, lean: bool, partial: bool, restricted: bool) -> str | None:
    """Why a forward of ``adapter`` (an :class:`~decodekit.models.hf.HFCausalLM`) cannot run compiled, for the
    call's one warning, or None: it runs through :class:`StaticForward` where the forward's shape allows.

    Args:
        lean: the eager forward would take the lean path (no hooks on the modules, no per-layer masks).
        partial: an early-exit or layer-skipping forward; restricted: ``attend=`` or attention recording.
    """
    name = type(adapter.hf).__name__
    if adapter._static is None:
        return (
            f"{name} is not run by decodekit's Llama-family forward (Llama, Mistral, Qwen2, Qwen3 with sdpa "
            "attention and full-attention layers only)"
        )
    if partial:
        return f"{name}'s early-exit and layer-skipping forwards (a self-speculative drafter)"
    if restricted or not lean or adapter.hf.training:
        return f"{name}'s forwards with restricted or recorded attention, hooks on its modules, or in training mode"
    return None


class StaticForward:
    """A covered decoder stack's forward at static shapes, compiled once (module docstring).

    Args:
        lean: the eager lean forward of the same decoder (its modules, per-head norms and rotary function).
    """

    def __init__(self, lean: LeanDecoder) -> None:
        from decodekit.models.grouped_attention import TORCH_HAS_GQA

        self.decoder, self.qk_norm, self.rotate, self.gqa = lean.decoder, lean.qk_norm, lean.rotate, TORCH_HAS_GQA
        config = self.decoder.config
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.failed: str | None = None  # why compiling failed (then every forward runs eager)
        self._compiled: Any = None
        self._lock = threading.Lock()  # dynamo's compiling is not thread-safe: one compiled forward at a time
        self._single: set[bool] = set()  # width classes (width > 1) whose one-row graph exists

    def __deepcopy__(self, memo: dict) -> StaticForward:
        """A copy for a copied model (a deep copy of a model deep-copies its adapter): everything but the compiled
        step, which is bound to this instance and so to the original model's modules; the copy compiles its own."""
        import copy

        twin = StaticForward.__new__(StaticForward)
        memo[id(self)] = twin
        for name, value in vars(self).items():
            if name not in ("_compiled", "_lock", "_single"):
                setattr(twin, name, copy.deepcopy(value, memo))
        twin._compiled, twin._lock, twin._single = None, threading.Lock(), set()
        return twin

    def _step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        slots: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        hidden_layers: tuple[int, ...],
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The traced forward: ``tokens``, ``positions``, ``slots [B, W]``, ``mask [B, 1, W, S_buf]``; writes the
        K/V at ``slots`` of each layer's ``keys`` / ``values [B, Hkv, S_buf, D]``; returns the normed output
        ``[B, W, H]`` and the requested layers' outputs (0 = embeddings)."""
        decoder = self.decoder
        batch, width = tokens.shape
        x = decoder.embed_tokens(tokens)
        hidden = {0: x} if 0 in hidden_layers else {}
        cos, sin = decoder.rotary_emb(x, position_ids=positions)
        index = slots[:, None, :, None]
        for number, layer in enumerate(decoder.layers._modules.values(), start=1):  # all blocks: no selection here
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = attention_inputs(attn, h, cos, sin, self.qk_norm, self.rotate)
            k_buf, v_buf = keys[attn.layer_idx], values[attn.layer_idx]
            k_buf.scatter_(2, index.expand_as(k), k)
            v_buf.scatter_(2, index.expand_as(v), v)
            groups = q.shape[1] // k_buf.shape[1]
            if groups > 1 and not self.gqa:
                k_buf, v_buf = k_buf.repeat_interleave(groups, 1), v_buf.repeat_interleave(groups, 1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k_buf, v_buf, attn_mask=mask, scale=attn.scaling, **({"enable_gqa": True} if self.gqa else {})
            )
            x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, width, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if number in hidden_layers:
                hidden[number] = x
        return decoder.norm(x), hidden

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        hidden_layers: Sequence[int] = (),
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | None:
        """Run ``tokens [B, N]`` at ``positions [B, N]`` under ``mask [B, 1, N, S]`` (bool) against ``cache``,
        writing the slots :meth:`KVCache.stage` planned. Returns the normed output ``[B, N, H]`` and the hidden
        states asked for (each ``[B, N, H]``), or None where this forward must run eager (nothing was written)."""
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
            return None  # per-layer, per-head or additive masks
        slots = cache.staged_slots()
        width = width_bucket(tokens.shape[1])
        if self.failed is not None or slots is None or width is None or cache.get_seq_length() == 0:
            return None  # a prefill (an empty cache: its width is the prompt's) or a plan other than stage()
        batch, num_new = tokens.shape
        decoder = self.decoder
        layers = len(decoder.layers._modules)
        cache.allocate(layers, self.kv_heads, self.head_dim, decoder.embed_tokens.weight)
        scratch = cache.capacity
        if width > num_new:  # padded queries: token 0 at the last position, writing to and attending the scratch slot
            pad = width - num_new
            tokens = torch.cat([tokens, tokens.new_zeros(batch, pad)], 1)
            positions = torch.cat([positions, positions[:, -1:].expand(batch, pad)], 1)
            slots = torch.cat([slots, slots.new_full((batch, pad), scratch)], 1)
        full = mask.new_zeros(batch, 1, width, scratch + 1)
        full[:, :, :num_new, : mask.shape[-1]] = mask
        full[:, :, num_new:, scratch] = True
        slots = slots.contiguous()
        for buffers in (cache.keys, cache.values):  # views (the cache's in-place compaction) would be other graphs
            buffers[:layers] = [b.clone() if b._base is not None else b for b in buffers[:layers]]
        keys, values = cache.keys[:layers], cache.values[:layers]
        inputs = _marked(tokens, positions, full, slots, keys, values)
        if tokens.device.type == "cuda":  # CUDA graphs replay on these addresses
            for buf in (*keys, *values):
                torch._dynamo.mark_static_address(buf)
        try:
            with self._lock:
                if self._compiled is None:
                    mode = "reduce-overhead" if tokens.device.type == "cuda" else None
                    self._compiled = torch.compile(_own_code(self._step), dynamic=None, mode=mode)
                layer_ids = tuple(sorted(hidden_layers))
                if (width > 1) not in self._single and batch > 1:  # compile the one-row graph now (module docstring)
                    row = [t[:1].clone() for t in inputs[:4]] + [[b[:1].clone() for b in bs] for bs in inputs[4:]]
                    self._compiled(*_marked(*row), layer_ids)
                self._single.add(width > 1)
                out, hidden = self._compiled(*inputs, layer_ids)
        except Exception as error:  # inductor without a compiler, an op it cannot trace: eager from now on
            self.failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
            warnings.warn(
                f"compile=True: compiling {type(decoder).__name__}'s forward failed ({self.failed}); it runs eager",
                stacklevel=4,
            )
            return None
        cache.staged_written(layers)
        return out[:, :num_new], {i: h[:, :num_new] for i, h in hidden.items()}


def _marked(*inputs: Any) -> tuple[Any, ...]:
    """The step's inputs (``tokens``, ``positions``, ``mask``, ``slots``, ``keys``, ``values`` as :meth:`StaticForward
    ._step` takes them) with their batch, width and key-length dimensions marked dynamic (one graph for every batch
    size, width bucket and cache capacity; dynamo still keeps a size of 1 apart)."""
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


def _own_code(method: Any) -> Any:
    """``method`` (bound) on a copy of its code object. Dynamo keeps its graphs, guards and recompile limit (8 by
    default) per code object: a target and a draft model sharing one would share that limit (each needs a few
    graphs) and fall back to eager past it. Each :class:`StaticForward` compiles its own copy."""
    function = method.__func__
    code = function.__code__.replace(co_name=f"{function.__name__}_{next(_COPIES)}")
    copy = types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)
    return types.MethodType(copy, method.__self__)
