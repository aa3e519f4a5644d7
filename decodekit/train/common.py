"""What the training recipes share: the learning-rate schedule, one logged optimizer step, checkpoints (accelerate
state, keep the last two, resume) and the loss plot."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


class WarmupCosine:
    """The learning-rate factor at a step: linear warm-up over the first ``warmup`` fraction of ``total`` steps,
    then cosine decay to 0 at ``total``. ``total`` may be reset mid-run (a time budget fixes it once the step time
    is measured); a callable object, so a checkpoint of its ``LambdaLR`` keeps it."""

    def __init__(self, total: int, warmup: float) -> None:
        self.total, self.warmup = total, warmup

    def __call__(self, step: int) -> float:
        warm = max(1, round(self.warmup * self.total))
        return min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / self.total)))


def warmup_cosine(optimizer: torch.optim.Optimizer, total: int, warmup: float) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over the first ``warmup`` fraction of ``total`` steps, then cosine decay to 0
    (:class:`WarmupCosine`, reachable as ``schedule.lr_lambdas[0]``)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(total, warmup))


BUDGET_PROBE = 10  # steps timed to turn a time budget into a step count


def budgeted_steps(budget_s: float, elapsed_s: float, step: int, step_s: float, eval_s: float, eval_every: int) -> int:
    """The step count a ``budget_s``-second run can reach: ``elapsed_s`` spent at ``step``, then ``step_s`` a step
    plus ``eval_s`` every ``eval_every`` steps (at least one more step)."""
    return step + max(1, int((budget_s - elapsed_s) / (step_s + eval_s / eval_every)))


def take_step(
    accelerator: Any,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    loss: torch.Tensor,
    history: dict[str, list[list[float]]],
    bar: Any,
    step: int,
    **shown: str,
) -> int:
    """One optimizer step on ``loss`` (backward, step, schedule, zero grads), logged in ``history["train"]`` and on
    the progress ``bar`` (its loss and ``shown``); returns the new step count."""
    accelerator.backward(loss)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()
    value = float(loss.detach())
    history["train"].append([step + 1, value])
    bar.update(1)
    bar.set_postfix(loss=f"{value:.4f}", **shown)
    return step + 1


class Checkpoints:
    """``<out>/checkpoints/step_*``: accelerate's full state plus the loss history, the last two kept.

    Args:
        accelerator: the run's :class:`accelerate.Accelerator` (its prepared model, optimizer and schedule are saved).
        out: the run directory.
    """

    def __init__(self, accelerator: Any, out: Path) -> None:
        self.accelerator, self.dir = accelerator, Path(out) / "checkpoints"

    def resume(self) -> tuple[int, dict[str, list[list[float]]]] | None:
        """Load the last checkpoint; its step and loss history (None: there is none)."""
        last = sorted(self.dir.glob("step_*"))
        if not last:
            return None
        self.accelerator.load_state(str(last[-1]))
        return int(last[-1].name.split("_")[1]), json.loads((last[-1] / "history.json").read_text())

    def save(self, step: int, history: dict[str, list[list[float]]]) -> None:
        path = self.dir / f"step_{step:07d}"
        if path.exists():
            return
        self.accelerator.save_state(str(path))
        if self.accelerator.is_main_process:
            (path / "history.json").write_text(json.dumps(history))
            for old in sorted(self.dir.glob("step_*"))[:-2]:
                shutil.rmtree(old)


def plot_losses(history: dict[str, list[list[float]]], path: Path, title: str, ylabel: str) -> None:
    """Training loss per step (and its running mean) and validation loss, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, losses = np.array(history["train"]).T if history["train"] else (np.array([]), np.array([]))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, losses, alpha=0.3, label="train (step)")
    if len(losses) >= 10:
        window = max(1, len(losses) // 20)
        ax.plot(steps[window - 1 :], np.convolve(losses, np.ones(window) / window, "valid"), label="train (mean)")
    if history["val"]:
        ax.plot(*np.array(history["val"]).T, "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
