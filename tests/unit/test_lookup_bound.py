"""The context-lookup bound (decodekit.bench.lookup_bound): hand-counted cases, a brute-force search over every
drafter's choices on small texts, and real lookup drafters never beating it."""

from __future__ import annotations

import functools
import random

import pytest

import decodekit as dk
from decodekit.bench.lookup_bound import (
    lookup_matches,
    lookup_rounds,
    lookup_speedup_bound,
    lookup_tokens_per_forward,
)
from decodekit.drafters import NGramDrafter, SuffixDrafter
from decodekit.policies import FixedLength
from decodekit.policies.analytic import CostModel


def test_copying_the_prompt_takes_few_rounds():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    # prefill gives 1; round 1 copies 2 3 4 5 (depth 4) and adds 6; round 2 may copy one token (7) before the last
    assert lookup_rounds(prompt, prompt, depth=4) == 2
    assert lookup_rounds(prompt, prompt, depth=16) == 1  # 2..7 copied, 8 is the target's own token


def test_new_text_takes_a_round_a_token():
    assert lookup_rounds([1, 2, 3], [4, 5, 6, 7], depth=8) == 3
    assert lookup_rounds([1, 2], [3], depth=8) == 0
    assert lookup_tokens_per_forward([[1, 2, 3]], [[4, 5, 6, 7]], depth=8) == 1.0


def test_min_match_needs_longer_occurrences():
    prompt, output = [9, 1, 2, 3, 8, 1, 4], [1, 2, 3, 0]
    assert lookup_rounds(prompt, output, depth=4) == 1  # after "1": copy "2 3", then 0
    # "4 1" never occurred: one token; then "1 2" did, followed by "3", the one token left to copy before the last
    assert lookup_rounds(prompt, output, depth=4, min_match=2) == 2


def best_rounds(prompt: list[int], output: list[int], depth: int) -> int:
    """Fewest rounds over every sequence of choices a copying drafter could make (exhaustive, memoised on ``n``)."""
    text = prompt + output

    @functools.cache
    def rounds_from(n: int) -> int:
        if n >= len(output):
            return 0
        here, best = len(prompt) + n, None
        limit = min(depth, len(text) - here - 1)
        options = {0}
        for j in range(1, here):  # the draft continues the occurrence of the last token ending at j - 1
            if text[j - 1] == text[here - 1]:
                size = 0
                while size < limit and j + size < here and text[j + size] == text[here + size]:
                    size += 1
                options.update(range(size + 1))  # a drafter may also stop short or pick a worse occurrence
        for accepted in options:
            total = 1 + rounds_from(n + accepted + 1)
            best = total if best is None else min(best, total)
        return best

    return rounds_from(1)


@pytest.mark.parametrize("seed", range(30))
def test_equals_the_best_of_every_choice(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 8])
    prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
    output = [rng.randrange(vocab) for _ in range(rng.randrange(1, 25))]
    depth = rng.choice([1, 2, 4, 16])
    assert lookup_rounds(prompt, output, depth) == best_rounds(prompt, output, depth)


@pytest.mark.parametrize(
    "drafter, policy",
    [(NGramDrafter(max_ngram=3), FixedLength(4)), (SuffixDrafter(cache_tokens=0), FixedLength(12, depth=4))],
    ids=["ngram", "suffix"],
)
def test_lookup_drafters_never_beat_it(target, drafter, policy):
    prompts = [[5, 6, 7, 8, 9] * 4, [3, 1, 4, 1, 5, 9, 2, 6] * 2, [11, 12, 13]]
    measured = []
    for prompt in prompts:  # one row at a time: the bound is per row, and rounds are shared in a batch
        out = dk.generate(target, [prompt], drafter, policy=policy, max_new_tokens=40, eos_token_id=())
        bound = lookup_tokens_per_forward([prompt], out.sequences, depth=4)
        assert out.stats.tokens_per_step <= bound + 1e-9
        measured.append(out.stats.tokens_per_step)
    assert max(measured) > 1.1  # the drafters did copy (the tiny model's outputs repeat little)


SPEEDUP_ROWS = ([[1, 2, 3, 4, 5, 6, 7, 8], [4, 5]], [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 4, 5, 9]])


def test_speedup_bound_prices_each_round_at_its_length():
    prompts, outputs = SPEEDUP_ROWS
    flat = lookup_speedup_bound(prompts, outputs, CostModel((0.0,) * 5, (1.0,) * 5))  # verifying is free
    assert flat == {d: lookup_tokens_per_forward(prompts, outputs, d) for d in range(1, 5)}
    steep = lookup_speedup_bound(prompts, outputs, CostModel((0.0,) * 5, (1.0, 2.0, 3.0, 4.0, 5.0), overhead=1.0))
    # depth 4, tokens copied per round: row 1 "2 3 4 5", then "7"; row 2 nothing twice ("9" is new, then "9 4" is
    # not), then "5" after "4" (the last token is the target's). A round copying m costs 2 + m, a plain step 2.
    matches = [4, 1, 0, 0, 1]
    assert steep[4] == pytest.approx((7 + 4) * 2.0 / sum(2.0 + m for m in matches))
    assert steep[4] < flat[4]
    # a wider forward that costs less is taken, within the depth: one position costs 3, two 2, four or five 1
    dip = lookup_speedup_bound(prompts, outputs, CostModel((0.0,) * 5, (3.0, 2.0, 2.0, 1.0, 1.0)))
    assert dip[4] == pytest.approx((7 + 4) * 3.0 / len(matches))
    rounds = sum(len(lookup_matches(p, o, 1)) for p, o in zip(prompts, outputs))
    assert dip[1] == pytest.approx((7 + 4) * 3.0 / (2.0 * rounds))


def test_bad_arguments():
    with pytest.raises(dk.ConfigError, match="depth"):
        lookup_rounds([1], [2, 3], depth=0)
    with pytest.raises(ValueError, match="prompts"):
        lookup_tokens_per_forward([[1]], [], depth=4)
