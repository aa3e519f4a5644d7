"""The analytic speed model (policies.md section 0), the goodput and batch-size policies built on it, and Stack."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter
from decodekit.errors import ConfigError
from decodekit.models.tiny import perturbed
from decodekit.policies import (
    AcceptanceTracker,
    BatchAwareLength,
    ConfidenceStop,
    CostModel,
    FixedLength,
    GoodputLength,
    HeuristicLength,
    Stack,
    profile_costs,
)
from decodekit.policies.analytic import (
    best_length,
    cost_at,
    expected_tokens,
    expected_tokens_positional,
    oracle_speedup,
)
from decodekit.policies.calibration import ProbePrice
from decodekit.policies.lengths import batch_cap, host_batch_cap
from decodekit.verifiers import GreedyVerifier
from tests.unit.test_host_syncs import Unmirrored
from tests.unit.traces import chain_round, dummy_state


@pytest.mark.parametrize(("alpha", "c", "k", "s"), [(0.8, 0.05, 8, 3.09), (0.8, 0.2, 4, 1.87), (0.6, 0.05, 4, 1.92)])
def test_the_spec_anchors(alpha, c, k, s):
    """policies.md section 0 (v = 1, o = 0): the optimal length and its speedup."""
    best, speed = best_length(expected_tokens(alpha, 32), CostModel.relative(c, 32))
    assert int(best) == k and round(float(speed), 2) == s


def test_expected_tokens():
    e = expected_tokens(torch.tensor([0.0, 0.5, 1.0]), 3)
    assert e.tolist() == [[1, 1, 1, 1], [1, 1.5, 1.75, 1.875], [1, 2, 3, 4]]
    assert expected_tokens_positional([0.5, 0.25]).tolist() == [1, 1.5, 1.75]


def test_no_length_beats_plain_decoding_when_drafts_always_fail():
    """k = 0 is a choice: with alpha = 0 and costly drafts the best is not to speculate (speedup 1)."""
    best, speed = best_length(expected_tokens(0.0, 8), CostModel.relative(0.1, 8))
    assert int(best) == 0 and float(speed) == 1.0


def test_cost_tables_extrapolate_and_interpolate():
    cost = CostModel((0.0, 1.0, 2.0), (10.0, 12.0, 13.0), overhead=1.0)
    assert cost.times(4).tolist() == [11.0, 14.0, 16.0, 18.0, 20.0]  # past the table: +1 draft, +1 verify per token
    big = CostModel((0.0, 3.0, 6.0), (20.0, 22.0, 23.0), overhead=3.0)
    mid = cost_at({1: cost, 9: big}, 5)
    assert mid.verify == (15.0, 17.0, 18.0) and mid.draft == (0.0, 2.0, 4.0) and mid.overhead == 2.0
    assert cost_at({1: cost, 9: big}, 32) is big and cost_at(cost, 7) is cost
    with pytest.raises(ConfigError, match="the same number"):
        CostModel((0.0,), (1.0, 2.0))
    with pytest.raises(ConfigError, match="empty"):
        cost_at({}, 1)


def test_oracle_speedup():
    """Rounds that accepted 2 and 0 tokens, at T(k) = 10 + k: the oracle pays 12 + 10 for 4 tokens (plain: 40)."""
    cost = CostModel((0.0,) * 4, (10.0, 11.0, 12.0, 13.0))
    assert oracle_speedup([2, 0], plain_rounds=1, plain_steps=4, cost=cost) == pytest.approx(40 / 32)


def test_acceptance_tracker_is_the_unbiased_estimate():
    """A round of k=4 accepting 1 tested 2 tokens (1 pass); accepting all 4 tested 4: alpha = 5 / 6 without prior."""
    t = AcceptanceTracker(prior=0.5, weight=1e-9, decay=1.0)
    t.begin(2, torch.device("cpu"))
    t.update(torch.tensor([4, 0]), torch.tensor([1, 0]))
    t.update(torch.tensor([4, 0]), torch.tensor([4, 0]))
    assert t.alpha[0].item() == pytest.approx(5 / 6) and t.alpha[1].item() == pytest.approx(0.5)  # row 1: the prior
    t.select_rows(torch.tensor([1]))
    assert t.alpha.tolist() == pytest.approx([0.5])
    bursty = AcceptanceTracker(weight=1e-9, decay=1.0, positions=4)
    bursty.update(torch.tensor([4]), torch.tensor([4]))
    bursty.update(torch.tensor([4]), torch.tensor([0]))  # position 1: 1 of 2 passed; positions 2-4: 1 of 1
    assert bursty.expected(5).tolist()[0] == pytest.approx([1, 1.5, 2, 2.5, 3, 3 + 0.5 * 0.8])  # past P: alpha = 4/5
    assert expected_tokens(bursty.alpha, 3).tolist()[0][1] == pytest.approx(1.8)
    pooled = AcceptanceTracker(weight=1e-9, decay=1.0)
    pooled.update(torch.tensor([4, 2]), torch.tensor([1, 2]), pooled=True)
    assert pooled.alpha.tolist() == pytest.approx([3 / 4])


def test_goodput_follows_each_rows_acceptance():
    """A row whose drafts always pass gets the longest length, one whose drafts always fail gets 0 once the model
    says nothing can be gained, and probes again after ``probe_every`` idle rounds."""
    cost = CostModel.relative(0.1, 8, verify_fixed=0.2)
    policy, state = GoodputLength(cost, max_len=8, probe_every=3, batch="sum", clock=steady()), dummy_state(2)
    policy.begin(state)
    k = policy.plan(state).lengths
    assert k.tolist() == [2, 2]  # prior 0.5: S(1..3) = 1.15, 1.25, 1.25 (ties: shorter)
    policy.observe(state, chain_round(k.tolist(), [2, 0]))
    for _ in range(6):
        k = policy.plan(state).lengths
        policy.observe(state, chain_round(k.tolist(), [int(k[0]), 0]))
    assert policy.plan(state).lengths.tolist()[0] == 8
    trace = []
    for _ in range(16):
        k = policy.plan(state).lengths
        trace.append(int(k[1]))
        policy.observe(state, chain_round(k.tolist(), [int(k[0]), 0]))
    assert 0 in trace and 1 in trace  # held at 0, then a probe
    policy.select_rows(torch.tensor([0]))
    assert policy.plan(dummy_state(1)).lengths.tolist() == [8]
    slowest = GoodputLength(cost, max_len=8, probe_every=0)  # a static batch ends with its slowest row
    e = torch.stack([expected_tokens(1.0, 8), expected_tokens(0.0, 8)])
    assert slowest.lengths(e, 2).tolist() == [0, 0] and policy.lengths(e, 2).tolist() == [8, 0]


def test_probes_back_off():
    """A row held at 0 probes after 2 idle rounds, then 4, then 8: each probe that changes nothing doubles the wait."""
    policy, state = (
        GoodputLength(CostModel.relative(0.5, 4), max_len=4, probe_every=2, prior=0.0, clock=steady()),
        dummy_state(1),
    )
    policy.begin(state)
    trace = []
    for _ in range(20):
        k = policy.plan(state).lengths
        trace.append(int(k[0]))
        policy.observe(state, chain_round(k.tolist(), [0]))
    assert [i for i, k in enumerate(trace) if k] == [2, 7, 16]  # idle 2, 4, 8 (a probe resets idle)


def test_batch_rows_probe_together():
    """Eight rows held at 0 whose probe waits have drifted apart: in a batch one row's probe costs every row a
    verification position, so due rows wait for the batch's probe round (its own doubling schedule, which the next
    call of the same batch size goes on with) or for a round that drafts anyway. Per-row schedules alone would make
    most rounds probe rounds."""
    policy, state = (
        GoodputLength(CostModel.relative(0.1, 4), max_len=4, probe_every=4, prior=0.0, clock=steady()),
        dummy_state(8),
    )

    def probe_rounds(idle: torch.Tensor) -> tuple[list[int], list[int]]:
        policy.begin(state)
        policy.idle = idle
        rounds, probed = [], []
        for i in range(40):
            k = policy.plan(state).lengths
            if int(k.max()):
                rounds.append(i)
                probed.append(int((k > 0).sum()))
            policy.observe(state, chain_round(k.tolist(), [0] * 8, width=max(int(k.max()), 1)))  # drafts fail
        return rounds, probed

    assert probe_rounds(torch.arange(8)) == ([4, 13, 30], [8, 8, 8])  # drifted rows; quiet 4, 8, 16 rounds
    assert probe_rounds(torch.full((8,), 40)) == ([23], [8])  # the next call: the clock (9 of 32) runs on

    policy.begin(state)  # a round that drafts anyway (row 0 pays) takes every due row's probe at no extra width
    policy.idle = torch.full((8,), 4)
    policy.tracker.expected = lambda max_len: torch.stack(  # type: ignore[method-assign]
        [expected_tokens(1.0 if r == 0 else 0.0, max_len) for r in range(8)]
    )
    policy.tracker.tested[:, 0] = 1.0  # every row has drafted this call: lengths on merit, not on the prior
    policy.batch = "sum"
    assert policy.plan(state).lengths.tolist() == [4] + [1] * 7


def test_a_first_round_on_the_prior_waits_once_probes_have_failed():
    """Seven rows accept every draft and one fails every draft, so at batch 8 the slowest row holds the batch at 0.
    A call's first round drafts on the rows' prior alone: a probe round, not a draft on merit; once probes have
    failed it waits for the probe schedule, whose clock and wait carry to the next call of the same batch size and
    sampling settings (another sampling setting keeps its own)."""
    policy = GoodputLength({8: CostModel.relative(0.1, 8, verify_fixed=0.3)}, max_len=8, probe_every=4, clock=steady())

    def draft_rounds(sampling: dk.SamplingParams | None = None) -> list[int]:
        state = dummy_state(8, sampling)
        policy.begin(state)
        found = []
        for i in range(40):
            k = policy.plan(state).lengths
            if int(k.max()):
                found.append(i)
            accepted = k.tolist()[:7] + [0]
            policy.observe(state, chain_round(k.tolist(), accepted, width=max(int(k.max()), 1)))
        return found

    assert draft_rounds() == [0, 9, 26]  # the prior's round, then probes after 8 and 16 quiet rounds
    assert draft_rounds() == [19]  # 13 quiet rounds at the end of the last call + 19 = the wait of 32
    assert draft_rounds() == []  # the next wait is 64 rounds
    assert draft_rounds(dk.SamplingParams(temperature=0.8)) == [0, 9, 26]


def steady() -> Callable[[], float]:
    """A fake clock on which every round takes one second (probes cost nothing over a plain round)."""
    ticks = itertools.count()
    return lambda: float(next(ticks))


def test_probes_are_priced_by_their_measured_time():
    """Eight rows that fail every draft. When a probe round takes 4x a plain round (a draft model catching up over
    every token since it last drafted), ``probe_share=0.1`` makes the wait after it at least 3 / 0.1 = 30 rounds
    rather than the doubled 8; at the price of a plain round the doubling schedule is unchanged (4, 8, 16 quiet
    rounds). The schedule carries to the next calls of the same kind."""

    def draft_rounds(probe_cost: float, calls: int = 1) -> tuple[list[int], int]:
        now = [0.0]
        policy = GoodputLength(
            {8: CostModel.relative(0.1, 8)}, max_len=8, probe_every=4, prior=0.0, probe_share=0.1,
            clock=lambda: now[0],
        )  # fmt: skip
        state, found = dummy_state(8), []
        for _ in range(calls):
            policy.begin(state)
            for i in range(40):
                k = policy.plan(state).lengths
                now[0] += probe_cost if int(k.max()) else 1.0
                if int(k.max()):
                    found.append(i)
                policy.observe(state, chain_round(k.tolist(), [0] * 8, width=max(int(k.max()), 1)))
        return found, policy.probes.wait

    assert draft_rounds(1.0) == ([4, 13, 30], 32)
    assert draft_rounds(4.0) == ([4, 35], 60)  # priced 30 after the first probe; the second doubles past its price
    assert draft_rounds(4.0, calls=3) == ([4, 35, 16], 120)  # the clock runs on: 4 + 40 + 16 quiet rounds = 60


def test_probe_price():
    """Plain rounds of 1 s, a probe round of 4 s: 3 plain rounds of excess, at share 0.1 a wait of 30 rounds (at most
    ``cap``). A probe before any plain round was timed, or an open round across a new call, is not priced; the plain
    time is kept per kind of call."""
    now = [0.0]
    price = ProbePrice(share=0.1, clock=lambda: now[0], cap=40)
    price.begin("a kind of call")
    assert price.lap(plain=False, probe=True) == 0
    now[0] += 4.0
    assert price.lap(plain=True, probe=False) == 0  # closes a probe, but no plain time yet
    for _ in range(3):
        now[0] += 1.0
        assert price.lap(plain=now[0] < 7.0, probe=now[0] == 7.0) == 0
    now[0] += 4.0
    assert price.lap(plain=True, probe=False) == 30 and price.plain_s == 1.0
    now[0] += 1.0
    assert price.lap(plain=False, probe=True) == 0  # a plain round of 1 s closed; a probe opened
    now[0] += 11.0
    assert price.lap(plain=False, probe=True) == 40  # 10 plain rounds of excess: 100 rounds, capped at 40
    now[0] += 100.0  # the open probe round spans the call's end: forgotten
    price.begin("a kind of call")
    assert price.lap(plain=True, probe=False) == 0 and price.plain_s == 1.0  # the kind's plain time carries over
    price.begin("another kind")
    assert price.plain_s is None
    with pytest.raises(ConfigError, match="probe_share"):
        ProbePrice(share=0.0)


def test_batch_aware_keeps_one_estimate_per_sampling_setting():
    policy, greedy = BatchAwareLength(CostModel.relative(0.05, 8), max_len=8), dummy_state(1)
    policy.begin(greedy)
    for _ in range(20):
        policy.observe(greedy, chain_round([8], [8]))
    assert policy.tracker.alpha.item() > 0.9
    policy.begin(dummy_state(1, dk.SamplingParams(temperature=0.8)))
    assert policy.tracker.alpha.item() == 0.5
    policy.begin(greedy)
    assert policy.tracker.alpha.item() > 0.9


def test_goodput_at_batch_size_uses_the_batch_costs():
    """The same acceptance, two batch sizes: verification cheap at 1 and costly at 8 (compute-bound)."""
    costs = {1: CostModel.relative(0.0, 8), 8: CostModel.relative(0.0, 8, verify_step=1.0)}
    alpha = torch.full((8,), 0.6, dtype=torch.float64)
    policy = GoodputLength(costs, max_len=8)
    e = expected_tokens(alpha, 8)
    assert policy.lengths(e[:1], 1).tolist() == [8] and policy.lengths(e, 8).tolist() == [0] * 8
    table = BatchAwareLength(costs, alpha=0.6).table(0.6, [1, 8])
    assert table == {1: 8, 8: 0}


def test_batch_aware_switches_off_at_large_batch():
    costs = {1: CostModel.relative(0.1, 8, verify_fixed=0.1), 8: CostModel.relative(0.1, 8, verify_fixed=0.9)}
    policy = BatchAwareLength(costs, alpha=0.5)
    assert policy.plan(dummy_state(1)).lengths.tolist() == [2]  # S(1..3) = 1.25, 1.35, 1.34
    assert policy.plan(dummy_state(8)).lengths.tolist() == [0] * 8


def test_optimistic_rate_shrinks_to_the_estimate():
    """The Wilson upper end is above the estimate, near 1 with no evidence, and closes in as tests accumulate."""
    t = AcceptanceTracker(prior=0.5, decay=1.0)
    t.begin(1, torch.device("cpu"))
    uppers = [t.upper().item()]
    for _ in range(3):
        for _ in range(10):
            t.update(torch.tensor([4]), torch.tensor([1]))  # 1 of 2 tested passes
        uppers.append(t.upper().item())
    assert uppers[0] > 0.9 and all(a > b for a, b in zip(uppers, uppers[1:]))
    assert t.alpha.item() < uppers[-1] < t.alpha.item() + 0.2


def test_batch_aware_stops_probing_where_drafting_cannot_pay():
    """At batch 8 drafting pays only at a high acceptance (verification nearly doubles the round); failing probes
    make the pooled estimate confidently low, so the probes stop (gated by could_pay), while with the gate forced
    open they go on at the doubling wait, which runs on into the next call of the same kind."""
    costs = {8: CostModel.relative(0.2, 8, verify_fixed=0.9)}

    def probes(policy: BatchAwareLength, calls: int, rounds: int = 40) -> list[int]:
        found, state = [], dummy_state(8)
        for _ in range(calls):
            policy.begin(state)
            for i in range(rounds):
                k = policy.plan(state).lengths
                if int(k.max()):
                    found.append(i)
                drafted = chain_round(k.tolist(), [0] * 8, width=int(k.max()))  # every draft fails
                policy.observe(state, drafted)
        return found

    gated = probes(BatchAwareLength(costs, probe_every=4, clock=steady()), calls=3)
    assert gated == [4]  # one probe of 8 failing rows: confidently below break-even, in this call and the next
    always = BatchAwareLength(costs, probe_every=4, clock=steady())
    always.begin(dummy_state(8))  # the pooled tracker of this sampling setting, kept by the calls below
    always.tracker.upper = lambda z=2.0: torch.ones(1, dtype=torch.float64)  # type: ignore[method-assign]
    assert probes(always, calls=3) == [4, 13, 30, 23]  # idle 4, 8, 16, then 32 (9 + 23); 64 (16 + 40) not reached


@pytest.mark.parametrize("batch_cap", [None, "mean", 0.0, 0.3, 0.5, 1.0])
def test_stack_mirrors_its_mirrored_parts(batch_cap):
    """A stack of parts with host mirrors has mirrors too, equal to its tensors (so the loop needs no read); a part
    without mirrors leaves the stack without them, with the same budget."""
    state = dummy_state(4)

    def heuristic():
        policy = HeuristicLength(initial=6, max_len=8)
        policy.begin(state)
        policy.lengths = torch.tensor([1, 2, 8, 5])
        return policy

    def goodput():
        return GoodputLength(CostModel.relative(0.2, 8), nodes_per_depth=3)

    fixed, tree = (lambda: FixedLength(6)), (lambda: FixedLength(12, depth=4))
    for makers in [(fixed, heuristic), (tree, goodput), (heuristic, goodput)]:
        budget = Stack(*(make() for make in makers), batch_cap=batch_cap).plan(state)
        assert budget.host_nodes == tuple(budget.nodes.tolist())
        assert budget.host_depth == (None if budget.depth is None else tuple(budget.depth.tolist()))
        budget.check(4, state.device, source="stack", values=True)
        parts = [make() for make in makers] + [Unmirrored(FixedLength(8))]
        unmirrored = Stack(*parts, batch_cap=batch_cap).plan(state)
        assert unmirrored.host_nodes is None and unmirrored.nodes.tolist() == budget.nodes.tolist()
        assert unmirrored.depth_or_nodes.tolist() == budget.depth_or_nodes.tolist()


def test_host_batch_cap_equals_batch_cap():
    """The host copy of the straggler cap gives the tensor rule's cap, quantiles' rounding included."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        lengths = torch.randint(0, 13, (int(torch.randint(1, 10, (1,), generator=generator)),), generator=generator)
        for how in (None, "max", "mean", 0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 0.9, 1.0):
            cap = batch_cap(lengths, how)
            assert host_batch_cap(lengths.tolist(), how) == (None if cap is None else int(cap)), (lengths, how)


