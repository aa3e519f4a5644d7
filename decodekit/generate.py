"""The speculative decoding loop. Autoregressive decoding is this loop with no drafter.

Host syncs (reads of device values that make the CPU wait for the GPU) per round: one read of the finished flags
and row lengths at the end of the round, plus one for the used width of a non-empty draft
(:meth:`~decodekit.draft.Draft.trimmed`); step-wise drafters add their own (``ModelDrafter``: one per draft step
when the policy has a stop rule). A streamer adds one per round. ``tests/unit/test_host_syncs.py`` counts them.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.checks import (
    check_bool,
    check_callable,
    check_int,
    check_model_spec,
    check_seed,
    eos_ids,
)
from decodekit.components import Components, check_components
from decodekit.draft import Draft
from decodekit.interfaces import Drafter, LengthPolicy, Verifier
from decodekit.metrics import RoundCounters, SpecStats
from decodekit.models import LanguageModel, load_model
from decodekit.policies import FixedLength
from decodekit.prompts import prompt_ids
from decodekit.round import Round, kept_inputs, round_extras
from decodekit.sampling import begin_round, make_generator, next_token
from decodekit.state import DecodeState
from decodekit.timing import PhaseTimer
from decodekit.types import GenerationOutput, SamplingParams, Verdict
from decodekit.verifiers import GreedyVerifier, RejectionVerifier

Streamer = Callable[[int, list[int]], Any]


@torch.no_grad()
def generate(
    model: Any,
    prompts: Any,
    drafter: Drafter | None = None,
    verifier: Verifier | None = None,
    policy: LengthPolicy | None = None,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | Sequence[int] | None = None,
    streamer: Streamer | None = None,
    debug: bool = False,
) -> GenerationOutput:
    """Generate continuations of ``prompts`` with speculative decoding (plain decoding when ``drafter`` is None).

    Args:
        model: the target (a :class:`LanguageModel`, a transformers causal LM, or a path).
        prompts: token ids, ragged ``list[list[int]]`` or an integer tensor / numpy array ``[B, T]`` (one
            ``list[int]`` or 1-D array = one prompt); strings are encoded with the model's tokenizer; a tokenizer's
            output (``BatchEncoding`` or a dict with ``input_ids``) works as is, its ``attention_mask`` (left or
            right padding) stripping each row's padding. Floats are refused, never truncated.
        drafter: proposes tokens each round; None = autoregressive decoding.
        verifier: decides what the target accepts; default greedy at temperature 0, else rejection sampling.
        policy: draft budget per round; default ``FixedLength(4)``.
        max_new_tokens: per row, including the EOS token.
        temperature, top_k, top_p: sampling of the target (and, by default, of the drafter); temperature 0 is
            greedy.
        eos_token_id: id(s) that end a row; None = the model's, ``()`` = never stop early.
        seed: an int seeds the call's generator (the same seed gives the same output); one int per prompt gives
            each row its own keyed generator, so a row's sampled output depends only on its prompt, its seed and
            the settings, not on the other rows of the batch (:class:`~decodekit.sampling.RowGenerators`).
        streamer: called as ``streamer(row, tokens)`` with each row's newly committed tokens.
        debug: validate every budget's, draft's and verdict's values and the cache's bookkeeping each round (host
            syncs); without it the first non-empty draft is validated and later outputs only by type, shape, dtype
            and device. A round that commits nothing to a live row raises :class:`~decodekit.errors.NoProgressError`
            either way.

    Every argument is checked before any model work (:mod:`decodekit.checks`): a wrong value raises a
    :class:`~decodekit.errors.ConfigError` (a ``ValueError``; :class:`~decodekit.errors.ConfigTypeError`, also a
    ``TypeError``, for a wrong type) whose message names the argument.

    Returns:
        :class:`GenerationOutput` with ``sequences`` (prompt excluded), ``finish_reasons`` and ``stats``.
    """
    start = time.perf_counter()
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1)
    sampling = SamplingParams(temperature, top_k, top_p)
    check_components(drafter, verifier, policy)
    check_callable("streamer", streamer, expected="a callable streamer(row, tokens)")
    debug = check_bool("debug", debug)
    check_model_spec("model", model)
    model = load_model(model)
    rows = _prompt_ids(prompts, model)
    seed = check_seed(seed, len(rows))
    eos = torch.tensor(_eos_ids(eos_token_id, model), dtype=torch.long, device=model.device)
    max_lengths = _max_lengths(rows, max_new_tokens, model)
    if verifier is None:
        verifier = GreedyVerifier() if sampling.greedy else RejectionVerifier()
    parts = Components(model, drafter, verifier, FixedLength(4) if policy is None else policy, sampling)
    parts.check_context(max(max_lengths))
    generator = make_generator(seed, model.device)  # a list of ints: one keyed generator per row
    state = DecodeState.from_prompts(rows, max_lengths, sampling, generator, model.device)
    state.needs = parts.needs
    timer, counters = PhaseTimer(model.device, exact="timings" in parts.needs), RoundCounters(model.device)
    out = _Outputs(state, eos, streamer)

    timer.start()
    cache = model.new_cache(state.batch_size, state.tokens.shape[1])
    width = max(state.host_lengths)
    logits = model.extend(cache, state.tokens[:, :width], state.lengths, host_counts=state.host_lengths).logits
    begin_round(generator, state.host_lengths)
    first = next_token(logits, sampling, generator)
    out.commit(state, first[:, None], torch.ones_like(first))
    out.sync(state, cache)
    parts.begin(state, model, cache)
    timer.mark("prefill")
    timer.end_round()
    index = 0
    while out.drop_finished(state, cache, parts):  # state.select_rows keeps per-row generators in step
        begin_round(generator, state.host_lengths)
        timer.start()
        draft = _propose(parts, state, validate=debug or parts.unchecked)
        timer.mark("draft")
        scored = model.score(
            cache, state.pending, draft, hidden_layers=parts.hidden_layers, return_hidden="hidden" in parts.needs
        )
        verdict = verifier.verify(draft, scored.logits, sampling, generator)
        parts.check_verdict(verdict, draft, values=debug)
        cache.keep(verdict.num_accepted + 1, _kept_slots(draft, verdict))
        timer.mark("verify")
        tokens, counts = _round_tokens(draft, verdict)
        counts = out.commit(state, tokens, counts)
        counters.add_round(draft.num_valid, verdict.num_accepted, draft.num_nodes)
        times = timer.end_round()
        before = state.host_lengths
        out.sync(state, cache, check=debug)
        parts.check_progress(before, state.host_lengths, verdict)
        if parts.observers:
            extras = round_extras(parts.needs, parts.hidden_layers, draft, scored, verdict, sampling)
            if times and "timings" in parts.needs:
                extras.update(draft_time_s=times["draft"], verify_time_s=times["verify"])
            parts.observe(state, Round(index, draft, verdict, tokens, counts, **extras))  # type: ignore[arg-type]
        index += 1
    return out.result(lambda generated: _stats(counters, timer, start, generated))


def _stats(counters: RoundCounters, timer: PhaseTimer, start: float, generated: int) -> SpecStats:
    totals = timer.finish()
    stats = SpecStats()
    counters.flush(stats, generated)
    stats.prefill_time_s = totals.get("prefill", 0.0)
    stats.draft_time_s, stats.verify_time_s = totals.get("draft", 0.0), totals.get("verify", 0.0)
    stats.total_time_s = time.perf_counter() - start
    return stats


def _propose(parts: Components, state: DecodeState, validate: bool) -> Draft:
    """This round's draft: the policy's budget, its depth capped so no round passes a row's limit, spent by the
    drafter; validated when ``validate``; unused columns trimmed."""
    if parts.drafter is None:
        return _empty_draft(state.batch_size, state.device)
    budget = parts.plan(state, validate).capped(state.remaining - 1, state.host_room - 1)
    parts.check_budget_size(budget)
    if budget.max_depth == 0 or budget.max_len == 0:
        return _empty_draft(state.batch_size, state.device)
    draft = parts.drafter.propose(state, budget)
    parts.check_draft(draft, state, budget, values=validate)
    return draft.trimmed() if draft.num_nodes else draft


@functools.lru_cache(maxsize=64)
def _empty_draft(batch_size: int, device: torch.device) -> Draft:
    return Draft.empty(batch_size, device)


def _kept_slots(draft: Draft, verdict: Verdict) -> torch.Tensor | None:
    """Staged slots the cache keeps: the pending token (slot 0) and the accepted path; None for chains (a prefix)."""
    return None if draft.is_chain else kept_inputs(verdict)


def _round_tokens(draft: Draft, verdict: Verdict) -> tuple[torch.Tensor, torch.Tensor]:
    """What a round commits per row: the accepted path then the next pending token (``[B, M]``, counts ``[B]``)."""
    num, nxt = verdict.num_accepted, verdict.next_token[:, None]
    if draft.num_nodes == 0:
        return nxt, num + 1
    path = draft.tokens.gather(1, verdict.accepted.clamp(min=0))
    return torch.cat([path, nxt], 1).scatter(1, num[:, None], nxt), num + 1


class _Outputs:
    """Commits tokens (EOS and length cuts), streams them, and keeps finished rows' sequences on the device until
    the call ends; :meth:`sync` is the loop's one host read per round."""

    def __init__(self, state: DecodeState, eos: torch.Tensor, streamer: Streamer | None) -> None:
        self.tokens = torch.zeros_like(state.tokens)  # [B0, C]: each caller row's tokens once it finished
        self.ends = state.lengths.clone()
        self.starts = list(state.host_lengths)
        self.eos, self.streamer = eos, streamer
        self.finished = torch.zeros_like(state.lengths, dtype=torch.bool)
        self.host_finished: list[int] = []  # this round's finished flags, as read by sync()

    def commit(self, state: DecodeState, new: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Append ``new [B, M]`` (first ``counts[b]`` per row) to the state, cut at EOS and at each row's limit.

        Returns the tokens committed per row ``[B]`` (device); sets :attr:`finished`.
        """
        hit_eos = None
        if self.eos.numel():
            is_eos = torch.isin(new, self.eos)
            if new.shape[1] > 1:
                is_eos &= torch.arange(new.shape[1], device=new.device) < counts[:, None]
            hit_eos = is_eos.any(-1)
            counts = torch.where(hit_eos, is_eos.int().argmax(-1) + 1, counts)
        counts = torch.minimum(counts, state.remaining)
        state.append(new, counts)
        self.finished = state.lengths >= state.max_lengths
        if hit_eos is not None:
            self.finished |= hit_eos
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
        cache.set_host_lengths([n - 1 for n in state.host_lengths])
        if check:
            cache.check_host_mirror()

    def drop_finished(self, state: DecodeState, cache: KVCache, parts: Components) -> bool:
        """Store the finished rows' tokens, remove those rows everywhere; False once no row is left."""
        host_keep = [b for b, finished in enumerate(self.host_finished) if not finished]
        if len(host_keep) == state.batch_size:
            return state.batch_size > 0
        order = torch.argsort(self.finished.int(), stable=True)  # live rows first, in order; no host sync
        keep, done = order[: len(host_keep)], order[len(host_keep) :]
        self.tokens[state.rows[done]] = state.tokens[done]
        self.ends[state.rows[done]] = state.lengths[done]
        state.select_rows(keep, host_keep)
        cache.select_rows(keep, host_rows=host_keep)
        parts.select_rows(keep)
        self.host_finished = [0] * len(host_keep)  # the rows left are live
        return state.batch_size > 0

    def result(self, make_stats: Callable[[int], SpecStats]) -> GenerationOutput:
        end = getattr(self.streamer, "end", None)
        if callable(end):
            end()
        tokens, ends, eos = self.tokens.tolist(), self.ends.tolist(), set(self.eos.tolist())
        sequences = [row[s:e] for row, s, e in zip(tokens, self.starts, ends)]
        reasons = ["eos" if seq and seq[-1] in eos else "length" for seq in sequences]
        stats = make_stats(sum(len(seq) for seq in sequences))
        stats.num_rows = len(sequences)
        return GenerationOutput(sequences=sequences, finish_reasons=reasons, stats=stats)


def _prompt_ids(prompts: Any, model: LanguageModel) -> list[list[int]]:
    """Normalise prompts to a non-empty list of non-empty id lists that fit the context (see
    :func:`decodekit.prompts.prompt_ids`)."""
    return prompt_ids(prompts, model)


def _max_lengths(rows: list[list[int]], max_new_tokens: int, model: LanguageModel) -> list[int]:
    limit = model.max_context or max(len(r) for r in rows) + max_new_tokens
    if any(len(r) + max_new_tokens > limit for r in rows):
        warnings.warn(
            f"prompt + max_new_tokens exceeds the model's context ({limit}); rows stop at the context length",
            stacklevel=3,
        )
    return [min(len(r) + max_new_tokens, limit) for r in rows]


def _eos_ids(eos_token_id: int | Sequence[int] | None, model: LanguageModel) -> list[int]:
    if eos_token_id is None:
        return list(model.eos_token_ids)
    return eos_ids(eos_token_id, model.vocab_size)
