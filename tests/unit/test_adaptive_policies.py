"""GammaTune(+), the entropy stops (SVIP, AdaEDL) and DSDE's KL-stability length: rules on synthetic traces, the KL
read from the round record, and greedy equality with plain decoding."""

from __future__ import annotations

import math

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.errors import ConfigError
from decodekit.models.tiny import perturbed
from decodekit.policies import AdaEDL, EntropyStop, GammaTune, GammaTunePlus, KLDStability, Stack
from decodekit.registry import build
from decodekit.verifiers import GreedyVerifier
from tests.unit.traces import chain_round, dummy_state

NAN = float("nan")


def _step(index: int, probs: list[list[float]]) -> dk.DraftStep:
    p = torch.tensor(probs)
    tokens = p.argmax(-1)
    return dk.DraftStep(index, tokens, p.gather(1, tokens[:, None])[:, 0], p)


def test_gammatune_trace():
    """A fully accepted round jumps to a + 2 (the smoothed length untouched); a rejection falls back to
    ceil(0.7 g + 0.3 a); rows that drafted nothing keep both."""
    policy, state = GammaTune(), dummy_state(3)
    policy.begin(state)
    smoothed, lengths = [], []
    for drafted, accepted in [([3, 3, 0], [3, 1, 0]), ([5, 3, 0], [5, 3, 0]), ([7, 5, 0], [0, 2, 0])]:
        assert policy.plan(state).lengths.tolist()[:2] == drafted[:2]
        policy.observe(state, chain_round(drafted, accepted))
        smoothed.append(policy.smoothed.tolist())
        lengths.append(policy.plan(state).lengths.tolist())
    assert smoothed == [pytest.approx(g) for g in ([3, 2.4, 3], [3, 2.4, 3], [2.1, 0.7 * 2.4 + 0.6, 3])]
    assert lengths == [[5, 3, 3], [7, 5, 3], [3, 3, 3]]
    for _ in range(5):  # the jump is capped at max_len = 10
        policy.observe(state, chain_round([10, 0, 0], [10, 0, 0], width=10))
    assert policy.plan(state).lengths.tolist() == [10, 3, 3]
    policy.select_rows(torch.tensor([1]))
    assert policy.smoothed.tolist() == pytest.approx([0.7 * 2.4 + 0.6])


def test_gammatune_counts_a_tree_as_fully_accepted_at_its_deepest_node():
    policy, state = GammaTune(initial=2, nodes_per_depth=2), dummy_state(1)
    policy.begin(state)
    budget = policy.plan(state)
    assert budget.nodes.tolist() == [4] and budget.depth.tolist() == [2]
    tree = dk.Draft.tree(torch.zeros(1, 4, dtype=torch.long), torch.tensor([[-1, -1, 0, 1]]), torch.ones(1, 4).bool())
    verdict = dk.Verdict(torch.tensor([[0, 2, -1, -1]]), torch.tensor([2]), torch.tensor([0]))
    policy.observe(state, dk.Round(0, tree, verdict, verdict.accepted, torch.tensor([3])))
    assert policy.plan(state).depth.tolist() == [4]  # depth 2 accepted in full: 2 + jump


def test_gammatune_plus_gates_on_the_top1_probability():
    budget = GammaTunePlus(max_len=6).plan(dummy_state(2))
    assert budget.node_bound == 3 and GammaTune().plan(dummy_state(2)).stop is None  # the longest k, not max_len
    assert budget.stop(_step(0, [[0.9, 0.1], [0.35, 0.65]])).tolist() == [False, False]
    assert budget.stop(_step(1, [[0.39, 0.3, 0.31], [0.5, 0.5, 0.0]])).tolist() == [True, False]
    sampled = dk.DraftStep(0, torch.tensor([1]), torch.tensor([0.1]), torch.tensor([[0.9, 0.1]]))
    assert budget.stop(sampled).tolist() == [False]  # an unlikely sample from a confident drafter goes on


def test_svip_stops_above_0_6_nats():
    """SVIP's rule: stop once sqrt(0.15 H) > 0.3, i.e. H > 0.6 nats (the token drafted is kept)."""
    rule = EntropyStop().plan(dummy_state(3)).stop
    probs = [[1.0, 0.0, 0.0], [0.85, 0.15, 0.0], [0.5, 0.5, 0.0]]  # H = 0, 0.42, 0.69 nats
    assert rule(_step(0, probs)).tolist() == [False, False, True]
    assert EntropyStop(min_len=2).plan(dummy_state(3)).stop(_step(0, probs)).tolist() == [False] * 3


