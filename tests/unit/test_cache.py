"""KVCache and tree forwards give the same logits as recomputing from scratch (float64, tolerance 1e-9).

Every cache op (stage at an offset, keep, crop, select_rows, write_at, attend, per-slot validity, snapshot/restore)
is checked against a full recomputation without cache; the host mirror of the lengths is checked by counting the
cache's host reads.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import decodekit as dk
from decodekit.cache import KVCache
from decodekit.masks import (
    attend_layout,
    bidirectional_mask,
    causal_mask,
    chain_mask,
    staged_layout,
    to_additive,
    tree_ancestors,
    write_at_layout,
)
from decodekit.models.tiny import tiny_llama, tiny_qwen2

TOL = dict(atol=1e-9, rtol=1e-9)


def llama():
    return tiny_llama(0).double()


def qwen2():
    return tiny_qwen2(0, init=0.02).double()


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256)).eval().double()


def llama_eager():
    model = tiny_llama(0, attn_implementation="eager").double()
    assert model.config._attn_implementation == "eager"
    return model


MODELS = {"llama": llama, "qwen2": qwen2, "gpt2": gpt2, "llama-eager": llama_eager}
# transformers' eager attention computes its softmax in float32 even for float64 models
TOLERANCE = {name: TOL for name in MODELS} | {"llama-eager": dict(atol=1e-5, rtol=1e-5)}


def full_logits(hf_model, ids: list[int]) -> torch.Tensor:
    """Reference: logits of the last position, recomputed from scratch without any cache."""
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0, -1]


def uncached_logits(hf_model, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Reference: ``[B, T, V]`` logits of one forward without cache over ``tokens [B, T]`` at positions ``0 .. T-1``
    under ``mask [B, 1, T, T]`` (bool)."""
    if hf_model.config._attn_implementation == "eager":
        mask = to_additive(mask, hf_model.dtype)
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        return hf_model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=False).logits


def padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    return tokens, torch.tensor([len(r) for r in rows])


@pytest.fixture
def rows():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 1, 9)]


@pytest.mark.parametrize("name", MODELS)
def test_ragged_extend_matches_recompute(name, rows):
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 4)  # small capacity: the cache must grow
    tokens, counts = padded(rows)
    logits = model.extend(cache, tokens, counts).logits
    for b, r in enumerate(rows):
        torch.testing.assert_close(logits[b], full_logits(hf_model, r), **tol)
    # a second ragged chunk, appended after the first
    more = [[3, 4], [5], [6, 7, 8]]
    tokens, counts = padded(more)
    logits = model.extend(cache, tokens, counts).logits
    for b, (r, m) in enumerate(zip(rows, more)):
        torch.testing.assert_close(logits[b], full_logits(hf_model, r + m), **tol)
    assert cache.lengths.tolist() == [len(r) + len(m) for r, m in zip(rows, more)]


def random_tree(batch: int, n: int, seed: int) -> dk.Draft:
    gen = torch.Generator().manual_seed(seed)
    parents = torch.stack(
        [
            torch.tensor([-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, n)])
            for _ in range(batch)
        ]
    )
    tokens = torch.randint(0, 128, (batch, n), generator=gen)
    valid = torch.ones(batch, n, dtype=torch.bool)
    valid[1, n - 2 :] = False  # a ragged row (its last nodes are leaves only if nobody hangs off them)
    valid[1] &= ~torch.isin(parents[1], torch.tensor([n - 2, n - 1])) | ~valid[1]
    return dk.Draft(tokens=tokens, parents=parents, valid=valid)


