"""THE diffusion sampling loop: blocks of the generation region, a forward per step, a rule picks the commits.

A call lays the rows out as ``[prompt, G mask ids]`` (:class:`~decodekit.dlm.state.DLMState`) and, block by block
(the region schedule, :class:`~decodekit.dlm.interfaces.RegionSchedule`: by default ``G / block_length`` equal blocks
left to right, semi-autoregressive), repeats a step until the block has no masked slot:

1. one forward over the canvas (classifier-free guidance: the conditional and the prompt-masked rows in one batch);
   through the cache strategy (:class:`~decodekit.dlm.interfaces.DLMCache`: recompute, or reuse kept K/V);
2. proposals for every slot (:func:`~decodekit.dlm.state.propose`: argmax, or float64 Gumbel-max);
3. the schedule names the slots a step may commit (the block; AdaBlock cuts it at the block's first step, DCD slides
   a window every step); ``rule.select`` picks the slots to commit among them
   (:class:`~decodekit.dlm.interfaces.UnmaskRule`); committed slots are never masked again.

With a draft strategy (:class:`~decodekit.dlm.interfaces.DLMDraft`, self-speculation) step 1 also runs drafted canvases
of the next steps, and steps 2-3 repeat on each drafted canvas's output while the canvas the steps reached equals
it: one forward, several steps, the same output. When the drafts may finish the block, the forward also computes
the next block on each canvas, and a row that finished on a drafted canvas takes the next block's first step on its
output (:mod:`decodekit.dlm.lookahead`).

One host read per step (how many slots each row has left in its block, whether a row stalled), and one per drafted
canvas checked. What the parts return is checked as it comes (:mod:`decodekit.dlm.components`: type, shape, dtype and
device every step; values on that one read, on a call's first drafts, and every step with ``debug=True``). With
``rule=None`` the loop is LLaDA's reference sampler (:class:`~decodekit.dlm.rules.LLaDARule`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_bool, check_float, check_int, describe
from decodekit.dlm.caches import Recompute
from decodekit.dlm.components import check_finished, check_finite, check_logits
from decodekit.dlm.drafting import Drafting
from decodekit.dlm.lookahead import NextBlock
from decodekit.dlm.model import DLMModel, check_context, load_model
from decodekit.dlm.parts import Parts, resolve_parts
from decodekit.dlm.state import DLMState, carry_tails, output_at
from decodekit.dlm.step import take_step
from decodekit.errors import ConfigError, ConfigTypeError, NoProgressError
from decodekit.metrics import DLMStats
from decodekit.models.base import evaluating
from decodekit.models.compile_switch import compiling, resolve_compile
from decodekit.models.prompts import prompt_ids
from decodekit.sampling import check_seed, make_generator


@dataclass
class DLMOutput:
    """What :func:`decodekit.dlm.generate` returns.

    Attributes:
        sequences: per row, the ``gen_length`` generated tokens (no mask ids left).
        stats: forwards, tokens per forward, per-block steps, wall time.
    """

    sequences: list[list[int]]
    stats: DLMStats


@torch.no_grad()
def generate(
    model: Any,
    prompts: Any,
    gen_length: int = 128,
    block_length: int = 32,
    steps: int = 128,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    rule: Any = None,
    cache: Any = None,
    cfg_scale: float = 0.0,
    seed: Any = None,
    schedule: Any = None,
    draft: Any = None,
    progress: bool = False,
    debug: bool = False,
    compile: bool | str = False,
) -> DLMOutput:
    """Generate ``gen_length`` tokens per prompt with a masked diffusion LM.

    Args:
        model: a :class:`~decodekit.dlm.DLMModel` (:func:`decodekit.dlm.load_model`).
        prompts: a ragged ``list[list[int]]``, a ``LongTensor [B, T]``, or strings (the model's tokenizer).
        gen_length: ``G``, tokens generated per row.
        block_length: the semi-autoregressive block (``G`` = one block: pure diffusion); must divide ``G``.
        steps: the step budget, split evenly across blocks (must be a multiple of the number of blocks); LLaDA's rule
            spreads each block's commits over its share, threshold-style rules stop a block as soon as it is clean.
        temperature: 0 = argmax proposals; > 0 = Gumbel-max samples from ``softmax(logits / temperature)``.
        remasking: the baseline rule's ``"low_confidence"`` or ``"random"`` (ignored when ``rule`` is given).
        rule: an :class:`~decodekit.dlm.interfaces.UnmaskRule` (``dk.build("dlm_rule", "threshold")``, ...); None =
            ``LLaDARule(remasking)``.
        cache: a cache strategy (``dk.build("dlm_cache", "prefix")``, ``"dual"``; :mod:`decodekit.dlm.caches`);
            None = recompute the whole canvas every step (exact).
        cfg_scale: classifier-free guidance ``w``: logits ``u + (w + 1)(c - u)``, ``u`` from the canvas with the
            prompt masked (LLaDA's unsupervised CFG); 0 = off.
        seed: None (torch's global generator), an int (one generator for the batch), or one int per prompt (each
            row's randomness depends only on its own seed, not on its batch mates).
        schedule: the region schedule (``dk.build("dlm_schedule", "adablock")``, ``"dcd"``;
            :mod:`decodekit.dlm.schedules`); None = fixed blocks of ``block_length``.
        draft: a self-speculative draft strategy (``dk.build("dlm_draft", "spiffy")``; :mod:`decodekit.dlm.drafts`):
            each forward also runs drafted canvases of the next steps, and takes as many steps as the drafts got
            right; the output is unchanged (lossless: greedy, or sampled with one seed per row; a single int seed
            draws per call, so drafted and undrafted batches then sample differently), the forward count falls.
            Needs a cache with ``logits_many`` (``cache=None``, ``BlockCausalCache``), fixed blocks and no
            classifier-free guidance. None = off.
        progress: show a progress bar over blocks.
        debug: also check the values of what the parts return at every step (a device read each: the logits hold no
            NaN, every drafted canvas's ids are in the vocabulary), not only on the call's first drafts.
        compile: run the model's forwards at static shapes through ``torch.compile``, as :func:`decodekit.generate`'s
            ``compile=`` does (True, ``"max-autotune"``, ``"auto"``: on CUDA only; :mod:`decodekit.models.compiled`):
            canvases padded to a multiple of 32 slots, every cache strategy, none of its arithmetic changed (the
            same tokens as eager); Llama, Mistral, Qwen2 and Qwen3 (the zoo DLMs; LLaDA, Dream, SDAR and Fast-dLLM
            v2 checkpoints load as such); other models (LLaDA 2's MoE) run eager with one warning. The first call
            compiles; later calls reuse it.

    Raises:
        ComponentOutputError: a rule, cache, schedule or draft strategy returned the wrong type, shape, dtype, device
            or window (:mod:`decodekit.dlm.components`).
        NoProgressError: a step left a row that still has masked slots in its block as it was (the loop would never
            end); the message names the part at fault.
    """
    start = time.perf_counter()
    dlm = model if isinstance(model, DLMModel) else _refuse_plain(model)
    rows = prompt_ids(prompts, dlm.lm)
    gen_length = check_int("gen_length", gen_length, low=1)
    block_length = check_int("block_length", block_length, low=1, high=gen_length, hint=" (at most gen_length)")
    if gen_length % block_length:
        raise ConfigError(f"block_length ({block_length}) must divide gen_length ({gen_length})")
    num_blocks = gen_length // block_length
    steps = check_int("steps", steps, low=num_blocks, hint=f" (at least one per block: {num_blocks} blocks)")
    if steps % num_blocks:
        raise ConfigError(f"steps ({steps}) must be a multiple of the number of blocks ({num_blocks})")
    temperature = check_float("temperature", temperature, low=0.0)
    cfg_scale = check_float("cfg_scale", cfg_scale, low=0.0)
    progress, debug = check_bool("progress", progress), check_bool("debug", debug)
    compiled = resolve_compile(compile, dlm.device)  # None (eager) or the mode forwards compile in
    parts = resolve_parts(dlm, rule, cache, schedule, remasking, block_length, draft)
    cache, schedule = parts.cache, parts.schedule
    if cfg_scale and (not isinstance(cache, Recompute) or cache.block_causal or parts.draft is not None):
        raise ConfigError(
            "classifier-free guidance runs with cache=None and draft=None on a bidirectional model only (a cache "
            "strategy keeps one batch's K/V; the unconditional pass attends bidirectionally; drafts are not guided)"
        )
    seed = check_seed(seed, len(rows))
    heads, tails, region = rows, None, gen_length
    if dlm.block_length is not None and dlm.block_grid == "absolute":  # the prompts' tails open the first block
        heads, tails = carry_tails(rows, block_length)
        region += block_length if any(tails) else 0  # one more block: a row's last one ends past gen_length
        steps = steps // num_blocks * (region // block_length)
    check_context(dlm, rows, gen_length, tails, block_length)
    state = DLMState.from_prompts(
        heads, region, dlm.mask_token_id, steps, make_generator(seed, dlm.device), dlm.device, filled=tails
    )
    state.block_length, state.eos_token_ids = block_length, tuple(dlm.lm.eos_token_ids)
    if tails is not None and region > gen_length:  # rows without a tail end at gen_length
        state.close_spare_block(tails, gen_length, next(iter(state.eos_token_ids), 0))
    stats = DLMStats(row_nfe=state.row_forwards, tokens=len(rows) * gen_length)
    if parts.declared.cache_begins:  # optional hook: a new call (drop what an earlier call kept)
        cache.begin(state)
    ahead = NextBlock()  # a block's first step, kept from the block before (drafts that look ahead)
    checks = _Checks(debug, dlm.vocab_size)
    idle = 0  # rounds in a row that took no forward: a schedule that keeps naming finished blocks never ends
    with compiling(compiled, canvas=True, model=dlm.lm), evaluating(dlm.lm):
        for _ in tqdm(schedule.rounds(dlm, state), desc="blocks", disable=not progress):
            forwards = _decode_block(dlm, state, parts, temperature, cfg_scale, ahead, checks)
            stats.row_block_steps.append(state.block_step.tolist())
            stats.block_steps.append(max(stats.row_block_steps[-1]))  # the row that took the most
            stats.nfe += forwards
            idle = 0 if forwards else idle + 1
            if idle > region // block_length:
                raise NoProgressError(
                    f"{type(schedule).__name__}.rounds set {idle} blocks in a row with no masked slot to decode; the "
                    "loop would never end: a schedule's rounds must move the block on and stop after the last"
                )
    tokens = state.tokens.tolist()
    check_finished(state, schedule, tokens)
    if tails is not None:
        tokens = [t[len(tail) : len(tail) + gen_length] for t, tail in zip(tokens, tails)]
    stats.cache_forwards = cache.forwards if parts.declared.counts_forwards else 0
    stats.wall_time_s = time.perf_counter() - start
    return DLMOutput(tokens, stats)


@dataclass
class _Checks:
    """How much of the parts' outputs a call checks beyond their metadata: ``debug`` every step's values; the first
    drafts' values in any case (``drafts_unchecked`` until then)."""

    debug: bool
    vocab_size: int
    drafts_unchecked: bool = True


def _decode_block(
    dlm: DLMModel,
    state: DLMState,
    parts: Parts,
    temperature: float,
    cfg_scale: float,
    ahead: NextBlock,
    checks: _Checks,
) -> int:
    """Forwards until the current block has no masked slot; returns how many were taken. The plain sampler: a
    forward of the canvas, a step on its logits, again. With a draft strategy
    (:class:`~decodekit.dlm.drafting.Drafting`) the forward also runs the drafted canvases, and steps follow on the
    outputs of those the rows reached.
    The block's first step runs on what ``ahead`` kept for a row that finished the last block on a drafted canvas
    (:mod:`decodekit.dlm.lookahead`), without a forward."""
    left = (state.masked & state.in_block).sum(1).tolist()
    state.block_step = torch.zeros(state.batch_size, dtype=torch.long, device=state.device)
    own_steps = parts.declared.per_row_steps
    drafting = Drafting(parts, ahead, checks) if parts.draft is not None else None
    forwards, taken = 0, ahead.take(left, own_steps)
    while max(left):
        outputs = None
        if taken is not None:  # the first step, on the last block's final forward
            (logits, live), taken = taken, None
        else:
            variants = None if drafting is None else drafting.variants  # [1 + N, B, T]: the canvas and its drafts
            outputs, logits = _forward(dlm, state, parts, cfg_scale, checks, variants)
            forwards += 1
            state.row_forwards[:] = [n + int(k > 0) for n, k in zip(state.row_forwards, left)]
            live = [k > 0 for k in left] if own_steps else [True] * len(left)  # the rows that step on this forward
        last = take_step(state, parts, logits, temperature, left, live)
        if drafting is not None:
            last = drafting.walk(state, outputs, last, left, temperature)
            drafting.draft(state, last)
        left = last.left
    state.lookahead = None
    return forwards


def _forward(
    dlm: DLMModel, state: DLMState, parts: Parts, cfg_scale: float, checks: _Checks, variants: torch.Tensor | None
) -> tuple[Any, Any]:
    """One forward through the cache strategy: of the canvas, or of ``variants [1 + N, B, T]`` (the canvas and its
    drafts) with ``logits_many``; checked as it comes. Returns its outputs and the canvas's logits."""
    source = f"{type(parts.cache).__name__}.logits" + ("" if variants is None else "_many")
    if variants is None:
        state.lookahead = None
        if cfg_scale == 0:
            outputs = check_logits(source, parts.cache.logits(dlm, state), state, checks.vocab_size)
        else:
            outputs = _guided_logits(dlm, state, cfg_scale)
    else:
        outputs = parts.cache.logits_many(dlm, state, variants)
        check_logits(source, outputs, state, checks.vocab_size, canvases=len(variants))
    if checks.debug:
        check_finite(source, outputs)
    return outputs, (outputs if variants is None else output_at(outputs, torch.zeros_like(state.lengths)))


def _guided_logits(dlm: DLMModel, state: DLMState, cfg_scale: float) -> torch.Tensor:
    """``[B, G, V]`` logits of the generation region with classifier-free guidance (recomputed)."""
    prompt = torch.arange(state.canvas.shape[1], device=state.device)[None, :] < state.starts[:, None]
    unconditional = state.canvas.masked_fill(prompt, state.mask_token_id)
    both, _ = dlm.forward(
        torch.cat([state.canvas, unconditional]), state.lengths.repeat(2), state.starts.repeat(2), state.gen_length
    )
    cond, uncond = both.chunk(2)
    return uncond + (cfg_scale + 1) * (cond - uncond)


def _refuse_plain(model: Any) -> DLMModel:
    if isinstance(model, type):
        raise ConfigTypeError(
            f"dk.dlm.generate needs a diffusion LM instance, got {describe(model)}; pass a loaded model: "
            "dk.dlm.load_model(<a zoo DLM name, or a model with mask_token_id=...>)"
        )
    raise ConfigError(
        f"dk.dlm.generate needs a diffusion LM; got {type(model).__name__}. Wrap it first: "
        "dk.dlm.load_model(model, mask_token_id=<its mask token id>)"
    )


__all__ = ["DLMOutput", "generate", "load_model"]
