"""What the training recipes share: the learning-rate schedule, one logged optimizer step, checkpoints (accelerate
state without frozen parameters, keep the last two, resume) and the loss plot."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from decodekit.errors import ConfigError


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
    """``<out>/checkpoints/step_*``: accelerate's state (the models' trainable parameters, optimizer, schedule, RNG)
    plus the loss history, the last two kept.

    A model's frozen parameters (a LoRA adapter's base model) are left out of the checkpoint: they come from where
    the run loaded them, so a SmolLM2 adapter's checkpoint holds its few MB instead of the 540 MB model.

    Args:
        accelerator: the run's :class:`accelerate.Accelerator` (its prepared model, optimizer and schedule are saved).
        out: the run directory.
    """

    def __init__(self, accelerator: Any, out: Path) -> None:
        self.accelerator, self.dir = accelerator, Path(out) / "checkpoints"
        accelerator.register_save_state_pre_hook(_trainable_only)

    def start(self, resume: bool) -> tuple[int, dict[str, list[list[float]]]] | None:
        """:meth:`resume` a run; or, for a fresh one, remove the checkpoints an earlier run left in this directory
        (with a warning), so none of them is taken for this run's by a later ``resume=true``."""
        if resume:
            return self.resume()
        old = sorted(self.dir.glob("step_*"))
        if old and self.accelerator.is_main_process:
            warnings.warn(
                f"a fresh run (resume=false) in {self.dir.parent}: removing the {len(old)} checkpoint(s) an earlier "
                "run left there (pass resume=true to continue that run instead)",
                stacklevel=2,
            )
            for path in old:
                shutil.rmtree(path)
        return None

    def resume(self) -> tuple[int, dict[str, list[list[float]]]] | None:
        """Load the last checkpoint; its step and loss history (None: there is none). Every trainable parameter
        must be in it (a checkpoint of another run's model is refused, naming what is missing)."""
        last = sorted(self.dir.glob("step_*"))
        if not last:
            return None
        for i, model in enumerate(self.accelerator._models):
            saved = _saved_names(last[-1], i)
            missing = sorted(_trainable_names(model) - saved) if saved is not None else []
            if missing:
                raise ConfigError(
                    f"the checkpoint {last[-1]} lacks {len(missing)} of this run's trainable parameters "
                    f"({', '.join(missing[:3])}...): it comes from another model or recipe; use another out_dir "
                    "or resume=false"
                )
        self.accelerator.load_state(str(last[-1]), strict=False)  # the frozen parameters stay as loaded
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


def _trainable_names(model: torch.nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


def _trainable_only(models: list[torch.nn.Module], weights: list[dict[str, Any]], output_dir: str) -> None:
    """accelerate's save hook: each model's state dict cut to its trainable parameters, in place (where accelerate
    saves a model itself, as under FSDP or DeepSpeed, ``weights`` lacks it and it is saved whole)."""
    for i, (model, state) in enumerate(zip(models, weights)):
        keep = _trainable_names(model)
        weights[i] = {k: v for k, v in state.items() if k in keep}


def _saved_names(path: Path, i: int) -> set[str] | None:
    """The tensor names in checkpoint ``path``'s file of model ``i``, named as accelerate names it; None where there is
    no such file (accelerate saved the model its own way, as under FSDP or DeepSpeed, and loads it so)."""
    from accelerate.utils import SAFE_WEIGHTS_NAME
    from safetensors import safe_open

    file = path / (SAFE_WEIGHTS_NAME if i == 0 else SAFE_WEIGHTS_NAME.replace(".", f"_{i}."))
    if not file.is_file():
        return None
    with safe_open(str(file), "pt") as f:
        return set(f.keys())


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
