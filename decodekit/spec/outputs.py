"""What a :func:`decodekit.generate` call commits and returns: cuts at EOS, stop strings and each row's limit,
streaming (decodekit's ``streamer(row, tokens)`` or a transformers streamer), finished rows' tokens, the result."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_signature, describe
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.metrics import SpecStats
from decodekit.spec.state import DecodeState
from decodekit.types import GenerationOutput

__all__ = ["Outputs", "StopStrings", "StreamerAdapter", "as_streamer", "check_streamer", "is_transformers_streamer"]

Streamer = Callable[[int, list[int]], Any]


class StreamerAdapter:
    """decodekit's ``streamer(row, tokens)`` callback on top of a transformers streamer (``put`` / ``end``, e.g.
    ``TextStreamer``): each round's committed tokens are put as one 1-D tensor; :meth:`end` runs once."""

    def __init__(self, streamer: Any) -> None:
        self.streamer = streamer
        self.ended = False

    def __call__(self, row: int, tokens: list[int]) -> None:
        self.streamer.put(torch.tensor(tokens, dtype=torch.long))

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.streamer.end()


def is_transformers_streamer(streamer: Any) -> bool:
    """A transformers-style streamer: an instance with ``put`` and ``end`` methods that is not itself callable."""
    return not callable(streamer) and all(callable(getattr(streamer, m, None)) for m in ("put", "end"))


def check_streamer(streamer: Any) -> None:
    """Refuse a streamer that is neither a callable ``streamer(row, tokens)`` nor a transformers streamer, or whose
    signature does not take the calls it will get (``streamer(row, tokens)`` and ``end()``; ``put(tokens)`` and
    ``end()``), before any model work: a mismatch would otherwise raise from inside the loop."""
    if isinstance(streamer, type):
        raise ConfigTypeError(f"streamer must be an instance, got the class {streamer.__name__}; pass an instance")
    if streamer is not None and not callable(streamer) and not is_transformers_streamer(streamer):
        raise ConfigTypeError(
            "streamer must be a callable streamer(row, tokens) or a transformers streamer (put(tokens) and end(), "
            f"e.g. TextStreamer(tokenizer)), got {describe(streamer)}"
        )
    if streamer is None:
        return
    if is_transformers_streamer(streamer):
        check_signature("streamer.put", streamer.put, 1, "put(tokens)")
    else:
        check_signature("streamer", streamer, 2, "streamer(row, tokens)")
    end = getattr(streamer, "end", None)
    if callable(end):
        check_signature("streamer.end", end, 0, "end()")


def end_stream(streamer: Any) -> None:
    """Call ``streamer.end()``, if it has one: the end of the call, which releases a consumer waiting for it."""
    end = getattr(streamer, "end", None)
    if callable(end) and not isinstance(streamer, type):
        end()


