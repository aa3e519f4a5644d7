"""The few hot ops with a plain-torch reference and a faster variant. Today: CPU linear layers."""

from decodekit.kernels.cpu import KERNELS, apply_kernels, int8_dynamic, match_kernels, onednn_linears

__all__ = ["KERNELS", "apply_kernels", "int8_dynamic", "match_kernels", "onednn_linears"]
