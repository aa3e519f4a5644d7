"""Train Medusa heads for a target (``python -m decodekit train recipe=medusa``, docs/training.md): the zoo's
``medusa`` drafter (:mod:`decodekit.drafters.medusa`).

Medusa-1 with self-distillation, on the same cached features as the EAGLE head
(:mod:`decodekit.train.feature_data`; point ``data_dir`` at an EAGLE run's ``data`` to reuse them): head ``k``
reads the target's feature ``f_t`` and learns the target's own distribution at ``t + k`` (``softmax(W_d f_{t+k})``,
the token after ``x_{t+k}``) by soft cross-entropy over the ``train_vocab`` most frequent tokens, weighted
``0.8^(k-1)``; the backbone and output head are frozen.

``device`` / ``online`` / ``time_budget_s``: as for the EAGLE heads (:mod:`decodekit.train.eagle3`): on a GPU the
target's features are computed per batch there instead of cached.

The draft vocabulary is picked from data as for EAGLE (:mod:`decodekit.train.eagle_vocab`): per candidate size,
each head's held-out agreement with the target's argmax ``a_k`` gives a chain of ``tau = 1 + sum_j prod_{k<=j} a_k``
tokens per round at the measured cost of drafting (every head's scores over ``s`` tokens) plus verifying
``K + 1`` tokens; the best modelled speedup ships.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from decodekit.train.recipe import HeadConfig, run_recipe, shares


def medusa_loss(
    heads: Any,
    w_d: torch.Tensor,
    feats: torch.Tensor,
    lengths: torch.Tensor,
    starts: torch.Tensor | None = None,
    decay: float = 0.8,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Medusa-1's weighted loss on ``feats [B, L, H]`` (``lengths [B]``; only predictions of tokens at or after
    ``starts [B]`` count); ``w_d [V_d, H]``. Returns the loss and ``acc`` (head 1's top-1 agreement with the target
    over ``V_d``) and ``accs`` (every head's)."""
    starts = torch.zeros_like(lengths) if starts is None else starts
    f = feats.float()
    width = f.shape[1]
    h = heads(f[:, : width - 1])  # [B, L - 1, K, H]
    total, accs = f.new_zeros(()), []
    for k in range(1, h.shape[2] + 1):
        n = width - k  # positions t with a target distribution at t + k
        logq = (h[:, :n, k - 1] @ w_d.T).log_softmax(-1)
        with torch.no_grad():
            p = (f[:, k : k + n] @ w_d.T).softmax(-1)
        t = torch.arange(n, device=f.device)[None]
        valid = (t + k < lengths[:, None]) & (t + k + 1 >= starts[:, None])
        total = total + decay ** (k - 1) * -(p * logq).sum(-1)[valid].mean()
        accs.append(float((logq.argmax(-1) == p.argmax(-1))[valid].float().mean()))
    return total, {"acc": accs[0], "accs": accs}


@torch.no_grad()
def pick_vocab(heads: Any, target: Any, val: Any, sizes: Sequence[int]) -> dict[str, Any]:
    """The draft vocabulary size with the best modelled chain speedup (module docstring), with every size's
    numbers (a single size is taken with its agreement, without timing anything)."""
    from decodekit.policies.analytic import expected_tokens_positional
    from decodekit.train.eagle_vocab import median_ms, target_ms, untimed_pick

    num_heads = len(heads.blocks)
    hits = {s: [0] * num_heads for s in sizes}
    totals = [0] * num_heads
    dev = target.device
    w = target.lm_head.weight[heads.vocab[: max(sizes)]]
    for i in range(0, len(val.lengths), 8):
        _, f, lengths, starts = val.batch(torch.arange(i, min(i + 8, len(val.lengths))), dev)
        f = f.float()
        width = f.shape[1]
        h = heads(f[:, : width - 1])
        for k in range(1, num_heads + 1):
            n = width - k
            t = torch.arange(n, device=dev)[None]
            valid = (t + k < lengths[:, None]) & (t + k + 1 >= starts[:, None])
            want = target.head(f[:, k : k + n][valid]).argmax(-1)
            scores = h[:, :n, k - 1][valid] @ w.T
            totals[k - 1] += int(valid.sum())
            for s in sizes:
                hits[s][k - 1] += int((heads.vocab[scores[:, :s].argmax(-1)] == want).sum())
    if len(sizes) == 1:  # nothing to pick: nothing timed
        return untimed_pick({s: [hits[s][k] / max(totals[k], 1) for k in range(num_heads)] for s in sizes})
    times = target_ms(target, (1, num_heads + 1))
    f1 = torch.randn(1, heads.blocks[0].in_features, device=dev)
    rows = {}
    for s in sizes:
        acc = [hits[s][k] / max(totals[k], 1) for k in range(num_heads)]
        draft = median_ms(lambda s=s: (heads(f1) @ w[:s].T).argmax(-1), dev)
        tau = float(expected_tokens_positional(torch.tensor(acc).cumprod(0))[-1])  # 1 + sum_j prod_{k<=j} a_k
        rows[s] = {
            "agreement": acc,
            "draft_ms": draft,
            "modelled_speedup": tau * times[1] / (times[num_heads + 1] + draft),
        }
    picked = max(rows, key=lambda s: rows[s]["modelled_speedup"])
    return {"picked": picked, "target_ms": times, "sizes": rows}


@shares(HeadConfig)
def train(out_dir: str | Path, *, num_heads: int = 3, decay: float = 0.8, **shared: Any) -> dict[str, Any]:
    """Train the heads; returns the summary numbers (also in ``summary.json``). The recipe's own knobs: ``num_heads``
    and head ``k``'s loss weight ``decay ** (k - 1)``; ``shared``: :class:`~decodekit.train.recipe.HeadConfig`'s
    (data, optimisation, device). ``decodekit/recipes/train/medusa.yaml`` documents each."""
    # every override (a negative decay would maximise the far heads' loss), before any work
    cfg = HeadConfig.of("medusa", locals(), train_vocab=4096, vocab_sizes=(1024, 2048, 4096), epochs=1)
    from decodekit.drafters.medusa import MedusaHeads

    return run_recipe(
        cfg, lambda target, data: MedusaHeads(target.config.hidden_size, num_heads, data.vocab),
        lambda heads, target, rows, b: medusa_loss(heads, rows, b.feats, b.lengths, b.starts, decay),
        pick=lambda heads, target, val, sizes: pick_vocab(heads, target, val, sizes), title="Medusa heads",
        loss_label="weighted soft CE", num_heads=num_heads,
    )  # fmt: skip
