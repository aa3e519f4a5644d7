"""The training run every head on the target's own hidden states shares (``eagle``, ``medusa``): the start (recipe,
target, data from :mod:`decodekit.train.feature_data`), the loop (accelerate, AdamW with warm-up and cosine,
checkpoints, resume, validation each epoch) and the end (the draft vocabulary picked, the files written).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_bool, check_float, check_int, parse_device
from decodekit.errors import ConfigError
from decodekit.train.common import BUDGET_PROBE, Checkpoints, budgeted_steps, plot_losses, take_step, warmup_cosine
from decodekit.train.feature_data import FeatureData, prepare

if TYPE_CHECKING:
    from decodekit.train.recipe import HeadConfig

BatchLoss = Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


def fit(
    head: torch.nn.Module,
    batch_loss: BatchLoss,
    data: FeatureData,
    out: Path,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    warmup: float,
    save_every: int,
    resume: bool,
    seed: int,
    progress: bool,
    desc: str,
    device: torch.device | str = "cpu",
    time_budget_s: float | None = None,
) -> tuple[torch.nn.Module, dict[str, list[list[float]]], dict[str, float]]:
    """Train ``head`` with ``batch_loss(sequence indices) -> (loss, {"acc": ...})`` (AdamW, warm-up and cosine),
    validating before training and after each epoch; checkpoints in ``out/checkpoints`` (``resume``). The head
    trains on ``device`` (the target's). ``time_budget_s``: stop after about that many seconds of training and
    validation, the cosine schedule fitted to the step count that the first steps' measured time allows (at most
    ``epochs`` epochs). Returns the trained head (eval mode), the history (``train``, ``val``, ``acc``: ``[step,
    value]`` lists) and numbers."""
    from accelerate import Accelerator

    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("save_every", save_every)):
        check_int(name, value, low=1)
    check_float("lr", lr, low=0, low_open=True)
    check_float("time_budget_s", time_budget_s, low=0.0, low_open=True, optional=True)
    accelerator = Accelerator(cpu=torch.device(device).type == "cpu")
    train_idx, val_idx = (~data.held).nonzero()[:, 0], data.held.nonzero()[:, 0]
    loader = torch.utils.data.DataLoader(
        train_idx, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    total = epochs * len(loader)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = warmup_cosine(optimizer, total, warmup)
    shape = schedule.lr_lambdas[0]
    head, optimizer, loader, schedule = accelerator.prepare(head, optimizer, loader, schedule)
    checkpoints = Checkpoints(accelerator, out)
    step, history = checkpoints.start(resume) or (0, {"train": [], "val": [], "acc": []})
    shape.total = total  # a checkpoint restores its own; this run's epochs (and budget) decide
    eval_s = 0.0  # the last validation's time (a time budget counts it)

    def validate() -> None:
        nonlocal eval_s
        began = time.perf_counter()
        head.eval()
        with torch.no_grad():
            parts = [batch_loss(i) for i in val_idx.split(batch_size)]
        head.train()
        history["val"].append([step, sum(float(p[0]) for p in parts) / len(parts)])
        history["acc"].append([step, sum(p[1]["acc"] for p in parts) / len(parts)])
        eval_s = time.perf_counter() - began

    if not history["val"]:
        validate()
    began = time.perf_counter()
    probe = (step + 2, step + 2 + BUDGET_PROBE)  # the steps timed for a time budget (the first ones warm up)
    bar = tqdm(total=total, initial=step, desc=desc, unit="step", disable=not progress)
    for epoch in range(step // len(loader), epochs):
        skip = step - epoch * len(loader)
        for idx in accelerator.skip_first_batches(loader, skip) if skip else loader:
            if step >= total:
                break
            if step == probe[0]:
                probe_began = time.perf_counter()
            loss, stats = batch_loss(idx)
            step = take_step(accelerator, optimizer, schedule, loss, history, bar, step, acc=f"{stats['acc']:.2f}")
            if time_budget_s is not None and step == probe[1]:
                step_s = (time.perf_counter() - probe_began) / BUDGET_PROBE
                spent = time.perf_counter() - began
                budget = budgeted_steps(time_budget_s, spent, step, step_s, eval_s, len(loader))  # validates each epoch
                total = shape.total = min(total, budget)
                bar.total = total
                bar.refresh()
            if step % save_every == 0:
                checkpoints.save(step, history)
        validate()
        if step >= total:
            break
    bar.close()
    checkpoints.save(step, history)
    recent = [loss for _, loss in history["train"][-len(loader) :]]
    numbers = {
        "steps": step,
        "final_train_loss": sum(recent) / max(1, len(recent)),
        "initial_val_loss": history["val"][0][1],
        "final_val_loss": history["val"][-1][1],
        "initial_val_top1_agreement": history["acc"][0][1],
        "final_val_top1_agreement": history["acc"][-1][1],
        "training_time_s": round(time.perf_counter() - began, 1),
    }
    return accelerator.unwrap_model(head).eval(), history, numbers


def device_settings(device: str | None, online: bool | None, time_budget_s: float | None) -> tuple[torch.device, bool]:
    """Where a feature head's recipe runs (``device``; None: CUDA when there is one, else the CPU) and whether the
    target's states are computed per batch there (``online``; None: on a GPU, where that costs less than storing
    them; the CPU caches them once). Refuses a bad ``device``, ``online`` or ``time_budget_s`` (a positive number of
    seconds, or None) before anything is loaded."""
    check_float("time_budget_s", time_budget_s, low=0, low_open=True, optional=True)
    dev = parse_device("device", device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return dev, dev.type != "cpu" if online is None else check_bool("online", online)


def held_out(target: Any, data: FeatureData, online: bool, batch_size: int) -> FeatureData:
    """The validation split, its final features computed by the target (``batch_size`` sequences a forward, on its
    device, in length-sorted batches: :func:`~decodekit.train.feature_data.by_length`) when the run computed them
    per batch (``online``) instead of caching them."""
    from decodekit.train.feature_data import by_length
    from decodekit.train.layer_features import final_states

    val = data.subset(data.held)
    if online:
        val.feats = by_length(val.tokens, val.lengths, batch_size, final_states, target, "held-out features", False)
    return val


def start_run(
    cfg: HeadConfig,
    check_target: Callable[[Any], Sequence[int] | None] | None = None,
    *,
    device: torch.device | str = "cpu",
    features: bool = True,
) -> tuple[dict[str, Any], Path, Any, FeatureData]:
    """What a feature head's run does first: the recipe (its plain arguments, for the weights' metadata), threads
    and seed, the target (``cfg.base``, on ``device``; ``check_target(target)`` raises for a recipe that does not
    fit it, before the data is built, and returns the target layers whose states the recipe reads, if any) and the
    data (:func:`prepare`, on :func:`data_target`; ``features=False``: no cached features). Returns the recipe, the
    run directory, the target and the data."""
    import decodekit as dk
    from decodekit.train.recipe import SCALARS

    recipe = cfg.start((*SCALARS, tuple, list))
    out = Path(cfg.out_dir)
    target = dk.load_model(cfg.base, device=device)
    if not isinstance(cfg.base, str):  # a loaded model (from Python): its files and records name its class
        recipe["base"] = type(getattr(target, "hf", target)).__name__
    # refuse a recipe that does not fit the target before building the data
    layers = check_target(target) if check_target is not None else None
    where = cfg.data_path
    data = prepare(
        data_target(target, where) if features else target,
        recipe,
        where,
        train_vocab=cfg.train_vocab,
        val_fraction=cfg.val_fraction,
        seed=cfg.seed,
        progress=cfg.progress,
        features=features,
        layers=layers or (),
    )
    return recipe, out, target, data


def data_target(target: Any, data_dir: Path) -> Any:
    """The model the data passes run on (the target's greedy responses and its features: no gradients). On the
    CPU, with the features not yet cached in ``data_dir``: a copy of the target with oneDNN's packed linears (the
    same float32 weights; the kernels the benchmark's target runs, faster at generation's small batches), freed
    with the data pass; the target itself otherwise, or where this PyTorch has no oneDNN."""
    import decodekit as dk

    if target.device.type != "cpu" or (Path(data_dir) / "features.pt").is_file():
        return target
    try:
        return dk.load_model(target, kernels="onednn")
    except ConfigError:  # no oneDNN in this PyTorch, or a target decodekit cannot convert
        return target


def finish_run(
    head: torch.nn.Module,
    data: FeatureData,
    out: Path,
    target: Any,
    recipe: dict[str, Any],
    *,
    pick: Callable[[list[int]], dict[str, Any]],
    vocab_sizes: tuple[int, ...],
    history: dict[str, list[list[float]]],
    numbers: dict[str, float],
    name: str,
    title: str,
    loss_label: str,
    metadata: dict[str, Any] | None = None,
    keep: Callable[[torch.nn.Module, torch.Tensor], None] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """What a feature head's ``train`` does last: ``pick(sizes)`` the draft vocabulary among ``vocab_sizes`` (those
    within the training vocabulary), trim the head to it, write ``history.json``, ``summary.json``, ``loss.png``
    and ``<name>_<base>.safetensors`` (``base`` as :func:`~decodekit.train.arguments.file_stem` names it; the
    recipe, the summary and ``metadata``, fields the drafter reads, in its metadata; ``keep(head, vocab)`` trims a
    head with its own output rows, None: the head's ``vocab`` is set). Returns the summary."""
    from decodekit.drafters.head_files import head_metadata
    from decodekit.train.arguments import file_stem

    base = recipe["base"]
    sizes = sorted({s for s in vocab_sizes if s <= len(data.vocab)} or {len(data.vocab)})
    choice = pick(sizes)
    head = head.cpu()
    if keep is None:
        head.vocab = data.vocab[: choice["picked"]].clone()
    else:
        keep(head, data.vocab[: choice["picked"]])
    summary = {**data.summary(), **numbers, "vocab": choice, "base": base, **extra}
    (out / "history.json").write_text(json.dumps(history))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_losses(history, out / "loss.png", f"{title} for {base}", loss_label)
    meta = head_metadata(target, base=base, summary=summary, recipe=recipe, **(metadata or {}))
    head.save(out / f"{name}_{file_stem(base)}.safetensors", meta)  # base may be a local directory's path
    return summary