def test_adaedl_threshold_steers_acceptance_to_its_target():
    """A row accepting above the target (0.9) lowers its threshold (drafts longer), one below raises it (stops
    sooner), by 0.001 a round; rows that drafted nothing keep theirs."""
    policy, state = EntropyStop(scale=0.2, threshold=0.5, adaptive=True), dummy_state(3)
    policy.begin(state)
    policy.observe(state, chain_round([4, 4, 0], [4, 0, 0]))
    assert policy.rate.tolist() == pytest.approx([0.95, 0.45, 0.9])
    assert policy.lam.tolist() == pytest.approx([0.499, 0.501, 0.5])
    for _ in range(99):
        policy.observe(state, chain_round([4, 4, 0], [4, 0, 0]))
    assert policy.lam.tolist() == pytest.approx([0.4, 0.6, 0.5], abs=1e-5)
    uniform4 = [[0.25] * 4] * 3  # bound 1 - sqrt(0.2 ln 4) = 0.47
    assert policy.plan(state).stop(_step(0, uniform4)).tolist() == [False, True, True]
    policy.select_rows(torch.tensor([0]))
    assert policy.plan(dummy_state(1)).stop(_step(0, uniform4[:1])).tolist() == [False]


def test_entropy_stop_needs_the_distribution():
    rule = EntropyStop().plan(dummy_state(1)).stop
    with pytest.raises(ConfigError, match="DraftStep.probs"):
        rule(dk.DraftStep(0, torch.tensor([1]), torch.tensor([0.5])))


def test_kld_buffer_keeps_the_last_window_of_round_kl_values():
    """The policy stores exactly Round.kl's values (it never recomputes a KL), the newest ``long`` per row."""
    policy, state = KLDStability(short=2, long=4, batch_cap=None), dummy_state(2)
    policy.begin(state)
    policy.observe(state, chain_round([3, 1], [1, 0], width=3, kl=torch.tensor([[1.0, 2, 3], [7, NAN, NAN]])))
    policy.observe(state, chain_round([2, 0], [2, 0], width=3, kl=torch.tensor([[4.0, 5, NAN], [NAN] * 3])))
    assert policy.kl[0].tolist() == [2, 3, 4, 5]
    assert policy.kl[1, 0].item() == 7 and policy.kl[1, 1:].isnan().all()
    with pytest.raises(ConfigError, match="Round.kl"):
        policy.observe(state, chain_round([1, 1], [0, 0]))


def _weighted_var(values: list[float], decay: float) -> tuple[float, float]:
    """Mean and variance of ``values`` (oldest first) with weights ``decay ** age``."""
    w = torch.tensor([decay ** (len(values) - 1 - i) for i in range(len(values))], dtype=torch.float64)
    x = torch.tensor(values, dtype=torch.float64)
    mean = float((w * x).sum() / w.sum())
    return mean, float((w * (x - mean) ** 2).sum() / w.sum())


def test_kld_calibrates_sl_max_then_maps_kl_stability_to_lengths():
    """SL_max from the calibration rounds; then SL = (1 - SF * WVIR) (SL_max - SL_min) + SL_min, SF from the recent
    mean KL, WVIR the short over the long weighted variance; SL_min once SF * WVIR > 1."""
    policy, state = KLDStability(max_len=10, initial=4, calibration=2, short=3, long=6, batch_cap=None), dummy_state(3)
    policy.begin(state)
    calib = torch.tensor([[0.1, 0.1, 0.1, 0.1], [0.0, 0.2, 0.0, 0.2], [0.3, 0.1, NAN, NAN]])
    for _ in range(2):
        assert policy.plan(state).lengths.tolist() == [4, 4, 4]  # calibrating
        policy.observe(state, chain_round([4, 4, 2], [4, 1, 0], width=4, kl=calib))
    mean = float(calib.nan_to_num(0).sum() / calib.isfinite().sum())
    assert policy.sl_max.item() == round(4 * (1 + mean / 0.3))  # most accepted 4, largest KL 0.3
    steady = [0.02] * 6
    growing = [0.01, 0.01, 0.01, 0.02, 0.2, 0.01]
    far = [2.0, 2.1, 2.0, 2.1, 2.0, 2.1]
    policy.kl = torch.tensor([steady, growing, far])
    expected = []
    for row in (steady, growing, far):
        mean, var_short = _weighted_var(row[-3:], 0.85)
        var_long = _weighted_var(row, 0.85)[1]
        x = math.expm1(2 * mean) * (var_short / var_long if var_long else 0.0)
        sl = round((1 - x) * (policy.sl_max.item() - 2) + 2) if x <= 1 else 2
        expected.append(sl)
    assert policy.plan(state).lengths.tolist() == expected
    assert expected[0] == policy.sl_max.item() and expected[2] == 2 and 2 < expected[1] < expected[0]
    policy.batch_cap = "mean"
    capped = policy.plan(state)
    assert capped.lengths.tolist() == [min(k, math.ceil(sum(expected) / 3)) for k in expected]
    assert capped.node_bound == max(capped.lengths.tolist())  # a draft model runs the longest row's steps, no more


