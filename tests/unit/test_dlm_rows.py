"""The diffusion sampler's rows and rounds, under what a researcher's parts or prompts may do (reliability round 3):
on an absolute block grid a prompt's tail is prompt (EoTStop does not end a row on it), a row without a tail decodes
what it decodes alone (no extra block, the same forwards, the same Prophet stages), and the context check counts the
last block; a schedule that stops early or never stops, a rule that rewrites proposals outside the vocabulary, a draft
strategy that changes its first canvas after the first check, and logits with no distribution all fail with the
part named; LLaDA's rule keeps committing under a sliding window."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.dlm.model import DLMModel
from decodekit.errors import ComponentOutputError, ConfigError, ContextLengthError, NoProgressError
from tests.unit.dlm_common import MASK, peaked_llama

SETTINGS = dict(gen_length=8, block_length=4, steps=8)
PROMPTS = [[5, 9, 14, 2], [33, 7]]


@pytest.fixture(scope="module")
def dlm():
    return dk.dlm.load_model(peaked_llama(), mask_token_id=MASK)


@pytest.fixture(scope="module")
def absolute(dlm):
    """The same tiny model on an absolute grid of blocks of 4 (as SDAR, Fast-dLLM v2 and LLaDA 2 run)."""
    return DLMModel(dlm.lm, MASK, False, block_length=4, block_grid="absolute")


# ------------------------------------------------------------------------------------------------ the absolute grid
def test_a_prompts_tail_is_not_read_as_the_end_of_the_text(absolute):
    """A chat prompt ends with an end-of-turn id a few tokens from its end; on an absolute grid those tokens open the
    first block. EoTStop read them as generated and padded the whole answer with end-of-text."""
    base = dk.dlm.generate(absolute, [[3, 4, 5, 6, 7, 126, 8]], gen_length=8, block_length=4, steps=8)
    eot = dk.dlm.generate(
        absolute, [[3, 4, 5, 6, 7, 126, 8]], gen_length=8, block_length=4, steps=8, rule=dk.dlm.EoTStop(None, 126)
    )
    assert 126 not in base.sequences[0][:4]  # so EoTStop must not change the first block
    assert eot.sequences[0][:4] == base.sequences[0][:4]


@pytest.mark.parametrize("cache", [None, "block_causal"])
@pytest.mark.parametrize("rule", ["llada", "prophet"])
def test_a_row_without_a_tail_decodes_as_it_does_alone(absolute, cache, rule):
    """A batch where some prompt's tail opens the first block runs one block more; a row without a tail ended at
    gen_length alone but decoded that extra block in the batch (more forwards; Prophet's stages and its mean over the
    masked slots then depended on the batch)."""
    prompts, seeds = [[1, 2, 3, 9, 10], [8] * 8], [1, 2]

    def run(rows, seed):
        part = dk.build("dlm_rule", rule, thresholds=[3.0, 2.0, 1.0]) if rule == "prophet" else None
        made = None if cache is None else dk.build("dlm_cache", cache)
        return dk.dlm.generate(absolute, rows, gen_length=12, block_length=4, steps=12, temperature=0.8, seed=seed,
                               rule=part, cache=made)  # fmt: skip

    batch, alone = run(prompts, seeds), run(prompts[1:], seeds[1:])
    assert batch.sequences[1] == alone.sequences[0]
    assert batch.stats.row_nfe[1] == alone.stats.row_nfe[0]
    assert len(batch.stats.block_steps) == 4 and len(alone.stats.block_steps) == 3


def test_the_context_check_counts_the_last_block_of_a_row_with_a_tail(dlm):
    """A row whose tail opens the first block decodes to the end of its last block, past P + G (beyond the context
    where its length is no multiple of the block length); a row without a tail decodes P + G, in a batch too."""
    thirds = DLMModel(dlm.lm, MASK, False, block_length=3, block_grid="absolute")
    limit, settings = dlm.lm.max_context, dict(gen_length=6, block_length=3, steps=6)
    assert limit % 3 == 1
    fits = [1] * (limit - 6 - 1)  # P + G = limit - 1, and a tail of 0 (no block past it)
    out = dk.dlm.generate(thirds, [fits, [2] * 4], **settings)  # the second row's tail opens the first block
    assert [len(s) for s in out.sequences] == [6, 6]
    with pytest.raises(ContextLengthError, match=r"row 1 \(250 tokens\).*its last block runs 2 slots further"):
        dk.dlm.generate(thirds, [[3] * 6, [2] * (limit - 6)], **settings)


# ------------------------------------------------------------------------------------------ parts that misbehave
class Schedule(dk.dlm.FixedBlocks):
    """Fixed blocks, of which ``rounds`` yields what ``take`` makes of them."""

    def __init__(self, take) -> None:
        self.take = take

    def rounds(self, dlm, state):
        return self.take(super().rounds(dlm, state), state)


def test_a_schedule_that_stops_early_is_refused_not_mask_ids_returned(dlm):
    first = Schedule(lambda rounds, state: (r for i, r in zip(range(1), rounds)))
    with pytest.raises(
        ComponentOutputError, match=r"Schedule.rounds ended with masked slots left in row\(s\) \[0, 1\]"
    ):
        dk.dlm.generate(dlm, PROMPTS, schedule=first, **SETTINGS)


def test_a_schedule_that_repeats_a_finished_block_forever_is_stopped(dlm):
    def forever(rounds, state):
        yield from rounds
        while True:
            yield

    with pytest.raises(NoProgressError, match="Schedule.rounds set 3 blocks in a row with no masked slot"):
        dk.dlm.generate(dlm, PROMPTS, schedule=Schedule(forever), **SETTINGS)


class Rewrites:
    """LLaDA's rule, but it writes ``token`` into the proposals of what it commits (a rewrite EoTStop also does)."""

    def __init__(self, token: int) -> None:
        self.token, self.inner = token, dk.dlm.LLaDARule()

    def select(self, state, proposal, eligible):
        chosen = self.inner.select(state, proposal, eligible)
        proposal.tokens = proposal.tokens.masked_fill(chosen, self.token)
        return chosen


