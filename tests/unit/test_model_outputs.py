"""Model outputs beyond logits: hidden states of requested layers, early exit, embed / norm / head, and one
adapter per model that leaves the model as documented."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import decodekit as dk
from decodekit.models import HFCausalLM
from decodekit.models.tiny import tiny_llama, tiny_qwen2
from decodekit.models.truncate import truncate_layers

TOL = dict(atol=1e-9, rtol=1e-9)
IDS = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=64, n_layer=3, n_head=4, n_positions=64)).eval()


MODELS = {"llama": lambda: tiny_llama(0, layers=3), "qwen2": lambda: tiny_qwen2(0, layers=3), "gpt2": gpt2}


def run(adapter, ids=IDS, **kwargs):
    cache = adapter.new_cache(ids.shape[0], 16)
    return adapter.extend(cache, ids, torch.full((ids.shape[0],), ids.shape[1]), **kwargs), cache


@pytest.mark.parametrize("name", MODELS)
def test_hidden_layers_match_transformers(name):
    hf = MODELS[name]().double()
    adapter = dk.load_model(hf)
    hooks = sum(len(m._forward_hooks) for m in hf.modules())
    out, _ = run(adapter, hidden_layers=[1, 2, 3], return_hidden=True)
    assert sum(len(m._forward_hooks) for m in hf.modules()) == hooks  # capture hooks are removed
    with torch.no_grad():
        ref = hf(IDS, output_hidden_states=True)
    for i in (1, 2):  # transformers' hidden_states[i] is layer i's output; the last entry is after the final norm
        torch.testing.assert_close(out.hidden[i], ref.hidden_states[i], **TOL)
    torch.testing.assert_close(out.last_hidden, ref.hidden_states[-1], **TOL)
    torch.testing.assert_close(adapter.norm(out.hidden[3]), out.last_hidden, **TOL)
    torch.testing.assert_close(adapter.head(out.last_hidden[:, -1]), out.logits, **TOL)
    torch.testing.assert_close(out.logits, ref.logits[:, -1], **TOL)
    assert adapter.num_layers == 3


def test_embed_is_the_input_embedding():
    hf = tiny_llama(0).double()
    adapter = dk.load_model(hf)
    out, _ = run(adapter, hidden_layers=[0])
    torch.testing.assert_close(adapter.embed(IDS), out.hidden[0], **TOL)
    torch.testing.assert_close(out.hidden[0], hf.model.embed_tokens(IDS), **TOL)


def first_layers(hf, n: int):
    """Reference: a copy of ``hf`` with only its first ``n`` blocks (GPT-2 keeps them in ``.h``)."""
    if hasattr(hf.get_decoder(), "layers"):
        return truncate_layers(hf, n)
    out = copy.deepcopy(hf)
    out.transformer.h = out.transformer.h[:n]
    out.config.n_layer = n
    return out


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("exit_layer", [1, 2])
def test_early_exit_equals_the_truncated_model(name, exit_layer):
    hf = MODELS[name]().double()
    adapter = dk.load_model(hf)
    out, cache = run(adapter, exit_layer=exit_layer, hidden_layers=[exit_layer], return_hidden=True)
    with torch.no_grad():
        ref = first_layers(hf, exit_layer)(IDS).logits[:, -1]
    torch.testing.assert_close(out.logits, ref, **TOL)
    torch.testing.assert_close(adapter.head(adapter.norm(out.hidden[exit_layer]))[:, -1], out.logits, **TOL)
    # only the layers that ran wrote K/V; the layer list is restored afterwards
    assert len(cache.keys) == exit_layer
    assert adapter.num_layers == 3 and len(adapter.layers) == 3
    full, _ = run(adapter)
    with torch.no_grad():
        torch.testing.assert_close(full.logits, hf(IDS).logits[:, -1], **TOL)


def test_bad_layer_arguments_are_refused():
    adapter = dk.load_model(tiny_llama(0))
    with pytest.raises(dk.ConfigError, match=r"exit_layer must be an integer in \[1, 2\]"):
        run(adapter, exit_layer=3)
    with pytest.raises(dk.ConfigError, match=r"hidden_layers entries must be integers in \[0, 2\]"):
        run(adapter, hidden_layers=[5])
    assert len(adapter.layers) == 2  # restored after the failed call


def test_one_adapter_per_model():
    hf = tiny_llama(0)
    adapter = dk.load_model(hf)
    assert dk.load_model(hf) is adapter
    assert dk.load_model(adapter) is adapter
    dk.generate(hf, [[1, 2, 3]], max_new_tokens=3)
    assert dk.load_model(hf) is adapter  # generate() reused it
    assert dk.load_model(tiny_llama(0)) is not adapter
    assert isinstance(HFCausalLM(hf), HFCausalLM) and HFCausalLM(hf) is not adapter  # explicit rebuild


def test_wrapping_and_decoding_leave_the_model_alone():
    """Only what load_model documents changes: eval mode (already set here), and nothing else."""
    hf = tiny_llama(0)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    config_before = hf.config.to_dict()
    attn = hf.config._attn_implementation
    dk.generate(hf, [[1, 2, 3], [4]], drafter=dk.drafters.ModelDrafter(hf), max_new_tokens=8)
    assert hf.config._attn_implementation == attn
    assert hf.config.to_dict() == config_before
    assert all(torch.equal(before[k], v) for k, v in hf.state_dict().items())
    assert len(hf.model.layers) == 2