def test_a_draft_model_runs_the_longest_rows_steps_not_max_len(target):
    """An adaptive policy's budget bounds the drafter's steps by the longest row's length: GammaTune starts at
    k = 3 with max_len = 8, so the first round's draft model is called 3 times (the catch-up, then 2 more steps)."""
    calls: list[int] = []

    class Counting(ModelDrafter):
        def propose(self, state, budget):
            extend, count = self.model.extend, [0]

            def counted(*args, **kwargs):
                count[0] += 1
                return extend(*args, **kwargs)

            self.model.extend = counted
            try:
                return super().propose(state, budget)
            finally:
                del self.model.extend
                calls.append(count[0])

    dk.generate(
        target, [[1, 2, 3]], Counting(perturbed(target, 0.3, seed=1)), policy=GammaTune(max_len=8), max_new_tokens=12
    )
    assert calls[0] == 3


def test_bad_arguments():
    with pytest.raises(ConfigError, match="initial"):
        GammaTune(initial=20, max_len=8)
    with pytest.raises(ConfigError, match="eta"):
        GammaTune(eta=0.0)
    with pytest.raises(ConfigError, match="long"):
        KLDStability(short=10, long=5)
    with pytest.raises(ConfigError, match="batch_cap"):
        KLDStability(batch_cap="median")
    with pytest.raises(ConfigError, match="min_len"):
        EntropyStop(min_len=5, max_len=4)


class KLSpy(KLDStability):
    """Records whether the loop handed it the round's KL."""

    rounds_with_kl = 0

    def observe(self, state, round):
        self.rounds_with_kl += int(round.kl is not None and bool(round.kl.isfinite().any()))
        super().observe(state, round)


POLICIES = {
    "gammatune": lambda: GammaTune(initial=2, max_len=6),
    "gammatune_plus": lambda: GammaTunePlus(max_len=6),
    "entropy_stop": lambda: EntropyStop(max_len=6),
    "adaedl": lambda: AdaEDL(max_len=6),
    "kld_stability": lambda: KLSpy(max_len=6, calibration=2),
    "stack": lambda: Stack(KLDStability(max_len=6), EntropyStop(adaptive=True), batch_cap=0.5),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_greedy_equals_plain_decoding(target, ragged_prompts, name):
    policy = POLICIES[name]()
    reference = dk.generate(target, ragged_prompts, max_new_tokens=16, eos_token_id=()).sequences
    drafter = ModelDrafter(perturbed(target, 0.3, seed=1))
    out = dk.generate(target, ragged_prompts, drafter, GreedyVerifier(), policy, max_new_tokens=16, eos_token_id=())
    assert out.sequences == reference and out.stats.drafted > 0
    if isinstance(policy, KLSpy):
        assert policy.rounds_with_kl > 0


def test_chain_only_rules_leave_model_free_drafters_at_max_len(target, ragged_prompts):
    reference = dk.generate(target, ragged_prompts, max_new_tokens=12, eos_token_id=()).sequences
    for policy in (EntropyStop(max_len=3), KLDStability(max_len=3, initial=3)):
        out = dk.generate(target, ragged_prompts, NGramDrafter(), policy=policy, max_new_tokens=12, eos_token_id=())
        assert out.sequences == reference


def test_registered_names_build():
    for name in ("gammatune", "gammatune_plus", "kld_stability", "entropy_stop"):
        assert build("policy", name).plan(dummy_state(2)).nodes.shape == (2,)