def path_tokens(draft: dk.Draft, b: int, node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(int(draft.tokens[b, node]))
        node = int(draft.parents[b, node])
    return out[::-1]


@pytest.mark.parametrize("name", MODELS)
def test_tree_forward_and_keep_match_recompute(name, rows):
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 32)
    tokens, counts = padded(rows)
    model.extend(cache, tokens, counts)
    pending = torch.tensor([11, 12, 13])
    draft = random_tree(len(rows), 7, seed=1)
    draft.check(len(rows), 128, dk.DraftBudget(torch.full((3,), 7)))
    assert not draft.is_chain
    logits = model.score(cache, pending, draft).logits
    for b, r in enumerate(rows):
        prefix = r + [int(pending[b])]
        torch.testing.assert_close(logits[b, 0], full_logits(hf_model, prefix), **tol)
        for i in range(7):
            if draft.valid[b, i]:
                expected = full_logits(hf_model, prefix + path_tokens(draft, b, i))
                torch.testing.assert_close(logits[b, i + 1], expected, **tol)
    # keep the path to the deepest valid node of each row, then extend: must equal a fresh forward
    leaf = (draft.depth * draft.valid).argmax(-1)
    length = draft.depth.gather(1, leaf[:, None])[:, 0]
    path = draft.path(leaf, length)
    cache.keep(length + 1, torch.cat([torch.zeros(3, 1, dtype=torch.long), path + 1], 1))
    nxt = torch.tensor([[21], [22], [23]])
    logits = model.extend(cache, nxt, torch.ones(3, dtype=torch.long)).logits
    for b, r in enumerate(rows):
        committed = r + [int(pending[b])] + path_tokens(draft, b, int(leaf[b])) + [int(nxt[b, 0])]
        torch.testing.assert_close(logits[b], full_logits(hf_model, committed), **tol)


def test_crop_and_select_rows_match_recompute(rows):
    hf_model = llama()
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 16)
    tokens, counts = padded(rows)
    model.extend(cache, tokens, counts)
    cache.crop(torch.tensor([3, 1, 4]))  # drop the tail of rows 0 and 2
    cache.select_rows(torch.tensor([2, 0]))
    logits = model.extend(cache, torch.tensor([[9], [8]]), torch.ones(2, dtype=torch.long)).logits
    torch.testing.assert_close(logits[0], full_logits(hf_model, rows[2][:4] + [9]), **TOL)
    torch.testing.assert_close(logits[1], full_logits(hf_model, rows[0][:3] + [8]), **TOL)


@pytest.mark.parametrize("finished", [[0, 1, 0], [1, 0, 0], [0, 0, 1], [1, 0, 1]])
def test_dropping_finished_rows_moves_only_the_rows_that_change_place(rows, finished):
    """The engine's order (fill_holes): rows past the new batch size fill the gaps; the cache then overwrites those
    rows in place and keeps a view of the prefix (no copy of the rest), and the logits match a recompute."""
    from decodekit.spec.outputs import fill_holes

    hf_model = llama()
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 16)
    model.extend(cache, *padded(rows))
    order = fill_holes(finished)
    assert sorted(order) == [b for b, f in enumerate(finished) if not f]
    assert all(order[i] == i for i in range(len(order)) if not finished[i])  # live rows below B' stay put
    base = cache.keys[0].data_ptr()
    cache.select_rows(torch.tensor(order), host_rows=order)
    assert cache.keys[0].data_ptr() == base and cache.keys[0].shape[0] == len(order)  # a view: nothing copied
    new = torch.arange(len(order))[:, None] + 3
    logits = model.extend(cache, new, torch.ones(len(order), dtype=torch.long)).logits
    for i, b in enumerate(order):
        torch.testing.assert_close(logits[i], full_logits(hf_model, rows[b] + [i + 3]), **TOL)


def test_snapshot_restore(rows):
    model = dk.load_model(llama())
    cache = model.new_cache(len(rows), 16)
    tokens, counts = padded(rows)
    model.extend(cache, tokens, counts)
    snap = cache.snapshot()
    first = model.extend(cache, torch.tensor([[1], [2], [3]]), torch.ones(3, dtype=torch.long)).logits
    model.extend(cache, torch.tensor([[4], [5], [6]]), torch.ones(3, dtype=torch.long))
    cache.restore(snap)
    again = model.extend(cache, torch.tensor([[1], [2], [3]]), torch.ones(3, dtype=torch.long)).logits
    torch.testing.assert_close(first, again, **TOL)


