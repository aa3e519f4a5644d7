"""CPU linear-layer kernels for small models, where decoding is memory-bound and the linear layers are ~85% of
a forward.

* ``"onednn"``: float32 ``nn.Linear`` layers run as oneDNN (MKL-DNN) linears with weights reordered once
  (:class:`PackedLinear`), on ordinary dense activations. Same dtype and results to ~1e-4 in the logits; faster
  than the default MKL path for one token and much faster for the 2-17 token forwards speculative decoding
  verifies, where MKL processes small batches of rows almost row by row (docs/benchmarks.md). Before 2026-11-26
  this was ``torch.utils.mkldnn.MkldnnLinear``, which converts every input to oneDNN's layout and every output
  back (~20 us each way, ~8 ms of a SmolLM2 forward); on SmolLM2's shapes the dense-input kernel is 1.5-2.5x
  faster per layer for 1-17 rows, with the same outputs.
* ``"int8"``: a copy with dynamically quantized int8 linears (``torch.ao.quantization.quantize_dynamic``):
  ~2.5x faster and close to the original's predictions, a cheap *draft* model for a float32 target (its outputs
  are not the original's, so never use it as the target of a lossless comparison).

Both are CPU-only and inference-only.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
import warnings

import torch

from decodekit.errors import ConfigError

KERNELS = ("onednn", "int8")


class PackedLinear(torch.nn.Module):
    """A float32 ``nn.Linear`` whose weight is reordered once into oneDNN's blocked layout; inputs and outputs stay
    ordinary dense tensors (``torch.ops.mkldnn._linear_pointwise``, the kernel PyTorch's own CPU compiler emits for
    frozen linears). ``x [..., in_features]`` -> ``[..., out_features]``.

    With ``dtype=torch.bfloat16`` the weight (and bias) are stored in bfloat16 and each call converts its float32
    input to bfloat16 and its output back: half the bytes a call reads, for a draft head on a CPU that computes
    bfloat16 natively (:func:`native_bf16`); its outputs differ from the float32 layer's at bfloat16's precision.

    The layout is chosen for ``BATCH_HINT`` rows; any number of rows runs. ``weight`` is an opaque MKL-DNN tensor
    (``weight.to_dense()`` gives the original matrix); copies and pickles carry the dense matrix and reorder it
    again."""

    BATCH_HINT = 8  # on SmolLM2's shapes: as fast as a hint of 1 for one row, up to 2x faster for 3-17 rows

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = dtype or linear.weight.dtype
        bias = None if linear.bias is None else linear.bias.detach().to(self.compute_dtype)
        self._pack(linear.weight.detach().to(self.compute_dtype), bias)

    def _pack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight, self.BATCH_HINT))
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.compute_dtype:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.compute_dtype), self.weight, self.bias, "none", [], "")
        return y.to(x.dtype)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_buffers"] = {**self._buffers, "weight": self.weight.to_dense()}  # opaque tensors cannot be copied
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pack(self._buffers["weight"], self._buffers["bias"])

    def extra_repr(self) -> str:
        dtype = "" if self.compute_dtype == torch.float32 else f", dtype={self.compute_dtype}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{dtype}"


def fused_linear(parts: list[torch.nn.Module]) -> torch.nn.Module:
    """One linear computing ``parts`` (linears of the same input, all ``nn.Linear`` or all :class:`PackedLinear`)
    side by side: ``fused(x) = cat([p(x) for p in parts], -1)`` in one product, of the parts' kind (a packed fusion
    keeps their weights' dtype). Inference only: the fusion holds a copy of the weights."""
    dense = [p.weight.to_dense() if isinstance(p, PackedLinear) else p.weight for p in parts]
    weight = torch.cat([w.detach() for w in dense])
    has_bias = any(p.bias is not None for p in parts)
    biases = [p.bias if p.bias is not None else torch.zeros_like(w[:, 0]) for p, w in zip(parts, dense)]
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device="meta")
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    if has_bias:
        linear.bias = torch.nn.Parameter(torch.cat([b.detach() for b in biases]), requires_grad=False)
    if isinstance(parts[0], PackedLinear):
        return PackedLinear(linear, parts[0].compute_dtype)
    return linear


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 matrix products natively (AVX-512 BF16 or AMX), so that a bfloat16
    :class:`PackedLinear` runs faster than a float32 one rather than emulating."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def onednn_linears(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Replace every float32 ``nn.Linear`` of ``model`` (in place) by a :class:`PackedLinear`; returns ``model`` (a
    new :class:`PackedLinear` when ``model`` is itself a bare ``nn.Linear``).

    Tied weights are untied (the output head gets its own packed copy of the embedding matrix). ``dtype`` is the
    packed weights' (None = float32; ``torch.bfloat16``: bfloat16 weights behind float32 inputs and outputs).
    """
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        raise ConfigError("kernels='onednn' needs a PyTorch build with MKL-DNN (oneDNN); use kernels=None")
    if _packable(model):
        return PackedLinear(model, dtype)  # type: ignore[arg-type]  # a bare linear: nothing to replace it in
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if _packable(child) and name not in _weights_read(type(module)):
                setattr(module, name, PackedLinear(child, dtype))  # type: ignore[arg-type]
    return model


def _packable(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.Linear and module.weight.dtype == torch.float32 and module.weight.is_cpu


@functools.cache
def _weights_read(cls: type) -> frozenset[str]:
    """The children whose ``.weight`` ``cls.forward`` reads itself (``self.classifier.weight``: LongCat-Flash's
    router): they stay plain linears, since a packed weight is an opaque oneDNN tensor no other op takes."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return frozenset()
    return frozenset(re.findall(r"self\.(\w+)\.weight", source))


