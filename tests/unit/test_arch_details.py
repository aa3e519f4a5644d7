"""What a family's own ``forward`` or ``generate`` does beyond its decoder, which greedy token equality does not see:
logits scaled after the head (Cohere, Granite, HyperCLOVA X, MiniCPM3: sampling would draw from another law), Phi-3's
longrope (other rotary factors past ``original_max_position_embeddings``), eager-only attention, a router that reads
its linear's weight itself (oneDNN packing), and the EOS ids of the generation config alone."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

import decodekit as dk
from tests.archs import build_model, tiny_config, tiny_config_kwargs

PROMPT = [5, 17, 33, 5, 17, 33, 40, 41]


def built(model_type: str, **edits) -> torch.nn.Module:
    config = type(tiny_config(model_type))(**(tiny_config_kwargs(model_type) | edits))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize(
    ("model_type", "edits"),
    [("cohere", {"logit_scale": 0.0625}), ("granite", {"logits_scaling": 8.0}),
     ("hyperclovax", {"logits_scaling": 0.25}), ("minicpm3", {})],
)  # fmt: skip
def test_logits_scaled_after_the_head_are_the_models_own(model_type, edits):
    """The argmax is the same either way, so only the logits (what sampling, top-k and top-p read) tell."""
    model = built(model_type, **edits)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        want = model(ids).logits[0, -1]
    adapter = dk.load_model(model)
    got = adapter.extend(adapter.new_cache(1, 16), ids, torch.tensor([len(PROMPT)])).logits[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_phi3_longrope_runs_exactly_up_to_where_its_rotary_factors_change():
    """transformers' generate recomputes the whole cache at ``original_max_position_embeddings``; decodekit's keys
    cached before it would carry the short factors, so its context stops there (tokens equal up to it)."""
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
            "short_factor": [1.0] * 8, "long_factor": [8.0] * 8}  # fmt: skip
    model = built("phi3", original_max_position_embeddings=16, rope_parameters=rope, sliding_window=None)
    model.generation_config = GenerationConfig(pad_token_id=0)
    with pytest.warns(UserWarning, match="its context is capped at 16"):
        adapter = dk.load_model(model)
    assert adapter.max_context == 16
    ids = torch.tensor([PROMPT])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=7)[0, 8:].tolist()
    plain = dk.generate(adapter, [PROMPT], max_new_tokens=7, eos_token_id=()).sequences[0]
    drafted = dk.generate(adapter, [PROMPT], dk.drafters.NGramDrafter(), max_new_tokens=7, eos_token_id=()).sequences[0]
    assert plain == drafted == want
    with pytest.warns(UserWarning, match=r"exceeds the model's context \(16\)"):
        assert len(dk.generate(adapter, [PROMPT], max_new_tokens=12, eos_token_id=()).sequences[0]) == 8


def test_an_eager_only_family_loaded_with_flex_attention_runs_eager():
    """Switching every other implementation to sdpa failed in transformers for the families without one."""
    torch.manual_seed(0)  # build_model's weights
    model = AutoModelForCausalLM.from_config(tiny_config("gemma2"), attn_implementation="flex_attention").eval()
    adapter = dk.load_model(model)
    assert model.config._attn_implementation == "eager"
    reference = build_model("gemma2")
    assert (
        dk.generate(adapter, [PROMPT], max_new_tokens=6).sequences
        == dk.generate(reference, [PROMPT], max_new_tokens=6).sequences
    )


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this PyTorch")
def test_onednn_leaves_a_linear_whose_weight_its_parent_reads_itself():
    """LongCat-Flash's router calls F.linear on its classifier's weight: packed, that weight is opaque to it."""
    model = build_model("longcat_flash")
    want = dk.generate(model, [PROMPT], max_new_tokens=6, eos_token_id=()).sequences
    packed = dk.load_model(build_model("longcat_flash"), kernels="onednn")
    assert dk.generate(packed, [PROMPT], max_new_tokens=6, eos_token_id=()).sequences == want


def test_eos_ids_come_from_the_generation_config_alone():
    """model.generate reads its generation config's EOS ids; an EOS id of 0 is one too."""
    model = built("llama", eos_token_id=51)
    model.generation_config = GenerationConfig(eos_token_id=None)
    assert dk.load_model(model).eos_token_ids == ()
    model = built("llama", eos_token_id=51)
    model.generation_config = GenerationConfig(eos_token_id=0)
    assert dk.load_model(model).eos_token_ids == (0,)