def test_stack_takes_the_least_and_caps_the_batch():
    heuristic = HeuristicLength(initial=6, max_len=8)
    stack = Stack(FixedLength(4), heuristic, ConfidenceStop(0.5, max_len=8))
    state = dummy_state(3)
    stack.begin(state)
    budget = stack.plan(state)
    assert budget.lengths.tolist() == [4, 4, 4] and budget.stop is not None and budget.node_bound == 4
    heuristic.lengths = torch.tensor([1, 2, 8])
    assert Stack(heuristic, batch_cap="mean").plan(state).lengths.tolist() == [1, 2, 4]
    assert Stack(heuristic, batch_cap=0.0).plan(state).lengths.tolist() == [1, 1, 1]
    tree = Stack(FixedLength(12, depth=4), GoodputLength(CostModel.relative(0.2, 8), nodes_per_depth=3))
    b = tree.plan(state)
    assert b.nodes.tolist() == [3, 3, 3] and b.depth.tolist() == [
        1,
        1,
        1,
    ]  # goodput at the prior: depth 1 (S = 1.25 at 1 and 2)
    stack.select_rows(torch.tensor([2]))
    assert heuristic.lengths.tolist() == [8]
    with pytest.raises(ConfigError, match="at least one policy"):
        Stack()
    with pytest.raises(ConfigError, match="batch_cap"):
        Stack(FixedLength(2), batch_cap="median")
    with pytest.raises(ConfigError, match="Stack's part 1 must implement the LengthPolicy protocol"):
        Stack(FixedLength(2), "fixed")


