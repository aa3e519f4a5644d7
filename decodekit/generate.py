"""The speculative decoding loop. Autoregressive decoding is this loop with no drafter."""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from decodekit.errors import (
    ConfigError,
    ContextLengthError,
    EmptyPromptError,
    IncompatibleDraftError,
    VocabMismatchError,
)
from decodekit.interfaces import Drafter, LengthPolicy, Verifier
from decodekit.metrics import SpecStats, timed
from decodekit.models import LanguageModel, load_model
from decodekit.policies import FixedLength
from decodekit.sampling import next_token
from decodekit.state import DecodeState
from decodekit.types import Draft, DraftBudget, GenerationOutput, SamplingParams, Verdict
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
    seed: int | None = None,
    streamer: Streamer | None = None,
) -> GenerationOutput:
    """Generate continuations of ``prompts`` with speculative decoding (plain decoding when ``drafter`` is None).

    Args:
        model: the target (a :class:`LanguageModel`, a transformers causal LM, or a path).
        prompts: token ids, ragged ``list[list[int]]`` or a ``LongTensor [B, T]`` (one ``list[int]`` = one
            prompt); strings are encoded with the model's tokenizer.
        drafter: proposes tokens each round; None = autoregressive decoding.
        verifier: decides what the target accepts; default greedy at temperature 0, else rejection sampling.
        policy: draft budget per round; default ``FixedLength(4)``.
        max_new_tokens: per row, including the EOS token.
        temperature, top_k, top_p: sampling of the target (and, by default, of the drafter); temperature 0 is
            greedy.
        eos_token_id: id(s) that end a row; None = the model's, ``()`` = never stop early.
        seed: seeds the call's generator; the same seed gives the same output.
        streamer: called as ``streamer(row, tokens)`` with each row's newly committed tokens.

    Returns:
        :class:`GenerationOutput` with ``sequences`` (prompt excluded), ``finish_reasons`` and ``stats``.
    """
    start = time.perf_counter()
    model = load_model(model)
    sampling = SamplingParams(temperature, top_k, top_p)
    verifier = verifier or (GreedyVerifier() if sampling.greedy else RejectionVerifier())
    policy = policy or FixedLength(4)
    rows = _prompt_ids(prompts, model)
    _check_components(model, drafter, verifier, sampling)
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    eos = torch.tensor(_eos_ids(eos_token_id, model), dtype=torch.long, device=model.device)
    generator = None if seed is None else torch.Generator(model.device).manual_seed(seed)
    state = DecodeState.from_prompts(rows, _max_lengths(rows, max_new_tokens, model), sampling, generator, model.device)
    stats, out = SpecStats(num_rows=len(rows)), _Outputs(len(rows), eos, streamer)

    components = (drafter, policy) if drafter is not None else ()
    with timed(stats, "prefill_time_s", model.device):
        cache = model.new_cache(state.batch_size, state.tokens.shape[1])
        prompts_width = int(state.lengths.max())
        first = next_token(model.extend(cache, state.tokens[:, :prompts_width], state.lengths), sampling, generator)
        finished, committed = out.commit(state, first[:, None], torch.ones_like(first))
        stats.generated += int(committed.sum())
        for component in components:
            _hook(component, "begin", state)
    while True:
        _drop_finished(finished, out, state, cache, *components)
        if state.batch_size == 0:
            break
        with timed(stats, "draft_time_s", model.device):
            draft = _propose(drafter, policy, verifier, state, model.vocab_size)
        with timed(stats, "verify_time_s", model.device):
            verdict = verifier.verify(draft, model.score(cache, state.pending, draft), sampling, generator)
            cache.keep(verdict.num_accepted + 1, _kept_slots(draft, verdict))
        finished, committed = out.commit(state, *_round_tokens(draft, verdict))
        stats.record_round(draft.num_valid.cpu(), verdict.num_accepted.cpu(), committed)
        for component in components:
            _hook(component, "observe", state, draft, verdict)
    stats.total_time_s = time.perf_counter() - start
    return out.result(stats)


def _propose(
    drafter: Drafter | None, policy: LengthPolicy, verifier: Verifier, state: DecodeState, vocab: int
) -> Draft:
    """This round's draft: the policy's budget, capped so no round passes a row's limit, spent by the drafter."""
    if drafter is None:
        return _empty_draft(state.batch_size, state.device)
    budget = policy.plan(state)
    budget = DraftBudget(torch.minimum(budget.lengths, state.remaining - 1).clamp(min=0), budget.stop)
    if budget.max_len == 0:
        return _empty_draft(state.batch_size, state.device)
    draft = drafter.propose(state, budget)
    if draft.num_nodes and draft.kind not in verifier.accepts:  # an empty draft is plain decoding
        raise IncompatibleDraftError(
            f"{type(verifier).__name__} cannot verify {draft.kind.value} drafts "
            f"(it accepts: {', '.join(sorted(k.value for k in verifier.accepts))})"
        )
    draft.check(state.batch_size, vocab, budget.lengths)
    return draft.trimmed()


@functools.lru_cache(maxsize=64)
def _empty_draft(batch_size: int, device: torch.device) -> Draft:
    return Draft.empty(batch_size, device)


def _kept_slots(draft: Draft, verdict: Verdict) -> torch.Tensor | None:
    """Staged slots the cache keeps: the pending token (slot 0) and the accepted path; None for chains (a prefix)."""
    if draft.is_chain:
        return None
    return torch.cat([torch.zeros_like(verdict.num_accepted)[:, None], verdict.accepted + 1], 1)


