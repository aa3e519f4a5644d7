"""A draft head's layer run without transformers' per-call machinery (``LeanLayer``) computes what transformers'
path does, for every covered architecture; bfloat16 packed weights and fused products stay what they claim."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from transformers import CONFIG_MAPPING

from decodekit.cache import KVCache
from decodekit.drafters.eagle_head import EagleHead
from decodekit.drafters.lean_layer import lean_layer
from decodekit.kernels.cpu import PackedLinear, fused_linear, match_kernels, onednn_linears
from decodekit.masks import chain_mask, tree_ancestors, tree_mask
from decodekit.models.tiny import tiny_llama

SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2)
ARCHS = {  # model_type -> extra config: biases on the projections, Qwen3's per-head norms, no grouping
    "llama": {"attention_bias": True},
    "mistral": {"num_key_value_heads": 4},
    "qwen2": {},
    "qwen3": {"head_dim": 8},
}


def _packs_bfloat16() -> bool:
    """Whether oneDNN packs bfloat16 linear weights on this CPU (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    try:
        PackedLinear(torch.nn.Linear(8, 8), torch.bfloat16)
    except RuntimeError:
        return False
    return True


BF16 = _packs_bfloat16()
needs_bf16 = pytest.mark.skipif(not BF16, reason="this CPU has no oneDNN bfloat16 linears")


def head_for(model_type: str, seed: int = 0) -> EagleHead:
    """A random EAGLE head of ``model_type``'s layer; norms randomised too, so a skipped one would show."""
    config = CONFIG_MAPPING[model_type](**{**SIZES, **ARCHS[model_type], "num_hidden_layers": 1})
    torch.manual_seed(seed)
    head = EagleHead(config).eval()
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "norm" not in name else 0.5) + (1.0 if "norm" in name else 0.0))
    return head


def run(head: EagleHead, lean: bool) -> list[torch.Tensor]:
    """A ragged prefill, a chain of 3 on it, then a 4-node tree past the kept tokens: the head's outputs."""
    saved = head.lean
    head.lean = lean_layer(head.decoder) if lean else None
    assert (head.lean is not None) == lean
    gen = torch.Generator().manual_seed(1)
    embeds, feats = torch.randn(2, 16, 32, generator=gen), torch.randn(2, 16, 32, generator=gen)
    cache, outs = KVCache(2, 32), []
    with torch.no_grad():
        view = cache.stage(9)
        mask, positions = chain_mask(cache.lengths, 9, view.kv_len)
        outs.append(head(embeds[:, :9], feats[:, :9], positions, mask, view))
        cache.keep(torch.tensor([9, 6]), host_counts=[9, 6])
        view = cache.stage(3)
        mask, positions = chain_mask(cache.lengths, 3, view.kv_len)
        outs.append(head(embeds[:, 9:12], feats[:, 9:12], positions, mask, view))
        cache.keep(torch.tensor([1, 3]), host_counts=[1, 3])
        parents = torch.tensor([[-1, 0, 0, 1], [-1, -1, 1, 2]])
        ancestors = tree_ancestors(parents, torch.ones_like(parents, dtype=torch.bool))
        view = cache.stage(4)
        mask, positions = tree_mask(cache.lengths, ancestors, view.kv_len)
        outs.append(head(embeds[:, 12:], feats[:, 12:], positions, mask, view))
    head.lean = saved
    return outs


@pytest.mark.parametrize("native_gqa", [True, False])
@pytest.mark.parametrize("model_type", sorted(ARCHS))
def test_the_lean_layer_computes_what_transformers_does(model_type, native_gqa, monkeypatch):
    """Both ways of grouping the query heads: torch's ``enable_gqa`` (the CPU's) and repeated keys and values (what
    GPUs and torch < 2.5 take)."""
    monkeypatch.setattr("decodekit.models.grouped_attention.TORCH_HAS_GQA", native_gqa)  # grouped_attention reads it
    head = head_for(model_type)
    for got, want in zip(run(head, lean=True), run(head, lean=False)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_lean_layer_takes_the_heads_packed_kernels():
    """On packed (float32) linears the lean path still equals transformers' path on the same packed head."""
    head = head_for("llama")
    packed = onednn_linears(copy.deepcopy(head))
    for got, want in zip(run(packed, lean=True), run(head, lean=False)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_layers_it_does_not_cover_keep_transformers_path():
    head = head_for("llama")
    assert lean_layer(head.decoder) is not None
    assert lean_layer(tiny_llama(0).model) is None  # several layers: not a head
    eager = copy.deepcopy(head)
    eager.decoder.config._attn_implementation = "eager"
    assert lean_layer(eager.decoder) is None
    assert head.lean is None  # a head built for training runs transformers' path; load_head sets the lean one


def test_fused_linear_is_its_parts_side_by_side():
    torch.manual_seed(0)
    parts = [torch.nn.Linear(16, 8), torch.nn.Linear(16, 4, bias=False), torch.nn.Linear(16, 6)]
    x = torch.randn(3, 16)
    want = torch.cat([p(x) for p in parts], -1)
    torch.testing.assert_close(fused_linear(parts)(x), want)
    for dtype, tol in ((None, 1e-5), (torch.bfloat16, 3e-2))[: 2 if BF16 else 1]:
        packed = [PackedLinear(p, dtype) for p in parts]
        fused = fused_linear(packed)
        assert type(fused) is PackedLinear and fused.compute_dtype == (dtype or torch.float32)
        torch.testing.assert_close(fused(x), torch.cat([p(x) for p in packed], -1), atol=tol, rtol=tol)


@needs_bf16
def test_bfloat16_packed_weights_keep_float32_inputs_and_outputs():
    """Weights in bfloat16, activations in float32 on both sides; close to the float32 layer at bfloat16's
    precision, not equal to it (the difference the drafts see); copies and pickles keep the dtype."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    x = torch.randn(5, 64)
    half = PackedLinear(linear, torch.bfloat16)
    y = half(x)
    assert y.dtype == torch.float32 and half.weight.to_dense().dtype == torch.bfloat16
    torch.testing.assert_close(y, linear(x), atol=5e-2, rtol=5e-2)
    assert not torch.allclose(y, linear(x), atol=1e-6, rtol=0)
    buffer = io.BytesIO()
    torch.save(half, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(half), torch.load(buffer, weights_only=False)):
        assert other.compute_dtype == torch.bfloat16 and torch.equal(other(x), y)


def test_match_kernels_packs_like_the_target_in_the_asked_dtype():
    packed_target = onednn_linears(tiny_llama(0))
    for bf16, dtype in ((True, torch.bfloat16), (False, torch.float32))[0 if BF16 else 1 :]:
        module = match_kernels(torch.nn.Sequential(torch.nn.Linear(8, 8)), packed_target, bf16=bf16)
        assert type(module[0]) is PackedLinear and module[0].compute_dtype == dtype
    stock = match_kernels(torch.nn.Sequential(torch.nn.Linear(8, 8)), tiny_llama(0), bf16=True)
    assert type(stock[0]) is torch.nn.Linear  # a stock target: nothing changes
