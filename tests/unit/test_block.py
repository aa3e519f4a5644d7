"""Block verification is lossless (exact enumeration of one step, then the whole loop by sampling), never accepts
less than token-wise rejection, and reproduces the paper's binary example; a deliberately biased variant fails."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

import decodekit as dk
import decodekit.verifiers.block as block
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.policies import FixedLength
from decodekit.verifiers import BlockVerifier
from tests.unit.test_lossless import assert_matches, models, sample_counts  # noqa: F401  (models: a fixture)

V = 3


@functools.cache
def _row(seed: int, temperature: float, prefix: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash((seed, prefix)) % 2**31)
    return (torch.randn(V, generator=g, dtype=torch.float64) * 1.5 / temperature).softmax(-1)


def table(seed: int, temperature: float = 1.0):
    """A context-dependent distribution ``f(prefix) -> [V]`` (fp64), from a hash of the prefix; each row is computed
    once per process (the enumerations ask for the same prefixes many times), so callers must not change it in
    place."""
    return functools.partial(_row, seed, temperature)


def one_hot(f):
    return lambda prefix: torch.nn.functional.one_hot(f(prefix).argmax(), V).double()


def output_law(p, q, gamma: int, plan=block.block_plan) -> dict[tuple[int, ...], float]:
    """Exact law of the first ``gamma + 1`` output tokens of one block-verification step, shorter outputs
    extended by the target ``p``."""
    law: dict[tuple[int, ...], float] = {}

    def extend(prefix, mass):
        if len(prefix) == gamma + 1:
            law[prefix] = law.get(prefix, 0.0) + mass
            return
        for y, py in enumerate(p(prefix).tolist()):
            if py > 0:
                extend((*prefix, y), mass * py)

    for x in itertools.product(range(V), repeat=gamma):
        qs = torch.stack([q(x[:i]) for i in range(gamma)])  # [γ, V]
        mass = float(torch.prod(qs[torch.arange(gamma), torch.tensor(x)]))
        if mass == 0:
            continue
        ps = torch.stack([p(x[:i]) for i in range(gamma + 1)])  # [γ + 1, V]
        h, a = plan(ps[None], qs[None], torch.tensor([x]), torch.tensor([gamma]))
        h, a = h[0].tolist(), a[0]
        for tau in range(gamma + 1):
            prob = (h[tau] if tau else 1.0) * float(torch.prod(1 - torch.tensor(h[tau + 1 :], dtype=torch.float64)))
            if prob <= 0:
                continue
            if tau == gamma:
                nxt = ps[gamma]
            else:
                nxt = (a[tau] * ps[tau] - qs[tau]).clamp(min=0)
                nxt = nxt / nxt.sum() if nxt.sum() > 0 else ps[tau]
            for y, py in enumerate(nxt.tolist()):
                if py > 0:
                    extend((*x[:tau], y), mass * prob * py)
    return law


def target_law(p, length: int) -> dict[tuple[int, ...], float]:
    law = {}
    for z in itertools.product(range(V), repeat=length):
        law[z] = float(torch.prod(torch.stack([p(z[:i])[z[i]] for i in range(length)])))
    return law


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


CASES = {
    "sampled": lambda: (table(1), table(2)),
    "sampled-T0.7": lambda: (table(1, 0.7), table(2, 0.7)),
    "argmax draft": lambda: (table(3), one_hot(table(4))),
    "p = q": lambda: (table(5), table(5)),
    "greedy target": lambda: (one_hot(table(6)), table(7)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_one_step_is_exactly_the_target(case, gamma):
    p, q = CASES[case]()
    assert tv(output_law(p, q, gamma), target_law(p, gamma + 1)) < 1e-9


def test_using_the_previous_ratio_in_the_residual_is_detected():
    """Negative control (verifiers.md §8 T3): the residual with ``a_{i-1}`` in place of ``a_i``."""

    def shifted(p, q, tokens, lengths):
        h, a = block.block_plan(p, q, tokens, lengths)
        return h, torch.cat([a[:, :1], a[:, :-1]], 1)

    p, q = table(2), table(12)  # a draft where the block may stop mid-way with a_i < a_{i-1} (exact: noise ~1e-16)
    assert tv(output_law(p, q, 3, plan=shifted), target_law(p, 4)) > 1e-3
    assert tv(output_law(p, q, 3), target_law(p, 4)) < 1e-9


def test_the_papers_binary_example():
    """p = (1/3, 2/3), q = (2/3, 1/3) at every position, γ = 2: expected accepted tokens 11/9 (token-wise: 10/9)."""
    p = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    q = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    expected_block = expected_sps = 0.0
    for x in itertools.product(range(2), repeat=2):
        mass = float(q[x[0]] * q[x[1]])
        h, _ = block.block_plan(p.expand(1, 3, 2), q.expand(1, 2, 2), torch.tensor([x]), torch.tensor([2]))
        h = h[0].tolist()
        expected_block += mass * sum(i * h[i] * _after(h, i) for i in (1, 2))  # E[τ] = Σ i P(τ = i)
        r = [min(1.0, float(p[t] / q[t])) for t in x]
        expected_sps += mass * (r[0] + r[0] * r[1])
    assert expected_block == pytest.approx(11 / 9) and expected_sps == pytest.approx(10 / 9)


def _after(h: list[float], i: int) -> float:
    out = 1.0
    for j in range(i + 1, len(h)):
        out *= 1 - h[j]
    return out


# ------------------------------------------------------------------------------------------- the whole loop
@pytest.mark.parametrize("setting", ["T1", "T0.7-p0.9"])
def test_block_verification_in_the_loop_is_lossless(models, setting):  # noqa: F811
    target, draft = models
    counts, stats = sample_counts(target, ModelDrafter(draft), BlockVerifier(), FixedLength(2), setting, seed=31)
    assert_matches(target, counts, setting)
    assert 0.05 < stats.draft_acceptance_rate < 0.95
    assert stats.drafted >= 2 * sum(int(c.sum()) for c in counts)  # every row's first round verified a block of 2


def test_block_verification_is_greedy_at_temperature_0(target, ragged_prompts):
    plain = dk.generate(target, ragged_prompts, max_new_tokens=24, eos_token_id=())
    for drafter in (NGramDrafter(), ModelDrafter(target)):
        out = dk.generate(target, ragged_prompts, drafter, BlockVerifier(), max_new_tokens=24, eos_token_id=())
        assert out.sequences == plain.sequences
