"""Every registered verifier reads only valid draft nodes.

Drafts with ragged rows leave unused slots, which a drafter may fill with anything (``-1`` passes
``Draft.check``). Each verifier in the registry, current or future, runs on such drafts (chains, and trees where
it verifies trees; every draft kind it accepts; temperature 0 and 1) and must not crash, must return a next
token in the vocabulary and at most the row's valid nodes, and must give the same verdict as on the same draft
with the padding replaced by real ids and other ``q`` rows (the same generator seed).
"""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.errors import ConfigError, IncompatibleDraftError
from decodekit.interfaces import ChecksSampling
from decodekit.registry import available, resolve

VOCAB, BATCH, NODES = 16, 4, 5
CHAIN_LENGTHS = [5, 2, 0, 3]  # ragged: valid nodes per row
TREE_PARENTS = [-1, -1, 0, 0, 2]  # node 0 and 1 are roots; 2, 3 children of 0; 4 a child of 2
TREE_VALID = [  # per row; a valid node's parent is valid, and valid nodes need not come first
    [1, 1, 1, 1, 1],
    [1, 0, 1, 0, 0],
    [0, 0, 0, 0, 0],
    [1, 1, 0, 1, 0],
]
VERIFIERS = available("verifier")


def target_logits(seed: int) -> torch.Tensor:
    """``[B, N + 1, V]`` peaked logits, so that drafts of the argmax are often accepted."""
    return torch.randn(BATCH, NODES + 1, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def random_q(seed: int) -> torch.Tensor:
    return torch.randn(BATCH, NODES, VOCAB, generator=torch.Generator().manual_seed(seed)).softmax(-1)


def drafts(shape: str, kind: dk.DraftKind, logits: torch.Tensor) -> dict[str, dk.Draft]:
    """The same ragged draft three ways: padded with ``-1`` ids (and zero ``q``), and with the padding replaced by
    random ids or by the target's argmax at the node's parent (the ids most likely to be accepted if read)."""
    if shape == "chain":
        parents = (torch.arange(NODES) - 1).expand(BATCH, NODES)
        valid = torch.arange(NODES) < torch.tensor(CHAIN_LENGTHS)[:, None]
    else:
        valid = torch.tensor(TREE_VALID, dtype=torch.bool)
        parents = torch.tensor(TREE_PARENTS).expand(BATCH, NODES).where(valid, -1)
    gen = torch.Generator().manual_seed(3)
    argmax = logits.argmax(-1).gather(1, parents + 1)  # [B, N] the target's argmax after each node's parent
    guess = torch.randint(0, VOCAB, (BATCH, NODES), generator=gen)
    tokens = torch.where(torch.rand(BATCH, NODES, generator=gen) < 0.7, argmax, guess)  # valid nodes' ids
    fills = {
        "padded": torch.full_like(tokens, -1),
        "random": torch.randint(0, VOCAB, (BATCH, NODES), generator=gen),
        "argmax": argmax,
    }
    q = random_q(4) if kind.needs_q else None
    out = {}
    for name, fill in fills.items():
        pad_q = None
        if q is not None:
            pad_q = torch.zeros_like(q) if name == "padded" else random_q(5 + len(out))
            pad_q = torch.where(valid[..., None], q, pad_q)
        if shape == "chain":
            out[name] = dk.Draft.chain(tokens.where(valid, fill), valid=valid, q=pad_q, kind=kind)
        else:
            out[name] = dk.Draft.tree(tokens.where(valid, fill), parents, valid, kind=kind, q=pad_q)
    return out


def verify(verifier, draft: dk.Draft, logits: torch.Tensor, sampling: dk.SamplingParams) -> dk.Verdict:
    return verifier.verify(draft, logits, sampling, torch.Generator().manual_seed(7))


def test_the_registry_lists_the_built_in_verifiers():
    assert {"greedy", "rejection", "block"} <= set(VERIFIERS)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("name", VERIFIERS)
def test_verifier_ignores_padded_slots(name, shape, temperature):
    verifier = resolve("verifier", name)()
    sampling = dk.SamplingParams(temperature)
    try:
        if isinstance(verifier, ChecksSampling):
            verifier.check(sampling)
    except ConfigError:
        pytest.skip(f"{name} refuses temperature {temperature}")
    checked = 0
    for kind in sorted(verifier.accepts, key=lambda k: k.value):
        for seed in range(3):
            logits = target_logits(seed)
            versions = drafts(shape, kind, logits)
            for draft in versions.values():
                draft.check(BATCH, VOCAB, dk.DraftBudget(torch.full((BATCH,), NODES)))
            try:
                reference = verify(verifier, versions["random"], logits, sampling)
            except IncompatibleDraftError:
                pytest.skip(f"{name} does not verify {shape} drafts")
            padded = versions["padded"]
            verdict = verify(verifier, padded, logits, sampling)  # must not crash on -1 ids
            assert ((verdict.next_token >= 0) & (verdict.next_token < VOCAB)).all()
            assert (verdict.num_accepted <= padded.num_valid).all()
            accepted = verdict.accepted.clamp(min=0)
            on_path = torch.arange(verdict.accepted.shape[1]) < verdict.num_accepted[:, None]
            assert (padded.valid.gather(1, accepted) | ~on_path).all(), "accepted an invalid node"
            for other in ("random", "argmax"):
                again = reference if other == "random" else verify(verifier, versions[other], logits, sampling)
                assert torch.equal(verdict.num_accepted, again.num_accepted), (kind, other)
                assert torch.equal(verdict.next_token, again.next_token), (kind, other)
                assert torch.equal(verdict.accepted, again.accepted), (kind, other)
            checked += int(verdict.num_accepted.sum())
    assert checked > 0, "no draft token was ever accepted: the comparison tested nothing"
