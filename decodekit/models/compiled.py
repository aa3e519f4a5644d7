"""Static-shape, compiled forwards: ``dk.generate(..., compile=True)`` and ``dk.dlm.generate(..., compile=True)``.

The eager adapter runs a forward at whatever shape the ragged state has: ``N`` tokens per row (the pending token and
this round's draft), ``S = max(L) + N`` keys, its K/V written where the :class:`~decodekit.cache.CacheView` from
:meth:`KVCache.stage` says. Compiled code (and a CUDA graph above all) wants a forward whose shapes take few values
and that reads nothing from the host. Under :func:`~decodekit.models.compile_switch.compiling`, a covered family's
forward (Llama, Mistral, Qwen2, Qwen3, Gemma 2 and 3; sliding-window layers with a mask per layer type, stacked as
planes; :class:`~decodekit.models.lean.LeanDecoder`'s blocks) runs as :class:`StaticForward` instead:

- **explicit slots**: the forward gets the slots it writes as a ``[B, N]`` tensor (:meth:`CacheView.slots` of the
  view ``stage`` or ``write_at`` made: gpt-fast's ``input_pos``) and scatters its K/V into the cache's buffers itself;
- **a fixed key length**: attention always reads the whole buffer, ``capacity + 1`` slots (the last is scratch),
  under the caller's mask padded with False; under ``compiling`` new caches get a capacity rounded up to a
  multiple of ``compile_switch.CAPACITY_STEP`` (with room for a padded draft), so calls with other prompt lengths
  see the same key length;
- **width buckets**: ``N`` is padded to the next of ``compile_switch.WIDTHS`` (1, 2, 4, 8, 16, 32, 64); padded
  queries write to the scratch slot and attend only to it, and their outputs are dropped. Wider forwards and
  prefills (a forward into an empty cache, whose width is the prompt's) run eager;
- **canvases**: a diffusion LM's call (``compiling(..., canvas=True)``) compiles those too: a width past 64 is
  padded to the next multiple of ``compile_switch.WIDE_STEP`` (32), and a canvas's cache gets a capacity rounded up
  to a multiple of 32 only (every forward reads the whole buffer: a 256-slot step would make attention read
  several times the canvas).

The step is one ``torch.compile`` per adapter and mode, kept across calls, with the output head inside when the
caller wants logits at every position (the speculative loop does). ``compile=True`` compiles with inductor's default
kernels (``mode="reduce-overhead"``, i.e. CUDA graphs, on CUDA); ``compile="max-autotune"`` freezes the weights
into the compiled code (inductor's ``freezing``: constants it packs once) and runs the linear layers as its tuned
GEMM templates (on the CPU its C++ micro-GEMMs, ``CPU_AUTOTUNE``; on CUDA torch's ``max-autotune`` mode, CUDA
graphs included). A frozen step is compiled against the weights as they were: each forward compares the weights'
identities, in-place version counters and storage addresses with those it froze, and compiles again where they
changed (a head trained in place, ``load_state_dict``, a ``param.data = ...`` swap), so a stale copy never runs.
The batch, width and key-length dimensions are marked dynamic (one graph serves every batch size
after compaction, every width bucket and every capacity; dynamo keeps a size of 1 apart, and CUDA graphs record one
graph per shape). Dynamo compiles a batch of one apart from larger ones, and a batch shrinks to one row as rows
finish, so the first batched forward of each kind (one token or more; the hidden layers it returns; the output head
inside or not) also runs a copy of its first row alone:
the one-row graph compiles up front, not in the middle of a later call. A cache compacted in place (its buffers then
views of the larger ones, which dynamo would trace as other graphs) is copied once at the next compiled forward.
A first batched call compiles four graphs, a later call with other prompt lengths or batch sizes none
(``tests/unit/test_compiled.py`` counts dynamo's compiles); a first call of one row compiles only the one-row graphs,
so the first batched call after it compiles the batched ones. Each kind of forward adds up to four graphs, so a
model shared by a few drafters passes dynamo's default limit of 8 a code object: the step raises it to
``static_call.RECOMPILE_LIMIT`` (64) for itself, past which dynamo would run it eager.

Where a forward cannot run this way it runs eager: silently for the speculative loop's prefills and for
``attend`` plans (the diffusion drafter's), with one warning a call naming why for a model outside the covered
families or a hand-written one, a layer-skipping forward (an early exit, a prefix of the layers, compiles), a
restricted attention (``attend=``, attention recording), and once per adapter when compiling itself fails (no C++
compiler for inductor, an unsupported op in a custom kernel).

Measured on a 2-core CPU (docs/benchmarks.md, "Compiled forwards on the CPU"): ``compile=True`` gives the same
tokens at 0.99-1.04x the eager loop with the same stock kernels (a SmolLM2 token is bound by the matrix-vector
products, which it leaves to the same ATen kernels); ``"max-autotune"`` streams the weights at close to the
machine's read bandwidth instead: plain greedy decoding 1.9x the eager loop with stock kernels at batch 1 and 4
(lookup + EAGLE-3 head 2.6x, n-gram 3.3x at batch 1; ``python -m decodekit.bench.token_profile`` says where a
token's time goes). On a 2-core Intel Xeon, whose stock kernels leave less to gain: 1.22x and 1.38x.

The EAGLE heads' draft steps (:class:`~decodekit.drafters.eagle_head.EagleHead`'s lean layer and the released EAGLE-3
layer) run the same way, one graph per head and mode (:class:`~decodekit.drafters.lean_layer.StaticLayer`, on
:class:`~decodekit.models.static_call.StaticCall` like :class:`StaticForward`): on the 2-core CPU a SmolLM2 EAGLE-3
step costs what it costs eager (1.0-1.4 ms either way, 2026-12-06); it is built for GPUs, where an eager step is
dozens of kernel launches. Medusa's heads (no cache, one small forward a round) stay eager.

A diffusion LM's canvas forward is bound by its matrix products on the CPU: compiled it runs at the eager speed
(``python -m decodekit dlm-bench experiment=compiled``). Not covered yet: the early-exit family's partial forwards,
and CUDA itself (written, not yet run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from decodekit.masks import to_additive
from decodekit.models.lean import LeanDecoder
from decodekit.models.static_call import CPU_AUTOTUNE, StaticCall, StaticInputs

__all__ = ["CPU_AUTOTUNE", "StaticForward", "eager_reason"]


def eager_reason(adapter: Any, lean: bool, restricted: bool, skips: bool = False) -> str | None:
    """Why a forward of ``adapter`` (an :class:`~decodekit.models.hf.HFCausalLM`) cannot run compiled, for the
    call's one warning, or None: it runs through :class:`StaticForward` where the forward's shape allows.

    Args:
        lean: the eager forward would take the lean path (no hooks on the modules, no per-layer masks).
        restricted: ``attend=`` or attention recording; skips: a layer-skipping forward (SWIFT's search tries many
            sets of layers, each another graph: they run eager; an early exit, a prefix of the layers, compiles).
    """
    name = type(adapter.hf).__name__
    if adapter._static is None:
        return (
            f"{name} is not run by decodekit's compiled forward (Llama, Mistral, Qwen2, Qwen3, Gemma 2 and 3, full "
            "or sliding-window layers)"
        )
    if skips:
        return f"{name}'s layer-skipping forwards (each searched set of layers would be another graph)"
    if restricted or not lean or adapter.hf.training:
        return f"{name}'s forwards with restricted or recorded attention, hooks on its modules, or in training mode"
    return None


class StaticForward(StaticCall):
    """A covered decoder stack's forward at static shapes, compiled once (module docstring).

    Args:
        lean: the eager lean forward of the same decoder (its modules, per-head norms and rotary function).
        head: the output head (inside the compiled step when the caller wants logits at every position).
        weights: the model's weights (what a frozen step is compiled against).
    """

    def __init__(
        self,
        lean: LeanDecoder,
        head: Callable[[torch.Tensor], torch.Tensor],
        weights: Callable[[], Iterable[torch.Tensor]],
    ) -> None:
        from decodekit.models.grouped_attention import TORCH_HAS_GQA

        super().__init__(weights, f"{type(lean.decoder).__name__}'s forward")
        self.lean, self.decoder, self.gqa = lean, lean.decoder, TORCH_HAS_GQA
        self.head = head
        self.mask_types = tuple(dict.fromkeys(lean.layer_types))  # a decoder taking a mask per layer type
        types = self.mask_types
        self.planes = tuple(types.index(t) for t in lean.layer_types) if len(types) > 1 else ()  # layer -> its mask
        config = self.decoder.config
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def _step(
        self, inputs: StaticInputs, hidden_layers: tuple[int, ...], logits: bool, run: tuple[int, ...] | None
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], torch.Tensor | None]:
        """The traced forward on ``inputs`` (``tokens``, ``positions``, ``slots [B, W]``, ``mask [B, 1, W, S_buf]``):
        writes the K/V at ``slots`` of each layer's ``keys`` / ``values [B, Hkv, S_buf, D]``; returns the normed output
        ``[B, W, H]``, the requested layers' outputs (0 = embeddings) and, if ``logits``, the output head's
        ``[B, W, V]``. ``run``: the 1-based blocks it runs (an early exit, skipped layers; None: all), the others
        neither run nor written, as the eager forward's layer selection does."""
        tokens, positions, mask, slots, keys, values = inputs
        decoder = self.decoder
        batch, width = tokens.shape
        x = decoder.embed_tokens(tokens)
        hidden = {0: x} if 0 in hidden_layers else {}
        rope, index = self.lean.rope(x, positions), slots[:, None, :, None]
        softcapped = self.lean.softcapped_attention() if self.lean.family.softcap else None

        def attend(attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str | None) -> torch.Tensor:
            k_buf, v_buf = keys[attn.layer_idx], values[attn.layer_idx]
            k_buf.scatter_(2, index.expand_as(k), k)
            v_buf.scatter_(2, index.expand_as(v), v)
            groups = q.shape[1] // k_buf.shape[1]
            if groups > 1 and not self.gqa and softcapped is None:
                k_buf, v_buf = k_buf.repeat_interleave(groups, 1), v_buf.repeat_interleave(groups, 1)
            plane = self.planes[attn.layer_idx] if self.planes else 0
            layer_mask = mask[:, plane : plane + 1]
            if softcapped is not None:  # Gemma 2: its own attention, its logits softcapped, an additive mask
                additive, cap = to_additive(layer_mask, q.dtype), attn.attn_logit_softcapping
                out, _ = softcapped(attn, q, k_buf, v_buf, additive, dropout=0.0, scaling=attn.scaling, softcap=cap)
                return out.reshape(batch, width, -1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k_buf, v_buf, attn_mask=layer_mask, scale=attn.scaling, **({"enable_gqa": True} if self.gqa else {})
            )
            return out.transpose(1, 2).reshape(batch, width, -1)

        for number, layer in enumerate(decoder.layers._modules.values(), start=1):
            if run is not None and number not in run:
                continue
            x = self.lean.block(layer, x, rope, attend)
            if number in hidden_layers:
                hidden[number] = x
        last = decoder.norm(x)
        return last, hidden, self.head(last) if logits else None

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        view: Any,
        hidden_layers: Sequence[int] = (),
        logits: bool = False,
        mode: str = "default",
        canvas: bool = False,
        run: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], torch.Tensor | None] | None:
        """Run ``tokens [B, N]`` at ``positions [B, N]`` under ``mask [B, 1, N, S]`` (bool) against ``view``
        (a :class:`~decodekit.cache.CacheView`), writing its slots, compiled in ``mode``
        (``compile_switch.MODES``); ``canvas``: a diffusion LM's forward (a canvas-wide width, an empty cache);
        ``run``: the 1-based blocks an early-exit or layer-skipping forward runs (None: all).
        Returns the normed output ``[B, N, H]``, the hidden states asked for (each ``[B, N, H]``) and, if
        ``logits``, the output head's logits ``[B, N, V]``; or None where this forward must run eager (nothing
        was written)."""
        decoder = self.decoder
        layers = len(decoder.layers._modules)
        buffers = (layers, self.kv_heads, self.head_dim, decoder.embed_tokens.weight)
        if isinstance(mask, dict) and mask.keys() == set(self.mask_types):
            mask = torch.cat([mask[t] for t in self.mask_types], 1)  # [B, T, N, S]: one plane per layer type
        inputs = self.prepare(tokens, positions, mask, view, buffers, canvas, planes=max(len(self.mask_types), 1))
        if inputs is None:
            return None
        layer_ids = tuple(sorted(hidden_layers))
        out = self.run(inputs, (layer_ids, logits, run), mode)
        if out is None:
            return None
        view.written(range(layers) if run is None else [n - 1 for n in run])
        last, hidden, scores = out
        num_new = tokens.shape[1]
        scores = None if scores is None else scores[:, :num_new]
        return last[:, :num_new], {i: h[:, :num_new] for i, h in hidden.items()}, scores
