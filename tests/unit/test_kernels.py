"""CPU kernels: same model (oneDNN) or a cheaper draft copy (int8); decoding stays exact where it must."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.kernels import apply_kernels, int8_dynamic, onednn_linears
from decodekit.models.tiny import tiny_llama


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_onednn_linears_compute_the_same_model(ragged_prompts):
    reference, model = tiny_llama(0), onednn_linears(tiny_llama(0))
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    torch.testing.assert_close(
        logits(model, ragged_prompts[2]), logits(reference, ragged_prompts[2]), atol=1e-4, rtol=1e-4
    )
    fast = dk.load_model(model)
    plain = dk.generate(fast, ragged_prompts, max_new_tokens=24, eos_token_id=())
    spec = dk.generate(fast, ragged_prompts, dk.drafters.ModelDrafter(fast), max_new_tokens=24, eos_token_id=())
    assert spec.sequences == plain.sequences  # speculative == plain decoding on the same kernels


def test_int8_draft_keeps_the_target_output(target, ragged_prompts):
    draft = int8_dynamic(target)
    assert type(target.model.layers[0].mlp.up_proj) is torch.nn.Linear  # the target is untouched
    plain = dk.generate(target, ragged_prompts, max_new_tokens=24, eos_token_id=())
    spec = dk.generate(target, ragged_prompts, dk.drafters.ModelDrafter(draft), max_new_tokens=24, eos_token_id=())
    assert spec.sequences == plain.sequences
    assert spec.stats.mean_acceptance_length > 2.0  # int8 predictions mostly agree with float32


def test_load_model_applies_kernels():
    model = dk.load_model(tiny_llama(0), kernels="onednn")
    assert model.vocab_size == 128 and type(model.lm_head) is not torch.nn.Linear
    with pytest.raises(dk.ConfigError, match="unknown kernels"):
        apply_kernels(tiny_llama(0), "fp4")


def test_packed_linears_survive_copies_and_pickles():
    """PackedLinear's weight is an opaque oneDNN tensor: deepcopy and torch.save carry its dense matrix and reorder
    it again, giving the same logits; ``weight.to_dense()`` is the original matrix."""
    import copy
    import io

    reference, model = tiny_llama(0), onednn_linears(tiny_llama(0))
    layer = model.model.layers[0].mlp.up_proj
    assert type(layer).__name__ == "PackedLinear"
    assert torch.equal(layer.weight.to_dense(), reference.model.layers[0].mlp.up_proj.weight)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        assert torch.equal(logits(other, [1, 2, 3, 4]), logits(model, [1, 2, 3, 4]))
