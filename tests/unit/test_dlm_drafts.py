"""Self-speculative drafts for the diffusion sampler: lossless (the output is the undrafted sampler's, token for
token, greedy and seeded sampling, every rule, both caches that run drafts), fewer forwards, and refused where
they cannot run."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

import decodekit as dk
from decodekit.dlm import DLMState, SlotLogits
from decodekit.dlm.drafts.calibrate import forwards, greedy_graph
from decodekit.errors import ConfigError
from tests.unit.dlm_common import MASK, dense, peaked_llama

PROMPTS = [[5, 9, 14, 2], [33, 7], [1, 2, 3, 4, 5, 6, 7]]
CACHES = {
    "recompute": lambda: None,
    "recompute_block_causal": lambda: dk.dlm.Recompute(block_causal=True),
    "block_causal": dk.dlm.BlockCausalCache,
}


@pytest.fixture(scope="module")
def hf():
    return peaked_llama()


def run(model, draft=None, cache="recompute", **kwargs):
    settings = dict(gen_length=12, block_length=6, steps=12, seed=[4, 5, 6]) | kwargs
    return dk.dlm.generate(model, PROMPTS, cache=CACHES[cache](), draft=draft, **settings)


def make_rule(name: str, model, **kwargs):
    """The rule ``name``; EoTStop ends a text at the token the base writes second in row 0 (the tiny model declares
    no end-of-sequence id), so that it fires."""
    if name != "eot_stop":
        return dk.build("dlm_rule", name)
    return dk.dlm.EoTStop(eot_token_ids=run(model, **kwargs).sequences[0][1])


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("rule", ["llada", "random_order", "threshold", "factor", "local_leap", "prophet", "eot_stop"])
def test_drafted_sampler_is_the_sampler_token_for_token(hf, shift, cache, temperature, rule):
    """With drafts, every row's output equals the undrafted run's (per-row seeds: the same draws), and the steps are
    the same ones; only the forwards fall, one per step at most. Every registered rule."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    kwargs = dict(cache=cache, temperature=temperature)
    made = make_rule(rule, model, **kwargs)  # (EoTStop's token found once)
    plain = run(model, rule=copy.deepcopy(made), **kwargs)
    drafted = run(model, dk.dlm.SpiffyDrafts(depth=3), rule=copy.deepcopy(made), **kwargs)
    assert drafted.sequences == plain.sequences
    assert drafted.stats.block_steps == plain.stats.block_steps and plain.stats.nfe == sum(plain.stats.block_steps)
    assert drafted.stats.nfe <= plain.stats.nfe and sum(drafted.stats.row_nfe) <= sum(plain.stats.row_nfe)


class Lockstep:
    """A rule's steps without its ``per_row_steps``: the loop keeps the batch's rows in step."""

    def __init__(self, rule):
        self.rule = rule

    def begin_block(self, state):
        self.rule.begin_block(state) if hasattr(self.rule, "begin_block") else None

    def select(self, state, proposal, eligible):
        return self.rule.select(state, proposal, eligible)


@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("rule", ["llada", "random_order", "threshold", "eot_stop"])
def test_each_row_takes_the_forwards_it_takes_alone(hf, cache, temperature, rule):
    """With a rule that declares ``per_row_steps``, a row goes on stepping on the drafts it reached while its batch
    mates wait for the next forward: its output and its forwards (``row_nfe``) are those it has alone. Kept in step
    (``Lockstep``), the same rows give the same output with more forwards: a forward's steps end for all when one
    row leaves its drafts."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    kwargs = dict(cache=cache, temperature=temperature)
    made = make_rule(rule, model, **kwargs)  # (EoTStop's token found once)
    rule_for = lambda: copy.deepcopy(made)  # noqa: E731 - a fresh rule for each run
    assert rule_for().per_row_steps
    batch = run(model, dk.dlm.SpiffyDrafts(), rule=rule_for(), **kwargs)
    settings = dict(gen_length=12, block_length=6, steps=12, temperature=temperature)
    alone = [
        dk.dlm.generate(
            model, [p], cache=CACHES[cache](), draft=dk.dlm.SpiffyDrafts(), rule=rule_for(), seed=[s], **settings
        )
        for p, s in zip(PROMPTS, [4, 5, 6])
    ]
    assert batch.sequences == [a.sequences[0] for a in alone]
    assert batch.stats.row_nfe == [a.stats.nfe for a in alone]
    lockstep = run(model, dk.dlm.SpiffyDrafts(), rule=Lockstep(rule_for()), **kwargs)
    assert lockstep.sequences == batch.sequences
    assert sum(lockstep.stats.row_nfe) > sum(batch.stats.row_nfe)


@pytest.mark.parametrize("cache", list(CACHES))
def test_drafts_save_forwards_on_a_peaked_model(hf, cache):
    """LLaDA's one-token-a-step sampler: drafts take fewer forwards, and the graph over 3 candidates no more than
    the single most confident candidate (the drafts are accepted, not only checked)."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    plain = run(model, cache=cache)
    one, graph = (run(model, dk.dlm.SpiffyDrafts(width=w, depth=w), cache=cache) for w in (1, 3))
    assert one.sequences == graph.sequences == plain.sequences
    assert graph.stats.nfe <= one.stats.nfe < plain.stats.nfe == 12
    assert graph.stats.tokens_per_forward > 1.0