def test_tree_ancestors_matches_brute_force():
    draft = random_tree(4, 12, seed=3)
    anc = tree_ancestors(draft.parents, draft.valid)
    for b in range(4):
        for i in range(12):
            expected = {i}
            node = int(draft.parents[b, i])
            while draft.valid[b, i] and node >= 0:
                expected.add(node)
                node = int(draft.parents[b, node])
            assert set(anc[b, i].nonzero()[:, 0].tolist()) == expected


# ------------------------------------------------------------------------------------------------ host mirror
@pytest.fixture
def count_reads(monkeypatch):
    """Counts the cache's host reads of its lengths (each one a device sync on GPU)."""
    reads = []
    original = KVCache._read_lengths

    def counted(self):
        reads.append(1)
        return original(self)

    monkeypatch.setattr(KVCache, "_read_lengths", counted)
    return reads


def test_host_mirror_spares_syncs(rows, count_reads):
    hf_model = llama()
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 4)
    tokens, counts = padded(rows)
    model.extend(cache, tokens, counts, host_counts=counts.tolist())
    for step in range(3):  # a decoding loop that tells the cache what it commits: no reads at all
        model.extend(cache, torch.tensor([[step + 1]] * 3), torch.ones(3, dtype=torch.long), host_counts=1)
        assert cache.get_seq_length() == max(map(len, rows)) + step + 1
    assert count_reads == []
    cache.check_host_mirror()
    logits = model.extend(cache, torch.tensor([[4], [5], [6]]), torch.ones(3, dtype=torch.long)).logits
    for b, r in enumerate(rows):  # (no host_counts: the mirror is unknown now)
        torch.testing.assert_close(logits[b], full_logits(hf_model, r + [1, 2, 3, 4 + b]), **TOL)
    assert count_reads == []
    cache.stage(1)  # reads once, then keeps the mirror
    cache.keep(torch.ones(3, dtype=torch.long), host_counts=[1, 1, 1])
    cache.stage(1)
    assert count_reads == [1]
    expected = [len(r) + 5 for r in rows]
    assert cache.host_lengths() == expected == cache.lengths.tolist()
    cache.crop(torch.tensor([4, 9, 9]), host_lengths=[4, 9, 9])
    cache.select_rows(torch.tensor([2, 0]), host_rows=[2, 0])
    assert cache.host_lengths() == [min(expected[2], 9), 4] and count_reads == [1]
    cache.check_host_mirror()
    cache.crop(torch.tensor([3, 3]))  # no host lengths: unknown, read once when asked
    assert cache.host_lengths() == [3, 3] and cache.get_seq_length() == 3 and count_reads == [1, 1]
    cache.lengths = cache.lengths + 1  # assigning lengths forgets the mirror
    assert cache.host_lengths() == [4, 4] and count_reads == [1, 1, 1]
    cache.set_host_lengths([4, 4])
    cache.stage(2)
    assert count_reads == [1, 1, 1]


def test_check_host_mirror_catches_a_wrong_mirror():
    cache = KVCache(2, 8)
    cache.keep(torch.tensor([3, 1]), host_counts=[3, 2])  # the caller lied
    with pytest.raises(AssertionError, match="host mirror"):
        cache.check_host_mirror()
    cache.set_host_lengths([3, 1])
    cache.check_host_mirror()
    with pytest.raises(ValueError):
        cache.set_host_lengths([3])


# ------------------------------------------------------------------------------------------ forward views
def test_a_view_carries_its_slots_and_the_cache_no_plan():
    cache = KVCache(2, 8)
    cache.keep(torch.tensor([3, 5]), host_counts=[3, 5])
    staged = cache.stage(2, offset=1)
    assert staged.kind == "stage" and staged.kv_len == 5 + 1 + 2
    assert staged.slots().tolist() == [[4, 5], [6, 7]]  # L_b + offset + j: ragged rows, one tensor
    cache.keep(torch.tensor([0, 0]), host_counts=0)
    cache.lengths = torch.tensor([4, 4])
    cache.set_host_lengths([4, 4])
    assert cache.stage(3).slots().tolist() == [[4, 5, 6]] * 2  # equal lengths: one start (a slice copy)
    written = cache.write_at(torch.tensor([[1, -1], [7, 2]]))
    assert written.kind == "write_at" and written.slots().tolist() == [[1, cache.capacity], [7, 2]]  # -1: scratch
    attending = cache.attend(3)
    assert attending.slots() is None and (attending.cached_len, attending.kv_len) == (4, 7)
    # two views made in a row are both what they say: nothing of the first is replaced by the second
    first, second = cache.stage(1), cache.stage(1, offset=1)
    assert first.slots().tolist() == [[4]] * 2 and second.slots().tolist() == [[5]] * 2


