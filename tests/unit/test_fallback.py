"""FallbackDrafter: each row drafts with the primary drafter, or with the fallback where the primary proposes nothing;
:meth:`Draft.where` merges the two drafts row by row. Greedy equality on ragged batches, the sampled law in the
whole loop (a merge that keeps the wrong rows' ``q`` must fail the same test), and the refusals."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import decodekit as dk
from decodekit.drafters import FallbackDrafter, ModelDrafter, NGramDrafter, RecyclingDrafter, SuffixDrafter
from decodekit.drafters.composite import Composite
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.policies import FixedLength
from decodekit.verifiers import RejectionVerifier
from tests.conftest import assert_greedy_twice
from tests.unit.spies import Wrapped
from tests.unit.test_lossless import assert_detected, assert_matches, models, sample_counts  # noqa: F401

V = 16


def state_of(prompts: list[list[int]]) -> dk.DecodeState:
    lengths = [len(p) + 16 for p in prompts]
    return dk.DecodeState.from_prompts(prompts, lengths, dk.SamplingParams(0.0), None, torch.device("cpu"))


class Fixed:
    """Proposes a given draft and counts its calls."""

    def __init__(self, draft: dk.Draft) -> None:
        self.draft, self.calls = draft, 0

    def draft_kind(self, sampling):
        return self.draft.kind

    def propose(self, state, budget):
        self.calls += 1
        return self.draft


def chain(rows: list[list[int]], kind=dk.DraftKind.DETERMINISTIC, q=None) -> dk.Draft:
    width = max(map(len, rows))
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    valid = torch.tensor([[i < len(r) for i in range(width)] for r in rows])
    return dk.Draft.chain(tokens, valid=valid, q=q, kind=kind)


# ------------------------------------------------------------------------------------------------ Draft.where
def test_where_takes_each_row_from_one_draft_and_pads_the_narrower():
    a = chain([[1, 2], [], [3]])
    b = dk.Draft.tree(
        torch.tensor([[4, 5, 6]] * 3), torch.tensor([[-1, -1, 0]] * 3), torch.ones(3, 3, dtype=torch.bool)
    )
    merged = a.where(torch.tensor([True, False, True]), b)
    assert merged.tokens[merged.valid].tolist() == [1, 2, 4, 5, 6, 3]
    assert merged.parents.tolist()[1] == [-1, -1, 0] and merged.num_valid.tolist() == [2, 3, 1]
    assert not merged.is_chain  # declared a tree: one input is
    both_chains = a.where(torch.tensor([False, True, True]), chain([[7, 8, 9], [7], [7]]))
    assert both_chains.is_chain and both_chains.tokens[both_chains.valid].tolist() == [7, 8, 9, 3]


def test_where_merges_q_per_node_and_refuses_mixed_kinds():
    qa = torch.softmax(torch.randn(2, 1, V), -1)
    a = chain([[1], [2]], kind=dk.DraftKind.SAMPLED, q=qa)
    qb = torch.softmax(torch.randn(2, 1, V), -1)  # one row per parent, shared through q_index
    b = dk.Draft.tree(
        torch.tensor([[3, 4], [5, 6]]),
        torch.tensor([[-1, -1]] * 2),
        torch.ones(2, 2, dtype=torch.bool),
        kind=dk.DraftKind.SAMPLED,
        q=qb,
        q_index=torch.zeros(2, 2, dtype=torch.long),
    )
    merged = a.where(torch.tensor([True, False]), b)
    assert merged.q.shape == (2, 2, V) and merged.q_index is None
    torch.testing.assert_close(merged.q[0, 0], qa[0, 0])
    torch.testing.assert_close(merged.q[1], qb[1, [0, 0]])  # expanded through q_index
    merged.check(2, V, dk.DraftBudget(torch.tensor([2, 2])))
    with pytest.raises(dk.IncompatibleDraftError, match="same kind"):
        a.where(torch.tensor([True, False]), chain([[1], [2]]))


# ------------------------------------------------------------------------------------------------- propose
def test_rows_without_a_primary_draft_get_the_fallbacks():
    primary, fallback = Fixed(chain([[1, 2], [], [3]])), Fixed(chain([[9], [8, 7], [6]]))
    drafter = FallbackDrafter(primary, fallback)
    draft = drafter.propose(state_of([[1], [2], [3]]), dk.DraftBudget(torch.tensor([4, 4, 4])))
    assert draft.tokens[draft.valid].tolist() == [1, 2, 8, 7, 3]
    everyone = FallbackDrafter(Fixed(chain([[1], [2]])), fallback := Fixed(chain([[9], [9]])))
    assert everyone.propose(state_of([[1], [2]]), dk.DraftBudget(torch.tensor([4, 4]))).tokens.tolist() == [[1], [2]]
    assert fallback.calls == 0  # every row drafted, known on the host: the fallback is not asked
    nobody = FallbackDrafter(Fixed(dk.Draft.empty(2)), Fixed(chain([[9], [8]])))
    assert nobody.propose(state_of([[1], [2]]), dk.DraftBudget(torch.tensor([4, 4]))).tokens.tolist() == [[9], [8]]


def test_a_primary_that_knows_its_rows_on_the_host_decides_without_a_read():
    """A primary draft that declares its per-row counts (suffix lookup builds its drafts on the host) tells the
    fallback drafter which rows drafted without reading the device; the merged draft declares a bound on its width
    when both parts declared theirs, so the loop trims it without a read either."""
    from tests.unit.test_host_syncs import count_syncs

    budget, state = dk.DraftBudget(torch.tensor([4, 4])), state_of([[1], [2]])
    known = chain([[1], [2, 3]]).knowing_width(2).knowing_counts([1, 2])
    everyone = FallbackDrafter(Fixed(known), fallback := Fixed(chain([[9], [9]])))
    with count_syncs() as syncs:
        assert everyone.propose(state, budget) is known
    assert syncs[0] == 0 and fallback.calls == 0
    with count_syncs() as syncs:  # the same draft undeclared: the fallback drafter asks the tensor (on a GPU, a sync)
        FallbackDrafter(Fixed(chain([[1], [2, 3]])), Fixed(chain([[9], [9]]))).propose(state, budget)
    assert syncs[0] == 1
    partial = chain([[1, 2, 3], []]).knowing_width(3).knowing_counts([3, 0])
    merged = FallbackDrafter(Fixed(partial), Fixed(chain([[9], [8, 7]]).knowing_width(2))).propose(state, budget)
    assert merged.tokens[merged.valid].tolist() == [1, 2, 3, 8, 7] and merged.__dict__["used_width"] == 3
    merged.check(2, 128, budget)
    undeclared = FallbackDrafter(Fixed(partial), Fixed(chain([[9], [8, 7]]))).propose(state, budget)
    assert "used_width" not in undeclared.__dict__  # a part that did not declare: the loop reads the width
    with pytest.raises(dk.ConfigError, match=r"declared \[3, 1\] valid nodes per row"):
        chain([[1, 2, 3], []]).knowing_counts([3, 1]).check(2, 128, budget)


def count_drafted(drafter) -> list[int]:
    """Make ``drafter.propose`` record how many tokens each of its drafts holds; returns that (growing) list."""
    proposed, propose = [], drafter.propose

    def counted(state, budget):
        draft = propose(state, budget)
        proposed.append(int(draft.num_valid.sum()))
        return draft

    drafter.propose = counted
    return proposed


def test_fallback_len_caps_only_the_fallbacks_budget():
    class Budgets(Fixed):
        def propose(self, state, budget):
            self.seen, self.host = (budget.max_len, budget.lengths.tolist()), budget.host_lengths
            return super().propose(state, budget)

    primary, fallback = Budgets(chain([[1, 2, 3, 4], []])), Budgets(chain([[9], [8, 7]]))
    FallbackDrafter(primary, fallback, fallback_len=2).propose(
        state_of([[1], [2]]), dk.DraftBudget(torch.tensor([6, 1]))
    )
    assert primary.seen == (6, [6, 1]) and fallback.seen == (2, [2, 1])
    mirrored = dk.DraftBudget(torch.tensor([6, 1]), node_bound=6, host_nodes=(6, 1))
    FallbackDrafter(primary, fallback, fallback_len=2).propose(state_of([[1], [2]]), mirrored)
    assert fallback.seen == (2, [2, 1]) and fallback.host == [2, 1]  # the host mirrors are capped with it
    with pytest.raises(dk.ConfigError, match="fallback_len"):
        FallbackDrafter(NGramDrafter(), RecyclingDrafter(), fallback_len=0)


def test_the_default_policy_is_the_primarys():
    suffix_first = FallbackDrafter(SuffixDrafter(cache_tokens=0), RecyclingDrafter()).default_policy()
    ngram_first = FallbackDrafter(NGramDrafter(), RecyclingDrafter()).default_policy()
    assert (suffix_first.k, suffix_first.depth) == (15, 15) and (ngram_first.k, ngram_first.depth) == (4, None)


def test_suffix_backed_by_recycling_equals_greedy_decoding_on_ragged_rows(target, ragged_prompts):
    reference = dk.generate(target, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    recycling = RecyclingDrafter("smollm2_8")
    proposed = count_drafted(recycling)
    drafter = FallbackDrafter(SuffixDrafter(cache_tokens=0), recycling)
    assert_greedy_twice(target, ragged_prompts, drafter, FixedLength(16, depth=16), reference, 40)
    assert sum(proposed) > 0  # the fallback drafted in rounds suffix had no match for
    assert recycling.matrix is not None and (recycling.matrix >= 0).any()  # it observed the rounds


def test_a_capped_chain_fallback_declares_its_width_truly(target, ragged_prompts):
    """Suffix lookup backed by a draft model capped at ``fallback_len``: the fallback's chains declare their width
    from the capped host mirrors (``debug=True`` checks each declaration) and output is greedy decoding's."""
    from decodekit.models.tiny import perturbed

    reference = dk.generate(target, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    model = ModelDrafter(perturbed(target, 0.3, seed=1))
    proposed = count_drafted(model)
    drafter = FallbackDrafter(SuffixDrafter(cache_tokens=0), model, fallback_len=3)
    assert_greedy_twice(target, ragged_prompts, drafter, FixedLength(16, depth=16), reference, 40)
    assert sum(proposed) > 0


def test_a_part_that_shares_the_target_gets_it_and_output_stays_greedy_decoding(target, ragged_prompts):
    """n-gram lookup backed by the target's own first layer (drafting in the target's cache): the fallback is given
    the target in ``begin``, both parts draft in some rounds, and greedy output is plain decoding's."""
    reference = dk.generate(target, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    ngram, exit_ = NGramDrafter(max_ngram=2), EarlyExitDrafter(exit_layer=1)
    looked_up, exited = count_drafted(ngram), count_drafted(exit_)
    drafter = FallbackDrafter(ngram, exit_)
    assert drafter.shares_target
    assert_greedy_twice(target, ragged_prompts, drafter, FixedLength(3), reference, 40)
    assert sum(looked_up) > 0 and sum(exited) > 0


def test_both_drafters_see_every_hook(target, ragged_prompts):
    suffix = SuffixDrafter(cache_tokens=4096)
    drafter = FallbackDrafter(suffix, RecyclingDrafter())
    dk.generate(target, ragged_prompts, drafter, policy=FixedLength(8, depth=8), max_new_tokens=8, eos_token_id=())
    assert len(suffix.cached_outputs) == len(ragged_prompts)  # select_rows reached suffix as rows finished
    drafter.clear()
    assert suffix.cached_outputs == [] and drafter.fallback.matrix is None
    assert drafter.needs == {"logits", "host_rows"}  # the union of its parts' (suffix takes host rows)


class Alternate(Composite):
    """A user's composite: its parts take turns round by round (only ``propose`` written)."""

    def __init__(self, *parts) -> None:
        self.compose(parts, "Alternate")
        self.turn = 0

    def draft_kind(self, sampling):
        return self.parts[0].draft_kind(sampling)

    def propose(self, state, budget):
        self.turn += 1
        return self.parts[self.turn % len(self.parts)].propose(state, budget)


def test_a_composite_of_your_own_passes_every_hook_and_stays_greedy_decoding(target, ragged_prompts):
    """A composite written as the docs say (``Composite``, ``compose`` and ``propose``): its parts' hooks run
    (n-gram's index, the early exit's ``begin`` with the target), declarations are the union, output is greedy."""
    reference = dk.generate(target, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    ngram, exit_ = NGramDrafter(max_ngram=2), EarlyExitDrafter(exit_layer=1)
    looked_up, exited = count_drafted(ngram), count_drafted(exit_)
    drafter = Alternate(ngram, exit_)
    assert drafter.shares_target and "host_rows" in drafter.needs
    assert_greedy_twice(target, ragged_prompts, drafter, FixedLength(3), reference, 24)
    assert sum(looked_up) > 0 and sum(exited) > 0
    with pytest.raises(dk.errors.ConfigError, match="Alternate's drafters have different vocabularies"):
        Alternate(SimpleNamespace(vocab_size=7), SimpleNamespace(vocab_size=8))


# ------------------------------------------------------------------------------------------- distribution
class EmptyOnOddRows(Wrapped):
    """A sampled drafter that proposes nothing for rows at an odd length, so rounds mix both drafters' rows."""

    def propose(self, state, budget):
        draft = self.inner.propose(state, budget)
        even = (state.lengths % 2 == 0)[:, None]
        return dk.Draft.chain(draft.tokens, valid=draft.valid & even, q=draft.q)


class KeepsPrimaryQ(FallbackDrafter):
    """Biased on purpose: the fallback's rows are verified against the primary's ``q``."""

    def propose(self, state, budget):
        first = self.primary.propose(state, budget)
        second = self.fallback.propose(state, budget)
        merged = first.where(first.valid.any(-1), second)
        return dataclasses.replace(merged, q=first._padded(merged.num_nodes).q)


def parts(draft):
    return EmptyOnOddRows(ModelDrafter(draft, temperature=1.6)), ModelDrafter(draft, temperature=0.6)


def test_merged_sampled_rows_keep_the_target_law(models):  # noqa: F811
    target, draft = models
    drafter = FallbackDrafter(*parts(draft))
    counts, stats = sample_counts(target, drafter, RejectionVerifier(), FixedLength(2), "T1", seed=21)
    assert_matches(target, counts, "T1")
    assert stats.accepted > 0


def test_a_merge_with_the_wrong_rows_q_is_detected(models):  # noqa: F811
    target, draft = models
    counts, _ = sample_counts(target, KeepsPrimaryQ(*parts(draft)), RejectionVerifier(), FixedLength(2), "T1", seed=22)
    assert_detected(target, counts, "T1")


# ---------------------------------------------------------------------------------------------- refusals
def test_mixed_kinds_are_refused_before_any_forward(target, ragged_prompts):
    drafter = FallbackDrafter(NGramDrafter(), ModelDrafter(dk.load_model(target)))
    with pytest.raises(dk.IncompatibleDraftError, match="one kind"):
        dk.generate(target, ragged_prompts, drafter, max_new_tokens=4, temperature=1.0)
    dk.generate(target, ragged_prompts, drafter, max_new_tokens=4)  # greedy: both deterministic


def test_parts_that_hide_their_kind_are_refused():
    class Anonymous:
        def propose(self, state, budget):
            return dk.Draft.empty(state.batch_size)

    with pytest.raises(dk.ConfigError, match="draft_kind"):
        FallbackDrafter(NGramDrafter(), Anonymous())
    with pytest.raises(dk.ConfigError, match="FallbackDrafter"):
        FallbackDrafter(SuffixDrafter, NGramDrafter())  # a class, not an instance
