"""THE diffusion sampling loop: blocks of the generation region, one forward per step, a rule picks the commits.

A call lays the rows out as ``[prompt, G mask ids]`` (:class:`~decodekit.dlm.state.DLMState`) and, block by block
(the region schedule, :class:`~decodekit.interfaces.RegionSchedule`: by default ``G / block_length`` equal blocks
left to right, semi-autoregressive), repeats a step until the block has no masked slot:

1. one forward over the canvas (classifier-free guidance: the conditional and the prompt-masked rows in one batch);
   through the cache strategy (:class:`~decodekit.interfaces.DLMCache`: recompute, or reuse kept K/V);
2. proposals for every slot (:func:`~decodekit.dlm.state.propose`: argmax, or float64 Gumbel-max);
3. the schedule names the slots a step may commit (the block; AdaBlock cuts it at the block's first step, DCD slides
   a window every step); ``rule.select`` picks the slots to commit among them
   (:class:`~decodekit.interfaces.UnmaskRule`); committed slots are never masked again.

One host read per step (whether the block is done, whether a row stalled). With ``rule=None`` the loop is LLaDA's
reference sampler (:class:`~decodekit.dlm.rules.LLaDARule`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_float, check_instance, check_int, check_seed
from decodekit.dlm.caches import Recompute
from decodekit.dlm.model import DLMModel, load_model
from decodekit.dlm.rules import LLaDARule
from decodekit.dlm.schedules import FixedBlocks
from decodekit.dlm.state import DLMState, propose
from decodekit.errors import ConfigError, ContextLengthError, NoProgressError
from decodekit.interfaces import DLMCache, RegionSchedule, UnmaskRule
from decodekit.metrics import DLMStats
from decodekit.prompts import prompt_ids
from decodekit.sampling import begin_round, make_generator


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
    progress: bool = False,
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
        rule: an :class:`~decodekit.interfaces.UnmaskRule` (``dk.build("dlm_rule", "threshold")``, ...); None =
            ``LLaDARule(remasking)``.
        cache: a cache strategy (``dk.build("dlm_cache", "prefix")``, ``"dual"``; :mod:`decodekit.dlm.caches`);
            None = recompute the whole canvas every step (exact).
        cfg_scale: classifier-free guidance ``w``: logits ``u + (w + 1)(c - u)``, ``u`` from the canvas with the
            prompt masked (LLaDA's unsupervised CFG); 0 = off.
        seed: None (torch's global generator), an int (one generator for the batch), or one int per prompt (each
            row's randomness depends only on its own seed, not on its batch mates).
        schedule: the region schedule (``dk.build("dlm_schedule", "adablock")``, ``"dcd"``;
            :mod:`decodekit.dlm.schedules`); None = fixed blocks of ``block_length``.
        progress: show a progress bar over blocks.
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
    rule, cache, schedule = _parts(dlm, rule, cache, schedule, remasking, block_length)
    if cfg_scale and (not isinstance(cache, Recompute) or cache.block_causal):
        raise ConfigError(
            "classifier-free guidance runs with cache=None on a bidirectional model only (a cache strategy keeps "
            "one batch's K/V; the unconditional pass attends bidirectionally)"
        )
    _check_context(dlm, rows, gen_length)
    seed = check_seed(seed, len(rows))
    state = DLMState.from_prompts(
        rows, gen_length, dlm.mask_token_id, steps, make_generator(seed, dlm.device), dlm.device
    )
    state.block_length, state.eos_token_ids = block_length, tuple(getattr(dlm.lm, "eos_token_ids", ()))
    stats = DLMStats(row_nfe=state.row_steps, tokens=len(rows) * gen_length)
    if hasattr(cache, "begin"):  # optional hook: a new call (drop what an earlier call kept)
        cache.begin(state)
    for _ in tqdm(schedule.rounds(dlm, state), desc="blocks", disable=not progress):
        steps_taken = _decode_block(dlm, state, rule, schedule, cache, temperature, cfg_scale)
        stats.block_steps.append(steps_taken)
        stats.nfe += steps_taken
    tokens = state.tokens.tolist()
    stats.cache_forwards = getattr(cache, "forwards", 0)
    stats.wall_time_s = time.perf_counter() - start
    return DLMOutput(tokens, stats)


def _decode_block(
    dlm: DLMModel, state: DLMState, rule: Any, schedule: Any, cache: Any, temperature: float, cfg_scale: float
) -> int:
    """Steps until the current block has no masked slot; returns how many were taken."""
    live = (state.masked & state.in_block).any(1).tolist()
    while any(live):
        begin_round(state.generator, state.row_steps)
        logits = cache.logits(dlm, state) if cfg_scale == 0 else _guided_logits(dlm, state, cfg_scale)
        proposal = propose(logits, temperature, state)
        eligible = state.masked & schedule.region(state, proposal)
        if state.step == 0 and hasattr(rule, "begin_block"):
            rule.begin_block(state)
        commit = rule.select(state, proposal, eligible) & state.masked
        stalled = eligible.any(1) & ~commit.any(1)
        state.commit(commit, proposal.tokens)
        if getattr(schedule, "slides", False):  # the window moves on after a commit: a row is live while it has one
            schedule.region(state, proposal)
        state.row_steps[:] = [n + int(on) for n, on in zip(state.row_steps, live)]
        state.step += 1
        state.global_step += 1
        now = torch.cat([(state.masked & state.in_block).any(1), stalled.any()[None]]).tolist()
        live, stuck = now[:-1], now[-1]
        if stuck:
            raise NoProgressError(
                f"{type(rule).__name__}.select committed nothing in a row that still has masked slots in its block "
                f"(step {state.step}); a rule must commit at least one eligible slot per row and step"
            )
    return state.step


def _parts(dlm: DLMModel, rule: Any, cache: Any, schedule: Any, remasking: str, block_length: int) -> tuple:
    """The rule, cache and schedule a call runs (None = the defaults: LLaDA's rule, recompute, fixed blocks),
    checked alone and together before any forward."""
    rule = LLaDARule(remasking) if rule is None else rule
    check_instance("rule", rule, UnmaskRule, what="an unmasking rule with select(state, proposal, eligible)")
    cache = Recompute(block_causal=dlm.block_length is not None) if cache is None else cache
    check_instance("cache", cache, DLMCache, what="a cache strategy with logits(dlm, state)")
    schedule = FixedBlocks() if schedule is None else schedule
    check_instance("schedule", schedule, RegionSchedule, what="a region schedule with rounds() and region()")
    _check_parts(rule, cache, schedule)
    _check_block_causal(dlm, cache, schedule, block_length)
    return rule, cache, schedule


def _check_parts(rule: Any, cache: Any, schedule: Any) -> None:
    """Refuse a rule, cache and schedule that cannot work together, before any forward."""
    if not getattr(schedule, "fixed_blocks", False):
        for part, why in ((cache, "keeps K/V per block"), (rule, "plans its commits per block")):
            if getattr(part, "fixed_blocks", False):
                raise ConfigError(
                    f"{type(part).__name__} {why}, which needs the same blocks in every row; "
                    f"{type(schedule).__name__} gives rows their own: use schedule=None (fixed blocks)"
                    + (" or cache=None, DKVCache(), PrefixCache() or DualCache()" if part is cache else "")
                )
    if getattr(cache, "needs_plan", False) and not getattr(rule, "plans", False):
        raise ConfigError(
            f"{type(cache).__name__} feeds only the slots the rule will commit next (state.planned), and "
            f"{type(rule).__name__} does not know them in advance: use rule=dk.dlm.RandomOrderRule() (random "
            "remasking in an order drawn per block), or cache=dk.dlm.DKVCache() for confidence-based rules"
        )


def _check_block_causal(dlm: DLMModel, cache: Any, schedule: Any, block_length: int) -> None:
    """A block-causally trained model runs block-causally, on its own block length and fixed blocks."""
    trained = dlm.block_length
    if trained is None:
        return
    if block_length != trained:
        raise ConfigError(
            f"this model was trained block-causally with blocks of {trained}; got block_length={block_length}: pass "
            f"block_length={trained} (a multiple-block gen_length)"
        )
    if not getattr(cache, "block_causal", False):
        raise ConfigError(
            f"this model was trained block-causally (blocks of {trained}) and {type(cache).__name__} attends "
            "bidirectionally: use cache=None (block-causal recompute) or cache=dk.dlm.BlockCausalCache() (exact); "
            "to run it bidirectionally anyway, wrap it as dk.dlm.load_model(model.lm, mask_token_id=..., "
            "shift_logits=...) without block_length"
        )
    if not getattr(schedule, "fixed_blocks", False):
        raise ConfigError(
            f"this model was trained block-causally on fixed blocks of {trained}; {type(schedule).__name__} moves the "
            "block ends: use schedule=None"
        )


def refusal(dlm: DLMModel, spec: dict[str, Any], block_length: int) -> str | None:
    """Why :func:`generate` would refuse ``dlm`` with a method ``spec`` (``{rule, cache, schedule}``; None = the
    defaults) before any forward, or None: for a benchmark to list a method the model cannot run instead of
    failing midway."""
    try:
        _parts(dlm, spec.get("rule"), spec.get("cache"), spec.get("schedule"), "low_confidence", block_length)
    except ConfigError as error:
        return str(error)
    return None


def _guided_logits(dlm: DLMModel, state: DLMState, cfg_scale: float) -> torch.Tensor:
    """``[B, G, V]`` logits of the generation region with classifier-free guidance (recomputed)."""
    prompt = torch.arange(state.canvas.shape[1], device=state.device)[None, :] < state.starts[:, None]
    unconditional = state.canvas.masked_fill(prompt, state.mask_token_id)
    both, _ = dlm.forward(
        torch.cat([state.canvas, unconditional]), state.lengths.repeat(2), state.starts.repeat(2), state.gen_length
    )
    cond, uncond = both.chunk(2)
    return uncond + (cfg_scale + 1) * (cond - uncond)


def _check_context(dlm: DLMModel, rows: list[list[int]], gen_length: int) -> None:
    limit = getattr(dlm.lm, "max_context", None)
    longest = max(map(len, rows))
    if limit and longest + gen_length > limit:
        raise ContextLengthError(
            f"the longest prompt ({longest} tokens) + gen_length ({gen_length}) exceeds the model's context ({limit}); "
            "shorten the prompt or lower gen_length"
        )


def _refuse_plain(model: Any) -> DLMModel:
    raise ConfigError(
        f"dk.dlm.generate needs a diffusion LM; got {type(model).__name__}. Wrap it first: "
        "dk.dlm.load_model(model, mask_token_id=<its mask token id>)"
    )


__all__ = ["DLMOutput", "generate", "load_model"]