@contextlib.contextmanager
def ended_on_error(streamer: Any) -> Iterator[None]:
    """:func:`end_stream` when the block raises: a call refused before its :class:`Outputs` takes the streamer over
    still releases a consumer waiting for the end (a ``TextIteratorStreamer``'s)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # the refusal is what the caller must see
            end_stream(streamer)
        raise


def as_streamer(streamer: Any, prompts: list[list[int]]) -> Streamer | None:
    """decodekit's callback for ``streamer``: itself when callable; a :class:`StreamerAdapter` for a transformers
    streamer, which (as in ``model.generate``) first receives the prompt ``[1, T]`` and takes one row only."""
    if streamer is None or not is_transformers_streamer(streamer):
        return streamer
    if len(prompts) != 1:
        raise ConfigError(
            f"a transformers streamer ({type(streamer).__name__}) takes one sequence, but the call has {len(prompts)} "
            "prompts: pass one prompt, or stream a batch with streamer=fn, called as fn(row, tokens)"
        )
    streamer.put(torch.tensor(prompts, dtype=torch.long))
    return StreamerAdapter(streamer)


class StopStrings:
    """transformers' ``stop_strings``: a row ends with the token that completes one of ``strings`` in its decoded
    text (the prompt included; the token may overhang the string), found by transformers' own
    ``StopStringCriteria`` at every committed position, so a round that commits several tokens stops at the right
    one. One criteria call per (row, committed position); no host sync of its own."""

    def __init__(self, strings: Sequence[str], tokenizer: Any) -> None:
        from transformers.generation.stopping_criteria import StopStringCriteria

        self.strings = tuple(strings)
        self.criteria = StopStringCriteria(tokenizer, list(self.strings))

    def hits(self, state: DecodeState, new: torch.Tensor) -> torch.Tensor:
        """``[B, M]`` bool: whether committing ``new [B, M]`` up to and including column ``m`` completes a stop
        string (columns past a row's count are computed too and ignored by the caller)."""
        out = []
        for b, n in enumerate(state.host_lengths):
            ids = torch.cat([state.tokens[b, :n], new[b]])
            out.extend(self.criteria(ids[None, : n + m + 1], None) for m in range(new.shape[1]))
        return torch.cat(out).view(new.shape).to(new.device)


def fill_holes(finished: list[int]) -> list[int]:
    """The rows that stay when the ``finished`` ones leave, in their new order (indices into the current batch):
    each live row keeps its index, except that live rows past the new batch size move into the gaps finished rows
    left below it. Caches then move only those rows and keep a view of the rest (:meth:`KVCache.select_rows`)."""
    kept = len(finished) - sum(1 for f in finished if f)
    tail = iter(b for b in range(kept, len(finished)) if not finished[b])
    return [next(tail) if finished[b] else b for b in range(kept)]


class Outputs:
    """Commits tokens (EOS, stop-string and length cuts), streams them, and keeps finished rows' sequences on the
    device until the call ends; :meth:`sync` is the loop's one host read per round."""

    def __init__(
        self,
        state: DecodeState,
        eos: torch.Tensor,
        streamer: Streamer | None,
        stop: StopStrings | None = None,
        pad_token_id: int | None = None,
        prompts: list[list[int]] | None = None,
        inputs: torch.Tensor | None = None,
    ) -> None:
        self.tokens = torch.zeros_like(state.tokens)  # [B0, C]: each caller row's tokens once it finished
        self.ends = state.lengths.clone()
        self.starts = list(state.host_lengths)
        self.prompts, self.inputs = prompts or [], inputs
        self.eos, self.streamer, self.stop, self.pad_token_id = eos, streamer, stop, pad_token_id
        self.finished = torch.zeros_like(state.lengths, dtype=torch.bool)
        self.stopped = torch.zeros_like(state.lengths, dtype=torch.bool)  # [B0]: ended by a stop string
        self.host_finished: list[int] = []  # this round's finished flags, as read by sync()

    def commit(self, state: DecodeState, new: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Append ``new [B, M]`` (first ``counts[b]`` per row) to the state, cut at EOS, at a stop string and at
        each row's limit. Returns the tokens committed per row ``[B]`` (device); sets :attr:`finished`."""
        ended = None
        if self.eos.numel() or self.stop is not None:
            is_end = torch.isin(new, self.eos) if self.eos.numel() else torch.zeros_like(new, dtype=torch.bool)
            is_stop = self.stop.hits(state, new) if self.stop is not None else None
            if is_stop is not None:
                is_end = is_end | is_stop
            if new.shape[1] > 1:
                is_end &= torch.arange(new.shape[1], device=new.device) < counts[:, None]
            ended = is_end.any(-1)
            first = is_end.int().argmax(-1)
            counts = torch.where(ended, first + 1, counts)
            if is_stop is not None:  # ended by a stop string, unless the row's limit cuts first
                by_stop = ended & is_stop.gather(1, first[:, None])[:, 0] & (first < state.remaining)
                self.stopped[state.rows] |= by_stop & ~torch.isin(new.gather(1, first[:, None])[:, 0], self.eos)
        counts = torch.minimum(counts, state.remaining)
        state.append(new, counts)
        self.finished = state.lengths >= state.max_lengths
        if ended is not None:
            self.finished |= ended
        if self.streamer is not None:
            for row, tokens, n in zip(state.rows.tolist(), new.tolist(), counts.tolist()):
                if n:
                    self.streamer(row, tokens[:n])
        return counts

    def sync(self, state: DecodeState, cache: KVCache, check: bool = False) -> None:
        """The round's host read: finished flags and lengths; hands the lengths to the state and the cache."""
        batch = state.batch_size
        host = torch.cat([self.finished.long(), state.lengths]).tolist()
        self.host_finished = host[:batch]
        state.host_lengths = host[batch:]
        lengths = [n - 1 for n in state.host_lengths]
        if any(self.host_finished):  # a row cut at its EOS or stop string kept the K/V of the draft past it
            cache.crop(state.lengths - 1)
        cache.set_host_lengths(lengths)
        if check:
            cache.check_host_mirror()

    def take_finished(self, state: DecodeState) -> list[int] | None:
        """Store the finished rows' tokens; returns the rows of the batch to keep (host ints: live rows keep their
        place unless one from the end fills a gap), or None when no row finished. The caller removes the others
        from the state, the cache and the components."""
        host_done = [b for b, finished in enumerate(self.host_finished) if finished]
        if not host_done:
            return None
        order = fill_holes(self.host_finished)
        done = torch.tensor(host_done, dtype=torch.long, device=state.device)
        self.tokens[state.rows[done]] = state.tokens[done]
        self.ends[state.rows[done]] = state.lengths[done]
        self.host_finished = [0] * len(order)  # the rows left are live
        return order

    def end_stream(self) -> None:
        """Tell the streamer the call ended (also after an error, so a consumer waiting for the end is released)."""
        end_stream(self.streamer)

    def result(self, make_stats: Callable[[int], SpecStats]) -> GenerationOutput:
        self.end_stream()
        tokens, ends, eos = self.tokens.tolist(), self.ends.tolist(), set(self.eos.tolist())
        stopped = self.stopped.tolist() if self.stop is not None else [False] * len(tokens)
        sequences = [row[s:e] for row, s, e in zip(tokens, self.starts, ends)]
        reasons = [
            "stop_string" if hit else "eos" if seq and seq[-1] in eos else "length"
            for seq, hit in zip(sequences, stopped)
        ]
        stats = make_stats(sum(len(seq) for seq in sequences))
        stats.num_rows = len(sequences)
        return GenerationOutput(
            sequences=sequences,
            finish_reasons=reasons,
            stats=stats,
            prompts=self.prompts,
            pad_token_id=self.pad_token_id,
            inputs=self.inputs,
        )