def test_a_forward_refuses_the_cache_itself_and_a_stale_view(rows):
    model = dk.load_model(llama())
    cache = model.new_cache(len(rows), 16)
    model.extend(cache, *padded(rows))
    view = cache.stage(1)
    mask, positions = chain_mask(cache.lengths, 1, view.kv_len)
    tokens = torch.tensor([[5], [6], [7]])
    with pytest.raises(TypeError, match="CacheView"):
        model.forward(tokens, positions, mask, cache)
    model.forward(tokens, positions, mask, view)
    cache.keep(torch.ones(3, dtype=torch.long))  # the lengths moved: the view's slots are wrong now
    with pytest.raises(RuntimeError, match="after its cache changed"):
        model.forward(tokens, positions, mask, view)
    with pytest.raises(TypeError, match="CacheView"):
        cache.update(torch.zeros(3, 1, 1, 4), torch.zeros(3, 1, 1, 4), 0)  # a hand-written forward, same message


# ------------------------------------------------------------------------------------ staging at an offset
def test_staged_extent_bookkeeping():
    cache = KVCache(2, 4)
    cache.keep(torch.tensor([2, 1]), host_counts=[2, 1])
    kv = torch.zeros(2, 1, 1, 2)

    def run(num_new, offset, layers):
        view = cache.stage(num_new, offset)
        states = kv.expand(2, 1, num_new, 2)
        for layer in layers:
            view.update(states, states, layer)
        return [cache.staged_extent(layer) for layer in range(3)]

    assert run(2, 0, [0, 1]) == [2, 2, 0]
    assert run(1, 2, [0]) == [3, 2, 0]  # an early exit after layer 0 fills only layer 0
    assert run(1, 5, [0, 1]) == [3, 2, 0]  # a gap: not contiguous with the staged run
    assert run(3, 0, [0, 1, 2]) == [3, 3, 3]
    cache.keep(torch.tensor([1, 1]))
    assert [cache.staged_extent(layer) for layer in range(3)] == [0, 0, 0]
    assert run(2, 0, [0, 1, 2]) == [2, 2, 2]
    cache.crop(torch.tensor([9, 9]))
    assert cache.staged_extent(0) == 0
    run(1, 0, [0])
    cache.select_rows(torch.tensor([1]))
    assert cache.staged_extent(0) == 0


def staged_step(model, cache, tokens, offset: int = 0, **forward_kwargs):
    """Run the chain ``tokens [B, N]`` staged at ``offset`` past each row's committed length; its logits."""
    view = cache.stage(tokens.shape[1], offset=offset)
    mask, positions = chain_mask(cache.lengths + offset, tokens.shape[1], view.kv_len)
    return model.forward(tokens, positions, mask, view, **forward_kwargs).logits


