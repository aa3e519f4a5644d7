"""SuffixDrafter: frequency-scored suffix-match trees within budgets, a bounded LRU cache of outputs, and greedy
equality with plain decoding on ragged batches."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters.suffix import SuffixDrafter, load_outputs, save_outputs
from decodekit.errors import ConfigError
from decodekit.policies import FixedLength
from decodekit.verifiers import GreedyVerifier
from tests.conftest import assert_greedy_twice

MAX_NEW = 40
VOCAB = 128


def state_of(prompts: list[list[int]], room: int = 32) -> dk.DecodeState:
    lengths = [len(p) + room for p in prompts]
    return dk.DecodeState.from_prompts(prompts, lengths, dk.SamplingParams(0.0), None, torch.device("cpu"))


def budget(nodes, depth=None, width=None) -> dk.DraftBudget:
    nodes = torch.tensor(nodes)
    return dk.DraftBudget(nodes, None if depth is None else torch.tensor(depth), width)


def propose(drafter: SuffixDrafter, prompts, b: dk.DraftBudget) -> dk.Draft:
    state = state_of(prompts)
    drafter.begin(state)
    draft = drafter.propose(state, b)
    draft.check(len(prompts), VOCAB, b)
    return draft


def row(draft: dk.Draft, b: int) -> tuple[list[int], list[int]]:
    keep = draft.valid[b]
    return draft.tokens[b][keep].tolist(), draft.parents[b][keep].tolist()


def finish(drafter: SuffixDrafter, prompt: list[int], output: list[int]) -> None:
    """Run one row through begin / observe / select_rows, as the loop does for a call that generates ``output``."""
    state = state_of([prompt])
    drafter.begin(state)
    state.append(torch.tensor([output]), torch.tensor([len(output)]))
    state.host_lengths = state.lengths.tolist()
    drafter.observe(state, None)
    drafter.select_rows(torch.zeros(0, dtype=torch.long))


def test_continues_the_longest_match():
    draft = propose(SuffixDrafter(cache_tokens=0), [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]], budget([4]))
    assert row(draft, 0) == ([3, 4, 1, 2], [-1, 0, 1, 2])
    assert draft.is_chain and draft.kind == dk.DraftKind.DETERMINISTIC


def test_most_frequent_continuation_first_and_min_prob():
    history = [8, 5, 6, 5, 6, 5, 7, 5]  # after 5: 6 twice, 7 once
    tree = propose(SuffixDrafter(factor=8, cache_tokens=0), [history], budget([3], [1]))
    assert row(tree, 0) == ([6, 7], [-1, -1])
    pruned = propose(SuffixDrafter(factor=8, min_prob=0.5, cache_tokens=0), [history], budget([3], [1]))
    assert row(pruned, 0) == ([6], [-1])


def test_draft_size_grows_with_the_match_length():
    history = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1]  # matches "9 1": 2 tokens
    assert len(row(propose(SuffixDrafter(factor=1, cache_tokens=0), [history], budget([8])), 0)[0]) == 2
    assert len(row(propose(SuffixDrafter(factor=3, cache_tokens=0), [history], budget([8])), 0)[0]) == 6
    assert len(row(propose(SuffixDrafter(factor=3, cache_tokens=0), [history], budget([4])), 0)[0]) == 4


def test_ragged_batch_within_per_row_budgets():
    prompts = [
        [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, 5, 1, 2],  # branches after "1 2"
        [10, 11, 12, 13],  # no repeat: no match
        [7, 7, 7, 7, 7, 7, 7],
        [20, 21, 20, 22, 20, 23, 20, 21, 20],
    ]
    b = budget([12, 12, 3, 5], [4, 4, 3, 2], width=2)
    draft = propose(SuffixDrafter(factor=4, min_prob=0.05, cache_tokens=0), prompts, b)  # check() passed
    assert not draft.valid[1].any()
    assert draft.num_valid.tolist()[2] == 3 and draft.num_valid.tolist()[0] > 4
    assert not draft.is_chain
    assert (draft.depth.max(-1).values <= torch.tensor([4, 4, 3, 2])).all()
    tokens, parents = row(draft, 0)
    assert tokens[:3] == [3, 1, 2] and parents[:3] == [-1, 0, 1]  # "1 2" went on "3 1 2" half of the time
    assert sorted(t for t, p in zip(tokens, parents) if p == -1) in ([3, 4], [3, 5])  # an alternative, width 2


def test_no_match_drafts_nothing():
    draft = propose(SuffixDrafter(), [[1, 2, 3], [4]], budget([4, 4]))
    assert draft.num_nodes == 0 or not draft.valid.any()


@pytest.fixture(scope="module")
def reference(target, ragged_prompts):
    return dk.generate(target, ragged_prompts, max_new_tokens=MAX_NEW, eos_token_id=()).sequences


@pytest.mark.parametrize(
    "policy", [FixedLength(12, depth=4), FixedLength(4), FixedLength(6, depth=3, width=2)], ids=repr
)
def test_greedy_equals_plain_decoding(target, ragged_prompts, reference, policy):
    drafter = SuffixDrafter()  # the second call also drafts from the first call's outputs (now in the cache)
    assert_greedy_twice(target, ragged_prompts, drafter, policy, reference, MAX_NEW)
    assert sorted(drafter.cached_outputs) == sorted(reference * 2)  # order: least recently used first


def test_outputs_are_cached_as_rows_finish(target, ragged_prompts, reference):
    eos = reference[0][10]  # rows stop at different rounds
    expected = dk.generate(target, ragged_prompts, max_new_tokens=MAX_NEW, eos_token_id=eos).sequences
    drafter = SuffixDrafter()
    out = dk.generate(
        target,
        ragged_prompts,
        drafter,
        GreedyVerifier(),
        FixedLength(12, depth=4),
        max_new_tokens=MAX_NEW,
        eos_token_id=eos,
    )
    assert out.sequences == expected
    assert sorted(drafter.cached_outputs) == sorted(expected)


def test_repetitive_text_gets_accepted(target):
    prompt = [5, 6, 7, 8, 9] * 6
    out = dk.generate(
        target,
        [prompt],
        SuffixDrafter(cache_tokens=0),
        policy=FixedLength(12, depth=4),
        max_new_tokens=MAX_NEW,
        eos_token_id=(),
    )
    assert out.sequences == dk.generate(target, [prompt], max_new_tokens=MAX_NEW, eos_token_id=()).sequences
    assert out.stats.accepted > 0


def test_cache_is_bounded_lru_and_clearable():
    a, b, c = [40, 41, 42, 43], [50, 51, 52, 53], [60, 61, 62, 63]
    drafter = SuffixDrafter(cache_tokens=10)
    finish(drafter, [1], a)
    finish(drafter, [1], b)
    assert drafter.cached_outputs == [a, b]
    draft = propose(drafter, [[40, 41]], budget([4]))  # no local match: drafted from the cached output a
    assert row(draft, 0) == ([42, 43], [-1, 0])
    finish(drafter, [1], c)  # 12 tokens > 10: the least recently used output (b) goes
    assert drafter.cached_outputs == [a, c]
    finish(drafter, [1], list(range(70, 85)))  # longer than the cache: its last 10 tokens, alone
    assert drafter.cached_outputs == [list(range(75, 85))]
    assert row(propose(drafter, [[77]], budget([2])), 0) == ([78, 79], [-1, 0])
    drafter.clear()
    assert drafter.cached_outputs == []
    assert not propose(drafter, [[77]], budget([2])).valid.any()


def test_remembered_outputs_draft_like_finished_rows():
    drafter = SuffixDrafter(cache_tokens=10)
    drafter.remember([[40, 41, 42, 43], [50, 51, 52, 53], [60, 61, 62, 63]])  # 12 > 10 tokens: the oldest goes
    assert drafter.cached_outputs == [[50, 51, 52, 53], [60, 61, 62, 63]]
    assert row(propose(drafter, [[1, 51]], budget([4])), 0) == ([52, 53], [-1, 0])
    assert not propose(drafter, [[1, 41]], budget([4])).valid.any()
    with pytest.raises(ConfigError, match="non-negative int"):
        drafter.remember([torch.tensor([1, 2])])
    with pytest.raises(ConfigError, match="cache_tokens=0"):
        SuffixDrafter(cache_tokens=0).remember([[1, 2]])


def test_preload_warms_the_cache_and_clear_returns_to_it(tmp_path):
    from safetensors.torch import save_file

    outputs = [[40, 41, 42, 43], [50, 51, 52]]
    path = tmp_path / "outputs.safetensors"
    save_outputs(path, outputs, {"source": "a test"})
    assert load_outputs(path) == outputs
    for source in (outputs, path, str(path)):
        drafter = SuffixDrafter(cache_tokens=20, preload=source)
        assert drafter.cached_outputs == outputs
        assert row(propose(drafter, [[1, 51]], budget([4])), 0) == ([52], [-1])
        finish(drafter, [1], [60, 61, 62])
        drafter.clear()  # back to the preloaded outputs, without the finished row's
        assert drafter.cached_outputs == outputs
    with pytest.raises(ConfigError, match="cache_tokens >= 7"):
        SuffixDrafter(cache_tokens=6, preload=outputs)
    with pytest.raises(ConfigError, match="neither a file nor a zoo model"):
        SuffixDrafter(preload="no-such-model")
    save_file({"tokens": torch.tensor([1, 2])}, str(path))
    with pytest.raises(ConfigError, match="'tokens' and 'offsets'"):
        SuffixDrafter(preload=path)


def test_the_zoo_targets_shipped_outputs():
    from safetensors import safe_open

    from decodekit.resources import shipped_weights

    outputs = load_outputs("smollm2-135m-instruct")
    with safe_open(str(shipped_weights("suffix_responses_smollm2-135m-instruct.safetensors")), "pt") as f:
        meta = f.metadata()
    assert len(outputs) == int(meta["responses"]) == 512
    assert sum(map(len, outputs)) == int(meta["tokens"]) and "no benchmark prompt" in meta["source"]
    assert all(0 <= t < int(meta["vocab_size"]) for o in outputs for t in o)
    assert all(len(o) <= 128 for o in outputs)


def test_no_cache():
    drafter = SuffixDrafter(cache_tokens=0)
    finish(drafter, [1], [40, 41, 42])
    assert drafter.cached_outputs == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"factor": 0}, "factor"),
        ({"min_prob": 1.5}, "min_prob"),
        ({"trie_depth": 1}, "trie_depth"),
        ({"cache_tokens": -1}, "cache_tokens"),
        ({"factor": "2"}, "factor"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(dk.ConfigError, match=message):
        SuffixDrafter(**kwargs)


def test_registered():
    assert isinstance(dk.build("drafter", "suffix"), SuffixDrafter)


def test_a_call_without_a_policy_gets_the_drafters_default(target, ragged_prompts):
    """generate(policy=None) asks the drafter (``default_policy``): suffix's 15 nodes up to 15 deep; a drafter
    without the hook gets FixedLength(4)."""
    budgets = []

    def spy(cls):
        class Spy(cls):
            def propose(self, state, budget):
                budgets.append((budget.max_nodes, budget.max_depth))
                return super().propose(state, budget)

        return Spy

    dk.generate(target, ragged_prompts, spy(SuffixDrafter)(cache_tokens=0), max_new_tokens=24, eos_token_id=())
    assert budgets and max(budgets) == (15, 15)
    budgets.clear()
    dk.generate(target, ragged_prompts, spy(dk.drafters.NGramDrafter)(), max_new_tokens=8, eos_token_id=())
    assert budgets and max(budgets) == (4, 4)