def _round_tokens(draft: Draft, verdict: Verdict) -> tuple[torch.Tensor, torch.Tensor]:
    """What a round commits per row: the accepted path then the next pending token (``[B, M]``, counts ``[B]``)."""
    num, nxt = verdict.num_accepted, verdict.next_token[:, None]
    if draft.num_nodes == 0:
        return nxt, num + 1
    path = draft.tokens.gather(1, verdict.accepted.clamp(min=0))
    return torch.cat([path, nxt], 1).scatter(1, num[:, None], nxt), num + 1


class _Outputs:
    """Streams committed tokens and collects each caller row's sequence when the row finishes."""

    def __init__(self, num_rows: int, eos: torch.Tensor, streamer: Streamer | None) -> None:
        self.sequences: list[list[int]] = [[] for _ in range(num_rows)]
        self.reasons = ["length"] * num_rows
        self.eos = eos
        self.streamer = streamer

    def commit(self, state: DecodeState, new: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``new [B, M]`` (first ``counts[b]`` per row) to the state, cut at EOS and at each row's limit.

        Returns ``finished [B]`` (device) and the tokens committed per row ``[B]`` (CPU).
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
        finished = state.lengths >= state.max_lengths
        if hit_eos is not None:
            finished |= hit_eos
        counts_cpu = counts.cpu()
        if self.streamer is not None:
            for b, (row, tokens) in enumerate(zip(state.rows.tolist(), new.cpu().tolist())):
                if counts_cpu[b]:
                    self.streamer(row, tokens[: counts_cpu[b]])
        return finished, counts_cpu

    def collect(self, state: DecodeState, finished: torch.Tensor) -> None:
        """Record the sequences of the ``finished [B]`` rows (before they leave the batch)."""
        eos = set(self.eos.tolist())
        for b in finished.nonzero()[:, 0].tolist():
            row = int(state.rows[b])
            self.sequences[row] = state.tokens[b, state.prompt_lengths[b] : state.lengths[b]].tolist()
            if self.sequences[row][-1] in eos:
                self.reasons[row] = "eos"

    def result(self, stats: SpecStats) -> GenerationOutput:
        end = getattr(self.streamer, "end", None)
        if callable(end):
            end()
        return GenerationOutput(sequences=self.sequences, finish_reasons=self.reasons, stats=stats)


def _hook(component: Any, name: str, *args: Any) -> None:
    method = getattr(component, name, None)
    if method is not None:
        method(*args)


def _drop_finished(finished: torch.Tensor, out: _Outputs, state: DecodeState, cache: Any, *components: Any) -> None:
    """Collect finished rows, then remove them from the state, the cache and every component's per-row state."""
    if not bool(finished.any()):
        return
    out.collect(state, finished)
    keep = (~finished).nonzero()[:, 0]
    state.select_rows(keep)
    cache.select_rows(keep)
    for component in components:
        _hook(component, "select_rows", keep)


def _check_components(model: LanguageModel, drafter: Any, verifier: Any, sampling: SamplingParams) -> None:
    """Fail before any compute when the components cannot work together."""
    for name, component, protocol in (("drafter", drafter, Drafter), ("verifier", verifier, Verifier)):
        if component is not None and not isinstance(component, protocol):
            raise ConfigError(f"{name} {component!r} does not implement the {protocol.__name__} protocol")
    _hook(verifier, "check", sampling)
    if drafter is None:
        return
    draft_vocab = getattr(drafter, "vocab_size", None)
    if draft_vocab is not None and draft_vocab != model.vocab_size:
        raise VocabMismatchError(
            f"the drafter's vocabulary has {draft_vocab} tokens but the target's has {model.vocab_size}; "
            "use a draft model trained with the target's tokenizer (same vocabulary)"
        )
    kind_of = getattr(drafter, "draft_kind", None)
    if kind_of is not None and (kind := kind_of(sampling)) not in verifier.accepts:
        raise IncompatibleDraftError(
            f"{type(verifier).__name__} cannot verify {kind.value} drafts from {type(drafter).__name__}; "
            f"choose a verifier that accepts them"
        )


def _prompt_ids(prompts: Any, model: LanguageModel) -> list[list[int]]:
    """Normalise prompts to a non-empty list of non-empty id lists that fit the context."""
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist() if prompts.ndim == 2 else [prompts.tolist()]
    elif isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    prompts = list(prompts)
    if not prompts:
        raise EmptyPromptError("no prompts given; pass at least one prompt")
    rows = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if model.tokenizer is None:
                raise ConfigError("string prompts need a model with a tokenizer; pass token ids instead")
            prompt = model.tokenizer(prompt)["input_ids"]
        ids = [int(t) for t in (prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt)]
        if not ids:
            raise EmptyPromptError(f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)")
        if min(ids) < 0 or max(ids) >= model.vocab_size:
            raise ConfigError(f"prompt {i} has token ids outside the vocabulary [0, {model.vocab_size})")
        if model.max_context is not None and len(ids) >= model.max_context:
            raise ContextLengthError(
                f"prompt {i} has {len(ids)} tokens but the model's context is {model.max_context}; "
                f"shorten it to at most {model.max_context - 1} tokens"
            )
        rows.append(ids)
    return rows


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
    return [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
