"""The diffusion samplers token for token with the authors' code, at temperature 0 on a tiny random Llama.

Each reference below is ported here by hand (our own transcription, not their code): one row at a time, the
model called directly (a transformers Llama run bidirectionally through an all-True 4-D mask), the reference's loop,
step counters, commit rule and cache layout kept as they are. Ports of approximate caches keep the reference's own
approximation (which K/V are reused from which step, in the reference's key order), so decodekit's caches are
compared with them, never with the uncached sampler (each such test also checks that the approximation shows).
Read at:

- Fast-dLLM: NVlabs/Fast-dLLM @ f6b35ec3f1b16e1b3d3357938046559ae2d350fa, ``llada/generate.py`` (``generate``,
  ``generate_with_prefix_cache``, ``generate_with_dual_cache``; ``get_transfer_index`` with a fixed count or a
  ``threshold``, ``get_transfer_index_dynamic`` for ``factor``); the caches' attention (the prefix's keys, then the
  fed ones; the dual cache's block rewritten in place) in ``llada/model/modeling_llada.py`` @
  24cc59e75f20a6384bae8c905965bb090b96388e (the newest copy of that file we could read).
- dKV-Cache: horseee/dKV-Cache @ 49a76fcc43b744ec2d960137f216e419317138b1,
  ``generation_utils/llada_dkv_cache_decode.py`` and ``generation_utils/llada_dkv_cache_greedy.py``, their caches in
  ``models/modeling_llada_dkv_cache_decode.py`` and ``models/modeling_llada_dkv_cache_greedy.py`` (fed keys first,
  then the cached ones).
- Prophet: pixeli99/Prophet @ 460afe41c7063a29a9893675aca07b985997bb83, ``generate_earlyexit.py`` (``generate`` with
  ``should_early_exit``).

What the ports change: the model is a transformers Llama, whose cache holds keys after RoPE (the references keep
them before and rotate them at their positions each forward: the same numbers); the Greedy variant's random decode
order is the one decodekit drew (the reference draws ``torch.rand``); Prophet's gap is averaged over the masked slots
(decodekit's ``region="masked"``) instead of 5 answer positions pinned by a task prompt, except in the test that pins
them. Known differences decodekit keeps, each shown by a test to be the only one where it applies: Fast-dLLM's
factor rule also takes the last rank when only that one fails (``quirk``; decodekit follows the paper);
dKV-Cache-Greedy finds the windows of a step's due slots one after the other, so neighbouring due slots claim
distinct window slots (decodekit finds each on its own: ``sequential=False``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import decodekit as dk
from decodekit.dlm import DLMState, RandomOrderRule
from decodekit.errors import ConfigError, ConfigTypeError
from tests.unit.dlm_common import MASK, peaked_llama

PROMPTS = [[5, 9, 14, 2], [33, 7], [1, 2, 3, 4, 5, 6, 7]]
NEG = -math.inf

Keys = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@pytest.fixture(scope="module")
def hf():
    return peaked_llama()


@pytest.fixture(scope="module")
def dlm(hf):
    return dk.dlm.load_model(hf, mask_token_id=MASK)


# ---------------------------------------------------------------------------------------------------------------
# The model, called directly


class _Splice:
    """Stands in for transformers' cache for one forward: layer ``l`` attends to ``keys(l, k, v)`` (the fed tokens'
    own keys and values ``[1, H, n, D]``, after RoPE) and the fed K/V are kept in ``fed[l]``."""

    def __init__(self, keys: Keys) -> None:
        self.keys, self.fed = keys, {}

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.fed[layer_idx] = (key, value)
        return self.keys(layer_idx, key, value)


@torch.no_grad()
def run(hf, tokens: torch.Tensor, positions: torch.Tensor, width: int, keys: Keys | None = None) -> tuple:
    """``tokens [1, n]`` at ``positions [n]``, bidirectional over the ``width`` keys ``keys`` returns (default: the
    fed tokens themselves, ``width = n``). Returns float32 logits ``[1, n, V]`` and the fed K/V per layer."""
    splice = _Splice(keys or (lambda layer, k, v: (k, v)))
    mask = torch.ones(1, 1, tokens.shape[1], width, dtype=torch.bool)
    logits = hf(input_ids=tokens, position_ids=positions[None], attention_mask=mask, cache=splice).logits
    return logits.float(), splice.fed


def whole(hf, x: torch.Tensor) -> tuple:
    """The whole canvas ``x [1, T]``: logits ``[1, T, V]`` and every position's K/V."""
    return run(hf, x, torch.arange(x.shape[1]), x.shape[1])