@pytest.mark.parametrize("token", [10_000, -1])
def test_a_rule_that_rewrites_proposals_outside_the_vocabulary_is_refused(dlm, token):
    """Returned as output at the last step, or an IndexError inside the embedding at the next forward."""
    with pytest.raises(ComponentOutputError, match=r"Rewrites.select committed token ids outside the vocabulary"):
        dk.dlm.generate(dlm, PROMPTS, rule=Rewrites(token), **SETTINGS)


def test_logits_with_no_distribution_are_refused_in_debug_mode(dlm):
    class Cache(dk.dlm.Recompute):
        def logits(self, dlm, state):
            return super().logits(dlm, state).index_fill(1, torch.tensor([1]), float("-inf"))

    with pytest.raises(ComponentOutputError, match="Cache.logits returned a slot whose logits are all -inf"):
        dk.dlm.generate(dlm, PROMPTS, cache=Cache(), debug=True, **SETTINGS)


def test_drafts_whose_first_canvas_changes_after_the_check_stay_lossless(dlm):
    """The first canvas is checked on the first drafts only; after that the loop uses the canvas itself, so a strategy
    that swaps it later cannot change the output (it did, silently, without debug)."""

    class SwapLater(dk.dlm.SpiffyDrafts):
        calls = 0

        def variants(self, state, proposal, committed, left):
            found = super().variants(state, proposal, committed, left)
            self.calls += found is not None
            return found if found is None or self.calls == 1 else found.flip(0)

    plain = dk.dlm.generate(dlm, PROMPTS, **SETTINGS).sequences
    assert dk.dlm.generate(dlm, PROMPTS, draft=SwapLater(), **SETTINGS).sequences == plain


def test_llada_rule_keeps_committing_under_a_sliding_window(dlm):
    """Its counts spread the slots masked when the (one, sliding) block began; DCD's window then brings in others,
    and the rule committed none of them (a NoProgressError naming LLaDARule)."""
    for steps, window in (
        (16, dk.dlm.DeferredWindow()),
        (32, dk.dlm.DeferredWindow()),
        (16, dk.dlm.DeferredWindow(max_masked=3)),
    ):
        out = dk.dlm.generate(dlm, [[1, 2, 3]], gen_length=16, block_length=4, steps=steps, schedule=window)
        assert MASK not in out.sequences[0]


def test_calibrate_graph_says_what_it_cannot_run_with(dlm):
    with pytest.raises(ConfigError, match="calibrate_graph runs the undrafted sampler .* drop draft="):
        dk.dlm.calibrate_graph(dlm, PROMPTS, draft=dk.dlm.SpiffyDrafts(), progress=False, **SETTINGS)
    with pytest.raises(ConfigError, match="calibrate_graph's step recorder .* needs a cache that runs several"):
        dk.dlm.calibrate_graph(dlm, PROMPTS, cache=dk.dlm.DualCache(), progress=False, **SETTINGS)
