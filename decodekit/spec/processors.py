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

Checks: each processor's output is checked on every call to be a floating-point tensor of the shape and device it
was given (host metadata, no sync). Its values (no NaN or ``+inf``, some token left finite in every row: a row of
``-inf`` everywhere would sample token 0) cost a host sync, so they are checked on the call's first processed
distribution (the first generated token's) and, with ``generate(..., debug=True)``, on every one; each failure is a
:class:`~decodekit.errors.ComponentOutputError` naming the processor (or the model, when its logits were bad before
any processor ran).

Cost: contexts are exact, never padded (padding would change what a repetition penalty or an n-gram ban sees), so
a chain round makes one processor call per (distinct row length, slot), each on all rows of that length; a tree
round one per (row, node), plus one host sync (its parent pointers). A call without processors takes none of this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from decodekit.checks import describe_on, tensor_fits
from decodekit.draft import Draft
from decodekit.errors import ComponentOutputError

if TYPE_CHECKING:
    from decodekit.spec.state import DecodeState

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
        debug: check every processed distribution's values (a host sync each); else only the first one's.
    """

    def __init__(
        self,
        processors: Sequence[Processor],
        min_new_tokens: int,
        eos: torch.Tensor,
        vocab_size: int,
        debug: bool = False,
    ) -> None:
        self.processors = list(processors)
        self.debug = debug
        self.unchecked = bool(self.processors)  # the first processed distribution's values are checked
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
        values = self.processors and (self.unchecked or self.debug)
        flags = [_bad_values(scores)] if values else []
        for processor in self.processors:
            out = processor(input_ids, scores)
            if not tensor_fits(out, [tuple(scores.shape)], scores.device, "float"):
                raise ComponentOutputError(
                    f"the logits processor {_name(processor)} returned {describe_on(out)}; a processor "
                    "f(input_ids [n, T], scores [n, V]) must return the scores it was given, processed: a float "
                    f"tensor of shape {tuple(scores.shape)} on {scores.device}"
                )
            scores = out
            if values:
                flags.append(_bad_values(scores))
        if values:
            self.unchecked = False
            self._check_values(flags)
        return scores

    def _check_values(self, flags: list[torch.Tensor]) -> None:
        """Raise for the first of the model's logits (``flags[0]``) and each processor's output (``flags[i + 1]``)
        that holds NaN / +inf or leaves a row no finite score (one host sync for all of them)."""
        read = torch.stack(flags).tolist()
        for i, (nan, banned) in enumerate(read):
            if not (nan or banned):
                continue
            who = (
                "the model's logits (before any processor)"
                if i == 0
                else f"the logits processor {_name(self.processors[i - 1])}"
            )
            what = (
                "NaN or +inf scores"
                if nan
                else "a row where every token is -inf (every token banned: sampling would return token 0)"
            )
            raise ComponentOutputError(
                f"{what} from {who}; a processor must leave finite scores and at least one allowed token per row. "
                "Processed values are checked on the call's first distribution only: run with debug=True to check "
                "every one"
            )


def _bad_values(scores: torch.Tensor) -> torch.Tensor:
    """``[2]`` bool on the device: whether ``scores [n, V]`` hold NaN or +inf, and whether a row has no finite score."""
    return torch.stack([(scores.isnan() | scores.isposinf()).any(), (scores == float("-inf")).all(-1).any()])


def _name(processor: Processor) -> str:
    """A processor for a message: its function name, else its class."""
    return getattr(processor, "__qualname__", None) or type(processor).__name__


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