def test_a_loop_that_skipped_verification_would_fail_the_equality_test(hf, monkeypatch):
    """The equality test can fail: a loop that took the first draft's output without checking that the steps
    reached its canvas gives another output."""
    drafting = importlib.import_module("decodekit.dlm.drafting")
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    plain = run(model)

    def first_draft(state, variants):  # as if every row always reached the first draft
        return torch.ones(state.batch_size, dtype=torch.long), [True] * state.batch_size

    monkeypatch.setattr(drafting, "on_graph", first_draft)
    unchecked = run(model, dk.dlm.SpiffyDrafts(depth=3))
    assert unchecked.sequences != plain.sequences


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("name", ["recompute", "recompute_block_causal", "block_causal"])
def test_logits_many_equal_each_canvas_alone(hf, shift, name):
    """One forward over several canvases (the block side by side in the sequence for the block-causal cache, rows
    for recompute) gives each canvas the logits a forward of it alone gives."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    state = DLMState.from_prompts(PROMPTS, 8, MASK, total_steps=4, generator=None, device="cpu")
    state.block_length, state.block = 4, (4, 8)
    state.commit(torch.arange(8).expand(3, 8) < 4, torch.full((3, 8), 11))  # the first block done
    canvases = [state.canvas]
    for slot, token in ((5, 20), (7, 3)):
        slots = torch.zeros(3, 8, dtype=torch.bool)
        slots[:, slot] = True
        next_ = DLMState.from_prompts(PROMPTS, 8, MASK, total_steps=4, generator=None, device="cpu")
        next_.canvas = canvases[-1].clone()
        next_.commit(slots, torch.full((3, 8), token))
        canvases.append(next_.canvas)
    cache = CACHES[name]() or dk.dlm.Recompute()
    many = cache.logits_many(model, state, torch.stack(canvases))
    if isinstance(many, SlotLogits):  # [N, B, W, V] from slot lo
        many = [SlotLogits(window, many.lo) for window in many.logits]
    for canvas, got in zip(canvases, many):
        alone = CACHES[name]() or dk.dlm.Recompute()
        state.canvas = canvas
        want = dense(alone.logits(model, state))
        torch.testing.assert_close(dense(got)[:, 4:], want[:, 4:], atol=1e-4, rtol=1e-4)


def test_drafted_rows_do_not_depend_on_their_batch_mates(hf):
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    kwargs = dict(gen_length=8, block_length=4, steps=8, temperature=0.8, draft=dk.dlm.SpiffyDrafts())
    batch = dk.dlm.generate(model, PROMPTS, seed=[11, 12, 13], cache=dk.dlm.BlockCausalCache(), **kwargs).sequences
    for b, prompt in enumerate(PROMPTS):
        alone = dk.dlm.generate(model, [prompt], seed=[11 + b], cache=dk.dlm.BlockCausalCache(), **kwargs)
        assert alone.sequences[0] == batch[b]


def test_drafts_are_refused_where_they_cannot_run(hf):
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    draft = dk.dlm.SpiffyDrafts()
    with pytest.raises(ConfigError, match="logits_many"):
        dk.dlm.generate(model, PROMPTS, gen_length=8, block_length=4, steps=8, cache=dk.dlm.PrefixCache(), draft=draft)
    with pytest.raises(ConfigError, match="fixed block"):
        dk.dlm.generate(model, PROMPTS, gen_length=8, block_length=4, steps=8, schedule=dk.dlm.AdaBlock(), draft=draft)
    with pytest.raises(ConfigError, match="guidance"):
        dk.dlm.generate(model, PROMPTS, gen_length=8, block_length=4, steps=8, cfg_scale=1.0, draft=draft)
    with pytest.raises(ConfigError, match="depth"):
        dk.dlm.SpiffyDrafts(depth=0)
    with pytest.raises(ConfigError, match="at most width"):
        dk.dlm.SpiffyDrafts(width=2, depth=3)
    with pytest.raises(ConfigError, match="draft"):
        dk.dlm.generate(model, PROMPTS, gen_length=8, block_length=4, steps=8, draft=3)
    with pytest.raises(ConfigError, match="not both"):
        dk.dlm.SpiffyDrafts(width=3, graph=[[0]])
    with pytest.raises(ConfigError, match="smollm2-135m-bdlm"):  # the message lists the calibrated graphs
        dk.dlm.SpiffyDrafts(graph="no-such-model")
    with pytest.raises(ConfigError, match="budget takes"):
        dk.dlm.SpiffyDrafts(budget=3)
    for bad, message in (
        ([[0], [0]], "each node once"),
        ([[]], "non-empty"),
        ([[0, 0]], "distinct"),
        ([[0, [0, 1]]], "distinct"),  # one slot, two tokens
        ([[[0, -1]]], "j >= 0"),
        ([[[0, 1, 2]]], "pair"),
        ([[True]], "ranks"),
        ([["a"]], "ranks"),
    ):
        with pytest.raises(ConfigError, match=message):
            dk.dlm.SpiffyDrafts(graph=bad)


def test_a_graph_names_the_sets_it_drafts(hf):
    """``graph=`` drafts exactly the sets it lists: the full graph over 3 candidates is the default's (same
    forwards), a graph of the first candidate alone is the chain, and any graph is lossless."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    full = [[0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2]]
    default, listed = run(model, dk.dlm.SpiffyDrafts()), run(model, dk.dlm.SpiffyDrafts(graph=full))
    assert listed.sequences == default.sequences and listed.stats.nfe == default.stats.nfe
    chain = run(model, dk.dlm.SpiffyDrafts(width=1, depth=1))
    assert run(model, dk.dlm.SpiffyDrafts(graph=[[0]])).stats.nfe == chain.stats.nfe
    named = dk.dlm.SpiffyDrafts(graph="smollm2-135m-bdlm", budget=7)  # the zoo's calibration, first 7 picks
    assert set(named.nodes) == set(dk.dlm.SpiffyDrafts().nodes)  # for LLaDA's rule they are the default graph
    assert len(dk.dlm.SpiffyDrafts(graph="smollm2-135m-bdlm").nodes) == 31
    odd = run(model, dk.dlm.SpiffyDrafts(graph=[[2], [1, 3]]))
    assert odd.sequences == run(model).sequences


