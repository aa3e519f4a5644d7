"""An EAGLE-3 head of the released architecture started from a trained ``fc`` head
(:func:`~decodekit.train.eagle3_start.from_fc_head`): its first draft step is the ``fc`` head's up to the term the
released layer cannot carry (the embedding's share of the residual), exactly so where that term is zero; the later
steps are left to training (the two heads feed their outputs back differently)."""

from __future__ import annotations

import torch

import decodekit as dk
from decodekit.models.tiny import tiny_llama
from decodekit.train.eagle3_start import from_fc_head
from decodekit.train.layer_features import layer_states
from tests.unit.test_eagle3 import LAYERS, fused_head


def first_steps(embed_share: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The first-step draft logits ``[B, N, V]`` of an ``fc`` head with random weights (its embedding half scaled by
    ``embed_share``, its bias zero) and of the released head converted from it, on random tokens."""
    lm = dk.load_model(tiny_llama(0))
    fc = fused_head(lm)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in fc.parameters():  # norms' weights too: the conversion must fold them in
            p.add_(0.3 * p.abs().mean() * torch.randn(p.shape, generator=gen))
        fc.fc.weight[:, : fc.fc.weight.shape[1] // 2] *= embed_share  # [A | B]: A reads the embedding
        fc.fc.bias.zero_()
    tokens = torch.randint(0, lm.vocab_size, (3, 12), generator=gen)
    embeds, taps = lm.embed(tokens), layer_states(lm, tokens, LAYERS)
    released = fused_head(lm, seed=2, release=True)
    numbers = from_fc_head(released, dict(fc.state_dict()), embeds.flatten(0, 1), taps.flatten(0, 1))
    with torch.no_grad():
        want = lm.head(fc(embeds, fc.fuse(taps)))  # the fc head scores its (normed) output with the target's rows
        got = released.scores(released(embeds, released.fuse(taps)))
    return want, got, numbers


def test_without_an_embedding_term_the_first_step_is_the_fc_heads():
    want, got, numbers = first_steps(0.0)
    assert numbers["embed_share"] == 0 and abs(numbers["scale_feature"] - 1) < 1e-6
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_with_a_small_embedding_term_the_first_step_stays_close():
    want, got, numbers = first_steps(0.05)
    assert 0 < numbers["embed_share"] < 0.2
    assert not torch.allclose(got, want, atol=2e-4)  # the dropped term shows...
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean()
    assert agree > 0.9, float(agree)  # ...but rarely changes the drafted token
