"""A researcher's component that is subtly wrong is caught, not trusted (reliability round 3): a sampled draft whose
``q`` is no distribution, a verifier whose accepted path is wrong after a first round that accepted nothing, a
component that writes the loop's tensors in place, and a model left training by its owner (decoded in eval mode, its
mode put back). Each case failed silently before: biased samples, wrong tokens, or an error blaming another part."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.errors import ComponentOutputError, ConfigError, ConfigTypeError
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength

PROMPTS = [[5, 6, 7, 7, 7], [1, 2], [9] * 11]


@pytest.fixture(scope="module")
def target():
    return dk.load_model(tiny_llama(0))


@pytest.fixture(scope="module")
def plain(target):
    return dk.generate(target, PROMPTS, max_new_tokens=16, eos_token_id=()).sequences


class Uniform:
    """Draws one token uniformly (not token 0) and reports ``q = scale / V`` (``scale = 1``: nearly the true ``q``,
    which passes), or with the drawn token's mass moved to token 0."""

    def __init__(self, scale: float, zero_at_token: bool = False) -> None:
        self.scale, self.zero_at_token = scale, zero_at_token

    def propose(self, state, budget):
        tokens = torch.randint(1, state.vocab_size, (state.batch_size, 1))  # (token 0 takes the mass moved below)
        q = torch.full((state.batch_size, 1, state.vocab_size), self.scale / state.vocab_size)
        if self.zero_at_token:
            q[:, 0, 0] += q[torch.arange(state.batch_size), 0, tokens[:, 0]]
            q[torch.arange(state.batch_size), 0, tokens[:, 0]] = 0.0
        return dk.Draft.chain(tokens, q=q)


@pytest.mark.parametrize(
    ("drafter", "message"),
    [
        (Uniform(0.02), "Draft.q must be a distribution"),
        (Uniform(float("nan")), "Draft.q must be a distribution"),
        (Uniform(1.0, zero_at_token=True), r"Draft.q must give each drafted token .* \(> 0"),
    ],
)
def test_a_sampled_draft_whose_q_is_no_distribution_is_refused(target, drafter, message):
    """An unnormalised q (a softmax forgotten) biased rejection sampling with no sign (TV 0.057 against 0.009)."""
    with pytest.raises(ComponentOutputError, match=f"Uniform.propose returned a malformed Draft: {message}"):
        dk.generate(target, PROMPTS, drafter=drafter, policy=FixedLength(1), temperature=1.0, seed=0)
    torch.manual_seed(0)
    out = dk.generate(target, PROMPTS, drafter=Uniform(1.0), policy=FixedLength(1), temperature=1.0, seed=0)
    assert out.stats.drafted > 0  # the true q passes


class Oracle:
    """Drafts the target's greedy continuation (``plain``), garbage on the first round (which then accepts nothing)."""

    def __init__(self, plain) -> None:
        self.plain, self.round = plain, 0

    def propose(self, state, budget):
        self.round += 1
        rows = []
        for row, length, prompt in zip(state.rows.tolist(), state.host_lengths, state.prompt_lengths.tolist()):
            done = length - prompt
            cont = (self.plain[row][done : done + budget.max_len] + [0] * budget.max_len)[: budget.max_len]
            rows.append(cont if self.round > 1 else [(t + 1) % 128 for t in cont])
        return dk.Draft.chain(torch.tensor(rows), valid=budget.mask())


class NoPath:
    """Greedy verification with the right counts but an accepted path never filled in."""

    accepts = frozenset(dk.DraftKind)
    lossless = True

    def verify(self, draft, logits, sampling, generator):
        best = logits.argmax(-1)
        num = ((best[:, : draft.num_nodes] == draft.tokens) & draft.valid).long().cumprod(1).sum(1)
        return dk.Verdict(torch.full_like(draft.tokens, -1), num, best.gather(1, num[:, None])[:, 0])


def test_a_wrong_path_after_a_first_verdict_that_accepted_nothing_is_refused(target, plain):
    """The first non-empty verdict is checked where it is made; it accepted nothing, so its path said nothing. The
    later ones are checked on the device and read when the call ends: the call raises instead of returning wrong
    tokens (it returned them)."""
    with pytest.raises(ComponentOutputError, match=r"NoPath.verify \(round \d+; its output is not returned\) .*path"):
        dk.generate(target, PROMPTS, Oracle(plain), NoPath(), FixedLength(3), max_new_tokens=16, eos_token_id=())
    right = dk.generate(target, PROMPTS, Oracle(plain), None, FixedLength(3), max_new_tokens=16, eos_token_id=())
    assert right.sequences == plain and right.stats.accepted > 0  # the same drafts, verified right


class Writes:
    """A drafter (with the n-gram drafter's drafts), policy or verifier that writes ``write(state, draft)``."""

    def __init__(self, write) -> None:
        self.write, self.inner, self.verifier = write, dk.build("drafter", "ngram"), dk.build("verifier", "greedy")
        self.policy = FixedLength(3)

    def propose(self, state, budget):
        draft = self.inner.propose(state, budget)
        self.write(state, None)
        return draft

    def plan(self, state):
        self.write(state, None)
        return self.policy.plan(state)

    accepts, lossless = frozenset(dk.DraftKind), True

    def verify(self, draft, logits, sampling, generator):
        self.write(None, draft)
        return self.verifier.verify(draft, logits, sampling, generator)