def test_calibration_replays_the_drafted_loop_and_picks_what_saves_forwards():
    """The replay counts the forwards the loop takes: per block, one for the first step, then one per step plus the
    walk's nodes the graph holds. Each greedy pick saves the most forwards; a node after one the graph lacks saves
    none, and a pick that saves nothing is not made."""
    block = [((0,), (0, 1)), ((0,),), ((1,), (1, 2)), ((2,),), ()]  # walks from a block's first 5 of 6 steps
    assert forwards([block], set()) == 6
    assert forwards([block], {(0,)}) == 5  # steps 0 | 1, 2 | 3 | 4 | 5
    assert forwards([block], {(0,), (0, 1)}) == 4  # steps 0 | 1, 2, 3 | 4 | 5
    assert forwards([block], {(1, 2)}) == 6  # (1, 2) is never reached without (1,)
    result = greedy_graph([block, block], budget=5)
    assert result.forwards[0] == result.steps == 12
    assert result.graph[:2] == [(0,), (1,)]  # then (1,) and (0, 1) each save 2: the smaller set wins the tie
    assert result.graph[2] == (1, 2) and result.forwards == [12, 10, 8, 6]
    # (0, 1) would now cost a forward: its walk ends at step 3, past step 2, whose walk the graph follows to the end
    assert forwards([block], {(0,), (1,), (1, 2), (0, 1)}) == 4 > forwards([block], {(0,), (1,), (1, 2)}) == 3
    assert result.forwards == sorted(result.forwards, reverse=True)
    assert len(set(result.forwards)) == len(result.forwards)  # every pick saved forwards


