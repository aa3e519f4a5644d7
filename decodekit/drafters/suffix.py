"""SuffixDecoding: frequency-scored token trees from suffix matches in the prompt, the output and earlier outputs."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_float, check_int
from decodekit.drafters.suffix_outputs import load_outputs as load_outputs
from decodekit.drafters.suffix_outputs import save_outputs as save_outputs
from decodekit.drafters.suffix_trie import GlobalCache, RowTrie, TrieNode, distinct_matches
from decodekit.errors import ConfigError
from decodekit.policies.fixed import FixedLength
from decodekit.registry import register
from decodekit.spec.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, SamplingParams

if TYPE_CHECKING:
    from decodekit.spec.round import Round


@register("drafter", "suffix")
class SuffixDrafter:
    """SuffixDecoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative Decoding for Emerging AI
    Applications"): model-free token trees from the continuations of the current suffix.

    Each row keeps a suffix trie (every substring of up to ``trie_depth`` tokens, with its count) of its prompt and
    output so far, updated as tokens are committed; a global trie holds the outputs of earlier rows and calls.
    Each round, per row and per trie, the suffixes of the row (pending token included) that occurred before with a
    continuation are matched (at most ``trie_depth - depth`` tokens, so the continuations fit the trie), and from
    the longest one per distinct number of occurrences a draft grows best-first: a child's score is its parent's
    times ``count(child) / count(parent)`` (an estimate of its acceptance probability); nodes below ``min_prob`` are
    not drafted, ties go to the most recent continuation. A draft has at most ``floor(factor * match length)``
    nodes, within the budget's nodes, depth and width. The draft with the largest score (sum of node scores: the
    expected accepted length) is proposed. Rows without a match draft nothing. Drafts are deterministic (given the
    history and the cache), so any lossless verifier treats them as point masses.

    **The global cache** holds generated tokens only (no prompts): a row's output is added when it finishes (in
    ``select_rows``, which the loop calls for finished rows, the last ones included), so later rows of the same
    call and later calls draft from it. It holds at most ``cache_tokens`` tokens (0 = off); when full, whole outputs
    are evicted least recently used first (used = added, or the source of a proposed draft). ``clear()`` empties it.
    In a benchmark that repeats the same prompts, the cache holds the earlier pass's output of the very prompt
    being timed: use ``cache_tokens=0`` there (the recipe does), or ``clear()`` between calls.

    Faithfulness: the two trees, the frequency scores (``count(child)/count(parent)`` products, ``min_token_prob``),
    the best-first tree, the choice of the best-scoring draft across match lengths and trees, and the draft size
    ``alpha * match length`` follow the reference (ArcticInference's description of ``speculate``); ours: a
    depth-limited suffix *trie* in Python instead of a path-compressed suffix tree, one expansion per distinct
    number of occurrences instead of per match length, the global cache filled when a row finishes (the reference
    extends it token by token) with LRU eviction of whole outputs (the reference: FIFO by request).

    Measured (SmolLM2-135M-Instruct, float32 oneDNN, 2-core shared CPU, batch 1, greedy): propose 0.11 ms a round
    (0.15 with a warm global cache) against 57 ms for a one-token forward and 67-80 ms for a verification of
    2-17 tokens; ``begin`` builds a 434-token prompt's trie in 3.2 ms. The tensorised ``NGramDrafter``, doing less,
    takes 0.33 ms a round on the same prompts: a match here is a few dictionary lookups, cheaper than the torch
    ops a tensor version would launch, so the tries stay in Python. With ``FixedLength(16, depth=16)`` and no
    global cache: 1.98x over autoregressive decoding (6 mixed prompts, 64 tokens, 2 interleaved passes) against
    1.79x for ``ngram`` k=4 and 1.67x for transformers' prompt lookup (1.19x over it; HumanEval 1.20x, MT-Bench
    1.08x, stdlib code 1.11x), every output equal to plain greedy decoding's. ``factor`` 4 / 8 / 16 gave 1.95x /
    1.98x / 1.94x in a cost model on 9 prompts; a call without a policy gets ``FixedLength(15, depth=15)``
    (:meth:`default_policy`), since ``generate``'s usual ``k=4`` caps it below ``ngram``: 15 nodes and the pending
    token verify as 16 queries, one width bucket of the compiled forward, where 16 nodes pad to 32 (the same
    acceptance, 1.86x -> 2.00x over eager plain decoding for ``lookup_eagle3`` with ``compile="max-autotune"``).

    Args:
        factor: draft nodes per matched token (SuffixDecoding's alpha).
        min_prob: smallest score a drafted node may have.
        trie_depth: the longest substring the tries hold (match length + draft depth).
        cache_tokens: capacity of the global cache in tokens (0 = no global cache). Memory: up to ``trie_depth``
            trie nodes per cached token, ~5.5 KiB a token at depth 24 (45 MiB for 8192 tokens of varied text);
            adding a 128-token output takes ~10 ms (once, when its row finishes).
        preload: earlier outputs the global cache starts with, and returns to on ``clear()`` (a warm start, as a
            server that has answered other requests): lists of token ids, a safetensors file of them
            (:func:`load_outputs`), or a zoo model's name for the responses shipped for it
            (``"smollm2-135m-instruct"``: 512 of its own greedy answers to the EAGLE recipe's prompts, 61,491
            tokens, no benchmark prompt; ~2.3 s to add and ~270 MB at depth 24). ``cache_tokens`` must hold them.
    """

    needs = frozenset({"host_rows"})  # select_rows keeps its per-row trees by the kept rows on the host

    def __init__(
        self,
        factor: float = 8.0,
        min_prob: float = 0.1,
        trie_depth: int = 24,
        cache_tokens: int = 8192,
        preload: str | Path | Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.factor = check_float("factor", factor, low=0.0, low_open=True, hint=" (draft nodes per matched token)")
        self.min_prob = check_float("min_prob", min_prob, low=0.0, high=1.0)
        self.trie_depth = check_int("trie_depth", trie_depth, low=2, hint=" (longest match + draft depth)")
        self.cache_tokens = check_int("cache_tokens", cache_tokens, low=0, hint=" (0 = no global cache)")
        self._cache = GlobalCache(self.cache_tokens, self.trie_depth)
        self._rows: list[RowTrie] = []
        self._vocab: int | None = None  # the vocabulary size of the target of the last call
        self._largest = -1  # the largest token id given by preload or remember() since the last clear()
        self._preload = [] if preload is None else load_outputs(preload)
        size = sum(len(tokens) for tokens in self._preload)
        if size > self.cache_tokens:
            raise ConfigError(
                f"preload holds {size} tokens but cache_tokens={self.cache_tokens} would evict them; set cache_tokens "
                f">= {size} (plus room for new outputs)"
            )
        self.remember(self._preload)

    def default_policy(self) -> FixedLength:
        """15 nodes up to 15 deep: with the pending token, 16 queries, one width bucket of a compiled forward (32
        nodes ran slower on SmolLM2; k = 4 caps suffix below ``ngram``)."""
        return FixedLength(15, depth=15)

    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        return DraftKind.DETERMINISTIC

    def clear(self) -> None:
        """Empty the global cache of earlier outputs, back to the ``preload`` outputs if any."""
        self._cache.clear()
        self._largest = -1
        self.remember(self._preload)

    def remember(self, outputs: list[list[int]]) -> None:
        """Add earlier outputs (token ids, no prompts) to the global cache, oldest first, as if rows had finished
        with them: SuffixDecoding's cache of historical outputs, for a workload whose outputs repeat (agents, a
        fixed response format). On SmolLM2 and the benchmark tasks, 512 of its own self-distilled responses (61k
        tokens, 2.3 s to add, ~270 MB) raised tokens per forward 1.58 -> 1.75 (MT-Bench) and 2.57 -> 2.77 (stdlib),
        but not the wall time with 16-node trees: the extra drafts cost as much to verify as they gained on a 2-core
        CPU. With 8-node trees (``FixedLength(8, depth=8)``), 1.56 -> 1.72 on 8 MT-Bench prompts and 7-9% less decode
        time (docs/benchmarks.md, "How far the model-free drafters are from what lookup can give")."""
        if not outputs:
            return
        if not self.cache_tokens:
            raise ConfigError(
                "this SuffixDrafter has no global cache (cache_tokens=0): set cache_tokens to keep outputs"
            )
        for tokens in outputs:
            if not all(isinstance(t, int) and t >= 0 for t in tokens):
                raise ConfigError("remember() takes lists of non-negative int token ids (no tensors, no strings)")
            self._largest = max(self._largest, max(tokens, default=-1))
            self._cache.add(list(tokens))

    @property
    def cached_outputs(self) -> list[list[int]]:
        """The outputs in the global cache, least recently used first."""
        return [list(tokens) for tokens in self._cache.sequences.values()]

    # ------------------------------------------------------------------------------------------------ hooks
    def begin(self, state: DecodeState) -> None:
        """Build each row's trie from its prompt. A call on a target with another vocabulary size than the last
        call's starts from a fresh global cache (:meth:`clear`: the outputs it holds are another tokenizer's ids);
        outputs given by ``preload`` or :meth:`remember` with ids outside the target's vocabulary are refused.

        Raises:
            ConfigError: the global cache holds a token id outside the target's vocabulary.
        """
        vocab = state.vocab_size
        if vocab is not None:
            if self._vocab is not None and vocab != self._vocab:
                self.clear()
            self._vocab = vocab
            if self._largest >= vocab:
                raise ConfigError(
                    f"SuffixDrafter's global cache holds token id {self._largest} (from preload or remember()), "
                    f"outside the target's vocabulary [0, {vocab}); give it outputs in this target's tokenizer"
                )
        read = torch.cat([state.prompt_lengths[:, None], state.tokens[:, : max(state.host_lengths)]], 1).tolist()
        self._rows = [RowTrie(row[1 : n + 1], row[0], self.trie_depth) for row, n in zip(read, state.host_lengths)]

    def observe(self, state: DecodeState, round: Round) -> None:
        self._sync(state)

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        keep = rows.tolist() if host_rows is None else host_rows
        for b in sorted(set(range(len(self._rows))) - set(keep)):  # finished: their outputs go to the cache
            row = self._rows[b]
            self._cache.add(row.tokens[row.prompt_length :])
        self._rows = [self._rows[b] for b in keep]

    def _sync(self, state: DecodeState) -> None:
        """Add the tokens committed since the last call to each row's trie (one host read)."""
        if len(self._rows) != state.batch_size:
            self.begin(state)
            return
        lengths = state.host_lengths
        seen = min(len(r.tokens) for r in self._rows) if self._rows else 0
        if all(len(r.tokens) == n for r, n in zip(self._rows, lengths)):
            return
        fresh = state.tokens[:, seen : max(lengths)].tolist()
        for row, tokens, n in zip(self._rows, fresh, lengths):
            row.add(tokens[len(row.tokens) - seen : n - seen], self.trie_depth)

    # ---------------------------------------------------------------------------------------------- drafting
    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        self._sync(state)
        nodes, depths = budget.host_values()  # no sync on a budget with host mirrors (FixedLength)
        drafts = [self._row_draft(r, n, d, budget.width) for r, n, d in zip(self._rows, nodes, depths)]
        width = max((len(t) for t, _ in drafts), default=0)
        if width == 0:
            return Draft.empty(state.batch_size, state.device)
        tokens = [t + [0] * (width - len(t)) for t, _ in drafts]
        parents = [p + [-1] * (width - len(p)) for _, p in drafts]
        valid = [[True] * len(t) + [False] * (width - len(t)) for t, _ in drafts]
        device = state.device
        tokens_t, valid_t = torch.tensor(tokens, device=device), torch.tensor(valid, device=device)
        if all(p == list(range(-1, len(p) - 1)) for _, p in drafts):
            draft = Draft.chain(tokens_t, valid=valid_t)
        else:
            draft = Draft.tree(tokens_t, torch.tensor(parents, device=device), valid_t)
        return draft.knowing_width(width).knowing_counts([len(t) for t, _ in drafts])

    def _row_draft(self, row: RowTrie, nodes: int, depth: int, width: int | None) -> tuple[list[int], list[int]]:
        """``(tokens, parents)`` of one row's draft (empty lists: no draft): the best-scoring expansion over the
        match lengths of the local and the global trie (one per distinct number of continuations)."""
        longest = min(self.trie_depth - depth, len(row.tokens))
        if nodes <= 0 or depth <= 0 or longest <= 0:
            return [], []
        best: tuple[float, list[int], list[int]] = (0.0, [], [])
        # local: active[j] is the suffix of j tokens; all its occurrences but the live one have a continuation
        for node, length, total in distinct_matches(
            (row.active[j], j, row.active[j].count - 1) for j in range(longest, 0, -1)
        ):
            found = self._expand(node, total, length, nodes, depth, width)
            if found[0] > best[0]:
                best = found
        if not self._cache.sequences:
            return best[1], best[2]
        source = None
        for node, length, total in distinct_matches(self._cache.suffixes(row.tokens, longest)):
            found = self._expand(node, total, length, nodes, depth, width)
            if found[0] > best[0]:
                best, source = found, node
        if source is not None:
            self._cache.touch(source.last)
        return best[1], best[2]

    def _expand(
        self, match: TrieNode, total: int, length: int, nodes: int, depth: int, width: int | None
    ) -> tuple[float, list[int], list[int]]:
        """Best-first tree from ``match`` (a suffix of ``length`` tokens, ``total`` occurrences with a continuation):
        ``(score, tokens, parents)``."""
        limit = min(nodes, int(self.factor * length))
        heap: list[
            tuple[float, int, int, int, int, TrieNode, int]
        ] = []  # -score, -stamp, tie, parent, depth, node, token
        tie = 0

        def push(node: TrieNode, score: float, parent: int, d: int) -> None:
            nonlocal tie
            for token, child in node.children.items():
                p = score * child.count / (total if parent < 0 else node.count)
                if p >= self.min_prob:
                    heapq.heappush(heap, (-p, -child.last, tie, parent, d, child, token))
                    tie += 1

        push(match, 1.0, -1, 1)
        tokens: list[int] = []
        parents: list[int] = []
        children: dict[int, int] = {}
        score = 0.0
        while heap and len(tokens) < limit:
            neg, _, _, parent, d, node, token = heapq.heappop(heap)
            if width is not None and children.get(parent, 0) >= width:
                continue
            children[parent] = children.get(parent, 0) + 1
            tokens.append(token)
            parents.append(parent)
            score -= neg
            if d < depth:
                push(node, -neg, len(tokens) - 1, d + 1)
        return score, tokens, parents
