"""Train an EAGLE head for a target (``python -m decodekit train recipe=eagle``, docs/training.md): the zoo's
``eagle`` drafter (:mod:`decodekit.drafters.eagle`).

Self-distillation on the target's own features (:mod:`decodekit.train.feature_data`: its greedy responses and
continuations of offline prompts, no benchmark prompts). EAGLE-1's objective:
``SmoothL1(g_t, f_{t+1}) + ce_weight * CE(softmax(W_d f_{t+1}), W_d g_t)`` with uniform noise on the input
features, where ``W_d`` is the output head's rows for the ``train_vocab`` most frequent tokens of the data (the
distillation target renormalised over them, as EAGLE-3 trains its trimmed head).

Vocabulary trimming is then picked from data (:func:`decodekit.train.eagle_vocab.pick_vocab`): for each candidate
size, the held-out top-1 agreement with the target's argmax and the measured draft-step time give a modelled chain
speedup; the best size ships.

``device``: where the target and the head run (None: CUDA when there is one); on a GPU the target's features are
computed per batch (``online``) instead of cached, and ``time_budget_s`` fits the schedule to a wall-clock budget,
as in :mod:`decodekit.train.eagle3`.

Writes to ``out_dir``: ``data/`` (cached sequences and features), ``checkpoints/step_*`` (``resume=true``),
``history.json``, ``summary.json``, ``loss.png`` and ``eagle_<base>.safetensors``; copy it to
``decodekit/weights/`` to ship it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decodekit.train.recipe import HeadConfig, run_recipe, shares


def head_loss(
    head: Any,
    embed: Any,
    w_d: torch.Tensor,
    tokens: torch.Tensor,
    feats: torch.Tensor,
    lengths: torch.Tensor,
    starts: torch.Tensor,
    noise: float,
    ce_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """EAGLE-1's loss on a batch: ``tokens [B, L]``, target features ``feats [B, L, H]``, ``lengths [B]``;
    ``w_d [V_d, H]`` the output head's rows scored by the head. Position ``t`` reads ``(x_{t+1}, f_t)`` and predicts
    ``f_{t+1}`` (regression) and the target's distribution at ``t + 1`` (soft cross-entropy over ``V_d``), i.e.
    the token ``x_{t+2}``; only positions with ``t + 2 >= starts`` count (a prompted sequence's response).
    Returns the loss and ``reg``, ``ce``, ``acc`` (top-1 agreement with the target over ``V_d``)."""
    f_in, f_out = feats[:, :-1].float(), feats[:, 1:].float()
    if noise:
        f_in = f_in + (torch.rand_like(f_in) * 2 - 1) * noise
    with torch.no_grad():
        emb = embed(tokens[:, 1:])
        p = (f_out @ w_d.T).softmax(-1)
    g = head(emb, f_in)
    t = torch.arange(tokens.shape[1] - 1, device=tokens.device)[None]
    valid = (t + 1 < lengths[:, None]) & (t + 2 >= starts[:, None])
    reg = torch.nn.functional.smooth_l1_loss(g, f_out, reduction="none").mean(-1)[valid].mean()
    logq = (g @ w_d.T).log_softmax(-1)
    ce = -(p * logq).sum(-1)[valid].mean()
    acc = (logq.argmax(-1) == p.argmax(-1))[valid].float().mean()
    return reg + ce_weight * ce, {"reg": float(reg.detach()), "ce": float(ce.detach()), "acc": float(acc)}


@shares(HeadConfig)
def train(
    out_dir: str | Path,
    *,
    draft_len: int = 4,
    noise: float = 0.1,
    ce_weight: float = 0.1,
    init: str | None = None,
    **shared: Any,
) -> dict[str, Any]:
    """Train the head; returns the summary numbers (also in ``summary.json``). The recipe's own knobs: the chain
    ``draft_len`` the vocabulary pick models, the feature ``noise``, the cross-entropy's ``ce_weight`` and a head to
    start from (``init``); ``shared``: :class:`~decodekit.train.recipe.HeadConfig`'s (data, optimisation, device).
    ``decodekit/recipes/train/eagle.yaml`` documents each."""
    cfg = HeadConfig.of("eagle", locals())  # every override, before the model or the data
    from decodekit.drafters.eagle_head import RETRAIN, EagleHead, read_init
    from decodekit.train.eagle_vocab import pick_vocab

    start: dict[str, torch.Tensor] = {}

    def check_init(target: Any) -> None:  # a missing or foreign init head fails before the data is built
        if init is not None:
            start.update(read_init(init, target, RETRAIN)[1])

    def make_head(target: Any, data: Any) -> EagleHead:
        head = EagleHead(target.config, data.vocab)
        head.init_from(target)
        if start:  # continue from a trained head (its layer and fc; the vocabulary is this run's, EAGLE-3's unused)
            kept = {k: v.float() for k, v in start.items() if k not in ("vocab", "fuse.weight")}
            head.load_state_dict(kept, strict=False)
        return head

    return run_recipe(
        cfg, make_head, lambda head, target, rows, b: head_loss(head, target.embed, rows, *b[:4], noise, ce_weight),
        pick=lambda head, target, val, sizes: pick_vocab(head, target, val, sizes, draft_len), title="EAGLE head",
        loss_label=f"SmoothL1 + {ce_weight} CE", check_target=check_init,
    )  # fmt: skip