def test_calibrated_graph_is_lossless_and_drafts_what_the_walks_reached(hf):
    """Calibration records the undrafted sampler's steps and picks reachable sets; drafting with them changes no
    token and saves forwards on the prompts it was calibrated on."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    settings = dict(gen_length=12, block_length=6, steps=12, seed=[4, 5, 6], cache=dk.dlm.BlockCausalCache())
    found = dk.dlm.calibrate_graph(model, PROMPTS, budget=3, width=4, depth=3, progress=False, **settings)
    assert 1 <= len(found.graph) <= 3 and found.steps > 0
    assert found.forwards[0] == found.steps and found.forwards == sorted(found.forwards, reverse=True)
    plain = dk.dlm.generate(model, PROMPTS, **settings)
    drafted = dk.dlm.generate(model, PROMPTS, draft=dk.dlm.SpiffyDrafts(graph=found.graph), **settings)
    assert drafted.sequences == plain.sequences and drafted.stats.nfe < plain.stats.nfe
    assert sum(drafted.stats.row_nfe) == found.forwards[-1]  # the replay counts the forwards the loop takes


def test_best_budget_trades_forwards_saved_against_each_canvas_cost():
    """The budget minimises the predicted time forwards[k] * (1 + cost * k): all nodes when canvases are free, fewer
    as they cost more, none when no draft pays; a negative or non-numeric cost is refused."""
    found = dk.dlm.drafts.Calibration(graph=[(0,), (1,), (0, 1)], forwards=[100, 60, 50, 48], steps=100)
    assert found.best_budget(0.0) == 3  # free canvases: every node
    assert found.best_budget(0.1) == 2  # 60 * 1.1 = 66, 50 * 1.2 = 60, 48 * 1.3 = 62.4
    assert found.best_budget(0.6) == 1  # 60 * 1.6 = 96 < 100 < 50 * 2.2
    assert found.best_budget(1.0) == 0  # 60 * 2 = 120 > 100: drafting does not pay
    with pytest.raises(ConfigError, match="canvas_cost"):
        found.best_budget(-0.1)


def test_canvas_cost_prices_a_drafted_forward_on_this_device(hf):
    """canvas_cost runs the sampler with and without the drafts and returns the extra time per drafted canvas, a
    non-negative fraction of a forward; the drafts it prices are checked like SpiffyDrafts' own."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    settings = dict(gen_length=12, block_length=6, steps=12, cache=dk.dlm.BlockCausalCache())
    cost = dk.dlm.canvas_cost(model, PROMPTS[:1], graph=[[0], [0, 1], [1]], repeats=1, **settings)
    assert isinstance(cost, float) and 0.0 <= cost < 100.0
    with pytest.raises(ConfigError, match="graph"):
        dk.dlm.canvas_cost(model, PROMPTS[:1], graph=[[]], **settings)
    with pytest.raises(ConfigError, match="repeats"):
        dk.dlm.canvas_cost(model, PROMPTS[:1], graph=[[0]], repeats=0, **settings)


def test_candidates_offer_the_next_most_likely_tokens():
    """A candidate's alternatives are the most likely tokens after its proposed one, by the step's logits (also when
    the proposed token was sampled and is not the argmax), most likely first."""
    from types import SimpleNamespace

    from decodekit.dlm.drafts.spiffy import candidates

    logits = torch.tensor([[[0.0, 3.0, 1.0, 2.0, -1.0], [4.0, 0.5, 0.0, 2.5, 3.0], [1.0, 1.0, 5.0, 0.0, 2.0]]])
    proposal = dk.dlm.Proposal(
        tokens=torch.tensor([[1, 3, 2]]), confidence=torch.tensor([[0.5, 0.2, 0.9]]), logits=logits
    )
    state = SimpleNamespace(masked=torch.tensor([[True, True, False]]), in_block=torch.ones(1, 3, dtype=torch.bool))
    ranked, usable, tokens = candidates(state, proposal, width=2, alternatives=2)
    assert ranked.tolist() == [[0, 1]] and usable.tolist() == [[True, True]]  # slot 2 is committed
    assert tokens.tolist() == [[[1, 3, 2], [3, 0, 4]]]  # slot 1's proposal (3) was sampled: 0 and 4 are next
    assert candidates(state, proposal, width=2)[2].tolist() == [[[1], [3]]]