def around(kv: dict, lo: int, hi: int) -> Keys:
    """Keys and values in position order: a whole-canvas forward's ``kv`` (per layer ``[1, H, T, D]``) before
    ``lo`` and from ``hi`` on, the fed positions' own between (Fast-dLLM's prefix cache: ``hi = T``; its dual cache:
    the block, rewritten in place)."""

    def keys(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = kv[layer]
        return torch.cat([old_k[:, :, :lo], k, old_k[:, :, hi:]], 2), torch.cat(
            [old_v[:, :, :lo], v, old_v[:, :, hi:]], 2
        )

    return keys


def fed_first(cache: dict, fed: torch.Tensor | None = None) -> Keys:
    """dKV-Cache's key order: the fed positions' own keys and values first, then the cached ones (per layer ``[1,
    H, M, D]``: Decode keeps only the positions it reads). ``fed [T]`` bool (Greedy, whose cache holds every
    position ``[1, H, T, D]``): read the others' and write the fed ones' in place, as its scatter does."""

    def keys(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = cache[layer]
        if fed is None:
            return torch.cat([k, old_k], 2), torch.cat([v, old_v], 2)
        out = torch.cat([k, old_k[:, :, ~fed]], 2), torch.cat([v, old_v[:, :, ~fed]], 2)
        old_k[:, :, fed], old_v[:, :, fed] = k, v
        return out

    return keys


def canvas(prompt: list[int], gen_length: int) -> torch.Tensor:
    x = torch.full((1, len(prompt) + gen_length), MASK, dtype=torch.long)
    x[0, : len(prompt)] = torch.tensor(prompt)
    return x


def schedule(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """``[1, steps]`` LLaDA's commits per step for the ``masked [1, L]`` slots: an equal share, the remainder one
    each on the first steps (``get_num_transfer_tokens``)."""
    n = int(masked.sum())
    counts = torch.full((1, steps), n // steps, dtype=torch.long)
    counts[0, : n % steps] += 1
    return counts


def greedy_proposals(logits: torch.Tensor, double: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax ``[1, n]`` and its softmax probability, in float64 as Fast-dLLM and dKV-Cache compute it (Prophet:
    in the logits' own dtype)."""
    tokens = logits.argmax(-1)
    probs = F.softmax(logits.double() if double else logits, dim=-1)
    return tokens, probs.gather(-1, tokens[..., None])[..., 0]


# ---------------------------------------------------------------------------------------------------------------
# Fast-dLLM


def fast_transfer(logits, masked, seen, count=None, threshold=None, factor=None, quirk=True):
    """Which slots of ``seen [1, n]`` a step commits, with what: ``get_transfer_index`` (``count`` commits, or with
    ``threshold`` every masked slot passing it besides the top one) or ``get_transfer_index_dynamic`` (``factor``:
    the longest run of ranks ``r`` with ``c_r >= 1 - factor / (r + 1)``)."""
    proposed, prob = greedy_proposals(logits)
    proposed = torch.where(masked, proposed, seen)
    conf = torch.where(masked, prob, NEG)
    take = torch.zeros_like(masked)
    if factor is None:
        k = int(masked.sum()) if threshold is not None else int(count)
        order = torch.topk(conf[0], k=k).indices
        take[0, order] = True
        if threshold is not None:
            for r in range(1, k):
                if conf[0, order[r]] < threshold:
                    take[0, order[r]] = False
        return proposed, take
    n = int(masked.sum())
    needed = [-1.0] + [1 - factor / (r + 1) for r in range(2, n + 1)]  # rank 1 always passes
    ranked = torch.sort(conf[0][masked[0]], descending=True).values
    for top in range(n):
        if ranked[top] < needed[top]:
            break
    else:
        top = n  # every rank passed (the reference's loop variable stays n - 1 and its fix-up adds 1)
    if quirk and top == n - 1:  # the fix-up also fires when only the last rank failed: it takes that one too
        top = n
    take[0, torch.topk(conf[0], k=top).indices] = True
    return proposed, take


def fast_dllm(hf, prompt, gen_length, block_length, steps, cache=None, threshold=None, factor=None, quirk=True):
    """``generate`` (``cache=None``), ``generate_with_prefix_cache`` or ``generate_with_dual_cache``: the
    generated tokens and the forwards taken."""
    x = canvas(prompt, gen_length)
    p, total = len(prompt), x.shape[1]
    blocks = gen_length // block_length
    per_block = steps // blocks
    forwards = 0

    def commit(logits, masked, seen, i):
        count = counts[0, i] if threshold is None and factor is None else None  # only the fixed count reads it
        proposed, take = fast_transfer(logits, masked, seen, count, threshold, factor, quirk)
        seen[take] = proposed[take]  # seen is a view of x

    for b in range(blocks):
        lo, hi = p + b * block_length, p + (b + 1) * block_length
        counts = schedule(x[:, lo:hi] == MASK, per_block)
        if cache is None:
            i = 0
            while True:
                forwards += 1
                masked = x == MASK
                masked[:, hi:] = False
                commit(whole(hf, x)[0], masked, x, i)
                i += 1
                if not (x[:, lo:hi] == MASK).any():
                    break
            continue
        # the block's first step: the whole canvas, its K/V kept
        logits, kv = whole(hf, x)
        masked = x == MASK
        masked[:, hi:] = False
        commit(logits, masked, x, 0)
        forwards += 1
        i = 1
        while (x[:, lo:hi] == MASK).any():
            forwards += 1
            if cache == "prefix":  # the block and everything after it, against the K/V before the block
                seen = x[:, lo:]
                masked = seen == MASK
                masked[:, block_length:] = False
                logits = run(hf, seen, torch.arange(lo, total), total, around(kv, lo, total))[0]
            else:  # dual: the block only, its K/V replacing the block's in the first step's K/V
                seen = x[:, lo:hi]
                masked = seen == MASK
                logits = run(hf, seen, torch.arange(lo, hi), total, around(kv, lo, hi))[0]
            commit(logits, masked, seen, i)
            i += 1
    return x[0, p:].tolist(), forwards


# ---------------------------------------------------------------------------------------------------------------
# dKV-Cache


def dkv_decode(hf, prompt, gen_length, block_length, steps, reload):
    """dKV-Cache-Decode (``llada_dkv_cache_decode.generate`` with ``enable_cache=True``, low-confidence): block
    steps 0 and 1 and every ``reload``-th run the whole canvas; the others feed every position not decoded at the
    previous step's input and read the rest from the cache, which after each step holds the K/V of the positions
    decoded at that step's input (fresh where fed, else as cached)."""
    x = canvas(prompt, gen_length)
    p, total = len(prompt), x.shape[1]
    blocks = gen_length // block_length
    per_block = steps // blocks
    for b in range(blocks):
        hi = p + (b + 1) * block_length
        counts = schedule(x[:, hi - block_length : hi] == MASK, per_block)
        cache, prv, cur = None, None, None  # prv / cur: decoded at the previous / this step's input ([T] bool)
        for i in range(per_block):
            masked = x == MASK
            if i > 1 and i % reload != 0:
                fed, held = (~prv).nonzero()[:, 0], prv.nonzero()[:, 0]
                logits, kv = run(hf, x[:, fed], fed, total, fed_first(cache))
                new = {}
                for layer, (k, v) in kv.items():  # back to position order, then the positions decoded now
                    full_k, full_v = (
                        k.new_zeros(*k.shape[:2], total, k.shape[-1]),
                        v.new_zeros(*v.shape[:2], total, v.shape[-1]),
                    )
                    full_k[:, :, fed], full_v[:, :, fed] = k, v
                    full_k[:, :, held], full_v[:, :, held] = cache[layer]
                    new[layer] = full_k[:, :, cur], full_v[:, :, cur]
                cache = new
                tokens, prob = greedy_proposals(logits)
                proposed = torch.full_like(x, MASK).index_copy_(1, fed, tokens)
                conf = torch.full((1, total), NEG, dtype=prob.dtype).index_copy_(1, fed, prob)
            else:
                logits, kv = whole(hf, x)
                if i > 0:
                    cache = {layer: (k[:, :, cur], v[:, :, cur]) for layer, (k, v) in kv.items()}
                proposed, conf = greedy_proposals(logits)
            conf[:, hi:] = NEG
            proposed = torch.where(masked, proposed, x)
            conf = torch.where(masked, conf, NEG)
            take = torch.topk(conf[0], k=int(counts[0, i])).indices
            x[0, take] = proposed[0, take]
            prv, cur = cur, (x != MASK)[0]
    return x[0, p:].tolist()


def claim_window(flags: torch.Tensor, centres: list[int], masked: torch.Tensor, size: int, sequential=True) -> None:
    """dKV-Cache-Greedy's window (``find_window_tokens``): for each centre in turn, flag the next ``size`` masked
    positions not flagged yet, looking left 1, right 1, left 2, right 2, ... ``sequential=False``: each centre looks
    past only what was flagged before any window (decodekit's per-slot windows; not the reference)."""
    n, before = flags.shape[0], flags.clone()
    for centre in centres:
        mine = flags if sequential else before.clone()
        left, right, found, go_left = centre - 1, centre + 1, 0, True
        while found < size:
            if go_left:
                if left >= 0 and not mine[left] and masked[left]:
                    mine[left], found = True, found + 1
                left -= 1
            else:
                if right < n and not mine[right] and masked[right]:
                    mine[right], found = True, found + 1
                right += 1
            go_left = not go_left
            if left < 0 and right > n:
                break
        flags |= mine


def dkv_greedy(hf, prompt, gen_length, block_length, steps, reload, window, orders, sequential=True):
    """dKV-Cache-Greedy (``llada_dkv_cache_greedy.generate`` with ``enable_cache=True``, random remasking): the
    decode order drawn once per block (here ``orders[b]``, ``[T]`` scores sorted descending; the reference draws
    ``torch.rand``), block step 0 and every ``reload``-th run the whole canvas and refill the cache with every
    position's K/V; the others feed only the positions flagged at the previous step (that step's commits, this step's
    due slots and their windows) and overwrite their K/V in the cache."""
    x = canvas(prompt, gen_length)
    p, total = len(prompt), x.shape[1]
    blocks = gen_length // block_length
    per_block = steps // blocks
    for b in range(blocks):
        lo, hi = p + b * block_length, p + (b + 1) * block_length
        counts = schedule(x[:, lo:hi] == MASK, per_block)
        bounds = torch.cat([torch.zeros(1, 1, dtype=torch.long), counts.cumsum(1)], 1)[0].tolist()
        score = torch.full((total,), NEG)
        score[lo:hi] = orders[b][lo:hi]
        order = torch.sort(score, descending=True).indices
        cache, flagged = None, None
        for i in range(per_block):
            masked = x == MASK
            if i % reload != 0:
                fed = flagged.nonzero()[:, 0]
                logits = run(hf, x[:, fed], fed, total, fed_first(cache, flagged))[0]
                proposed = torch.full_like(x, MASK).index_copy_(1, fed, logits.argmax(-1))
            else:
                logits, kv = whole(hf, x)
                cache = {layer: (k.clone(), v.clone()) for layer, (k, v) in kv.items()}
                proposed = logits.argmax(-1)
            proposed = torch.where(masked, proposed, x)
            due = order[bounds[i] : bounds[i + 1]]
            x[0, due] = proposed[0, due]
            flagged = torch.zeros(total, dtype=torch.bool)
            if i < per_block - 1:
                upcoming = order[bounds[i + 1] : bounds[i + 2]]
                flagged[upcoming] = True
                flagged[due] = True
                if window > 0:
                    claim_window(flagged, upcoming.tolist(), masked[0], window, sequential)
    return x[0, p:].tolist()


# ---------------------------------------------------------------------------------------------------------------
# Prophet


def prophet_exits(step: int, total: int, gap: float, thresholds: tuple[float, float, float]) -> bool:
    """``should_early_exit``: the gap needed by phase, ``step / total`` below 0.33, below 0.67, or later."""
    progress = step / total
    if progress < 0.33:
        return gap >= thresholds[0]
    if progress < 0.67:
        return gap >= thresholds[1]
    return gap >= thresholds[2]


def prophet(hf, prompt, gen_length, block_length, steps, thresholds, answer_start=None):
    """Prophet's ``generate`` (``generate_earlyexit.py``, low-confidence): the step counter is incremented before
    the step; each step, the mean top-1 minus top-2 logit over the 5 answer positions from ``answer_start`` (a
    canvas position; None: over the masked generation slots instead, decodekit's ``region="masked"``) is checked
    against the phase's threshold; once it passes, every masked position takes its argmax and generation ends.
    Otherwise LLaDA's step (confidences in float32, as there). Returns the generated tokens and the forwards
    taken."""
    x = canvas(prompt, gen_length)
    p = len(prompt)
    blocks = gen_length // block_length
    per_block = steps // blocks
    global_step, forwards = 0, 0
    for b in range(blocks):
        hi = p + (b + 1) * block_length
        counts = schedule(x[:, hi - block_length : hi] == MASK, per_block)
        for i in range(per_block):
            global_step += 1
            masked = x == MASK
            logits = whole(hf, x)[0]
            forwards += 1
            proposed, conf = greedy_proposals(logits, double=False)
            if answer_start is None:
                slots = (p + masked[0, p:].nonzero()[:, 0]).tolist()
            else:
                slots = list(range(answer_start, min(p + gen_length, answer_start + 5)))
            gaps = []
            for s in slots:
                top = torch.topk(logits[0, s], k=2).values
                gaps.append((top[0] - top[1]).item())
            if gaps and prophet_exits(global_step, steps, sum(gaps) / len(gaps), thresholds):
                x[masked] = proposed[masked]
                return x[0, p:].tolist(), forwards
            conf[:, hi:] = NEG
            proposed = torch.where(masked, proposed, x)
            conf = torch.where(masked, conf, NEG)
            k = int(counts[0, i])
            if k > 0:
                take = torch.topk(conf[0], k=k).indices
                x[0, take] = proposed[0, take]
    return x[0, p:].tolist(), forwards


# ---------------------------------------------------------------------------------------------------------------
# Fast-dLLM: the rules, uncached and with both caches


RULES = {
    "count": (None, {}),
    "threshold": ("threshold", {"threshold": 0.5}),  # the tiny model is rarely surer: 0.9 commits one a step
    "factor": ("factor", {"factor": 1.0}),
}


def fast_rule(name: str):
    kind, kwargs = RULES[name]
    return None if kind is None else dk.build("dlm_rule", kind, **kwargs)


@pytest.mark.parametrize("name", list(RULES))
@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
def test_fast_dllm(hf, dlm, name, cache):
    """``generate`` / ``generate_with_prefix_cache`` / ``generate_with_dual_cache`` with a fixed count, a
    threshold or a factor (without the reference's last-rank quirk, below): every row of a ragged batch, token for
    token, and the same forwards. With a cache, the outputs are the reference cache's own, not the recompute's."""
    gen, block, steps = 12, 4, 6
    kwargs = dict(gen_length=gen, block_length=block, steps=steps, rule=fast_rule(name))
    out = dk.dlm.generate(dlm, PROMPTS, cache=None if cache is None else dk.build("dlm_cache", cache), **kwargs)
    for b, prompt in enumerate(PROMPTS):
        want, forwards = fast_dllm(hf, prompt, gen, block, steps, cache=cache, quirk=False, **RULES[name][1])
        assert out.sequences[b] == want, b
        assert out.stats.row_nfe[b] == forwards
    if cache is not None:  # the cache's approximation shows in some row
        assert dk.dlm.generate(dlm, PROMPTS, **kwargs).sequences != out.sequences


def test_fast_dllm_factor_differs_only_by_the_last_rank_quirk():
    """The one difference from ``get_transfer_index_dynamic`` decodekit keeps (the paper's rule): when every rank
    but the last passes ``c_r >= 1 - factor / (r + 1)``, the reference takes the last one too."""
    conf = [0.999, 0.9, 0.6]  # ranks 1, 2 pass (0.9 >= 1 - 1/3); rank 3 fails (0.6 < 1 - 1/4)
    logits = torch.tensor([[[math.log(c), math.log(1 - c)] + [-math.inf] * 126 for c in conf]])
    masked, seen = torch.ones(1, 3, dtype=torch.bool), torch.zeros(1, 3, dtype=torch.long)
    assert fast_transfer(logits, masked, seen, factor=1.0, quirk=True)[1].tolist() == [[True, True, True]]
    assert fast_transfer(logits, masked, seen, factor=1.0, quirk=False)[1].tolist() == [[True, True, False]]
    state = DLMState.from_prompts([[1]], 3, MASK, total_steps=1, generator=None, device="cpu")
    state.block, state.block_steps = (0, 3), 1
    proposal = dk.dlm.propose(logits, 0.0, state)
    assert dk.dlm.FactorRule(1.0).select(state, proposal, masked).tolist() == [[True, True, False]]


# ---------------------------------------------------------------------------------------------------------------
# dKV-Cache


@pytest.mark.parametrize(("gen", "block", "steps", "reload"), [(12, 6, 12, 3), (12, 12, 6, 4)])
def test_dkv_cache_decode(hf, dlm, gen, block, steps, reload):
    """dKV-Cache-Decode against the reference's own delayed cache: every row, token for token (one and two commits
    a step; full forwards at block steps 0, 1 and the reload interval, cached ones between)."""
    out = dk.dlm.generate(
        dlm, PROMPTS, gen_length=gen, block_length=block, steps=steps, cache=dk.dlm.DKVCache(refresh=reload)
    )
    wants = [dkv_decode(hf, prompt, gen, block, steps, reload) for prompt in PROMPTS]
    assert out.sequences == wants
    uncached = dk.dlm.generate(dlm, PROMPTS, gen_length=gen, block_length=block, steps=steps).sequences
    assert uncached != wants  # the cache's approximation shows: the comparison is with it, not with the recompute


class RecordedOrder(dk.dlm.RandomOrderRule):
    """:class:`~decodekit.dlm.RandomOrderRule` that keeps each block's decode order (``[B, G]`` ranks), for the
    port to follow."""

    def __init__(self) -> None:
        super().__init__()
        self.ranks: list[torch.Tensor] = []

    def begin_block(self, state: DLMState) -> None:
        super().begin_block(state)
        self.ranks.append(self.rank.clone())


@pytest.mark.parametrize(
    ("gen", "block", "steps", "reload", "window", "sequential"),
    [(12, 6, 12, 3, 2, True), (12, 12, 6, 2, 0, True), (12, 12, 6, 2, 2, False)],
)
def test_dkv_cache_greedy(hf, dlm, gen, block, steps, reload, window, sequential):
    """dKV-Cache-Greedy against the reference's own cache, on the decode order decodekit drew: every row, token for
    token. With one due slot a step, or no window, the reference's windows (found one due slot after the other, each
    past the slots the earlier ones claimed) are decodekit's; with two due slots a step and windows, decodekit
    equals the port whose windows are found per slot (``sequential=False``), and the reference differs (the one
    known difference)."""
    rule = RecordedOrder()
    cache = dk.dlm.DKVGreedyCache(refresh=reload, window=window)
    kwargs = dict(gen_length=gen, block_length=block, steps=steps, seed=[3, 4, 5])
    out = dk.dlm.generate(dlm, PROMPTS, rule=rule, cache=cache, **kwargs)
    references = []
    for b, prompt in enumerate(PROMPTS):
        orders = []  # per block: [T] scores whose descending order is decodekit's decode order
        for ranks in rule.ranks:
            score = torch.full((len(prompt) + gen,), NEG)
            score[len(prompt) :] = -ranks[b].double()
            orders.append(score)
        assert out.sequences[b] == dkv_greedy(hf, prompt, gen, block, steps, reload, window, orders, sequential), b
        if not sequential:
            references.append(dkv_greedy(hf, prompt, gen, block, steps, reload, window, orders))
    if not sequential:
        assert references != out.sequences
    assert dk.dlm.generate(dlm, PROMPTS, rule=RandomOrderRule(), **kwargs).sequences != out.sequences


# ---------------------------------------------------------------------------------------------------------------
# Prophet


def test_prophet_counts_the_current_step(hf, dlm):
    """Prophet with the reference's own answer window (5 slots: here the whole generation, which at the first step
    is decodekit's masked region): at the first of 3 steps the reference's progress is already 1/3, the middle
    stage, and it fills every slot after one forward. Counting only the steps before (progress 0, the first stage)
    waits for a second forward."""
    prompt, gen = PROMPTS[0], 5
    logits = whole(hf, canvas(prompt, gen))[0][0, len(prompt) :]
    top = logits.topk(2, dim=-1).values
    gap = (top[:, 0] - top[:, 1]).mean().item()
    thresholds = (gap + 1.0, gap - 0.5, gap - 0.5)  # sure in the middle stage, not in the first
    want, forwards = prophet(hf, prompt, gen, gen, 3, thresholds, answer_start=len(prompt))
    assert forwards == 1
    out = dk.dlm.generate(
        dlm, [prompt], gen_length=gen, block_length=gen, steps=3, rule=dk.dlm.ProphetRule(thresholds=thresholds)
    )
    assert out.sequences == [want] and out.stats.nfe == forwards


@pytest.mark.parametrize(("gen", "block", "steps"), [(8, 4, 8), (12, 4, 6)])
def test_prophet(hf, dlm, gen, block, steps):
    """Prophet with LLaDA's rule before the trigger, its gap over the masked slots: every row, token for token, and
    the forwards each took. The thresholds make rows trigger in the middle stage and in the late one; counting only
    the steps before the current one, two rows would trigger later or never."""
    thresholds = (9.0, 2.0, 1.0)
    out = dk.dlm.generate(
        dlm,
        PROMPTS,
        gen_length=gen,
        block_length=block,
        steps=steps,
        rule=dk.dlm.ProphetRule(thresholds=thresholds),
    )
    wants = [prophet(hf, prompt, gen, block, steps, thresholds) for prompt in PROMPTS]
    assert out.sequences == [tokens for tokens, _ in wants]
    assert out.stats.row_nfe == [forwards for _, forwards in wants]
    assert min(forwards for _, forwards in wants) < steps  # some row triggered


def test_prophet_stages_are_the_references():
    """The reference's phases end at progress 0.33 and 0.67 (not 1/3 and 2/3); at the 33rd of 100 steps its
    progress is 0.33: the middle stage."""
    rule = dk.dlm.ProphetRule()
    assert rule.stages == (0.33, 0.67)
    assert [rule.threshold(p) for p in (0.3299, 0.33, 0.6699, 0.67)] == [7.5, 5.0, 5.0, 2.5]
    state = DLMState.from_prompts([[1]], 2, MASK, total_steps=100, generator=None, device="cpu")
    state.row_steps = [32]  # the row's 33rd step is being taken
    assert rule.progress(state) == pytest.approx([0.33]) and rule.threshold(rule.progress(state)[0]) == 5.0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(thresholds=(7.5, math.nan, 2.5)), ConfigError, r"thresholds\[1\] must be a finite number, got nan"),
        (dict(thresholds=(math.inf, 5.0, 2.5)), ConfigError, r"thresholds\[0\] must be a finite number, got inf"),
        (dict(stages=(0.33, 1.5)), ConfigError, r"stages\[1\] must be a finite number in \[0.0, 1.0\], got 1.5"),
        (dict(stages=(-0.1, 0.67)), ConfigError, r"stages\[0\] must be a finite number in \[0.0, 1.0\]"),
        (dict(base=dk.dlm.ThresholdRule), ConfigTypeError, r"pass an instance: ThresholdRule\(\)"),
    ],
)
def test_prophet_refuses_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        dk.dlm.ProphetRule(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Near-certain confidences


def test_saturated_confidences_rank_in_float64():
    """Two slots whose top probabilities are 1 - 1e-9 and 1 - 1e-10 (both 1.0 in float32): LLaDA's one commit goes
    to the surer second slot, as Fast-dLLM's float64 ranking takes it, not to the earlier one."""
    vocab = 128
    logits = torch.zeros(1, 2, vocab)
    for slot, p in enumerate((1 - 1e-9, 1 - 1e-10)):
        logits[0, slot, 3] = math.log(p * (vocab - 1) / (1 - p))  # p = e^a / (e^a + V - 1)
    assert logits.softmax(-1)[0, :, 3].tolist() == [1.0, 1.0]  # tied in float32
    state = DLMState.from_prompts([[1]], 2, MASK, total_steps=2, generator=None, device="cpu")
    state.block, state.block_steps = (0, 2), 2  # one commit a step
    proposal = dk.dlm.propose(logits, 0.0, state)
    assert proposal.confidence.dtype == torch.float64
    assert 1 - proposal.confidence[0].numpy() == pytest.approx([1e-9, 1e-10], rel=1e-3)
    masked = torch.ones(1, 2, dtype=torch.bool)
    want = fast_transfer(logits, masked, torch.zeros(1, 2, dtype=torch.long), count=1)[1]
    assert want.tolist() == [[False, True]]
    assert dk.dlm.LLaDARule().select(state, proposal, masked).tolist() == want.tolist()


def test_sharpened_model_commits_the_references_slots(hf):
    """A model whose logits are 4x sharper: two of its confidences round to the same float32 value, where LLaDA's
    fixed-count schedule (Fast-dLLM's ``generate``) tells them apart in float64. Every row, token for token."""
    sharp = copy.deepcopy(hf)
    with torch.no_grad():
        sharp.lm_head.weight.mul_(4.0)
    model = dk.dlm.load_model(sharp, mask_token_id=MASK)
    out = dk.dlm.generate(model, PROMPTS, gen_length=8, block_length=8, steps=8)
    assert out.sequences == [fast_dllm(sharp, prompt, 8, 8, 8)[0] for prompt in PROMPTS]
