"""Grouped-query attention without repeat_kv (decodekit/models/grouped_attention.py): a masked multi-position
forward of a grouped-query model copies no key/value heads, and its logits are bit-identical to transformers' own
path, on ragged rows under a tree-shaped mask; one-position, eager and plain multi-head models keep theirs."""

from __future__ import annotations

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa

import decodekit as dk
from decodekit.masks import chain_mask
from decodekit.models.grouped_attention import TORCH_HAS_GQA
from decodekit.models.tiny import tiny_llama

pytestmark = pytest.mark.skipif(not TORCH_HAS_GQA, reason="torch < 2.5 has no enable_gqa")


def forward(lm: dk.LanguageModel, new: int, monkeypatch) -> tuple[torch.Tensor, int]:
    """Logits ``[3, new, V]`` of ``new`` positions after ragged prefixes (7, 2, 5) under a tree-like mask (the
    last position does not see the one before it), and how often ``repeat_kv`` ran."""
    calls = [0]
    original = sdpa.repeat_kv

    def counting(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(sdpa, "repeat_kv", counting)
    gen = torch.Generator().manual_seed(0)
    cache = lm.new_cache(3, 32)
    lm.extend(cache, torch.randint(0, 128, (3, 7), generator=gen), torch.tensor([7, 2, 5]))
    calls[0] = 0  # the prefill above is a multi-position forward too: count only the one below
    view = cache.stage(new)
    mask, positions = chain_mask(cache.lengths, new, view.kv_len)
    if new > 2:
        mask[:, :, new - 1, cache.lengths.max() + new - 2] = False  # a sibling, not a child
    with torch.no_grad():
        out = lm.forward(torch.randint(0, 128, (3, new), generator=gen), positions, mask, view)
    monkeypatch.setattr(sdpa, "repeat_kv", original)
    return out.logits, calls[0]


@pytest.mark.parametrize("new", [2, 5])
def test_multi_position_forwards_copy_no_heads_and_equal_transformers_path(new, monkeypatch):
    lm = dk.load_model(tiny_llama(0, layers=3))  # 4 query heads, 2 key/value heads
    native, copies = forward(lm, new, monkeypatch)
    assert copies == 0
    lm._grouped = False  # transformers' own path: repeat_kv in every layer, for keys and values
    reference, copies = forward(lm, new, monkeypatch)
    assert copies == 2 * 3
    torch.testing.assert_close(native, reference, rtol=0, atol=0, equal_nan=True)


def test_other_calls_keep_transformers_path(monkeypatch):
    """One position (transformers packs the queries), a multi-head model and an eager one: no change, no error."""
    grouped = dk.load_model(tiny_llama(0, layers=3))
    assert forward(grouped, 1, monkeypatch)[1] == 0  # pack_gqa: no copies either way
    multi_head = dk.load_model(tiny_llama(0, layers=3, num_key_value_heads=4))
    assert forward(multi_head, 3, monkeypatch)[1] == 0
    eager = dk.load_model(tiny_llama(0, layers=3, attn_implementation="eager"))
    forward(eager, 3, monkeypatch)  # eager attention repeats its own heads; it must still run