def test_alternative_tokens_in_a_graph_are_lossless_and_replayed_exactly(hf):
    """A graph whose nodes draft candidates with other tokens (pairs [r, j]) changes no token; calibrating with
    alternatives picks such nodes where the walks need them, and the replay still counts the loop's forwards."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    settings = dict(gen_length=12, block_length=6, steps=12, seed=[4, 5, 6], cache=dk.dlm.BlockCausalCache())
    plain = dk.dlm.generate(model, PROMPTS, **settings)
    drafts = dk.dlm.SpiffyDrafts(graph=[[0], [[0, 1]], [0, [1, 2]], [[1, 1]]])
    assert drafts.alternatives == 2 and drafts.nodes[1] == ((0, 1),) and (drafts.width, drafts.depth) == (2, 2)
    assert dk.dlm.generate(model, PROMPTS, draft=drafts, **settings).sequences == plain.sequences
    every = dk.dlm.SpiffyDrafts(width=3, depth=2, alternatives=1)  # each set of up to 2 of 3, each with 2 tokens
    assert len(every.nodes) == 3 * 2 + 3 * 4 and ((0, 1), (2, 0)) in every.nodes
    widened = dk.dlm.generate(model, PROMPTS, draft=every, **settings)
    assert widened.sequences == plain.sequences
    assert widened.stats.nfe <= dk.dlm.generate(model, PROMPTS, draft=dk.dlm.SpiffyDrafts(3, 2), **settings).stats.nfe
    with pytest.raises(ConfigError, match="not both"):
        dk.dlm.SpiffyDrafts(graph=[[0]], alternatives=1)
    found = dk.dlm.calibrate_graph(
        model, PROMPTS, budget=12, width=4, depth=3, alternatives=2, progress=False, **settings
    )
    drafted = dk.dlm.generate(model, PROMPTS, draft=dk.dlm.SpiffyDrafts(graph=found.graph), **settings)
    assert drafted.sequences == plain.sequences
    assert sum(drafted.stats.row_nfe) == found.forwards[-1]
    assert any(isinstance(e, tuple) for node in found.graph for e in node)  # an (r, j) element: another token
    without = dk.dlm.calibrate_graph(model, PROMPTS, budget=12, width=4, depth=3, progress=False, **settings)
    assert found.forwards[-1] < without.forwards[-1]  # here the other tokens reach canvases the proposals miss


@pytest.mark.parametrize("cache", ["recompute", "block_causal"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("rule", ["llada", "threshold"])
@pytest.mark.parametrize("score", ["geometric", "product"])
def test_pruned_drafts_are_lossless_and_run_keep_canvases(hf, cache, temperature, rule, score, monkeypatch):
    """With ``keep``, each forward runs the canvas and ``keep`` drafts (each row its own best-scored nodes) and the
    output is still the undrafted sampler's; keeping every node drafts what the unpruned graph does."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    kwargs = dict(cache=cache, temperature=temperature, rule=dk.build("dlm_rule", rule))
    plain = run(model, **kwargs)
    widths = []
    original = dk.dlm.SpiffyDrafts.variants

    def counted(self, *args):
        out = original(self, *args)
        widths.append(None if out is None else out.shape[0])
        return out

    monkeypatch.setattr(dk.dlm.SpiffyDrafts, "variants", counted)
    pruned = run(model, dk.dlm.SpiffyDrafts(width=4, depth=3, alternatives=1, keep=3, score=score), **kwargs)
    assert pruned.sequences == plain.sequences
    assert max(w for w in widths if w is not None) == 4  # the canvas and 3 drafts (fewer where fewer nodes fit)
    full = run(model, dk.dlm.SpiffyDrafts(width=3, depth=2), **kwargs)
    every = run(model, dk.dlm.SpiffyDrafts(width=3, depth=2, keep=6), **kwargs)
    assert every.sequences == plain.sequences and every.stats.nfe == full.stats.nfe