@pytest.mark.parametrize("name", MODELS)
def test_offset_staging_matches_recompute(name, rows):
    """Draft one token per step at offsets 0, 1, 2 (all layers), then verify at offset 0 over the same slots."""
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 4)
    model.extend(cache, *padded(rows))
    drafts = torch.tensor([[31, 32, 33], [41, 42, 43], [51, 52, 53]])
    for k in range(3):
        logits = staged_step(model, cache, drafts[:, k : k + 1], offset=k)
        for b, r in enumerate(rows):
            torch.testing.assert_close(logits[b, 0], full_logits(hf_model, r + drafts[b, : k + 1].tolist()), **tol)
        assert [cache.staged_extent(layer) for layer in range(2)] == [k + 1, k + 1]
    verify = torch.cat([drafts, torch.tensor([[60], [61], [62]])], 1)
    logits = staged_step(model, cache, verify)
    for b, r in enumerate(rows):
        torch.testing.assert_close(logits[b, 3], full_logits(hf_model, r + verify[b].tolist()), **tol)
    cache.keep(torch.tensor([2, 4, 1]))
    assert cache.staged_extent(0) == 0
    logits = model.extend(cache, torch.tensor([[70], [71], [72]]), torch.ones(3, dtype=torch.long)).logits
    for b, (r, kept) in enumerate(zip(rows, [2, 4, 1])):
        expected = full_logits(hf_model, r + verify[b, :kept].tolist() + [70 + b])
        torch.testing.assert_close(logits[b], expected, **tol)


def test_early_exit_staging_fills_only_its_layers(rows):
    """Self-speculation: the target's first layer drafts at offsets 0, 1; the full verification then overwrites."""
    hf_model = tiny_llama(0, layers=3).double()
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 16)
    model.extend(cache, *padded(rows))
    drafts = torch.tensor([[31, 32], [41, 42], [51, 52]])
    for k in range(2):
        logits = staged_step(model, cache, drafts[:, k : k + 1], offset=k, exit_layer=1)
        assert [cache.staged_extent(layer) for layer in range(3)] == [k + 1, 0, 0]
        for b, r in enumerate(rows):  # == the 1-layer model recomputed from scratch
            fresh = model.new_cache(1, 16)
            seq = torch.tensor([r + drafts[b, : k + 1].tolist()])
            expected = model.extend(fresh, seq, torch.tensor([seq.shape[1]]), exit_layer=1).logits[0]
            torch.testing.assert_close(logits[b, 0], expected, **TOL)
    logits = staged_step(model, cache, drafts)
    assert [cache.staged_extent(layer) for layer in range(3)] == [2, 2, 2]
    for b, r in enumerate(rows):
        torch.testing.assert_close(logits[b, 1], full_logits(hf_model, r + drafts[b].tolist()), **TOL)


# ----------------------------------------------------------------------------------------------- write_at
@pytest.mark.parametrize("name", MODELS)
def test_write_at_refresh_matches_recompute(name, rows):
    """Overwrite each row's last committed tokens with new ones (ragged, with a padded slot) in place."""
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 16)
    model.extend(cache, *padded(rows))
    before = cache.lengths.clone()
    slots = torch.tensor([[3, 4], [0, -1], [7, 8]])  # the last two slots of rows 0 and 2, the only one of row 1
    new = torch.tensor([[91, 92], [93, 0], [94, 95]])
    view = cache.write_at(slots)
    assert view.kv_len == max(map(len, rows)) == cache.write_at(slots, kv_len=view.kv_len).kv_len
    mask, positions = causal_mask(write_at_layout(slots, cache.key_mask(view.kv_len)))
    logits = model.forward(new, positions, mask, view).logits
    assert torch.equal(cache.lengths, before)
    changed = [rows[0][:3] + [91, 92], [93], rows[2][:7] + [94, 95]]
    for b, seq in enumerate(changed):
        torch.testing.assert_close(logits[b, 0 if b == 1 else 1], full_logits(hf_model, seq), **tol)
    with pytest.raises(RuntimeError, match="nothing was staged"):
        cache.keep(torch.ones(3, dtype=torch.long))
    logits = model.extend(cache, torch.tensor([[5], [6], [7]]), torch.ones(3, dtype=torch.long)).logits
    for b, seq in enumerate(changed):
        torch.testing.assert_close(logits[b], full_logits(hf_model, seq + [5 + b]), **tol)


