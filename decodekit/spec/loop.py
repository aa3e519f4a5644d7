"""The speculative decoding loop. Autoregressive decoding is this loop with no drafter.

Host syncs (reads of device values that make the CPU wait for the GPU) per round: one read of the finished flags
and row lengths at the end of the round, plus one for the used width of a non-empty draft
(:meth:`~decodekit.draft.Draft.trimmed`); step-wise drafters add their own (``ModelDrafter``: one per draft step
when the policy has a stop rule). A streamer adds one per round. ``tests/unit/test_host_syncs.py`` counts them.
Logits processors and stop strings (:mod:`decodekit.spec.processors`, :mod:`decodekit.spec.outputs`) add none of their
own, except one per round for a tree draft's paths and whatever a processor itself reads from the device.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Literal

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_bool, check_model_spec
from decodekit.interfaces import Drafter, LengthPolicy, Verifier
from decodekit.metrics import RoundCounters, SpecStats
from decodekit.models import LanguageModel, load_model
from decodekit.models.base import evaluating
from decodekit.models.compile_switch import compiling, resolve_compile
from decodekit.models.prompts import prompt_ids
from decodekit.sampling import begin_round, check_seed, make_generator, next_token
from decodekit.spec.component_checks import check_components, check_progress, check_untouched, explain_failure
from decodekit.spec.components import Components
from decodekit.spec.conventions import warn_model_config
from decodekit.spec.options import (
    build_processors,
    call_options,
    eos_list_for,
    max_lengths_for,
    max_new_tokens_for,
    pad_id,
    padded_inputs,
    prompts_or_input_ids,
    tokenizer_for,
)
from decodekit.spec.outputs import Outputs, StopStrings, as_streamer, check_streamer, ended_on_error
from decodekit.spec.parts import resolve_parts
from decodekit.spec.processors import LogitsProcessing, Processor, process_next, process_scored
from decodekit.spec.round import Round, round_extras
from decodekit.spec.state import DecodeState
from decodekit.spec.steps import kept_slots, propose, round_tokens
from decodekit.timing import PhaseTimer
from decodekit.types import GenerationOutput, SamplingParams


@torch.no_grad()
def generate(
    model: Any,
    prompts: Any = None,
    drafter: Drafter | None = None,
    verifier: Verifier | None = None,
    policy: LengthPolicy | None = None,
    *,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | Sequence[int] | None = None,
    streamer: Any = None,
    debug: bool = False,
    compile: bool | Literal["auto", "max-autotune"] = False,
    generation_config: Any = None,
    do_sample: bool | None = None,
    max_length: int | None = None,
    min_new_tokens: int | None = None,
    repetition_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
    bad_words_ids: list[list[int]] | None = None,
    suppress_tokens: list[int] | None = None,
    logits_processor: Sequence[Processor] | None = None,
    stop_strings: str | Sequence[str] | None = None,
    tokenizer: Any = None,
    pad_token_id: int | None = None,
    input_ids: Any = None,
    attention_mask: Any = None,
    **unsupported: Any,
) -> GenerationOutput:
    """Generate continuations of ``prompts`` with speculative decoding (plain decoding when ``drafter`` is None).

    Args:
        model: the target (a :class:`LanguageModel`, a transformers causal LM, or a path).
        prompts: token ids, ragged ``list[list[int]]`` or an integer tensor / numpy array ``[B, T]`` (one
            ``list[int]`` or 1-D array = one prompt); strings are encoded with the model's tokenizer; a tokenizer's
            output (``BatchEncoding`` or a dict with ``input_ids``) works as is, its ``attention_mask`` (left or
            right padding) stripping each row's padding. Floats are refused, never truncated.
        drafter: proposes tokens each round; None = autoregressive decoding.
        verifier: decides what the target accepts; default greedy at temperature 0, else rejection sampling for
            chain drafts and traversal verification for tree drafts.
        policy: draft budget per round; default: the drafter's ``default_policy()`` if it has one, else
            ``FixedLength(4)``.
        max_new_tokens: per row, including the EOS token; default 64.
        temperature, top_k, top_p: sampling of the target (and, by default, of the drafter); temperature 0 (the
            default) is greedy.
        eos_token_id: id(s) that end a row; None = the model's, ``()`` = never stop early.
        seed: an int seeds the call's generator (the same seed gives the same output); one int per prompt gives
            each row its own keyed generator, so a row's sampled output depends only on its prompt, its seed and
            the settings, not on the other rows of the batch (:class:`~decodekit.sampling.RowGenerators`). Both
            assume components without memory across calls or rows: a drafter that learns from what it saw
            (``recycling``'s successor table, ``suffix``'s global cache) drafts differently in a later call or
            beside other rows, which changes sampled tokens (never their distribution); build a fresh one (or
            ``clear()`` it) for a call to repeat. Likewise a length policy that picks lengths for the whole batch
            (``goodput``, ``batch_aware``, ``kld_stability``, a ``Stack``'s ``batch_cap``) and the ``diffusion``
            drafter (its block is the batch's longest budget).
        streamer: called as ``streamer(row, tokens)`` with each row's newly committed tokens (and ``end()``, if it
            has one, when the call ends); or a transformers streamer (``TextStreamer``, any ``BaseStreamer``) for
            one prompt, fed as ``model.generate`` feeds it: the prompt, then each round's tokens, then ``end()``.
        debug: validate every budget's, draft's and verdict's values, every processed distribution (no NaN, some
            token allowed) and the cache's bookkeeping each round (host syncs); without it the first budget, the first
            non-empty draft and its verdict (plain decoding: the first round's verdict), and the first processed
            distribution are validated, and later outputs only by type, shape, dtype and device (a later bad token
            that fails deep in a forward is reported as the :class:`~decodekit.errors.ComponentOutputError` of the
            component that made it). A round that commits nothing to a live row raises
            :class:`~decodekit.errors.NoProgressError` either way.
        compile: run the target's (and a draft model's) decode and verification forwards at static shapes through
            ``torch.compile`` (:mod:`decodekit.models.compiled`): Llama, Mistral, Qwen2 and Qwen3 (early-exit
            forwards too, a graph per exit layer); other models and layer-skipping forwards run eager with one warning.
            True: inductor's default kernels (CUDA graphs on CUDA);
            ``"max-autotune"``: the weights frozen into the compiled step and its linear layers as inductor's tuned
            GEMM templates (on the CPU plain decoding of SmolLM2-135M 1.9x eager with stock kernels, 1.7x eager with
            oneDNN's, docs/benchmarks.md; the
            first compile takes minutes, cached on disk; a weight changed later recompiles); ``"auto"``: True on
            CUDA, eager on the CPU. The first call compiles; later calls reuse it. Same tokens as eager.

    transformers' conventions (:mod:`decodekit.spec.conventions`): ``generation_config`` (a ``GenerationConfig``: its
    set fields are defaults the keywords override), ``do_sample`` (False = greedy whatever the temperature; True
    samples at ``temperature`` or 1.0), ``max_length`` (prompt + generated, counted from the longest prompt, as
    transformers counts from the padded width), ``min_new_tokens`` (per row), ``repetition_penalty``,
    ``no_repeat_ngram_size``, ``bad_words_ids``, ``suppress_tokens`` and ``logits_processor`` (processors ``f(input_ids
    [n, T], scores [n, V])``, applied to the target's and a model drafter's distributions alike before temperature
    / top-k / top-p, so speculation stays lossless for the processed distribution: :mod:`decodekit.spec.processors`),
    ``stop_strings`` (with ``tokenizer``, default the model's), ``pad_token_id`` (for :meth:`GenerationOutput.padded`,
    model.generate's ``[B, T + G]`` tensor), ``input_ids`` / ``attention_mask`` instead of ``prompts``. Other
    ``model.generate`` keywords are refused by name with what to do instead.

    Every argument is checked before any model work (:mod:`decodekit.checks`): a wrong value raises a
    :class:`~decodekit.errors.ConfigError` (a ``ValueError``; :class:`~decodekit.errors.ConfigTypeError`, also a
    ``TypeError``, for a wrong type) whose message names the argument.

    Returns:
        :class:`GenerationOutput` with ``sequences`` (prompt excluded), ``finish_reasons``, ``stats``, and
        :meth:`~GenerationOutput.padded`.
    """
    start = time.perf_counter()
    given = dict(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        do_sample=do_sample,
        max_length=max_length,
        pad_token_id=pad_token_id,
        min_new_tokens=min_new_tokens,
        repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size,
        bad_words_ids=bad_words_ids,
        suppress_tokens=suppress_tokens,
        logits_processor=logits_processor,
        stop_strings=stop_strings,
    )  # the transformers-style keywords, merged over generation_config by call_options
    with ended_on_error(streamer):  # a refused call still releases a transformers streamer's consumer
        options = call_options(generation_config, given, unsupported)
        sampling = SamplingParams(options.temperature, options.top_k, options.top_p)
        check_components(drafter, verifier, policy)  # their Protocols, before the model loads
        debug = check_bool("debug", debug)
        check_model_spec("model", model)
        model = load_model(model)
        compiled = resolve_compile(compile, model.device)  # None (eager) or the mode forwards compile in
        warn_model_config(model, generation_config, given)
        source = prompts_or_input_ids(prompts, input_ids, attention_mask)
        rows, inputs = prompt_ids(source, model), padded_inputs(source)
        max_new_tokens = max_new_tokens_for(options, rows, None if inputs is None else inputs.shape[1])
        seed = check_seed(seed, len(rows))
        eos_list = eos_list_for(options.eos_token_id, model)
        eos = torch.tensor(eos_list, dtype=torch.long, device=model.device)
        processors = build_processors(options, model.vocab_size, eos_list, model.device)
        stop = StopStrings(options.stop_strings, tokenizer_for(tokenizer, model)) if options.stop_strings else None
        check_streamer(streamer)
        max_lengths = max_lengths_for(rows, max_new_tokens, model)
        parts = resolve_parts(model, drafter, verifier, policy, sampling)  # defaults, checks, hooks: once
        parts.check_context(max(max_lengths))
        generator = make_generator(seed, model.device)  # a list of ints: one keyed generator per row
        state = DecodeState.from_prompts(rows, max_lengths, sampling, generator, model.device)
        state.needs, state.vocab_size = parts.needs, model.vocab_size
        if processors or options.min_new_tokens:
            state.processing = LogitsProcessing(processors, options.min_new_tokens, eos, model.vocab_size, debug=debug)
        pad = pad_id(options, model, eos_list)
        out = Outputs(state, eos, as_streamer(streamer, rows), stop, pad, rows, inputs)
    try:
        with compiling(compiled, model=model), evaluating(model):
            return _loop(model, state, parts, out, debug, start)
    finally:
        out.end_stream()  # also after an error, so a consumer waiting for the end is released


def _loop(
    model: LanguageModel, state: DecodeState, parts: Components, out: Outputs, debug: bool, start: float
) -> GenerationOutput:
    """The rounds of one call (see the module docstring), from prefill to the last row's end."""
    generator, sampling = state.generator, state.sampling
    timer, counters = PhaseTimer(model.device, exact="timings" in parts.needs), RoundCounters(model.device)
    timer.start()
    cache = model.new_cache(state.batch_size, state.tokens.shape[1])
    width, asked = max(state.host_lengths), parts.hidden_asked(prefill=True)
    prefill = model.extend(cache, state.tokens[:, :width], state.lengths, host_counts=state.host_lengths, **asked)
    parts.check_hidden(model, prefill, (state.batch_size, width), asked, prefill=True)
    begin_round(generator, state.host_lengths)
    first = next_token(process_next(state, prefill.logits), sampling, generator)
    out.commit(state, first[:, None], torch.ones_like(first))
    out.sync(state, cache)
    parts.begin(state, model, cache, prefill)
    timer.mark("prefill")
    timer.end_round()
    index, asked = 0, parts.hidden_asked(prefill=False)
    _compact(out, state, cache, parts)
    while state.batch_size:
        begin_round(generator, state.host_lengths)
        timer.start()
        draft = propose(parts, state, debug, index)
        timer.mark("draft")
        try:
            scored = model.score(cache, state.pending, draft, **asked)
        except (IndexError, RuntimeError) as error:  # a later round's bad token or tree: name who made it
            explain_failure(parts, error, state, draft, round_index=index)
            raise
        parts.check_hidden(model, scored, (state.batch_size, draft.num_nodes + 1), asked, prefill=False)
        logits = process_scored(state, scored.logits, draft)
        before, verifier = state.stamp(draft), parts.verifier_for(draft)
        verdict = verifier.verify(draft, logits, sampling, generator)
        check_untouched(before, state, verifier, "verify", draft)
        parts.check_verdict(verdict, draft, index, values=debug)
        try:
            cache.keep(verdict.num_accepted + 1, kept_slots(draft, verdict))
            timer.mark("verify")
            tokens, counts = round_tokens(draft, verdict)
        except (IndexError, RuntimeError) as error:  # a later round's malformed verdict
            explain_failure(parts, error, state, draft, verdict, round_index=index)
            raise
        counts = out.commit(state, tokens, counts)
        reach = None if not draft.num_nodes or draft.is_chain else draft.depth.max(-1).values  # a tree's depth
        counters.add_round(draft.num_valid, torch.minimum(verdict.num_accepted, counts), draft.num_nodes, reach)
        times = timer.end_round()
        before = state.host_lengths
        out.sync(state, cache, check=debug)
        check_progress(parts.verifier, before, state.host_lengths, verdict)
        if parts.observers:
            scored = dataclasses.replace(scored, logits=logits)  # the processed logits the verifier saw
            extras = round_extras(parts.needs, parts.hidden_layers, draft, scored, verdict, sampling)
            if times and "timings" in parts.needs:
                extras.update(draft_time_s=times["draft"], verify_time_s=times["verify"])
            parts.observe(state, Round(index, draft, verdict, tokens, counts, **extras))  # type: ignore[arg-type]
        index += 1
        _compact(out, state, cache, parts)
    result = out.result(lambda generated: _stats(counters, timer, start, generated))
    parts.check_output(result.sequences)  # the last round's next_token, which no forward read (host ints: no sync)
    return result


def _compact(out: Outputs, state: DecodeState, cache: KVCache, parts: Components) -> None:
    """Rows that finished leave the batch: their tokens stored (:meth:`Outputs.take_finished`), the live rows kept
    in the state (its per-row generators in step), the cache and every component with per-row state."""
    order = out.take_finished(state)
    if order is not None:
        keep = torch.tensor(order, dtype=torch.long, device=state.device)
        state.select_rows(keep, order)
        cache.select_rows(keep, host_rows=order)
        parts.select_rows(keep, order)


def _stats(counters: RoundCounters, timer: PhaseTimer, start: float, generated: int) -> SpecStats:
    totals = timer.finish()
    stats = SpecStats()
    counters.flush(stats, generated)
    stats.prefill_time_s = totals.get("prefill", 0.0)
    stats.draft_time_s, stats.verify_time_s = totals.get("draft", 0.0), totals.get("verify", 0.0)
    stats.total_time_s = time.perf_counter() - start
    return stats
