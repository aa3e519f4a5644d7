"""Logits processors on every distribution of a call: the target's and a model drafter's alike.

A processor is transformers' ``LogitsProcessor`` convention: ``processor(input_ids [n, T], scores [n, V]) ->
scores [n, V]`` (``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``, ``suppress_tokens`` and any
``logits_processor=[...]`` of :func:`decodekit.generate`). decodekit calls it at every position whose next-token
distribution is sampled from or verified against, with that position's **exact** context, never padded:

* the target's first token: the prompt;
* the target's scored positions in a round (:func:`process_scored`): the committed tokens (slot 0), and the
  committed tokens plus the draft path down to node ``i`` (slot ``i + 1``), for chains and trees;
* a model drafter's step ``j`` (:func:`process_next`): the committed tokens plus the ``j`` tokens drafted so far.

Temperature, top-k and top-p come after the processors, as in transformers. Speculation then stays lossless with
respect to the *processed* target distribution: every verifier compares against the processed ``p`` of each
node's own context, and a drafter's ``q`` is whatever it sampled from (processing it too only raises acceptance).
``tests/unit/test_processors.py`` shows it with the exact-enumeration distribution test and greedy equality with
transformers' ``generate``.

Cost: contexts are exact, never padded (padding would change what a repetition penalty or an n-gram ban sees), so
a chain round makes one processor call per (distinct row length, slot), each on all rows of that length; a tree
round one per (row, node), plus one host sync (its parent pointers). A call without processors takes none of this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from decodekit.draft import Draft

if TYPE_CHECKING:
    from decodekit.state import DecodeState

__all__ = ["LogitsProcessing", "Processor", "process_next", "process_scored"]

Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class LogitsProcessing:
    """The processors of one call, applied in order after ``min_new_tokens``.

    Args:
        processors: callables ``(input_ids [n, T] long, scores [n, V] float32) -> scores [n, V]``; transformers'
            ``LogitsProcessor`` instances (and a ``LogitsProcessorList``'s items) qualify.
        min_new_tokens: while a row has generated fewer tokens than this, its EOS ids get ``-inf`` (counted per
            row from its own prompt length, drafted tokens included).
        eos: the call's EOS ids (``[E]`` long), masked for ``min_new_tokens``.
        vocab_size: ``V``.
    """

    def __init__(
        self, processors: Sequence[Processor], min_new_tokens: int, eos: torch.Tensor, vocab_size: int
    ) -> None:
        self.processors = list(processors)
        self.min_new_tokens = min_new_tokens
        self.eos_mask = torch.zeros(vocab_size, dtype=torch.bool, device=eos.device)
        self.eos_mask[eos] = True
        self.vocab_size = vocab_size

    def __repr__(self) -> str:
        names = [type(p).__name__ for p in self.processors]
        return f"LogitsProcessing(min_new_tokens={self.min_new_tokens}, processors={names})"

    def row(self, input_ids: torch.Tensor, scores: torch.Tensor, prompt_lengths: torch.Tensor) -> torch.Tensor:
        """Process ``n`` positions whose contexts have the same length: ``input_ids [n, T]`` (each position's exact
        context), ``scores [n, V]`` float32, ``prompt_lengths [n]`` each position's row's prompt length (device:
        no host sync)."""
        if self.min_new_tokens:
            early = ((input_ids.shape[1] - prompt_lengths) < self.min_new_tokens)[:, None]
            scores = scores.masked_fill(early & self.eos_mask, float("-inf"))
        for processor in self.processors:
            scores = processor(input_ids, scores)
        return scores


def process_next(state: DecodeState, logits: torch.Tensor, drafted: torch.Tensor | None = None) -> torch.Tensor:
    """The call's processors on each row's next-token logits ``[B, V]`` after its committed tokens followed by
    ``drafted [B, j]`` (a drafter's tokens so far; None = none). Returns ``logits`` itself when the call has no
    processors, else float32 ``[B, V]``."""
    if state.processing is None:
        return logits
    j = 0 if drafted is None else drafted.shape[1]
    return _process_chain(state, logits[:, None], drafted, first=j)[:, 0]


def process_scored(state: DecodeState, logits: torch.Tensor, draft: Draft) -> torch.Tensor:
    """The call's processors on a round's scored logits ``[B, N + 1, V]`` (:meth:`LanguageModel.score`): slot 0
    after the committed tokens, slot ``i + 1`` after the path to node ``i``. Returns ``logits`` itself when the
    call has no processors, else float32 ``[B, N + 1, V]``."""
    if state.processing is None:
        return logits
    logits = logits[:, : draft.num_nodes + 1]
    if draft.is_chain:
        return _process_chain(state, logits, draft.tokens)
    return _process_tree(state, logits, draft)


def _process_chain(
    state: DecodeState, logits: torch.Tensor, extra: torch.Tensor | None, first: int = 0
) -> torch.Tensor:
    """``logits [B, S, V]``, slot ``s`` after the committed tokens and ``extra[:, : first + s]``: one processor
    call per (committed length, slot), on every row of that length. Returns float32 ``[B, S, V]``."""
    by_length: dict[int, list[int]] = {}
    for b, n in enumerate(state.host_lengths):
        by_length.setdefault(n, []).append(b)
    out = logits.float().clone()
    for n, rows in by_length.items():
        index = torch.tensor(rows, device=logits.device)
        context = state.tokens[index, :n]
        for s in range(logits.shape[1]):
            ids = torch.cat([context, extra[index, : first + s]], 1) if first + s else context
            out[index, s] = state.processing.row(ids, out[index, s], state.prompt_lengths[index])
    return out


def _process_tree(state: DecodeState, logits: torch.Tensor, draft: Draft) -> torch.Tensor:
    """``logits [B, N + 1, V]`` of a tree draft: each (row, slot) on its own, after the path to its node."""
    out = logits.float().clone()
    for b, (n, paths) in enumerate(zip(state.host_lengths, _paths(draft))):
        for s, path in enumerate(paths):
            ids = torch.cat([state.tokens[b, :n], draft.tokens[b, path]])[None]
            out[b, s] = state.processing.row(ids, out[b, s][None], state.prompt_lengths[b : b + 1])[0]
    return out


def _paths(draft: Draft) -> list[list[list[int]]]:
    """Per row, per scored slot, the draft node indices from the root down to that slot's node (slot 0: none)."""
    n, rows = draft.num_nodes, []
    for parents in draft.parents.tolist():  # the tree's one host sync
        paths: list[list[int]] = [[]]
        for i in range(n):
            p = parents[i]
            paths.append([*paths[p + 1], i] if 0 <= p < i else [i])
        rows.append(paths)
    return rows