# ------------------------------------------------------------------------------------------------- attend
@pytest.mark.parametrize("name", MODELS)
def test_attend_does_not_write(name, rows):
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 4)
    model.extend(cache, *padded(rows))
    snap = cache.snapshot()
    block = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    view = cache.attend(3)
    assert view.kv_len == max(map(len, rows)) + 3
    mask, positions = causal_mask(attend_layout(cache.lengths, 3, view.cached_len))
    logits = model.forward(block, positions, mask, view).logits
    for b, r in enumerate(rows):
        for j in range(3):
            torch.testing.assert_close(logits[b, j], full_logits(hf_model, r + block[b, : j + 1].tolist()), **tol)
    assert torch.equal(cache.lengths, snap["lengths"])
    assert all(torch.equal(a, b) for a, b in zip(cache.keys + cache.values, snap["keys"] + snap["values"]))
    with pytest.raises(RuntimeError, match="nothing was staged"):
        cache.keep(torch.ones(3, dtype=torch.long))
    with pytest.raises(RuntimeError, match="nothing was staged"):  # a tree's gather is refused before it moves K/V
        cache.keep(torch.ones(3, dtype=torch.long), nodes=torch.tensor([[2], [1], [2]]))
    assert all(torch.equal(a, b) for a, b in zip(cache.keys + cache.values, snap["keys"] + snap["values"]))
    logits = model.extend(cache, torch.tensor([[10], [11], [12]]), torch.ones(3, dtype=torch.long)).logits
    for b, r in enumerate(rows):
        torch.testing.assert_close(logits[b], full_logits(hf_model, r + [10 + b]), **tol)


# ----------------------------------------------------------------------------------------------- validity
def test_validity_follows_every_op():
    """key_mask against a direct model of which slots are valid, through every op that touches slots."""
    cache = KVCache(2, 8)
    assert not cache.validity.explicit
    cache.keep(torch.tensor([5, 3]), host_counts=[5, 3])
    assert cache.key_mask(6).tolist() == [[True] * 5 + [False], [True] * 3 + [False] * 3]
    assert not cache.validity.explicit  # plain decoding pays nothing
    cache.invalidate(torch.tensor([[1, -1], [0, 2]]))
    cache.mark_valid(torch.tensor([[7, -1], [6, 7]]))  # a cached suffix past L_b
    expected = [{0, 2, 3, 4, 7}, {1, 6, 7}]

    def check(kv_len):
        assert cache.key_mask(kv_len).tolist() == [[s in e for s in range(kv_len)] for e in expected]

    check(8)
    cache.stage(2)  # staged slots are invalid until kept
    expected = [{0, 2, 3, 4, 7}, {1, 6, 7}]
    check(8)
    cache.stage(2, offset=1)  # slots 6, 7 and 4, 5: row 0's suffix slot 7 is overwritten
    expected[0] -= {7}
    check(8)
    cache.keep(torch.tensor([1, 2]))  # commits slots 5 and 3, 4
    expected = [{0, 2, 3, 4, 5}, {1, 3, 4, 6, 7}]
    check(8)
    cache.stage(20)  # grows the capacity, keeps validity
    assert cache.capacity >= 26
    expected = [{0, 2, 3, 4, 5}, {1, 3, 4}]
    check(30)
    cache.keep(torch.tensor([0, 0]))
    snap = cache.snapshot()
    cache.crop(torch.tensor([3, 9]))  # drops committed slots 3..5 of row 0
    expected = [{0, 2}, {1, 3, 4}]
    check(30)
    cache.restore(snap)
    expected = [{0, 2, 3, 4, 5}, {1, 3, 4}]
    check(30)
    cache.write_at(torch.tensor([[9, 1], [10, -1]]), kv_len=11)  # written slots become valid
    expected = [{0, 1, 2, 3, 4, 5, 9}, {1, 3, 4, 10}]
    check(30)
    cache.select_rows(torch.tensor([1]))
    expected = [{1, 3, 4, 10}]
    check(30)
    cache.reset_validity()
    assert cache.key_mask(6).tolist() == [[s < 5 for s in range(6)]]


