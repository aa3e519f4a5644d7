"""Block-causal DLM training and the block-causal model contract: the training forward computes exactly the logits
the sampler computes, the loss trains, the data rows are what the sampler sees, and a block-causally trained model
is run block-causally (or refused with a message)."""

from __future__ import annotations

import random

import pytest
import torch

import decodekit as dk
from decodekit.dlm.parts import refusal
from decodekit.errors import ConfigError
from decodekit.models.tiny import tiny_llama
from decodekit.train.dlm_data import RegionRows
from decodekit.train.dlm_losses import Regions, region_diffusion_loss, region_logits

MASK = 127
BLOCK = 4
PROMPTS = [[5, 9, 3], [7, 1, 2, 8, 4, 6], [11]]


@pytest.fixture(scope="module")
def hf():
    return tiny_llama(3, init=0.6)


def ragged_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths, starts = torch.tensor([17, 14, 20, 11]), torch.tensor([5, 3, 8, 2])
    tokens = torch.randint(0, 120, (4, int(lengths.max())), generator=g)
    span = int((lengths - starts).max())
    real = starts[:, None] + torch.arange(span) < lengths[:, None]
    masked = (torch.rand(4, span, generator=g) < 0.5) & real
    return tokens, lengths, starts, masked


def sampler_logits(dlm, tokens, lengths, starts, masked, block):
    """Per row and block, what the sampler computes: ``DLMModel.forward`` on a canvas holding the clean context, the
    clean earlier blocks and this block with its masks (later slots masked: a block-causal step never sees them)."""
    rows = []
    for b in range(len(tokens)):
        s, n = int(starts[b]), int(lengths[b])
        parts = []
        for lo in range(s, n, block or n):
            hi = min(n, lo + block) if block else n
            canvas = tokens[b : b + 1, :n].clone()
            canvas[0, lo:hi][masked[b, lo - s : hi - s]] = MASK
            if block:
                canvas[0, hi:] = MASK
            out, _ = dlm.forward(canvas, torch.tensor([n]), torch.tensor([s]), n - s, block_causal=block)
            parts.append(out[0, lo - s : hi - s])
        rows.append(torch.cat(parts))
    return rows


@pytest.mark.parametrize("block", [BLOCK, None])
def test_training_logits_are_the_samplers(hf, block):
    """One vectorised training forward (the clean row and the noisy region side by side) gives every region slot
    the logits the block-causal (or bidirectional) sampler computes for it, on ragged rows."""
    dlm = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=True)
    tokens, lengths, starts, masked = ragged_batch()
    with torch.no_grad():
        logits, target = region_logits(hf, Regions(tokens, lengths, starts), masked, MASK, block)
    for b, ref in enumerate(sampler_logits(dlm, tokens, lengths, starts, masked, block)):
        n = len(ref)
        torch.testing.assert_close(logits[b, :n], ref, atol=2e-4, rtol=1e-4)
        assert target[b, :n].tolist() == tokens[b, int(starts[b]) : int(lengths[b])].tolist()
    if block:  # the comparison is sensitive: the bidirectional layout gives other logits
        other = sampler_logits(dlm, tokens, lengths, starts, masked, None)
        assert not torch.allclose(logits[0, : len(other[0])], other[0], atol=1e-2)


def test_the_region_loss_trains(hf):
    model = tiny_llama(3, init=0.6)
    model.load_state_dict(hf.state_dict())
    tokens, lengths, starts, _ = ragged_batch(1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        loss = region_diffusion_loss(
            model, Regions(tokens, lengths, starts), MASK, torch.Generator().manual_seed(step), BLOCK
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])


def test_rows_are_context_then_region_and_finished_responses_pad_with_eos():
    rows = RegionRows([[1, 2, 3, 4, 5, 6, 99], list(range(10, 40))], [4, None], end=(99,))
    tokens, lengths, starts = rows.batch([0, 1], gen_len=6, context=3, rng=random.Random(0))
    assert tokens[0, : lengths[0]].tolist() == [2, 3, 4, 5, 6, 99, 99, 99, 99]  # 3 of context, response + eos pad
    assert int(starts[0]) == 3
    text = tokens[1, : lengths[1]].tolist()
    assert len(text) == 3 + 6 and int(starts[1]) == 3 and text == list(range(text[0], text[0] + 9))  # a window


def test_a_block_causal_model_runs_block_causally_by_default(hf):
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=True, block_length=BLOCK)
    plain = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=True)
    kwargs = dict(gen_length=12, block_length=BLOCK, steps=12, seed=[1, 2, 3])
    default = dk.dlm.generate(model, PROMPTS, **kwargs).sequences
    assert default == dk.dlm.generate(plain, PROMPTS, cache=dk.dlm.Recompute(block_causal=True), **kwargs).sequences
    assert default == dk.dlm.generate(model, PROMPTS, cache=dk.dlm.BlockCausalCache(), **kwargs).sequences
    assert default != dk.dlm.generate(plain, PROMPTS, **kwargs).sequences  # bidirectional differs: the default matters
    assert "block_length=4" in repr(model)


def test_a_block_causal_model_refuses_what_it_was_not_trained_for(hf):
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=True, block_length=BLOCK)
    with pytest.raises(ConfigError, match="blocks of 4; got block_length=8"):
        dk.dlm.generate(model, PROMPTS, gen_length=16, block_length=8, steps=16)
    with pytest.raises(ConfigError, match="PrefixCache attends bidirectionally"):
        dk.dlm.generate(model, PROMPTS, gen_length=8, block_length=BLOCK, steps=8, cache=dk.dlm.PrefixCache())
    with pytest.raises(ConfigError, match="AdaBlock moves the block ends"):
        dk.dlm.generate(model, PROMPTS, gen_length=8, block_length=BLOCK, steps=8, schedule=dk.dlm.AdaBlock())
    assert "DualCache" in refusal(model, {"cache": dk.dlm.DualCache()}, BLOCK)
    assert refusal(model, {"rule": dk.dlm.ThresholdRule(0.9)}, BLOCK) is None
    plain = dk.dlm.load_model(hf, mask_token_id=MASK)
    assert refusal(plain, {"cache": dk.dlm.DualCache()}, BLOCK) is None


def test_the_recipe_refuses_a_bad_data_choice_before_loading(tmp_path):
    from decodekit.train.dlm_adapter import train

    with pytest.raises(ConfigError, match="block_length .* needs data=self"):
        train(tmp_path, block_length=32)
    with pytest.raises(ConfigError, match="data must be 'corpus' or 'self'"):
        train(tmp_path, data="chat")
    with pytest.raises(ConfigError, match="objective=draft needs data=self"):
        train(tmp_path, objective="draft")
    with pytest.raises(ConfigError, match="objective must be one of"):
        train(tmp_path, objective="drafting")


def test_the_lora_wrapper_starts_as_the_model_and_stays_quiet():
    """``with_lora`` (the recipe's and the zoo's LoRA): a fresh adapter leaves the outputs unchanged (B = 0), it
    trains only the adapter, and peft's read of a deprecated transformers property raises no warning."""
    import warnings

    from decodekit.dlm.zoo import with_lora

    model = tiny_llama(2, init=0.6)
    ids = torch.tensor([[5, 9, 3, 7]])
    before = model(ids).logits
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped = with_lora(model, 4, 8, ["q_proj", "v_proj"])
    assert torch.allclose(wrapped(input_ids=ids).logits, before)
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