def test_pruning_scores_nodes_by_geometric_means_and_keeps_each_rows_best():
    """A node's local score is the geometric mean of its tokens' probabilities; a node with children takes the
    geometric mean of that and its best child's score. Each row drafts its own top nodes, committed on its canvas."""
    from types import SimpleNamespace

    # row 0: a sure first candidate; row 1: its first candidate's two likeliest tokens are close, so drafting the
    # other one ([0, 1]) outscores the pair of candidates
    logits = torch.tensor([[[4.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.5]], [[3.0, 2.96, 0.0], [0.0, 0.5, 0.2],
                           [0.0, 0.1, 0.0]]])  # fmt: skip
    probs = logits.softmax(-1)
    proposal = dk.dlm.Proposal(tokens=logits.argmax(-1), confidence=probs.amax(-1), logits=logits)
    state = SimpleNamespace(
        masked=torch.ones(2, 3, dtype=torch.bool),
        in_block=torch.ones(2, 3, dtype=torch.bool),
        canvas=torch.tensor([[7, MASK, MASK, MASK], [7, MASK, MASK, MASK]]),
        slots=torch.tensor([[1, 2, 3], [1, 2, 3]]),
        batch_size=2,
        device=torch.device("cpu"),
        lookahead=None,
    )
    drafts = dk.dlm.SpiffyDrafts(graph=[[0], [1], [0, 1], [[0, 1]]], keep=2)
    from decodekit.dlm.drafts.spiffy import candidates

    ranked, usable, tokens = candidates(state, proposal, drafts.width, drafts.alternatives)
    graph = drafts._graph(state.device)
    score = drafts.scores(proposal, ranked, usable, tokens, graph, torch.ones(len(drafts.nodes), dtype=torch.bool))
    for b in range(2):
        top = probs[b].amax(-1)[ranked[b]]  # the candidates' proposed tokens' probabilities, most confident first
        other = probs[b, ranked[b, 0]].sort(descending=True).values[1]  # candidate 0's next most likely token
        pair = (top[0] * top[1]).sqrt()
        expected = {((0, 0),): (top[0] * pair).sqrt(), ((1, 0),): (top[1] * pair).sqrt(), ((0, 0), (1, 0)): pair,
                    ((0, 1),): other}  # fmt: skip
        for i, node in enumerate(drafts.nodes):
            assert score[b, i].item() == pytest.approx(expected[node].item(), rel=1e-5), (b, node)
    out = drafts.variants(state, proposal, torch.zeros(2, 3, dtype=torch.bool), left=3)
    assert out.shape == (3, 2, 4) and torch.equal(out[0], state.canvas)
    for b in range(2):
        best = score[b].topk(2).indices.tolist()
        for k, i in enumerate(best):
            expected_canvas = state.canvas[b].clone()
            for r, j in drafts.nodes[i]:
                expected_canvas[1 + ranked[b, r]] = tokens[b, r, j]
            assert torch.equal(out[1 + k, b], expected_canvas), (b, k)
    assert score[0].topk(2).indices.tolist() != score[1].topk(2).indices.tolist()  # each row kept its own nodes
    product = dk.dlm.SpiffyDrafts(graph=[[0], [1], [0, 1], [[0, 1]]], keep=2, score="product")
    by_product = product.scores(proposal, ranked, usable, tokens, graph, torch.ones(4, dtype=torch.bool))
    for b in range(2):
        top = probs[b].amax(-1)[ranked[b]]
        other = probs[b, ranked[b, 0]].sort(descending=True).values[1]
        expected = {((0, 0),): top[0], ((1, 0),): top[1], ((0, 0), (1, 0)): top[0] * top[1], ((0, 1),): other}
        for i, node in enumerate(product.nodes):
            assert by_product[b, i].item() == pytest.approx(expected[node].item(), rel=1e-5), (b, node)
    with pytest.raises(ConfigError, match="keep"):
        dk.dlm.SpiffyDrafts(keep=0)
    with pytest.raises(ConfigError, match="score"):
        dk.dlm.SpiffyDrafts(keep=2, score="mean")
    with pytest.raises(ConfigError, match="keep="):
        dk.dlm.SpiffyDrafts(score="product")
