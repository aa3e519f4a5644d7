"""Drafts that look ahead into the next block (decodekit/dlm/lookahead.py): a row that finishes its block on a drafted
canvas takes the next block's first step on that canvas's output. Lossless (the output is the undrafted sampler's),
fewer forwards, each row's forwards those it takes alone, the next block's logits those its own first forward gives,
and the replay counts the forwards the loop takes."""

from __future__ import annotations

import importlib

import pytest
import torch

import decodekit as dk
from decodekit.dlm import DLMState, SlotLogits
from decodekit.dlm.drafts.calibrate import forwards
from decodekit.dlm.state import restrict
from tests.unit.dlm_common import MASK, peaked_llama
from tests.unit.test_dlm_drafts import CACHES, PROMPTS, run


def dense(logits) -> torch.Tensor:
    """``[B, 12, V]`` of a cache's step, whichever form it returned."""
    return dk.dlm.dense_logits(logits, 12)


@pytest.fixture(scope="module")
def hf():
    return peaked_llama()


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("cache", list(CACHES))
def test_looking_ahead_saves_forwards_and_changes_no_token(hf, shift, cache):
    """Over LLaDA's rule and the threshold rule, greedy and sampled: the same tokens as the undrafted sampler and as
    drafts that stop at the block's end, and fewer forwards than the latter."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    ahead = stopped = 0
    for rule in ("llada", "threshold"):
        for temperature in (0.0, 0.8):
            kwargs = dict(cache=cache, temperature=temperature, rule=dk.build("dlm_rule", rule))
            plain = run(model, **kwargs)
            on = run(model, dk.dlm.SpiffyDrafts(), **kwargs)
            off = run(model, dk.dlm.SpiffyDrafts(lookahead=False), **kwargs)
            assert on.sequences == off.sequences == plain.sequences
            assert on.stats.block_steps == plain.stats.block_steps
            ahead, stopped = ahead + sum(on.stats.row_nfe), stopped + sum(off.stats.row_nfe)
    assert ahead < stopped


@pytest.mark.parametrize("cache", list(CACHES))
def test_a_row_looks_ahead_as_it_does_alone(hf, cache):
    """In a batch, a row that finished its block on a drafted canvas keeps the next block's logits until the batch
    gets there: its forwards (``row_nfe``) and tokens are those it has alone."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    settings = dict(gen_length=12, block_length=6, steps=12, rule=dk.build("dlm_rule", "threshold"))
    batch = run(model, dk.dlm.SpiffyDrafts(), cache=cache, rule=settings["rule"])
    alone = [
        dk.dlm.generate(model, [p], cache=CACHES[cache](), draft=dk.dlm.SpiffyDrafts(), seed=[s], **settings)
        for p, s in zip(PROMPTS, [4, 5, 6])
    ]
    assert batch.sequences == [a.sequences[0] for a in alone]
    assert batch.stats.row_nfe == [a.stats.nfe for a in alone]


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("name", list(CACHES))
def test_a_lookahead_forward_gives_the_next_blocks_first_step(hf, shift, name):
    """With ``state.lookahead``, each canvas's logits of its block are those without it, and a finished canvas's
    logits of the next block are those the next block's first forward computes on it."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    state = DLMState.from_prompts(PROMPTS, 12, MASK, total_steps=6, generator=None, device="cpu")
    state.block_length, state.block = 4, (4, 8)
    state.commit(torch.arange(12).expand(3, 12) < 4, torch.full((3, 12), 11))  # the first block done
    finished = state.canvas.clone()
    finished[torch.arange(3)[:, None], state.slots[:, 4:8]] = torch.tensor([20, 3, 9, 14])
    canvases = torch.stack([state.canvas, finished])
    cache = CACHES[name]() or dk.dlm.Recompute()
    state.lookahead = (8, 12)
    many = cache.logits_many(model, state, canvases)
    state.lookahead = None
    many = [SlotLogits(w, many.lo) for w in many.logits] if isinstance(many, SlotLogits) else list(many)
    for canvas, got in zip(canvases, many):
        state.canvas = canvas
        want = dense((CACHES[name]() or dk.dlm.Recompute()).logits(model, state))
        torch.testing.assert_close(dense(restrict(got, 4, 8))[:, 4:8], want[:, 4:8], atol=1e-4, rtol=1e-4)
    state.canvas, state.block = finished, (8, 12)
    first = dense((CACHES[name]() or dk.dlm.Recompute()).logits(model, state))
    torch.testing.assert_close(dense(restrict(many[1], 8, 12))[:, 8:], first[:, 8:], atol=1e-4, rtol=1e-4)


def test_a_loop_that_kept_the_wrong_canvas_would_fail_the_equality_test(hf, monkeypatch):
    """The equality tests can fail: keeping, for the next block, the output of the canvas the forward started from
    instead of the finished one a row reached gives other tokens."""
    lookahead = importlib.import_module("decodekit.dlm.lookahead")
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    plain = run(model)
    original = lookahead.NextBlock.keep

    def keep_first_canvas(self, state, outputs, node, rows):
        original(self, state, outputs, torch.zeros_like(node), rows)

    monkeypatch.setattr(lookahead.NextBlock, "keep", keep_first_canvas)
    assert run(model, dk.dlm.SpiffyDrafts()).sequences != plain.sequences


def test_looking_ahead_needs_the_cache_and_the_schedule_to_support_it(hf):
    """A cache without ``lookahead`` (or a fixed-block schedule without ``next_block``) keeps the drafts inside the
    block: the forwards of ``lookahead=False``, the same tokens."""

    class NoLookahead(dk.dlm.Recompute):
        lookahead = False

    class NoNextBlock(dk.dlm.FixedBlocks):
        next_block = None

    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    off, on = run(model, dk.dlm.SpiffyDrafts(lookahead=False)), run(model, dk.dlm.SpiffyDrafts())
    settings = dict(gen_length=12, block_length=6, steps=12, seed=[4, 5, 6], draft=dk.dlm.SpiffyDrafts())
    for cache, schedule in ((NoLookahead(), None), (dk.dlm.Recompute(), NoNextBlock())):
        got = dk.dlm.generate(model, PROMPTS, cache=cache, schedule=schedule, **settings)
        assert got.sequences == on.sequences and got.stats.row_nfe == off.stats.row_nfe
    assert sum(on.stats.row_nfe) < sum(off.stats.row_nfe)


def test_the_replay_saves_a_blocks_first_forward_after_a_walk_that_finished_the_last():
    """A walk one node longer than the block has steps left reached the finished block: with that node in the graph,
    the next block's first step needs no forward of its own."""
    first = [((0,), (0, 1)), ((0,),)]  # walks from the 1st and 2nd of 3 steps; each ends on the finished block
    second = [()]  # the next block (the last), 2 steps
    assert forwards([first, second], set()) == 5
    assert forwards([first, second], {(0,)}) == 4  # 1 | 2, 3 | then 1 | 2 in the next
    assert forwards([first, second], {(0,), (0, 1)}) == 3  # 1 | 2, 3, the next's 1 | 2
    assert forwards([second, first], {(0,), (0, 1)}) == 4  # the last block's finishing walk saves nothing after it


