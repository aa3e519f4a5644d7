"""Key layouts and attention patterns of decodekit.masks.

Each layout and pattern is checked against a direct (loop) construction, and each pattern is shown to make a cached
computation equal one uncached forward over the whole sequence under the same pattern (float64 tiny models).
"""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit import masks
from decodekit.masks import (
    attend_layout,
    bidirectional_mask,
    block_causal_mask,
    causal_mask,
    chain_mask,
    prefix_mask,
    staged_layout,
    write_at_layout,
)
from tests.unit.test_cache import MODELS, TOLERANCE, padded, uncached_logits

LENGTHS = torch.tensor([3, 0, 5])


def key_valid_for(lengths: torch.Tensor, kv_len: int) -> torch.Tensor:
    """A validity with holes: committed slots except slot 1, plus slot ``kv_len - 1`` past the committed part."""
    valid = torch.arange(kv_len)[None, :] < lengths[:, None]
    valid[:, 1] = False
    valid[:, -1] = True
    return valid


# ------------------------------------------------------------------------------------- direct construction
@pytest.mark.parametrize("offset", [0, 2])
@pytest.mark.parametrize("with_valid", [False, True])
def test_staged_layout_matches_direct(offset, with_valid):
    n, counts = 4, torch.tensor([4, 2, 3])
    kv_len = int(LENGTHS.max()) + offset + n + 1
    valid = key_valid_for(LENGTHS, kv_len) if with_valid else None
    keys = staged_layout(LENGTHS, n, kv_len, offset=offset, counts=counts, key_valid=valid)
    for b, length in enumerate(LENGTHS.tolist()):
        start = length + offset
        assert keys.positions[b].tolist() == list(range(start, start + n))
        assert keys.own[b].tolist() == list(range(start, start + n))
        assert keys.key_positions[b].tolist() == list(range(kv_len))
        for s in range(kv_len):
            if start <= s < start + n:  # the new block: its real tokens
                expected = s - start < counts[b]
            elif length <= s < start:  # staged earlier (offset drafting)
                expected = True
            else:
                expected = bool(valid[b, s]) if with_valid else s < length
            assert bool(keys.usable[b, s]) == expected, (b, s)


def test_write_at_layout_matches_direct():
    slots = torch.tensor([[1, 6], [0, -1], [4, 2]])
    valid = key_valid_for(LENGTHS, 8)
    keys = write_at_layout(slots, valid)
    for b in range(3):
        written = {s for s in slots[b].tolist() if s >= 0}
        assert keys.positions[b].tolist() == [max(s, 0) for s in slots[b].tolist()]
        for s in range(8):
            assert bool(keys.usable[b, s]) == (bool(valid[b, s]) or s in written)


@pytest.mark.parametrize("with_positions", [False, True])
def test_attend_layout_matches_direct(with_positions):
    n, cached, counts = 3, 6, torch.tensor([3, 1, 2])
    positions = torch.tensor([[1, 2, 3], [0, 1, 2], [2, 3, 4]]) if with_positions else None
    valid = key_valid_for(LENGTHS, cached)
    keys = attend_layout(LENGTHS, n, cached, positions=positions, counts=counts, key_valid=valid)
    for b, length in enumerate(LENGTHS.tolist()):
        expected_pos = positions[b].tolist() if with_positions else list(range(length, length + n))
        assert keys.positions[b].tolist() == expected_pos
        assert keys.own[b].tolist() == list(range(cached, cached + n))
        assert keys.key_positions[b].tolist() == list(range(cached)) + expected_pos
        assert keys.usable[b].tolist() == valid[b].tolist() + [j < counts[b] for j in range(n)]
    # without key_valid, a shorter row's gap between its length and S_c is masked out
    gap = attend_layout(LENGTHS, n, cached)
    assert gap.usable[:, :cached].tolist() == [[s < length for s in range(cached)] for length in LENGTHS.tolist()]


def relation(pattern: str, q: int, k: int, b: int) -> bool:
    """Direct definition of each attention pattern on positions (prefix lengths 2, 0, 4; blocks of 3 from 1, 0, 2)."""
    if pattern == "causal":
        return k <= q
    if pattern == "bidirectional":
        return True
    if pattern == "block_causal":
        origin = [1, 0, 2][b]
        return (k - origin) // 3 <= (q - origin) // 3
    return k < [2, 0, 4][b] or k <= q


def build(pattern: str, keys: masks.KeyLayout) -> tuple[torch.Tensor, torch.Tensor]:
    if pattern == "causal":
        return causal_mask(keys)
    if pattern == "bidirectional":
        return bidirectional_mask(keys)
    if pattern == "block_causal":
        return block_causal_mask(keys, 3, origin=torch.tensor([1, 0, 2]))
    return prefix_mask(keys, torch.tensor([2, 0, 4]))


