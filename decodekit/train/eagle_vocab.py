"""Pick an EAGLE head's draft vocabulary from data: coverage against draft latency (the seed "Balancing Coverage
and Draft Latency in Vocabulary Trimming", here with measured rather than modelled latency).

For each candidate size ``s`` (the ``s`` most frequent tokens of the training data): the held-out top-1 agreement
``a(s)`` of the head's argmax over those tokens with the target's argmax over its whole vocabulary (the chance that
a greedy draft token is accepted, had the head seen the true features), and the time ``d(s)`` of one draft step at
batch 1 on this machine. A chain of ``k`` tokens then commits ``tau = (1 - a^(k+1)) / (1 - a)`` tokens per round
(every position accepted independently with ``a``, an approximation: later positions read the head's own features)
at a cost of ``v(k + 1) + (k + 1) d(s)`` against ``v(1)`` per token for plain decoding, ``v(n)`` the target's
forward time for ``n`` tokens; the size with the best modelled speedup ``tau v(1) / cost`` is picked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from decodekit.masks import chain_mask
from decodekit.policies.analytic import expected_tokens
from decodekit.timing import median_time


def median_ms(fn: Callable[[], Any], device: torch.device | str | None = None) -> float:
    """Median wall time (ms) of ``fn()`` after a warm-up call, synchronised on ``device``: 30 calls, or as many as
    fit in a second but at least 5 (a target forward of 0.1-0.2 s on a slow CPU is timed 5-10 times)."""
    return 1000 * median_time(fn, repeats=30, device=device, budget_s=1.0, least=5)[1]


def scorer(head: Any, rows: torch.Tensor) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """``(g [..., H], s) -> [..., s]``: the head's scores of the first ``s`` tokens of its vocabulary, by its own
    output rows (an EAGLE-3 head of the released architecture) or by ``rows [n, H]``, the target's output rows of
    those tokens (an ``fc`` head; ``s <= n``). What training (:func:`decodekit.train.eagle3.ttt_loss`) and the
    vocabulary pick score the head with."""
    from decodekit.drafters.eagle3_head import Eagle3ReleaseHead

    if isinstance(head, Eagle3ReleaseHead):
        return lambda g, s: head.norm(g) @ head.lm_head.weight[:s].T
    return lambda g, s: g @ rows[:s].T


@torch.no_grad()
def agreement(
    head: Any, target: Any, val: Any, sizes: Sequence[int], taps: torch.Tensor | None = None
) -> dict[int, float]:
    """Held-out top-1 agreement with the target's full-vocabulary argmax, per draft vocabulary size. The head
    reads the final features (EAGLE-1) or, given ``taps [N, L, k H]`` (the validation rows' layer states),
    ``head.fuse(taps)`` (EAGLE-3)."""
    hits = dict.fromkeys(sizes, 0)
    total = 0
    score = scorer(head, target.lm_head.weight[head.vocab[: max(sizes)]])
    for i in range(0, len(val.lengths), 8):
        rows = torch.arange(i, min(i + 8, len(val.lengths)))
        tokens, feats, lengths, starts = val.batch(rows, target.device)
        f_out = feats[:, 1:].float()
        f_in = feats[:, :-1].float() if taps is None else head.fuse(taps[rows, :-1].to(target.device).float())
        g = head(target.embed(tokens[:, 1:]), f_in)
        t = torch.arange(tokens.shape[1] - 1, device=target.device)[None]
        valid = (t + 1 < lengths[:, None]) & (t + 2 >= starts[:, None])
        want = target.head(f_out[valid]).argmax(-1)
        scores = score(g[valid], max(sizes))
        for s in sizes:
            hits[s] += int((head.vocab[scores[:, :s].argmax(-1)] == want).sum())
        total += int(valid.sum())
    return {s: hits[s] / max(total, 1) for s in sizes}


@torch.no_grad()
def target_ms(target: Any, counts: Sequence[int], context: int = 256) -> dict[int, float]:
    """Batch-1 time (ms) of the target's forward of ``n`` tokens after ``context`` cached ones, per ``n``."""
    x = torch.randint(0, target.vocab_size, (1, context), device=target.device)
    cache = target.new_cache(1, context + max(counts) + 1)
    target.extend(cache, x, torch.tensor([context], device=target.device), host_counts=context)

    def verify(n: int) -> None:
        view = cache.stage(n)
        mask, pos = chain_mask(cache.lengths, n, view.kv_len)
        target.forward(x[:, :n], pos, mask, view)

    return {n: median_ms(lambda n=n: verify(n), target.device) for n in counts}


@torch.no_grad()
def step_ms(head: Any, target: Any, sizes: Sequence[int], context: int = 256) -> dict[int, float]:
    """Batch-1 time (ms) of one head step per size: the layer on one token against ``context`` cached entries,
    then the scores over the ``s`` rows and their argmax."""
    from decodekit.cache import KVCache

    hidden, dev = int(target.config.hidden_size), target.device
    cache = KVCache(1, context + 2, device=dev)
    x = torch.randint(0, target.vocab_size, (1, context), device=dev)
    view = cache.stage(context)
    mask, pos = chain_mask(cache.lengths, context, view.kv_len)
    head(target.embed(x), torch.randn(1, context, hidden, device=dev), pos, mask, view)
    cache.keep(torch.tensor([context], device=dev), host_counts=context)
    score = scorer(head, target.lm_head.weight[head.vocab[: max(sizes)]])

    def head_step(s: int) -> None:
        view = cache.stage(1)
        mask, pos = chain_mask(cache.lengths, 1, view.kv_len)
        g = head(target.embed(x[:, :1]), torch.randn(1, 1, hidden, device=dev), pos, mask, view)
        score(g[:, 0], s).argmax(-1)

    return {s: median_ms(lambda s=s: head_step(s), dev) for s in sizes}


def pick_vocab(
    head: Any, target: Any, val: Any, sizes: Sequence[int], k: int, taps: torch.Tensor | None = None
) -> dict[str, Any]:
    """The size with the best modelled speedup (module docstring), with every size's numbers (``taps``: as for
    :func:`agreement`). A single size is taken without timing anything (a GPU run that ships a head for the CPU
    names the size the CPU picked)."""
    head.eval()
    acc = agreement(head, target, val, sizes, taps)
    if len(sizes) == 1:
        return untimed_pick(acc, k)
    draft = step_ms(head, target, sizes)
    return chain_pick(acc, draft, target_ms(target, (1, k + 1)), k, k + 1)


def untimed_pick(acc: dict[int, Any], draft_len: int | None = None) -> dict[str, Any]:
    """The one size of ``acc`` (size -> its agreement) taken as it is, nothing timed: what every head recipe's
    picker returns when given a single size (``draft_len`` included where the picker reports one)."""
    ((size, agreement_at),) = acc.items()
    picked = {"picked": size, "draft_len": draft_len} if draft_len is not None else {"picked": size}
    return picked | {"sizes": {size: {"agreement": agreement_at}}}


def chain_pick(
    acc: dict[int, float], draft_ms: dict[int, float], times: dict[int, float], k: int, steps: int
) -> dict[str, Any]:
    """Per size ``s``: a chain of ``k`` drafts, each accepted with ``acc[s]``, commits ``tau`` tokens per round at
    ``v(k + 1) + steps * draft_ms[s]`` (``times``: the target's forward ms per token count, holding 1 and
    ``k + 1``) against ``v(1)`` per token plainly; the size with the best modelled speedup, with every size's
    numbers."""
    v1, vk = times[1], times[k + 1]
    rows = {}
    for s in acc:
        a, d = acc[s], draft_ms[s]
        tau = float(expected_tokens(a, k)[-1])  # (1 - a^(k+1)) / (1 - a)
        rows[s] = {"agreement": a, "draft_step_ms": d, "modelled_speedup": tau * v1 / (vk + steps * d)}
    picked = max(rows, key=lambda s: rows[s]["modelled_speedup"])
    return {"picked": picked, "draft_len": k, "target_ms": times, "sizes": rows}
