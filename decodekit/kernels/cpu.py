"""CPU linear-layer kernels for small models, where decoding is memory-bound and the linear layers are ~85% of
a forward.

* ``"onednn"``: float32 ``nn.Linear`` layers run as oneDNN (MKL-DNN) linears with weights prepacked once
  (``torch.utils.mkldnn.MkldnnLinear``). Same dtype and results to ~1e-4 in the logits; on our 2-core AMD EPYC it
  is ~10% faster for one token and ~25% faster for the 2-9 token forwards speculative decoding verifies, where
  the default MKL path processes small batches of rows almost row by row (docs/benchmarks.md).
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


def onednn_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every float32 ``nn.Linear`` of ``model`` (in place) by a prepacked oneDNN linear; returns ``model``.

    Tied weights are untied (the output head gets its own packed copy of the embedding matrix).
    """
    if not torch.backends.mkldnn.is_available():
        raise ConfigError("kernels='onednn' needs a PyTorch build with MKL-DNN (oneDNN); use kernels=None")
    from torch.utils.mkldnn import MkldnnLinear

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32 and child.weight.is_cpu:
                setattr(module, name, MkldnnLinear(child, torch.float32))
    return model


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