def test_bad_arguments():
    with pytest.raises(ConfigError, match="max_len"):
        GoodputLength(max_len=0)
    with pytest.raises(ConfigError, match="alpha"):
        BatchAwareLength(alpha=1.5)
    with pytest.raises(ConfigError, match="nodes_per_depth"):
        GoodputLength(nodes_per_depth=0)


@pytest.mark.parametrize("name", ["goodput", "batch_aware", "stack"])
def test_greedy_equals_plain_decoding(target, ragged_prompts, name):
    cost = CostModel.relative(0.05, 6)
    policy = {
        "goodput": GoodputLength(cost, max_len=6),
        "batch_aware": BatchAwareLength(cost, max_len=6),
        "stack": Stack(GoodputLength(cost, max_len=6), ConfidenceStop(0.3), batch_cap="mean"),
    }[name]
    reference = dk.generate(target, ragged_prompts, max_new_tokens=16, eos_token_id=()).sequences
    drafter = ModelDrafter(perturbed(target, 0.3, seed=1))
    out = dk.generate(target, ragged_prompts, drafter, GreedyVerifier(), policy, max_new_tokens=16, eos_token_id=())
    assert out.sequences == reference and out.stats.drafted > 0


def test_profile_costs_measures_every_length(target, ragged_prompts):
    costs = profile_costs(target, ModelDrafter(perturbed(target, 0.3, seed=1)), ragged_prompts, 3, (1, 2), 8, False)
    with pytest.raises(ConfigError, match="new_tokens"):
        profile_costs(target, None, ragged_prompts, max_len=8, new_tokens=12)
    assert sorted(costs) == [1, 2]
    for cost in costs.values():
        assert len(cost.verify) == 4 and all(cost.draft[0] < t for t in cost.draft[1:])
    alone = profile_costs(target, None, ragged_prompts, 3, (1,), 8, False)[1]  # the target alone: drafting free
    assert alone.draft == (0.0,) * 4 and all(t > 0 for t in alone.verify)