@pytest.mark.parametrize(
    ("role", "write", "message"),
    [
        ("drafter", lambda s, d: s.lengths.add_(1), r"Writes.propose changed state.lengths in place"),
        ("policy", lambda s, d: setattr(s, "lengths", s.lengths - 1), r"Writes.plan changed state.lengths"),
        ("verifier", lambda s, d: d and d.tokens.zero_(), r"Writes.verify changed draft.tokens in place"),
    ],
)
def test_a_component_that_writes_the_loops_tensors_is_named(target, role, write, message):
    """They gave wrong tokens in silence, a bare assert in the cache, or a NoProgressError blaming the verifier."""
    component = Writes(lambda s, d: write(s, d) if (s is None) == (role == "verifier") else None)
    parts = {
        "drafter": dict(drafter=component),
        "policy": dict(drafter=dk.build("drafter", "ngram"), policy=component),
        "verifier": dict(drafter=dk.build("drafter", "ngram"), verifier=component),
    }[role]
    with pytest.raises(ComponentOutputError, match=message):
        dk.generate(target, [[5, 6, 7, 5, 6, 7, 5, 6]], max_new_tokens=12, eos_token_id=(), **parts)


def test_a_model_left_training_decodes_in_eval_mode_and_stays_training():
    """Evaluating inside a training loop: the first call's wrapping put the model in eval mode for good, and after
    the owner's next train() greedy calls ran with dropout (three calls, three outputs)."""
    hf = tiny_llama(0, attention_dropout=0.5)
    model = dk.load_model(hf)
    first = dk.generate(model, PROMPTS, max_new_tokens=8, eos_token_id=()).sequences
    hf.train()
    again = [dk.generate(model, PROMPTS, max_new_tokens=8, eos_token_id=()).sequences for _ in range(2)]
    assert again == [first, first]
    assert hf.training and all(m.training for m in hf.modules())
    assert dk.dlm.generate(dk.dlm.load_model(model, mask_token_id=127), [[1, 2]], gen_length=4, block_length=4, steps=4)
    assert hf.training


def test_stats_count_the_accepted_tokens_a_round_committed(target):
    """A round that accepted 10 drafted tokens but ended at an end of sequence after 2 reported 10 accepted and a
    mean acceptance length of 11 for 3 generated tokens."""
    full = dk.generate(target, [[1, 2]], max_new_tokens=30, eos_token_id=()).sequences[0]
    drafter, policy = dk.drafters.ModelDrafter(target), FixedLength(10)  # the target drafts itself: all accepted
    out = dk.generate(target, [[1, 2]], drafter, policy=policy, max_new_tokens=30, eos_token_id=full[2])
    assert out.sequences == [full[:3]] and out.stats.accepted == 2 and out.stats.mean_acceptance_length == 3.0


def test_top_k_at_temperature_zero_warns_that_it_changes_nothing(target):
    with pytest.warns(UserWarning, match="at temperature 0 .* they change nothing"):
        dk.generate(target, PROMPTS[:1], max_new_tokens=2, top_k=5)


@pytest.mark.parametrize(
    ("name", "kwargs", "layers", "message"),
    [
        ("layer_skip", {}, 2, "3 layers or more"),
        ("early_exit", {}, 1, "2 layers or more"),
        ("dynamic_exit", {"exit_layers": [1]}, 1, "DynamicExitDrafter .* 2 layers or more"),
        ("dynamic_exit", {"exit_layers": [1, 5]}, 2, r"exit_layers=\[1, 5\] must all be below the target's 2 layers"),
    ],
)
def test_self_drafting_on_too_shallow_a_target_says_so(name, kwargs, layers, message):
    """A Cholesky error deep in the layer search, "pick 1..0", and a check of the loop's naming ``hidden_layers``."""
    shallow = dk.load_model(tiny_llama(0, layers=layers))
    with pytest.raises(dk.errors.ConfigError, match=message):
        dk.generate(shallow, PROMPTS[:1], drafter=dk.build("drafter", name, **kwargs), max_new_tokens=4)


class Observer(FixedLength):
    def observe(self, round):  # the loop calls observe(state, round)
        pass


class Selector(FixedLength):
    def select_rows(self):  # the loop calls select_rows(rows), when the first row finishes
        pass


class Proposer:
    def propose(self, state):  # the loop calls propose(state, budget)
        return dk.Draft.empty(state.batch_size)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        (dict(policy=Observer(2)), r"Observer.observe cannot be called as the loop calls it, observe\(state, round\)"),
        (dict(policy=Selector(2)), r"Selector.select_rows cannot be called .* select_rows\(rows\)"),
        (dict(drafter=Proposer()), r"Proposer.propose cannot be called .* propose\(state, budget\)"),
    ],
)
def test_a_hook_that_cannot_take_the_loops_arguments_is_refused_when_the_call_starts(target, parts, message):
    """A bare TypeError after the prefill (or when the first row finished, deep into a long run) before."""
    parts = {"drafter": dk.build("drafter", "ngram"), **parts}
    with pytest.raises(dk.errors.ConfigTypeError, match=message):
        dk.generate(target, PROMPTS, max_new_tokens=4, **parts)


@pytest.mark.parametrize(
    ("candidate", "error", "message"),
    [([200], ConfigError, r"candidates\[0\] holds 200, outside"), ("abc", ConfigTypeError, "got the string 'abc'")],
)
def test_first_divergence_refuses_ids_it_cannot_read(target, candidate, error, message):
    """An IndexError or torch's TypeError before."""
    with pytest.raises(error, match=message):
        dk.first_divergence(target, [1, 2, 3], [5, 6], candidate)
