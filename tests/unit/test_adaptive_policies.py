"""GammaTune(+), the entropy stops (SVIP, AdaEDL) and DSDE's KL-stability length: rules on synthetic traces, the KL
read from the round record, and greedy equality with plain decoding."""

from __future__ import annotations

import math

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.errors import ConfigError
from decodekit.policies import CostModel, EntropyStop, GammaTune, GammaTunePlus, KLDStability, Stack
from decodekit.policies.analytic import best_length, expected_tokens
from decodekit.registry import build
from decodekit.verifiers import GreedyVerifier
from tests.conftest import perturbed
from tests.unit.traces import chain_round, dummy_state

NAN = float("nan")


def _step(index: int, probs: list[list[float]]) -> dk.DraftStep:
    p = torch.tensor(probs)
    tokens = p.argmax(-1)
    return dk.DraftStep(index, tokens, p.gather(1, tokens[:, None])[:, 0], p)


def test_gammatune_trace():
    """Target a + 1 after a fully accepted round, a otherwise; gain 0.6 up, 0.2 down; idle rows keep their length."""
    policy, state = GammaTune(initial=3, up=0.6, down=0.2, max_len=8), dummy_state(3)
    policy.begin(state)
    gammas, lengths = [], []
    for drafted, accepted in [([3, 3, 0], [3, 1, 0]), ([4, 3, 0], [4, 3, 0]), ([4, 3, 0], [0, 2, 0])]:
        assert policy.plan(state).lengths.tolist()[:2] == drafted[:2]
        policy.observe(state, chain_round(drafted, accepted))
        gammas.append(policy.gamma.tolist())
        lengths.append(policy.plan(state).lengths.tolist())
    expected = [[3.6, 2.6, 3.0], [0.4 * 3.6 + 0.6 * 5, 0.4 * 2.6 + 0.6 * 4, 3.0]]
    expected.append([0.8 * expected[1][0], 0.8 * expected[1][1] + 0.2 * 2, 3.0])
    assert gammas == [pytest.approx(g) for g in expected]
    assert lengths == [[4, 3, 3], [4, 3, 3], [4, 3, 3]]
    policy.select_rows(torch.tensor([1]))
    assert policy.gamma.tolist() == pytest.approx([expected[2][1]])


def test_gammatune_counts_a_tree_as_fully_accepted_at_its_deepest_node():
    policy, state = GammaTune(initial=2, up=1.0, down=1.0, nodes_per_depth=2), dummy_state(1)
    policy.begin(state)
    budget = policy.plan(state)
    assert budget.nodes.tolist() == [4] and budget.depth.tolist() == [2]
    tree = dk.Draft.tree(torch.zeros(1, 4, dtype=torch.long), torch.tensor([[-1, -1, 0, 1]]), torch.ones(1, 4).bool())
    verdict = dk.Verdict(torch.tensor([[0, 2, -1, -1]]), torch.tensor([2]), torch.tensor([0]))
    policy.observe(state, dk.Round(0, tree, verdict, verdict.accepted, torch.tensor([3])))
    assert policy.gamma.tolist() == [3.0]  # depth 2 accepted in full: probe one deeper


def test_gammatune_plus_gates_on_confidence():
    budget = GammaTunePlus(max_len=6).plan(dummy_state(2))
    assert budget.node_bound == 6 and GammaTune().plan(dummy_state(2)).stop is None
    assert budget.stop(_step(0, [[0.9, 0.1], [0.35, 0.65]])).tolist() == [False, False]
    assert budget.stop(_step(1, [[0.39, 0.3, 0.31], [0.5, 0.5, 0.0]])).tolist() == [True, False]


def test_svip_stops_above_0_6_nats():
    """SVIP's rule: stop once sqrt(0.15 H) > 0.3, i.e. H > 0.6 nats (the token drafted is kept)."""
    rule = EntropyStop().plan(dummy_state(3)).stop
    probs = [[1.0, 0.0, 0.0], [0.85, 0.15, 0.0], [0.5, 0.5, 0.0]]  # H = 0, 0.42, 0.69 nats
    assert rule(_step(0, probs)).tolist() == [False, False, True]
    assert EntropyStop(min_len=2).plan(dummy_state(3)).stop(_step(0, probs)).tolist() == [False] * 3


