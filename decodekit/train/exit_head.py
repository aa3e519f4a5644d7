"""Train an exit head for a target (``python -m decodekit train recipe=exit_head``, docs/training.md): the trained
early exit of the zoo's ``early_exit`` drafter (``exit_head=true``; :mod:`decodekit.drafters.exit_head`).

Self-distillation on the same cached sequences as the EAGLE and Medusa heads (:mod:`decodekit.train.feature_data`;
point ``data_dir`` at an EAGLE run's ``data`` to reuse them). Kangaroo's objective: the head reads
``n_t = norm(h_L(t))``, the target's final norm of its state after layer ``exit_layer`` (computed here by the
target's own first layers, frozen), and learns the target's next-token distribution at ``t`` by soft
cross-entropy, ``CE(softmax(W_d f_t), W_d head(n_t))``, over the ``train_vocab`` most frequent tokens of the data
(``f_t``: the target's final feature, cached). Only the predictions of a prompted sequence's response count.

The draft vocabulary is then picked from data as for EAGLE (:mod:`decodekit.train.eagle_vocab`): per candidate
size, the held-out top-1 agreement with the target's full-vocabulary argmax and the measured draft step (the first
``exit_layer`` layers on one token in a 256-entry cache, the head, the scores) give a modelled chain speedup; the
best size ships.

``device`` / ``online`` / ``time_budget_s``: as for the EAGLE heads (:mod:`decodekit.train.eagle3`): on a GPU the
target's final features are computed per batch there instead of cached.

Writes to ``out_dir``: ``data/`` (unless ``data_dir``), ``checkpoints/step_*`` (``resume=true``),
``history.json``, ``summary.json``, ``loss.png`` and ``exit_head_<base>.safetensors``; copy it to
``decodekit/weights/`` to ship it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from decodekit.errors import ConfigError
from decodekit.train.recipe import HeadConfig, run_recipe, shares


@torch.no_grad()
def exit_states(target: Any, tokens: torch.Tensor, exit_layer: int) -> torch.Tensor:
    """``n [B, L, H]``: the target's final norm of its state after layer ``exit_layer``, at every position of the
    right-padded ``tokens [B, L]`` (the target's first layers only; no output head)."""
    from decodekit.train.acceptance_data import _forward

    empty = tokens.new_zeros(tokens.shape[0], 0)
    return _forward(target, tokens, empty, True, exit_layer=exit_layer).last_hidden.float()


def exit_loss(
    head: Any,
    n: torch.Tensor,
    w_d: torch.Tensor,
    feats: torch.Tensor,
    lengths: torch.Tensor,
    starts: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The soft cross-entropy of ``head(n) [B, L, H]`` against the target's distribution ``softmax(W_d f)`` at the
    same positions (``feats [B, L, H]``, ``w_d [V_d, H]``), over the positions ``t`` that predict a response
    token (``t + 1 >= starts``, ``t + 1 < lengths``). Returns the loss and ``acc`` (top-1 agreement over ``V_d``)."""
    with torch.no_grad():
        p = (feats.float() @ w_d.T).softmax(-1)
    logq = (head(n) @ w_d.T).log_softmax(-1)
    t = torch.arange(n.shape[1], device=n.device)[None]
    valid = (t + 1 < lengths[:, None]) & (t + 1 >= starts[:, None])
    ce = -(p * logq).sum(-1)[valid].mean()
    acc = (logq.argmax(-1) == p.argmax(-1))[valid].float().mean()
    return ce, {"acc": float(acc)}


@torch.no_grad()
def pick_vocab(head: Any, target: Any, val: Any, sizes: Sequence[int], k: int) -> dict[str, Any]:
    """The draft vocabulary size with the best modelled chain speedup of ``k`` drafts (module docstring), with
    every size's numbers: held-out agreement with the target's full-vocabulary argmax and the draft step's time
    (a single size is taken with its agreement, without timing anything)."""
    from decodekit.cache import KVCache
    from decodekit.drafters.head_files import head_rows
    from decodekit.masks import chain_mask
    from decodekit.train.eagle_vocab import chain_pick, median_ms, target_ms, untimed_pick

    head.eval()
    dev = target.device
    w = head_rows(target, head.vocab[: max(sizes)])[0]
    hits, total = dict.fromkeys(sizes, 0), 0
    for i in range(0, len(val.lengths), 8):
        tokens, feats, lengths, starts = val.batch(torch.arange(i, min(i + 8, len(val.lengths))), dev)
        t = torch.arange(tokens.shape[1], device=dev)[None]
        valid = (t + 1 < lengths[:, None]) & (t + 1 >= starts[:, None])
        want = target.head(feats[valid].to(w.dtype)).argmax(-1)
        scores = head(exit_states(target, tokens, head.exit_layer))[valid] @ w.T
        for s in sizes:
            hits[s] += int((head.vocab[scores[:, :s].argmax(-1)] == want).sum())
        total += int(valid.sum())
    acc = {s: hits[s] / max(total, 1) for s in sizes}
    if len(sizes) == 1:  # nothing to pick: nothing timed
        return untimed_pick(acc, k)
    context = 256
    cache = KVCache(1, context + 2, device=dev)
    x = torch.randint(0, target.vocab_size, (1, context + 1), device=dev)
    target.extend(cache, x[:, :context], torch.tensor([context], device=dev), host_counts=context)
    empty = x.new_zeros(1, 0)

    def step(s: int) -> None:
        view = cache.stage(1)
        mask, pos = chain_mask(cache.lengths, 1, view.kv_len)
        n = target.forward(x[:, -1:], pos, mask, view, empty, exit_layer=head.exit_layer, return_hidden=True)
        (head(n.last_hidden[:, 0]) @ w[:s].T).argmax(-1)

    draft = {s: median_ms(lambda s=s: step(s), target.device) for s in sizes}
    return chain_pick(acc, draft, target_ms(target, (1, k + 1)), k, k)  # k draft steps: the pending token and k - 1


@shares(HeadConfig)
def train(
    out_dir: str | Path, *, exit_layer: int = 4, width: int = 1536, draft_len: int = 3, **shared: Any
) -> dict[str, Any]:
    """Train the head; returns the summary numbers (also in ``summary.json``). The recipe's own knobs: the layer it
    reads (``exit_layer``), its hidden ``width`` and the chain ``draft_len`` the vocabulary pick models; ``shared``:
    :class:`~decodekit.train.recipe.HeadConfig`'s (data, optimisation, device).
    ``decodekit/recipes/train/exit_head.yaml`` documents each."""
    cfg = HeadConfig.of("exit_head", locals(), train_vocab=8192, vocab_sizes=(1024, 2048, 4096, 8192))
    from decodekit.drafters.exit_head import ExitHead

    def check_target(target: Any) -> None:  # before the data is built (an hour on a CPU)
        if exit_layer >= target.num_layers:
            raise ConfigError(f"exit_layer={exit_layer} must be below the target's {target.num_layers} layers")

    return run_recipe(
        cfg, lambda target, data: ExitHead(int(target.config.hidden_size), width, exit_layer, data.vocab),
        lambda head, target, rows, b: exit_loss(head, exit_states(target, b.tokens, exit_layer), rows, *b[1:4]),
        pick=lambda head, target, val, sizes: pick_vocab(head, target, val, sizes, draft_len), title="exit head",
        loss_label="CE(target distribution)", check_target=check_target, exit_layer=exit_layer,
    )  # fmt: skip