def test_the_benchmark_reports_the_oracle_column(target, ragged_prompts):
    """With free drafting and verification the oracle bound is the tokens per round the method realised (batch 1:
    each round costs T(0), the oracle pays one per round); the report gets the oracle and rejected-token columns."""
    from decodekit.bench.methods import Method
    from decodekit.bench.report import markdown
    from decodekit.bench.runner import run_benchmark

    free = {1: CostModel((0.0,) * 5, (1.0,) * 5)}
    drafter = ModelDrafter(perturbed(target, 0.3, seed=1))
    methods = [Method("ar"), Method("draft", drafter, GreedyVerifier(), FixedLength(4), costs=free)]
    results = run_benchmark(target, ragged_prompts[:2], methods, max_new_tokens=12, passes=1, progress=False, reruns=0)
    ar, spec = results
    steps = sum(len(s) - 1 for s in spec.sequences)
    assert ar.oracle is None and spec.oracle == pytest.approx(steps / spec.stats.rounds)
    assert sum(spec.stats.round_max_accepted) == spec.stats.num_drafts  # batch 1: one row per round
    table = markdown(results)
    assert "| oracle | rejected / token |" in table
    rejected = (spec.stats.drafted - spec.stats.accepted) / steps
    assert f"| {spec.oracle:.2f}x | {rejected:.2f} |" in table