@pytest.mark.parametrize("name", MODELS)
def test_invalidated_slot_is_not_attended(name, rows):
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 16)
    model.extend(cache, *padded(rows))
    cache.invalidate(torch.tensor([[1], [-1], [1]]))
    view = cache.stage(1)
    keys = staged_layout(cache.lengths, 1, view.kv_len, key_valid=cache.key_mask(view.kv_len))
    mask, positions = causal_mask(keys)
    logits = model.forward(torch.tensor([[5], [6], [7]]), positions, mask, view).logits
    for b, r in enumerate(rows):
        seq = r + [5 + b]
        ref_mask = torch.ones(len(seq), len(seq), dtype=torch.bool).tril()
        if len(r) > 1:
            ref_mask[-1, 1] = False  # only the new query misses slot 1: the cached K/V saw it
        expected = uncached_logits(hf_model, torch.tensor([seq]), ref_mask[None, None])[0, -1]
        torch.testing.assert_close(logits[b, 0], expected, **tol)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("block_write", ["stage", "write_at"])
def test_dual_cache_suffix_matches_recompute(name, block_write, rows):
    """DLM dual cache: a committed prompt, a suffix cached past an uncached block, the block run against both.

    One uncached forward under the combined mask is the reference: prompt causal, the block sees everything, the
    suffix sees the prompt and itself causally (so its cached K/V do not depend on the block, and caching is exact).
    """
    hf_model, tol = MODELS[name](), TOLERANCE[name]
    model = dk.load_model(hf_model)
    cache = model.new_cache(len(rows), 8)
    model.extend(cache, *padded(rows), host_counts=[len(r) for r in rows])
    nb, ns = 3, 2
    prompt = cache.lengths.clone()
    suffix_slots = prompt[:, None] + nb + torch.arange(ns)
    suffix = torch.tensor([[81, 82], [83, 84], [85, 86]])
    view = cache.write_at(suffix_slots)
    mask, positions = causal_mask(write_at_layout(suffix_slots, cache.key_mask(view.kv_len)))
    suffix_logits = model.forward(suffix, positions, mask, view).logits
    block = torch.tensor([[61, 62, 63], [64, 65, 66], [67, 68, 69]])
    if block_write == "stage":
        view = cache.stage(nb, kv_len=view.kv_len)
        keys = staged_layout(cache.lengths, nb, view.kv_len, key_valid=cache.key_mask(view.kv_len))
    else:
        block_slots = prompt[:, None] + torch.arange(nb)
        view = cache.write_at(block_slots, kv_len=view.kv_len)
        keys = write_at_layout(block_slots, cache.key_mask(view.kv_len))
    mask, positions = bidirectional_mask(keys)
    block_logits = model.forward(block, positions, mask, view).logits
    for b, r in enumerate(rows):
        p = len(r)
        q, k = torch.arange(p + nb + ns)[:, None], torch.arange(p + nb + ns)[None, :]
        in_block = (q >= p) & (q < p + nb)
        ref_mask = torch.where(q < p, k <= q, in_block | (k < p) | ((k >= p + nb) & (k <= q)))
        seq = torch.tensor([r + block[b].tolist() + suffix[b].tolist()])
        expected = uncached_logits(hf_model, seq, ref_mask[None, None])[0]
        torch.testing.assert_close(block_logits[b], expected[p : p + nb], **tol)
        torch.testing.assert_close(suffix_logits[b], expected[p + nb :], **tol)
    if block_write == "write_at":
        return
    cache.keep(torch.full((3,), nb), host_counts=nb)
    total = int(prompt.max()) + nb + ns
    assert cache.key_mask(total).tolist() == [[s < p + nb + ns for s in range(total)] for p in prompt.tolist()]
    # the same block again, attend-only, at its own positions with its slots invalidated: same logits, no writes
    cache.invalidate(prompt[:, None] + torch.arange(nb))
    snap = cache.snapshot()
    view = cache.attend(nb, cached_len=total)
    keys = attend_layout(
        cache.lengths, nb, total, positions=prompt[:, None] + torch.arange(nb), key_valid=cache.key_mask(total)
    )
    mask, positions = bidirectional_mask(keys)
    again = model.forward(block, positions, mask, view).logits
    torch.testing.assert_close(again, block_logits, **tol)
    assert all(torch.equal(a, b) for a, b in zip(cache.keys + cache.values, snap["keys"] + snap["values"]))
