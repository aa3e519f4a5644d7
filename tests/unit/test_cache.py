"""KVCache and tree forwards give the same logits as recomputing from scratch (float64, tolerance 1e-9)."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import decodekit as dk
from decodekit.masks import tree_ancestors
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
    logits = model.extend(cache, tokens, counts)
    for b, r in enumerate(rows):
        torch.testing.assert_close(logits[b], full_logits(hf_model, r), **tol)
    # a second ragged chunk, appended after the first
    more = [[3, 4], [5], [6, 7, 8]]
    tokens, counts = padded(more)
    logits = model.extend(cache, tokens, counts)
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
    draft.check(len(rows), 128, torch.full((3,), 7))
    assert not draft.is_chain
    logits = model.score(cache, pending, draft)
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
    logits = model.extend(cache, nxt, torch.ones(3, dtype=torch.long))
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
    logits = model.extend(cache, torch.tensor([[9], [8]]), torch.ones(2, dtype=torch.long))
    torch.testing.assert_close(logits[0], full_logits(hf_model, rows[2][:4] + [9]), **TOL)
    torch.testing.assert_close(logits[1], full_logits(hf_model, rows[0][:3] + [8]), **TOL)


def test_snapshot_restore(rows):
    model = dk.load_model(llama())
    cache = model.new_cache(len(rows), 16)
    tokens, counts = padded(rows)
    model.extend(cache, tokens, counts)
    snap = cache.snapshot()
    first = model.extend(cache, torch.tensor([[1], [2], [3]]), torch.ones(3, dtype=torch.long))
    model.extend(cache, torch.tensor([[4], [5], [6]]), torch.ones(3, dtype=torch.long))
    cache.restore(snap)
    again = model.extend(cache, torch.tensor([[1], [2], [3]]), torch.ones(3, dtype=torch.long))
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
