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
import warnings

import torch

from decodekit.errors import ConfigError

KERNELS = ("onednn", "int8")


class PackedLinear(torch.nn.Module):
    """A float32 ``nn.Linear`` whose weight is reordered once into oneDNN's blocked layout; inputs and outputs stay
    ordinary dense tensors (``torch.ops.mkldnn._linear_pointwise``, the kernel PyTorch's own CPU compiler emits for
    frozen linears). ``x [..., in_features]`` -> ``[..., out_features]``.

    The layout is chosen for ``BATCH_HINT`` rows; any number of rows runs. ``weight`` is an opaque MKL-DNN tensor
    (``weight.to_dense()`` gives the original matrix); copies and pickles carry the dense matrix and reorder it
    again."""

    BATCH_HINT = 8  # on SmolLM2's shapes: as fast as a hint of 1 for one row, up to 2x faster for 3-17 rows

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._pack(linear.weight.detach(), None if linear.bias is None else linear.bias.detach())

    def _pack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight, self.BATCH_HINT))
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_buffers"] = {**self._buffers, "weight": self.weight.to_dense()}  # opaque tensors cannot be copied
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pack(self._buffers["weight"], self._buffers["bias"])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def onednn_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every float32 ``nn.Linear`` of ``model`` (in place) by a :class:`PackedLinear`; returns ``model`` (a
    new :class:`PackedLinear` when ``model`` is itself a bare ``nn.Linear``).

    Tied weights are untied (the output head gets its own packed copy of the embedding matrix).
    """
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        raise ConfigError("kernels='onednn' needs a PyTorch build with MKL-DNN (oneDNN); use kernels=None")
    if _packable(model):
        return PackedLinear(model)  # type: ignore[arg-type]  # a bare linear: nothing to replace it in
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if _packable(child):
                setattr(module, name, PackedLinear(child))  # type: ignore[arg-type]
    return model


def _packable(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.Linear and module.weight.dtype == torch.float32 and module.weight.is_cpu


def match_kernels(module: torch.nn.Module, like: object) -> torch.nn.Module:
    """Give ``module`` (a drafter's head, in place) the linear kernels of the model ``like`` runs on: its float32
    CPU ``nn.Linear`` layers become :class:`PackedLinear` when ``like`` (a ``torch.nn.Module``, or an adapter whose
    ``hf`` is one) has any, else nothing changes; returns ``module``.

    A head of one decoder layer makes a handful of one-token forwards a round, each a few small linears: on the
    2-core CPU the packed kernels cut an EAGLE-3 step from 1.25 to 0.77 ms. The head's outputs change at the
    ~1e-6 level, which changes drafts, never what a lossless verifier commits. Inference only: a packed head
    cannot be trained.
    """
    model = like if isinstance(like, torch.nn.Module) else getattr(like, "hf", None)
    if isinstance(model, torch.nn.Module) and any(isinstance(m, PackedLinear) for m in model.modules()):
        return onednn_linears(module)
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
