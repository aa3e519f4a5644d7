"""Suffix lookup backed by the EAGLE-3 head: the fastest drafter decodekit has for SmolLM2 on a CPU."""

from __future__ import annotations

from pathlib import Path

from decodekit.drafters.eagle3 import Eagle3Drafter
from decodekit.drafters.fallback import FallbackDrafter
from decodekit.drafters.suffix import SuffixDrafter
from decodekit.registry import register


@register("drafter", "lookup_eagle3")
class LookupEagle3Drafter(FallbackDrafter):
    """:class:`~decodekit.drafters.FallbackDrafter` of :class:`~decodekit.drafters.SuffixDrafter` (SuffixDecoding's
    suffix trees over the prompt and output, plus earlier calls' outputs up to ``cache_tokens``) and
    :class:`~decodekit.drafters.Eagle3Drafter` (the trained head; a greedy chain of at most ``fallback_len`` tokens)
    for the rows suffix finds no match for.

    Copying wins where the text repeats itself (code, quoting the prompt) and the head where it does not (chat), so
    each covers the other's weak rounds: on SmolLM2-135M-Instruct on the 2-core CPU, greedy, batch 1, 2.4x over
    plain decoding on the mixed task against 1.6x for the head alone and 2.0-2.1x for lookup alone, ahead of both on
    every task (docs/benchmarks.md, "Lookup backed by the head"). Its default policy is suffix's,
    ``FixedLength(15, depth=15)``. The head drafts greedily at every temperature, so both parts draft deterministic
    trees and any verifier of those (greedy, rejection with point masses, traversal) keeps its guarantee: lossless.

    Args:
        weights: the EAGLE-3 head file; None = the head shipped for ``smollm2-135m-instruct``.
        fallback_len: the longest chain the head drafts.
        cache_tokens: suffix's global cache of earlier outputs, in tokens (0 = this call's text only; benchmarks
            that repeat their prompts need 0 or ``fresh``).
    """

    def __init__(self, weights: str | Path | None = None, fallback_len: int = 3, cache_tokens: int = 8192) -> None:
        super().__init__(
            SuffixDrafter(cache_tokens=cache_tokens), Eagle3Drafter(weights, temperature=0.0), fallback_len
        )
        self.weights, self.cache_tokens = weights, cache_tokens
