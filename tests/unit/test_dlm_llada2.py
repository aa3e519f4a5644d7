"""LLaDA 2 (``LLaDA2MoeModelLM``, a block-diffusion mixture of experts) read from its released layout as
transformers' GLM-4 MoE decoder (``decodekit.dlm.families.llada2``), on a tiny random checkpoint written in that
layout (``tests/unit/dlm_llada2.py``: two shards, its tensor names, its code files poisoned), against our ports of
the modeling code published with LLaDA2.0-mini-preview (zhangshuibai/dInfer @ 290b36d): the same logits under the
block-causal mask, its ``generate``'s tokens at temperature 0, and a clear error for what decodekit does not read."""

from __future__ import annotations

import json

import pytest
import torch

import decodekit as dk
from decodekit.errors import ConfigError, UnsupportedModelError
from tests.unit.dlm_llada2 import LLADA2_CONFIG, LLADA2_MASK, llada2_forward, llada2_generate, write_llada2
from tests.unit.test_dlm_families import BLOCK_ROWS


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    path = tmp_path_factory.mktemp("llada2")
    return path, write_llada2(path)


def test_llada2_reads_as_the_reference_computes(llada2):
    """The settings from the checkpoint (the tokenizer's mask token, no shift, generate's blocks of 32 on the absolute
    grid); logits of a 64-token canvas generating its second block equal the reference forward under the block-causal
    mask; the forward without the mask, and the one that ignores the routers' expert biases, differ."""
    path, tensors = llada2
    dlm = dk.dlm.load_model(str(path))
    assert (dlm.mask_token_id, dlm.shift_logits, dlm.block_length, dlm.block_grid) == (
        LLADA2_MASK,
        False,
        32,
        "absolute",
    )
    assert type(dlm.lm.hf).__name__ == "Glm4MoeForCausalLM"
    ids = torch.tensor([(sum(BLOCK_ROWS, []) * 2)[:64]])
    grid = torch.arange(64) // 32
    mask = grid[:, None] >= grid[None, :]
    got, _ = dlm.forward(ids, torch.tensor([64]), torch.tensor([32]), 32, block_causal=32)
    want = llada2_forward(tensors, LLADA2_CONFIG, ids, mask)[0, 32:]
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-5)
    assert not torch.allclose(got[0], llada2_forward(tensors, LLADA2_CONFIG, ids)[0, 32:], atol=1e-2)
    unbiased = {k: v * 0 if k.endswith("expert_bias") else v for k, v in tensors.items()}
    assert not torch.allclose(got[0], llada2_forward(unbiased, LLADA2_CONFIG, ids, mask)[0, 32:], atol=1e-2)


def test_llada2_generates_the_references_tokens(llada2):
    """``generate`` at temperature 0 with blocks of 8 (``block_length=8`` replaces the checkpoint's 32, as the
    reference's argument does) and ``SDARRule``'s ``low_confidence_dynamic`` strategy: the same tokens on every prompt
    shape, for a threshold that commits several slots a step and one that commits by the schedule, uncached and with
    the exact block cache. Blocks counted from the generation start instead, or committed by confidence alone (the
    static strategy), the tokens differ: the comparison sees the grid and the threshold."""
    path, tensors = llada2
    dlm = dk.dlm.load_model(str(path), block_length=8)
    forward = lambda x, mask: llada2_forward(tensors, LLADA2_CONFIG, x, mask)  # noqa: E731
    generation_grid = dk.dlm.DLMModel(dlm.lm, dlm.mask_token_id, block_length=8)
    several = False
    for threshold, steps in [(0.6, 4), (0.95, 8)]:
        want = [llada2_generate(forward, row, 16, 8, steps, threshold) for row in BLOCK_ROWS]
        rule = dk.build("dlm_rule", "sdar", strategy="low_confidence_dynamic", threshold=threshold)
        for cache in (None, dk.build("dlm_cache", "block_causal")):
            out = dk.dlm.generate(dlm, BLOCK_ROWS, gen_length=16, block_length=8, steps=3 * steps, rule=rule,
                                  cache=cache)  # fmt: skip
            assert out.sequences == want, (threshold, cache)
            several |= min(out.stats.row_nfe) < 3 * steps
        settings = dict(gen_length=16, block_length=8, steps=3 * steps)
        assert dk.dlm.generate(generation_grid, BLOCK_ROWS, rule=rule, **settings).sequences != want
        static = dk.build("dlm_rule", "sdar", strategy="low_confidence_static")
        assert dk.dlm.generate(dlm, BLOCK_ROWS, rule=static, **settings).sequences != want
    assert several  # some block finished in fewer steps than scheduled: the threshold path ran


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"use_bias": True}, "use_bias=True"),
        ({"score_function": "softmax"}, "score_function='softmax'"),
        ({"norm_head": True}, "norm_head=True"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling="),
    ],
)
def test_llada2_refuses_what_it_does_not_implement(tmp_path, edit, match):
    write_llada2(tmp_path, LLADA2_CONFIG | edit)
    with pytest.raises(UnsupportedModelError, match=f"LLaDA 2 checkpoint with {match}"):
        dk.dlm.load_model(str(tmp_path))


def test_llada2_names_a_missing_expert_and_a_misshapen_fused_projection(tmp_path):
    from safetensors.torch import load_file, save_file

    write_llada2(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    name = "model.layers.1.mlp.experts.5.up_proj.weight"
    shard = tmp_path / index["weight_map"][name]
    tensors = load_file(shard)
    save_file({k: v for k, v in tensors.items() if k != name}, shard)
    with pytest.raises(ConfigError, match=f"tensor '{name}' is missing"):
        dk.dlm.load_model(str(tmp_path))
    qkv = "model.layers.0.attention.query_key_value.weight"
    fused = tmp_path / index["weight_map"][qkv]
    save_file({**load_file(fused), qkv: torch.zeros(40, 32)}, fused)  # 40 rows: the config implies (4 + 2 * 2) * 8
    save_file(tensors, shard)
    with pytest.raises(ConfigError, match="query_key_value.weight"):
        dk.dlm.load_model(str(tmp_path))


def test_llada2_without_shared_experts_or_router_biases(tmp_path):
    """``num_shared_experts: 0`` and ``moe_router_enable_expert_bias: false`` (no such tensors in the weights): the
    reference's zero-width shared expert and zero biases, the same logits."""
    from safetensors.torch import load_file, save_file

    config = LLADA2_CONFIG | {"num_shared_experts": 0, "moe_router_enable_expert_bias": False}
    tensors = write_llada2(tmp_path, config)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    for shard in set(index["weight_map"].values()):
        kept = {k: v for k, v in load_file(tmp_path / shard).items() if "shared_experts" not in k and "bias" not in k}
        save_file(kept, tmp_path / shard)
    dlm = dk.dlm.load_model(str(tmp_path), block_length=8)
    reference = {k: v * 0 if k.endswith("expert_bias") else v for k, v in tensors.items()}
    ids = torch.tensor([BLOCK_ROWS[2]])  # 16 tokens: the second block of 8 generated
    grid = torch.arange(16) // 8
    got, _ = dlm.forward(ids, torch.tensor([16]), torch.tensor([8]), 8, block_causal=8)
    want = llada2_forward(reference, config, ids, grid[:, None] >= grid[None, :])[0, 8:]
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-5)
