"""The trained early exit (``EarlyExitDrafter(exit_head=...)``): a head trained here on tiny targets with the
recipe's own loss, then an untrained head drafting exactly what the untrained exit drafts, greedy output equal to
plain decoding, the exact output law under rejection sampling (full and trimmed vocabulary; a drafter that
misreports q fails the same test), and the refusals (missing file, another target, another layer, a file that is
not an exit head)."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.drafters.exit_head import ExitHead, load_exit_head
from decodekit.drafters.head_files import head_metadata
from decodekit.errors import ConfigError
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.train.exit_head import exit_loss, exit_states
from decodekit.verifiers import RejectionVerifier
from tests.conftest import assert_greedy_twice
from tests.unit.test_eagle import own_samples
from tests.unit.test_lossless import MisreportsQ, assert_detected, assert_matches, sample_counts


def train_exit(
    lm: dk.LanguageModel, layer: int, steps: int, vocab: torch.Tensor | None = None, data: dict | None = None
) -> ExitHead:
    """An exit head on layer ``layer`` trained with :func:`decodekit.train.exit_head.exit_loss` on the target's
    own samples (``data``: :func:`~tests.unit.test_eagle.own_samples`, computed once for several heads)."""
    data = own_samples(lm) if data is None else data
    torch.manual_seed(0)
    vocab = torch.arange(lm.vocab_size) if vocab is None else vocab
    head = ExitHead(lm.hf.config.hidden_size, 64, layer, vocab)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, len(data["lengths"]), (16,), generator=gen)
        tokens, feats, lengths = data["tokens"][idx], data["feats"][idx], data["lengths"][idx]
        n = exit_states(lm, tokens, layer)
        loss, _ = exit_loss(head, n, lm.lm_head.weight[vocab].detach(), feats, lengths, torch.zeros_like(lengths))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return head.eval()


def save(tmp_path_factory, lm: dk.LanguageModel, head: ExitHead, name: str):
    path = tmp_path_factory.mktemp("exit") / f"{name}.safetensors"
    head.save(path, head_metadata(lm, base=name))
    return path


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    lm = dk.load_model(tiny_llama(3, layers=4))
    return lm, save(tmp_path_factory, lm, train_exit(lm, 2, 120), "tiny")


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, layers=3, init=0.3))
    data = own_samples(lm)
    full = save(tmp_path_factory, lm, train_exit(lm, 1, 60, data=data), "tiny8")
    trimmed = save(tmp_path_factory, lm, train_exit(lm, 1, 60, torch.tensor([1, 2, 4, 6, 7]), data), "tiny8_trim")
    return lm, full, trimmed


def test_training_raises_agreement_with_the_target():
    """The recipe's loss trains the head: lower loss and higher top-1 agreement than the untrained exit (on a
    random tiny target, on the training data)."""
    lm = dk.load_model(tiny_llama(3, layers=4))
    data = own_samples(lm)
    tokens, feats, lengths = data["tokens"][:32], data["feats"][:32], data["lengths"][:32]
    stats = []
    for steps in (0, 150):
        head = train_exit(lm, 1, steps, data=data)
        with torch.no_grad():
            n = exit_states(lm, tokens, 1)
            loss, numbers = exit_loss(head, n, lm.lm_head.weight, feats, lengths, torch.zeros_like(lengths))
        stats.append((float(loss), numbers["acc"]))
    assert stats[1][0] < 0.9 * stats[0][0] and stats[1][1] > stats[0][1] + 0.1, stats


def test_an_untrained_head_drafts_what_the_untrained_exit_drafts(tmp_path, ragged_prompts):
    """A fresh head (its output layer zero) over the full vocabulary is the target's own exit: the same drafts,
    so the same accepted counts round for round."""
    lm = dk.load_model(tiny_llama(3, layers=4))
    path = tmp_path / "fresh.safetensors"
    ExitHead(lm.hf.config.hidden_size, 16, 2, torch.arange(lm.vocab_size)).save(path, head_metadata(lm, base="t"))
    runs = [
        dk.generate(lm, ragged_prompts, drafter, policy=FixedLength(3), max_new_tokens=24, eos_token_id=())
        for drafter in (EarlyExitDrafter(2), EarlyExitDrafter(exit_head=path))
    ]
    assert runs[0].stats.drafted > 0
    first, second = (run.stats for run in runs)
    assert (first.accepted_per_pos, first.round_max_accepted) == (second.accepted_per_pos, second.round_max_accepted)


def test_greedy_equals_plain_decoding(deep, ragged_prompts):
    lm, path = deep
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=30, eos_token_id=()).sequences
    drafter = EarlyExitDrafter(exit_head=path)
    assert_greedy_twice(lm, ragged_prompts, drafter, FixedLength(3), reference, 30)
    assert drafter.layers == 2  # the head's layer


def test_runs_on_a_target_with_onednn_kernels(deep, ragged_prompts):
    lm, path = deep
    packed = dk.load_model(lm, kernels="onednn")
    reference = dk.generate(packed, ragged_prompts, max_new_tokens=20, eos_token_id=()).sequences
    out = dk.generate(packed, ragged_prompts, EarlyExitDrafter(exit_head=path), max_new_tokens=20, eos_token_id=())
    assert out.sequences == reference and out.stats.drafted > 0


@pytest.mark.parametrize("trimmed", [False, True])
def test_sampling_is_lossless(small_vocab, trimmed):
    lm, full, trim = small_vocab
    drafter = EarlyExitDrafter(exit_head=trim if trimmed else full)
    counts, stats = sample_counts(lm, drafter, RejectionVerifier(), FixedLength(2), "T1", seed=41)
    assert_matches(lm.hf, counts, "T1")
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_a_trimmed_head_drafts_only_its_vocabulary(small_vocab):
    lm, _, trim = small_vocab
    drafter = EarlyExitDrafter(exit_head=trim)
    out = dk.generate(lm, [[1, 2, 3]] * 16, drafter, policy=FixedLength(3), max_new_tokens=8, temperature=1.0, seed=3)
    assert out.stats.drafted > 0 and drafter.head.vocab.tolist() == [1, 2, 4, 6, 7]
    logits = drafter.trimmed.logits(torch.randn(2, lm.hf.config.hidden_size))
    assert torch.isinf(logits[:, [0, 3, 5]]).all() and torch.isfinite(logits[:, [1, 2, 4, 6, 7]]).all()


def test_a_drafter_that_misreports_q_is_detected(small_vocab):
    lm, full, _ = small_vocab
    drafter = MisreportsQ(EarlyExitDrafter(exit_head=full))
    counts, _ = sample_counts(lm, drafter, RejectionVerifier(), FixedLength(2), "T1", seed=42)
    assert_detected(lm.hf, counts, "T1")


def test_refusals(deep, ragged_prompts, tmp_path):
    lm, path = deep
    with pytest.raises(ConfigError, match="recipe=exit_head"):
        EarlyExitDrafter(exit_head=tmp_path / "absent.safetensors")
    with pytest.raises(ConfigError, match="trained on layer 2"):
        dk.generate(lm, ragged_prompts, EarlyExitDrafter(3, exit_head=path), max_new_tokens=4)
    with pytest.raises(ConfigError, match="other weights"):
        EarlyExitDrafter(exit_head=path, target=dk.load_model(tiny_llama(5, layers=4)))
    from decodekit.drafters.eagle_head import EagleHead

    eagle = tmp_path / "eagle.safetensors"
    EagleHead(lm.hf.config).save(eagle, head_metadata(lm, base="tiny"))
    with pytest.raises(ConfigError, match="not an exit head"):
        load_exit_head(eagle, lm)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_no_host_syncs_of_its_own(deep, temperature):
    from tests.unit.test_host_syncs import syncs_per_round

    lm, path = deep
    assert syncs_per_round(lm, EarlyExitDrafter(exit_head=path), FixedLength(3), temperature) <= 2
