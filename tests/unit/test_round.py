"""The round record: components declare ``needs`` and get exactly that in ``observe(state, round)``; optional
hooks are typed Protocols (verifiers get them too); a hook name one letter off warns."""

from __future__ import annotations

import warnings

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength
from decodekit.sampling import probs_from_logits
from decodekit.verifiers import GreedyVerifier, RejectionVerifier


class Observer:
    """A policy that records every round it observes (and the state's lengths at that time)."""

    def __init__(self, needs=(), hidden_layers=()):
        self.needs = frozenset(needs)
        self.hidden_layers = tuple(hidden_layers)
        self.rounds, self.lengths, self.rows = [], [], []

    def plan(self, state):
        return dk.DraftBudget(torch.full_like(state.lengths, 3), node_bound=3)

    def observe(self, state, round):
        self.rounds.append(round)
        self.lengths.append(state.lengths.clone())
        self.rows.append(state.rows.tolist())


class LogitsRecorder:
    """Wraps a verifier and keeps the target logits it was given."""

    def __init__(self, inner):
        self.inner, self.logits = inner, []
        self.accepts, self.lossless = inner.accepts, inner.lossless

    def verify(self, draft, logits, sampling, generator):
        self.logits.append(logits)
        return self.inner.verify(draft, logits, sampling, generator)


@pytest.fixture(scope="module")
def target64():
    return tiny_llama(0).double()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_round_carries_what_was_asked(target64, ragged_prompts, temperature):
    observer = Observer({"target_probs", "kl", "hidden", "timings"}, hidden_layers=[1])
    verifier = LogitsRecorder(GreedyVerifier() if temperature == 0 else RejectionVerifier())
    drafter = ModelDrafter(perturbed(target64, 0.3, seed=1))
    out = dk.generate(
        target64,
        ragged_prompts,
        drafter=drafter,
        verifier=verifier,
        policy=observer,
        max_new_tokens=20,
        temperature=temperature,
        eos_token_id=(),
        seed=0,
    )
    sampling = dk.SamplingParams(temperature)
    assert len(observer.rounds) == out.stats.rounds
    for r, (round, logits) in enumerate(zip(observer.rounds, verifier.logits)):
        assert round.index == r
        draft = round.draft
        # target_probs: the (warped) target probability of each node's token after its parent
        parent_rows = logits.gather(1, (draft.parents + 1)[..., None].expand(-1, -1, logits.shape[-1]))
        p = parent_rows.softmax(-1).float() if temperature == 0 else probs_from_logits(parent_rows, sampling)
        expected = p.gather(-1, draft.tokens[..., None])[..., 0] * draft.valid
        torch.testing.assert_close(round.target_probs, expected)
        # kl: KL(target || drafter) at each node; the greedy drafter reports its softmax as draft_probs
        q = draft.draft_probs if temperature == 0 else draft.q
        if draft.num_nodes == 0:  # the last round of a row may draft nothing
            continue
        kl = (p * (p.clamp_min(1e-30).log() - q.float().clamp_min(1e-30).log())).sum(-1)
        torch.testing.assert_close(round.kl[draft.valid], kl[draft.valid], atol=1e-5, rtol=1e-4)
        assert torch.isnan(round.kl[~draft.valid]).all()
        assert round.draft_time_s >= 0 and round.verify_time_s >= 0
        assert round.hidden.shape[:2] == (draft.batch_size, round.verdict.accepted.shape[1] + 1)
    # hidden: the target's final hidden states of the tokens each round added to its cache
    final = [p + s for p, s in zip(ragged_prompts, out.sequences)]
    for row, tokens in enumerate(final):
        with torch.no_grad():
            ref = target64(torch.tensor([tokens]), output_hidden_states=True).hidden_states
        for round, lengths, rows in zip(observer.rounds, observer.lengths, observer.rows):
            if row not in rows:  # finished earlier
                continue
            b = rows.index(row)
            start = int(lengths[b] - round.counts[b]) - 1  # position of the round's pending token
            for j in range(int(round.counts[b])):
                torch.testing.assert_close(round.hidden[b, j], ref[-1][0, start + j])
                torch.testing.assert_close(round.layer_hidden[1][b, j], ref[1][0, start + j])


def test_plain_rounds_compute_nothing_extra(target, ragged_prompts):
    observer = Observer()
    dk.generate(target, ragged_prompts, drafter=NGramDrafter(), policy=observer, max_new_tokens=10)
    round = observer.rounds[0]
    assert round.target_probs is None and round.kl is None and round.hidden is None and round.layer_hidden == {}
    assert round.draft_time_s is None
    assert round.tokens.shape[0] == len(ragged_prompts) and round.counts.shape == (len(ragged_prompts),)


def test_kl_is_nan_without_a_reported_distribution(target, ragged_prompts):
    observer = Observer({"kl"})
    dk.generate(target, ragged_prompts, drafter=NGramDrafter(), policy=observer, max_new_tokens=10)
    assert all(torch.isnan(r.kl).all() for r in observer.rounds)


def test_unknown_needs_are_refused(target):
    known = "hidden, host_rows, kl, logits, prefill, target_probs, timings"
    with pytest.raises(dk.ConfigError, match=rf"'target_prob'.*known names: {known}"):
        dk.generate(target, [[1, 2]], drafter=NGramDrafter(), policy=Observer({"target_prob"}))


def test_verifiers_get_the_hooks_too(target, ragged_prompts):
    calls = []

    class HookedVerifier(GreedyVerifier):
        def begin(self, state):
            calls.append(("begin", state.batch_size))

        def observe(self, state, round):
            calls.append(("observe", round.index))

        def select_rows(self, rows):
            calls.append(("select_rows", len(rows)))

    eos = 7
    out = dk.generate(
        target, ragged_prompts, drafter=NGramDrafter(), verifier=HookedVerifier(), eos_token_id=eos, max_new_tokens=12
    )
    assert calls[0] == ("begin", len(ragged_prompts))
    assert [c for c in calls if c[0] == "observe"] == [("observe", i) for i in range(out.stats.rounds)]
    assert any(c[0] == "select_rows" for c in calls)
    assert isinstance(HookedVerifier(), dk.Observes) and isinstance(HookedVerifier(), dk.SelectsRows)
    assert not isinstance(GreedyVerifier(), dk.Observes)


def test_a_hook_name_one_letter_off_warns(target):
    class Typo(FixedLength):
        def obsrve(self, state, round):  # meant: observe
            pass

        def slect_rows(self, rows):  # meant: select_rows
            pass

        def observer_count(self):  # far from every hook: no warning
            return 0

    with pytest.warns(UserWarning) as record:
        dk.generate(target, [[1, 2]], drafter=NGramDrafter(), policy=Typo(2), max_new_tokens=3)
    messages = sorted(str(w.message) for w in record)
    assert len(messages) == 2
    assert "Typo.obsrve looks like the hook 'observe'" in messages[0]
    assert "Typo.slect_rows looks like the hook 'select_rows'" in messages[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dk.generate(target, [[1, 2]], drafter=NGramDrafter(), policy=FixedLength(2), max_new_tokens=3)
