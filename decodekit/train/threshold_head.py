"""Train SpecDec++'s acceptance head (``python -m decodekit train recipe=threshold_head``, docs/training.md).

Self-distillation (:mod:`decodekit.train.acceptance_data`), then the head alone on the draft's frozen hidden
states (precomputed once, like the reference's frozen draft LM): the paper's weighted soft binary cross-entropy,
reject weight ``w``, normalised by the weighted label mass; AdamW, linear warm-up then cosine decay. The loop runs
under :class:`accelerate.Accelerator` (``accelerate launch`` runs it unchanged on several processes / a GPU).

Writes to ``out_dir``: ``data/`` (the dataset, :mod:`datasets` shards), ``checkpoints/step_*`` (accelerate state,
the head as ``model.safetensors``; ``resume=true`` continues from the last one), ``history.json``, ``loss.png`` and
``threshold_head.safetensors`` (the head, with its recipe and numbers in the safetensors metadata).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from decodekit.errors import ConfigError
from decodekit.policies.threshold_head import AcceptanceHead
from decodekit.train.acceptance_data import DATA_SOURCE, generate_dataset, pydoc_prompts
from decodekit.train.common import Checkpoints, plot_losses, take_step, warmup_cosine
from decodekit.train.recipe import RunConfig, shares
from decodekit.train.sequences import check_data_models


def acceptance_loss(logits: torch.Tensor, labels: torch.Tensor, reject_weight: float) -> tuple[torch.Tensor, ...]:
    """SpecDec++'s weighted soft BCE: ``logits [N]``, soft ``labels [N]`` in [0, 1] (P(accept)); returns the loss
    ``sum(w (1-y) softplus(z) + y softplus(-z)) / sum(w (1-y) + y)`` and its numerator and denominator."""
    logits, labels = logits.float(), labels.float()
    loss = reject_weight * (1 - labels) * torch.nn.functional.softplus(logits) + labels * torch.nn.functional.softplus(
        -logits
    )
    mass = reject_weight * (1 - labels) + labels
    return loss.sum() / mass.sum().clamp(min=1e-8), loss.sum(), mass.sum()


@shares(RunConfig)
def train(
    out_dir: str | Path,
    *,
    target: Any = "smollm2-135m-instruct",
    draft: Any = "smollm2-135m-instruct",
    draft_kernels: str | None = "int8",
    prompts: list[list[int]] | None = None,
    num_prompts: int = 320,
    max_prompt_tokens: int = 320,
    max_new_tokens: int = 128,
    gen_batch_size: int = 8,
    shard_size: int = 32,
    labels: Literal["greedy", "sampled", "both"] = "greedy",
    mixing: float = 0.15,
    blocks: int = 3,
    reject_weight: float = 6.0,
    epochs: int = 4,
    **shared: Any,
) -> dict[str, Any]:
    """Generate the data (reused if ``data_dir`` holds it) and train the head; returns the summary numbers.

    Args:
        out_dir: where everything is written.
        target, draft: zoo names, paths or models (:func:`decodekit.load_model`); ``draft_kernels`` for the draft.
        prompts: token-id prompts; None = ``num_prompts`` Python-documentation questions (``pydoc_data``) in the
            target tokenizer's chat template, at most ``max_prompt_tokens`` tokens each.
        max_new_tokens: the target's greedy response length (EOS ends it earlier).
        gen_batch_size, shard_size: prompts per generation batch / per saved shard.
        labels: ``greedy`` (argmax match), ``sampled`` (``min(1, p/q)`` of a temperature-1 draft token) or both.
        mixing: fraction ``r`` of response positions holding the target token (unlabelled).
        blocks, reject_weight: the head's residual blocks; the reject class weight ``w``.
        epochs: passes over the training rows.
        shared: :class:`~decodekit.train.recipe.RunConfig`'s knobs (optimisation, the split, ``data_dir``,
            threads, seed), here by default ``batch_size=256`` (positions a step), ``lr=3e-4``,
            ``weight_decay=0.1``, ``save_every=500``, ``val_fraction=0.1`` (of the prompts held out).

    The arguments (models by name) go into the head's metadata as ``recipe``.
    """
    cfg = RunConfig.of(  # every override, before the models or the data
        "threshold_head", locals(), batch_size=256, lr=3e-4, weight_decay=0.1, save_every=500, val_fraction=0.1
    )
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    import decodekit as dk

    recipe = cfg.start()
    source = DATA_SOURCE if prompts is None else f"{len(prompts)} prompts passed to train()"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    target_lm, draft_lm = dk.load_model(target), dk.load_model(draft, kernels=draft_kernels)
    where = cfg.data_path
    models = {"target": (target, target_lm), "draft": (f"{draft} kernels={draft_kernels}", draft_lm)}
    check_data_models(where, models, record=not any(where.glob("shard_*")))  # shards made with other models: refused
    if prompts is None:
        prompts = pydoc_prompts(target_lm.tokenizer, num_prompts, max_prompt_tokens, cfg.seed)
    data, tokens, data_seconds = generate_dataset(
        target_lm,
        draft_lm,
        prompts,
        where,
        max_new_tokens=max_new_tokens,
        batch_size=gen_batch_size,
        shard_size=shard_size,
        mixing=mixing,
        seed=cfg.seed,
        progress=cfg.progress,
    )
    gen_time = time.perf_counter() - start
    columns = data.with_format("numpy")[:]
    chosen = np.ones(len(data), bool) if labels == "both" else columns["sampled"] == (labels == "sampled")
    held_out = np.random.default_rng(cfg.seed).random(len(prompts)) < cfg.val_fraction
    is_val = held_out[columns["prompt"]]
    hidden = torch.from_numpy(columns["hidden"]).float()
    y = torch.from_numpy(columns["label"]).float()
    train_set = torch.utils.data.TensorDataset(hidden[chosen & ~is_val], y[chosen & ~is_val])
    val_h, val_y = hidden[chosen & is_val], y[chosen & is_val]
    if len(train_set) == 0 or len(val_y) == 0:
        raise ConfigError(
            f"too little data: {len(train_set)} training and {len(val_y)} validation rows; raise num_prompts"
        )

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    loader = torch.utils.data.DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True)
    head = AcceptanceHead(hidden.shape[1], blocks)
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = epochs * len(loader)
    schedule = warmup_cosine(optimizer, total, cfg.warmup)
    head, optimizer, loader, schedule = accelerator.prepare(head, optimizer, loader, schedule)
    checkpoints = Checkpoints(accelerator, out)
    step, history = checkpoints.start(cfg.resume) or (0, {"train": [], "val": []})

    def validate() -> float:
        with torch.no_grad():
            logits = accelerator.unwrap_model(head)(val_h.to(accelerator.device))
            return float(acceptance_loss(logits, val_y.to(accelerator.device), reject_weight)[0])

    train_start = time.perf_counter()
    bar = tqdm(total=total, initial=step, desc="training head", unit="step", disable=not cfg.progress)
    for epoch in range(step // len(loader), epochs):
        loader.set_epoch(epoch)
        skip = step - epoch * len(loader)
        for h, label in accelerator.skip_first_batches(loader, skip) if skip else loader:
            loss = acceptance_loss(head(h), label, reject_weight)[0]
            step = take_step(accelerator, optimizer, schedule, loss, history, bar, step)
            if step % cfg.save_every == 0:
                checkpoints.save(step, history)
        history["val"].append([step, validate()])
    bar.close()
    checkpoints.save(step, history)
    train_time = time.perf_counter() - train_start
    per_epoch = len(loader)
    final_train = float(np.mean([loss for _, loss in history["train"][-per_epoch:]]))
    summary = {
        "data_source": source,
        "prompts": len(prompts),
        "response_tokens": tokens,
        "train_rows": len(train_set),
        "val_rows": len(val_y),
        "mean_label_train": float(train_set.tensors[1].mean()),
        "labels": labels,
        "final_train_loss": final_train,
        "final_val_loss": history["val"][-1][1],
        "val_loss_best_constant": constant_baseline(train_set.tensors[1], val_y, reject_weight),
        "data_generation_time_s": round(data_seconds, 1),
        "load_and_generation_time_s": round(gen_time, 1),
        "training_time_s": round(train_time, 1),
        "steps": step,
        "hidden_size": hidden.shape[1],
        "blocks": blocks,
    }
    if accelerator.is_main_process:
        (out / "history.json").write_text(json.dumps(history))
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        plot_losses(history, out / "loss.png", "SpecDec++ acceptance head", "weighted soft BCE")
        meta = {**summary, "recipe": recipe, "target": str(target), "draft": f"{draft} kernels={draft_kernels}"}
        accelerator.unwrap_model(head).save(out / "threshold_head.safetensors", meta)
    return summary


def constant_baseline(train_labels: torch.Tensor, val_labels: torch.Tensor, reject_weight: float) -> float:
    """Validation loss of the best constant prediction for the training labels, ``p = y / (y + w (1 - y))`` at
    their mean ``y``: what a head that ignores its input scores."""
    mean = float(train_labels.mean())
    p = min(max(mean / (mean + reject_weight * (1 - mean)), 1e-6), 1 - 1e-6)
    logits = torch.full_like(val_labels, math.log(p / (1 - p)))
    return float(acceptance_loss(logits, val_labels, reject_weight)[0])