def test_measured_costs_come_from_the_benchmark():
    """costs="measured": no cost model until the benchmark hands over its profile of the drafter (Stack parts too)."""
    from decodekit.policies.analytic import use_measured_costs, wants_measured_costs

    goodput = GoodputLength(costs="measured", max_len=4)
    with pytest.raises(ConfigError, match="oracle=<max_len>"):
        goodput.plan(dummy_state(1))
    stack = Stack(goodput, ConfidenceStop())
    assert wants_measured_costs(stack) and not wants_measured_costs(GoodputLength()) and not wants_measured_costs(None)
    use_measured_costs(stack, {1: CostModel.relative(0.0, 4)})
    assert goodput.plan(dummy_state(1)).lengths.tolist() == [4]  # free drafts, flat verification: the longest
    with pytest.raises(ConfigError, match="'measured'"):
        BatchAwareLength(costs="profiled")


@pytest.mark.parametrize("name", ["goodput", "batch_aware"])
def test_calibration_learns_that_drafting_rounds_cost_more_than_modelled(name):
    """Drafts always pass, and the model says drafting 8 pays 4.5x; but measured drafting rounds take 5x the modelled
    time (undrafted ones as modelled): the calibrated policy stops drafting (k = 0), the uncalibrated one goes on."""
    cost = CostModel.relative(0.1, 8, verify_fixed=0.2)

    def run(calibrate: bool, factor: float = 5.0) -> list[int]:
        if name == "goodput":
            policy = GoodputLength(cost, max_len=8, calibrate=calibrate, prior=0.9)
        else:
            policy = BatchAwareLength(cost, alpha=0.9, max_len=8, calibrate=calibrate)
        state, now = dummy_state(1), [0.0]
        if calibrate:
            policy.probes.timer.clock = lambda: now[0]
        policy.begin(state)
        trace = []
        for _ in range(12):
            k = int(policy.plan(state).lengths[0])
            trace.append(k)
            now[0] += float(cost.round_time(k)) * (factor if k else 1.0) * 0.05  # 50 ms a modelled step
            policy.observe(state, chain_round([k], [k], width=max(k, 1)))
        return trace

    calibrated, plain = run(True), run(False)
    assert plain[-1] == 8 and calibrated[:2] == [0, 8] and calibrated[-1] == 0
    assert run(True, factor=1.0)[1:] == [8] * 11  # the model was right: calibration changes nothing