def test_adaedl_threshold_follows_acceptance():
    """lambda = EMA(acceptance) - margin per row: a row whose drafts pass stops sooner at the same entropy."""
    policy, state = EntropyStop(scale=0.2, threshold=0.5, adaptive=True), dummy_state(2)
    policy.begin(state)
    policy.observe(state, chain_round([4, 4], [4, 0]))
    assert policy.lam.tolist() == pytest.approx([0.9 * 0.55 + 0.1 - 0.05, 0.9 * 0.55 - 0.05])
    uniform4 = [[0.25] * 4, [0.25] * 4]  # bound 1 - sqrt(0.2 ln 4) = 0.47
    assert policy.plan(state).stop(_step(0, uniform4)).tolist() == [True, False]
    policy.select_rows(torch.tensor([1]))
    assert policy.plan(dummy_state(1)).stop(_step(0, uniform4[:1])).tolist() == [False]


def test_entropy_stop_needs_the_distribution():
    rule = EntropyStop().plan(dummy_state(1)).stop
    with pytest.raises(ConfigError, match="DraftStep.probs"):
        rule(dk.DraftStep(0, torch.tensor([1]), torch.tensor([0.5])))


def test_kld_buffer_keeps_the_last_window_of_round_kl_values():
    """The policy stores exactly Round.kl's values (it never recomputes a KL), the newest ``window`` per row."""
    policy, state = KLDStability(window=4, batch_cap=None), dummy_state(2)
    policy.begin(state)
    policy.observe(state, chain_round([3, 1], [1, 0], width=3, kl=torch.tensor([[1.0, 2, 3], [7, NAN, NAN]])))
    policy.observe(state, chain_round([2, 0], [2, 0], width=3, kl=torch.tensor([[4.0, 5, NAN], [NAN] * 3])))
    assert policy.kl[0].tolist() == [2, 3, 4, 5]
    assert policy.kl[1, 0].item() == 7 and policy.kl[1, 1:].isnan().all()
    var, ready = policy.variance()
    assert ready.tolist() == [True, False] and var[0].item() == pytest.approx(torch.tensor([2.0, 3, 4, 5]).var())
    with pytest.raises(ConfigError, match="Round.kl"):
        policy.observe(state, chain_round([1, 1], [0, 0]))


def test_kld_steady_rows_draft_longer_and_the_batch_cap_holds_stragglers():
    cost = CostModel.relative(0.1, 8, verify_fixed=0.2)
    policy, state = KLDStability(max_len=8, initial=3, sigma0=1.0, costs=cost, batch_cap=None), dummy_state(3)
    policy.begin(state)
    assert policy.plan(state).lengths.tolist() == [3, 3, 3]  # no history yet
    steady = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 6.0, 0.0, 6.0], [1.0, 1.1, 0.9, 1.0]])
    policy.observe(state, chain_round([4, 4, 4], [3, 3, 3], width=4, kl=steady))
    base = best_length(expected_tokens(policy.tracker.alpha, 8), cost)[0].clamp(min=1)
    var = steady.var(1)  # 0, 12, 0.0067
    expected = (base * 2 / (1 + var)).round().clamp(1, 8).long()
    assert policy.plan(state).lengths.tolist() == expected.tolist()
    assert expected[0] > base[0] and expected[1] < base[1]
    policy.batch_cap = "mean"
    k = policy.plan(state).lengths
    assert k.tolist() == expected.clamp(max=math.ceil(expected.double().mean().item())).tolist()
    running = KLDStability(window=4)  # sigma0 = None: the running median of the variances seen
    running.begin(state)
    running.observe(state, chain_round([4, 4, 4], [3, 3, 3], width=4, kl=steady))
    assert running.history.nanmedian().item() == pytest.approx(var.median().item())


def test_bad_arguments():
    with pytest.raises(ConfigError, match="initial"):
        GammaTune(initial=20, max_len=8)
    with pytest.raises(ConfigError, match="up"):
        GammaTune(up=0.0)
    with pytest.raises(ConfigError, match="window"):
        KLDStability(window=1)
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
    "adaedl": lambda: EntropyStop(scale=0.2, threshold=0.5, adaptive=True, max_len=6),
    "kld_stability": lambda: KLSpy(max_len=6, window=8),
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
    for policy in (EntropyStop(max_len=3), KLDStability(max_len=3)):
        out = dk.generate(target, ragged_prompts, NGramDrafter(), policy=policy, max_new_tokens=12, eos_token_id=())
        assert out.sequences == reference


def test_registered_names_build():
    for name in ("gammatune", "gammatune_plus", "kld_stability", "entropy_stop"):
        assert build("policy", name).plan(dummy_state(2)).nodes.shape == (2,)