def match_kernels(module: torch.nn.Module, like: object, bf16: bool | None = None) -> torch.nn.Module:
    """Give ``module`` (a drafter's head, in place) the linear kernels of the model ``like`` runs on: its float32
    CPU ``nn.Linear`` layers become :class:`PackedLinear` when ``like`` (a ``torch.nn.Module``, or an adapter whose
    ``hf`` is one) has any, else nothing changes; returns ``module``.

    A head of one decoder layer makes a handful of one-token forwards a round, each a few small linears: on the
    2-core CPU the packed kernels cut an EAGLE-3 step from 1.25 to 0.77 ms. With ``bf16`` (None = where the CPU
    computes bfloat16 natively, :func:`native_bf16`) the packed weights are bfloat16 behind float32 inputs and
    outputs: half the bytes a draft step reads, the weights a target's forward has just pushed out of the cache
    (an EAGLE-3 round's drafting in the loop 4.1 -> 3.6 ms on the 2-core AMD EPYC). The head's outputs change at the
    ~1e-6 level (float32) or bfloat16's precision, which changes drafts, never what a lossless verifier commits.
    Inference only: a packed head cannot be trained.
    """
    model = like if isinstance(like, torch.nn.Module) else getattr(like, "hf", None)
    if isinstance(model, torch.nn.Module) and any(isinstance(m, PackedLinear) for m in model.modules()):
        use_bf16 = native_bf16() if bf16 is None else bf16
        if use_bf16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            raise ConfigError("bf16=True: this CPU cannot run oneDNN's bfloat16 linears; pass bf16=None or False")
        return onednn_linears(module, torch.bfloat16 if use_bf16 else None)
    return module


def int8_dynamic(model: torch.nn.Module, in_place: bool = False) -> torch.nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` layers are dynamically quantized to int8 (CPU, lossy); with
    ``in_place``, ``model`` itself is quantized (no copy)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.ao.quantization is deprecated.*")
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        target = model if in_place else copy.deepcopy(model)
        return torch.ao.quantization.quantize_dynamic(target, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def check_kernels(kernels: object) -> str | None:
    """``kernels`` if it is None or a name in :data:`KERNELS`; else a :class:`ConfigError` naming the choices."""
    if kernels is not None and (not isinstance(kernels, str) or kernels not in KERNELS):
        raise ConfigError(f"unknown kernels {kernels!r}; use None or one of {', '.join(map(repr, KERNELS))}")
    return kernels


def apply_kernels(model: torch.nn.Module, kernels: str | None, *, in_place: bool = False) -> torch.nn.Module:
    """Apply ``kernels`` (None, ``"onednn"`` or ``"int8"``) to a CPU model; returns the model to use: a converted
    copy, or with ``in_place`` ``model`` itself converted (``model`` unchanged when ``kernels`` is None)."""
    if check_kernels(kernels) is None:
        return model
    if any(not p.is_cpu for p in model.parameters()):
        raise ConfigError(f"kernels={kernels!r} are CPU kernels; load the model on the CPU or use kernels=None")
    if kernels == "onednn":
        return onednn_linears(model if in_place else copy.deepcopy(model))
    return int8_dynamic(model, in_place=in_place)