PATTERNS = ["causal", "bidirectional", "block_causal", "prefix"]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("layout", ["staged", "attend", "write_at"])
def test_patterns_match_direct(pattern, layout):
    counts = torch.tensor([4, 2, 3])
    if layout == "staged":
        keys = staged_layout(LENGTHS, 4, 10, offset=1, counts=counts, key_valid=key_valid_for(LENGTHS, 10))
    elif layout == "attend":
        keys = attend_layout(LENGTHS, 4, 6, counts=counts, key_valid=key_valid_for(LENGTHS, 6))
    else:
        keys = write_at_layout(torch.tensor([[1, 6, 7, 2], [0, 4, -1, -1], [4, 2, 8, -1]]), key_valid_for(LENGTHS, 9))
    mask, positions = build(pattern, keys)
    batch, n = keys.positions.shape
    kv_len = keys.usable.shape[1]
    assert mask.shape == (batch, 1, n, kv_len) and mask.dtype == torch.bool
    assert torch.equal(positions, keys.positions)
    for b in range(batch):
        for i in range(n):
            q = int(keys.positions[b, i])
            for s in range(kv_len):
                k = int(keys.key_positions[b, s])
                expected = (bool(keys.usable[b, s]) and relation(pattern, q, k, b)) or s == int(keys.own[b, i])
                assert bool(mask[b, 0, i, s]) == expected, (b, i, s)
    assert mask.any(-1).all()  # every query row attends to at least one key


def test_causal_over_staged_layout_is_chain_mask():
    for n in (1, 4):
        kv_len = int(LENGTHS.max()) + n
        expected = chain_mask(LENGTHS, n, kv_len)
        got = causal_mask(staged_layout(LENGTHS, n, kv_len))
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


# ------------------------------------------------------------------------ cached == uncached under a pattern
def grid(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key positions ``[T, 1]`` and ``[1, T]`` of one uncached row, for writing a reference mask."""
    pos = torch.arange(length)
    return pos[:, None], pos[None, :]


@pytest.fixture
def rows():
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 1, 7)]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("run", ["stage", "attend"])
def test_bidirectional_block_after_cached_prefix_matches_uncached(name, run, rows):
    """Causal prefix in the cache, then a block run bidirectionally against it (staged, or attend-only)."""
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 4)
    model.extend(cache, *padded(rows))
    block = torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14], [15, 16, 17, 18]])
    counts = torch.tensor([4, 2, 3])  # ragged blocks: padding is invisible to real queries
    if run == "stage":
        view = cache.stage(4)
        keys = staged_layout(cache.lengths, 4, view.kv_len, counts=counts)
    else:
        view = cache.attend(4)
        keys = attend_layout(cache.lengths, 4, view.cached_len, counts=counts)
    mask, positions = bidirectional_mask(keys)
    logits = model.forward(block, positions, mask, view).logits
    for b, r in enumerate(rows):
        real = block[b, : counts[b]].tolist()
        total = len(r) + len(real)
        q, k = grid(total)
        ref_mask = (k <= q) | (q >= len(r))  # the prefix causal, the block sees everything
        expected = uncached_logits(hf_model, torch.tensor([r + real]), ref_mask[None, None])[0, len(r) :]
        torch.testing.assert_close(logits[b, : counts[b]], expected, **tol)


@pytest.mark.parametrize("name", MODELS)
def test_block_causal_cached_blocks_match_uncached(name):
    """Blocks committed one at a time under a block-causal mask == one block-causal forward (exact caching)."""
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    gen = torch.Generator().manual_seed(6)
    rows = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (10, 6, 13)]
    block = 4
    cache = model.new_cache(len(rows), 4)
    got: list[list[torch.Tensor]] = [[] for _ in rows]
    for start in range(0, max(map(len, rows)), block):
        chunk = [r[start : start + block] for r in rows]
        counts = torch.tensor([len(c) for c in chunk])
        tokens = torch.tensor([c + [0] * (block - len(c)) for c in chunk])
        view = cache.stage(block)
        mask, positions = block_causal_mask(staged_layout(cache.lengths, block, view.kv_len, counts=counts), block)
        logits = model.forward(tokens, positions, mask, view).logits
        cache.keep(counts)
        for b, c in enumerate(counts.tolist()):
            got[b].append(logits[b, :c])
    for b, r in enumerate(rows):
        q, k = grid(len(r))
        expected = uncached_logits(hf_model, torch.tensor([r]), (k // block <= q // block)[None, None])[0]
        torch.testing.assert_close(torch.cat(got[b]), expected, **tol)


@pytest.mark.parametrize("name", MODELS)
def test_prefix_lm_cached_matches_uncached(name, rows):
    """A prompt run bidirectionally into the cache, then generated tokens causally: == one prefix-LM forward."""
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    prefix = torch.tensor([len(r) for r in rows])
    cache = model.new_cache(len(rows), 4)
    tokens, counts = padded(rows)
    view = cache.stage(tokens.shape[1])
    mask, positions = prefix_mask(staged_layout(cache.lengths, tokens.shape[1], view.kv_len, counts=counts), prefix)
    first = model.forward(tokens, positions, mask, view).logits
    cache.keep(counts)
    more = torch.tensor([[3, 4, 5], [6, 7, 8], [9, 10, 11]])
    view = cache.stage(3)
    mask, positions = prefix_mask(staged_layout(cache.lengths, 3, view.kv_len), prefix)
    second = model.forward(more, positions, mask, view).logits
    for b, r in enumerate(rows):
        seq = r + more[b].tolist()
        q, k = grid(len(seq))
        expected = uncached_logits(hf_model, torch.tensor([seq]), ((k < len(r)) | (k <= q))[None, None])[0]
        torch.testing.assert_close(first[b, : len(r)], expected[: len(r)], **tol)
        torch.testing.assert_close(second[b], expected[len(r) :], **tol)