def test_a_step_drafts_only_the_nodes_its_rows_can_use():
    """A node that names a candidate rank no row has (ranks >= the most masked slots left) or more elements than
    ``depth`` is not drafted: at a block's last slot, looking ahead drafts one canvas, not the graph's 3 of size 1."""
    from decodekit.dlm.drafts.graphs import DraftGraph

    drafts = dk.dlm.SpiffyDrafts()  # every set of up to 3 of the top 3
    graph = DraftGraph(drafts.nodes, torch.device("cpu"))
    names = lambda depth, left: [drafts.nodes[i] for i in graph.fitting(depth, left)[0].tolist()]  # noqa: E731
    assert names(1, 1) == [((0, 0),)]
    assert names(2, 2) == [((0, 0),), ((1, 0),), ((0, 0), (1, 0))]
    assert names(3, 5) == drafts.nodes and names(2, 5) == drafts.nodes[:6]
    assert graph.fitting(2, 2)[1].tolist() == [True, True, False, True, False, False, False]


def test_lookahead_must_be_a_bool(hf):
    """A string such as "false" would read as True: ``lookahead`` is refused unless it is True or False, before
    anything runs."""
    from decodekit.errors import ConfigError

    with pytest.raises(ConfigError, match="lookahead must be True or False"):
        dk.dlm.SpiffyDrafts(lookahead="false")
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    with pytest.raises(ConfigError, match="lookahead must be True or False"):
        dk.dlm.calibrate_graph(model, PROMPTS, lookahead=1, progress=False, gen_length=12, block_length=6, steps=12)


class WholeBlock:
    """LLaDA's rule, except that it commits every eligible slot of the block starting at ``start`` in one step."""

    per_row_steps = True

    def __init__(self, start: int) -> None:
        self.rule, self.start = dk.build("dlm_rule", "llada"), start

    def begin_block(self, state):
        self.rule.begin_block(state)

    def select(self, state, proposal, eligible):
        return eligible.clone() if state.block[0] == self.start else self.rule.select(state, proposal, eligible)


@pytest.mark.parametrize("lookahead", [False, True])
def test_the_replay_counts_a_block_finished_in_one_step(hf, lookahead):
    """A block a row finishes in one step records nothing (no draft follows a block's last step); the replay still
    counts its forward (``DLMStats.row_block_steps``), or none where the walk before it looked ahead, so calibration
    predicts the loop's forwards exactly, drafted or not."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK)
    settings = dict(gen_length=18, block_length=6, steps=18, cache=dk.dlm.BlockCausalCache())
    plain = dk.dlm.generate(model, PROMPTS, rule=WholeBlock(6), **settings)
    assert [steps[1] for steps in zip(*plain.stats.row_block_steps)] == [1, 1, 1]  # the middle block: one step
    assert plain.stats.block_steps == [max(s) for s in plain.stats.row_block_steps]
    found = dk.dlm.calibrate_graph(
        model, PROMPTS, budget=7, width=4, depth=3, lookahead=lookahead, progress=False, rule=WholeBlock(6), **settings
    )
    assert found.forwards[0] == sum(plain.stats.row_nfe) == found.steps  # one forward a step, the middle block's too
    draft = dk.dlm.SpiffyDrafts(graph=found.graph, lookahead=lookahead)
    drafted = dk.dlm.generate(model, PROMPTS, rule=WholeBlock(6), draft=draft, **settings)
    assert drafted.sequences == plain.sequences
    assert sum(drafted.stats.row_nfe) == found.forwards[-1] < found.forwards[0]
