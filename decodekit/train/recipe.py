"""One runner for the recipes that train a head on the target's hidden states (``eagle``, ``exit_head``,
``medusa``; ``eagle3`` calls the same parts around its layer taps): the knobs they share (:class:`HeadConfig`) and
the run itself (:func:`run_recipe`: device, target and data, fit, held-out split, vocabulary pick, files).

A recipe keeps only what is its own: its knobs (``train(out_dir, *, num_heads=3, decay=0.8, **shared)``), its
defaults for the shared ones, the head (``make_head``), the loss on a batch (``loss``) and the draft-vocabulary pick
(``pick``). Adding a head on features is one such ``train`` and a yaml recipe beside the others.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from decodekit.errors import ConfigError
from decodekit.train.arguments import check_arguments


@dataclasses.dataclass
class HeadConfig:
    """The knobs every head-on-features recipe shares (``decodekit/recipes/train/<name>.yaml`` documents each), its
    own knobs in ``own`` and its ``name`` (the file it writes: ``<name>_<base>.safetensors``).

    Data (:mod:`decodekit.train.feature_data`): ``base`` (the target), ``chat_prompts``, ``code_prompts``,
    ``text_chunks``, ``max_prompt_tokens``, ``max_new_tokens``, ``seq_len``, ``gen_batch_size``, ``train_vocab``
    (the tokens the loss scores), ``vocab_sizes`` (the draft vocabularies picked among), ``val_fraction``,
    ``data_dir`` (None: ``<out_dir>/data``). Optimisation (:func:`~decodekit.train.feature_heads.fit`): ``epochs``,
    ``batch_size``, ``lr``, ``weight_decay``, ``warmup``, ``save_every``, ``resume``, ``seed``, ``progress``,
    ``time_budget_s``. Where: ``device`` (None: CUDA when there is one), ``online`` (None: features per batch on a
    GPU, cached on the CPU), ``threads``.
    """

    out_dir: str | Path
    name: str = "head"
    own: dict[str, Any] = dataclasses.field(default_factory=dict)
    base: Any = "smollm2-135m-instruct"
    chat_prompts: int = 256
    code_prompts: int = 256
    text_chunks: int = 1024
    max_prompt_tokens: int = 320
    max_new_tokens: int = 128
    seq_len: int = 384
    gen_batch_size: int = 8
    train_vocab: int = 16384
    vocab_sizes: Sequence[int] = (2048, 4096, 8192, 16384)
    val_fraction: float = 0.05
    epochs: int = 3
    batch_size: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: float = 0.03
    save_every: int = 200
    resume: bool = False
    device: str | None = None
    online: bool | None = None
    time_budget_s: float | None = None
    data_dir: str | None = None
    threads: int | None = None
    seed: int = 0
    progress: bool = True

    @classmethod
    def of(cls, name: str, args: Mapping[str, Any], **defaults: Any) -> HeadConfig:
        """The config of recipe ``name``'s ``train(out_dir, *, <own knobs>, **shared)`` call from its ``locals()``
        (``args``): the shared knobs given, else the recipe's ``defaults``, else this class's. Every argument is
        checked (:func:`~decodekit.train.arguments.check_arguments`) before anything is loaded.

        Raises:
            ConfigError: an argument neither the recipe nor this class has (naming it and the recipe's arguments).
        """
        args = dict(args)
        given, out_dir = dict(args.pop("shared", {})), args.pop("out_dir")
        unknown = sorted(set(given) - set(SHARED))
        if unknown:
            known = ", ".join(sorted({*args, *SHARED}))
            raise ConfigError(f"the {name} recipe has no argument {', '.join(unknown)}; its arguments: {known}")
        cfg = cls(out_dir=out_dir, name=name, own=args, **{**defaults, **given})
        check_arguments(cfg.recipe())
        return cfg

    def recipe(self) -> dict[str, Any]:
        """Every argument by name (shared and own, without ``out_dir``): what the run records in its files."""
        shared = {key: getattr(self, key) for key in SHARED}
        return {**shared, **self.own}

    def fit_args(self) -> dict[str, Any]:
        """The optimisation knobs, as :func:`~decodekit.train.feature_heads.fit` takes them."""
        keys = ("epochs", "batch_size", "lr", "weight_decay", "warmup", "save_every", "resume", "seed", "progress")
        return {key: getattr(self, key) for key in keys} | {"time_budget_s": self.time_budget_s}


SHARED = tuple(f.name for f in dataclasses.fields(HeadConfig) if f.name not in ("out_dir", "name", "own"))


class Batch(NamedTuple):
    """One training batch of sequences: ``tokens [B, L]``, the target's final features ``feats [B, L, H]``,
    ``lengths [B]`` and the first response position ``starts [B]``."""

    tokens: torch.Tensor
    feats: torch.Tensor
    lengths: torch.Tensor
    starts: torch.Tensor


Loss = Callable[[torch.nn.Module, Any, torch.Tensor, Batch], tuple[torch.Tensor, dict[str, float]]]
Pick = Callable[[torch.nn.Module, Any, Any, list[int]], dict[str, Any]]


def run_recipe(
    cfg: HeadConfig,
    make_head: Callable[[Any, Any], torch.nn.Module],
    loss: Loss,
    *,
    pick: Pick,
    title: str,
    loss_label: str,
    check_target: Callable[[Any], None] | None = None,
    **summary: Any,
) -> dict[str, Any]:
    """Train a head on the target's hidden states and write it; returns the summary (also ``summary.json``).

    Args:
        cfg: the run (:meth:`HeadConfig.of`).
        make_head: ``(target, data) -> head`` with ``head.vocab`` the training vocabulary ``data.vocab [V]``.
        loss: ``(head, target, rows, batch) -> (loss, {"acc": top-1 agreement, ...})``, ``rows [V, H]`` the
            target's output-head rows for ``data.vocab`` (on its device), ``batch`` a :class:`Batch`.
        pick: ``(head, target, held-out data, sizes) -> {"picked": size, ...}``, the draft vocabulary.
        title, loss_label: what the progress bar, the plot and the summary call the head and its loss.
        check_target: raises for a target the recipe cannot train on, before the data is built (an hour on a CPU).
        summary: more fields for the summary.
    """
    from decodekit.drafters.head_files import head_rows
    from decodekit.train.feature_heads import device_settings, finish_run, fit, held_out, start_run

    dev, online = device_settings(cfg.device, cfg.online, cfg.time_budget_s)

    def check(target: Any) -> None:
        if head_rows(target, torch.zeros(1, dtype=torch.long)) is None:
            raise ConfigError(
                f"the {cfg.name} recipe scores a trimmed vocabulary with rows of the target's output head, and "
                f"{type(getattr(target, 'hf', target)).__name__} has no plain linear lm_head (weight [V, H]): "
                "use a target whose output head is a linear layer"
            )
        if check_target is not None:
            check_target(target)

    recipe, out, target, data = start_run(cfg, check, device=dev, features=not online)
    rows = head_rows(target, data.vocab)[0]
    head = make_head(target, data).to(dev)

    def batch_loss(idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        return loss(head, target, rows, Batch(*data.batch(idx, dev, target)))

    trained, history, numbers = fit(head, batch_loss, data, out, **cfg.fit_args(), desc=f"training {title}", device=dev)
    val = held_out(target, data, online, cfg.gen_batch_size)
    return finish_run(
        trained, data, out, target, recipe, pick=lambda sizes: pick(trained, target, val, sizes),
        vocab_sizes=tuple(cfg.vocab_sizes), history=history, numbers=numbers, name=cfg.name, title=title,
        loss_label=loss_label, **summary,
    )  # fmt: skip


def recipe_arguments(train: Callable[..., Any]) -> set[str]:
    """The argument names a recipe's ``train`` takes: its own parameters and, for one that takes ``**shared``,
    :class:`HeadConfig`'s shared knobs."""
    parameters = inspect.signature(train).parameters
    shared = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return {n for n, p in parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD} | (
        set(SHARED) if shared else set()
    )


__all__ = ["SHARED", "Batch", "HeadConfig", "recipe_arguments", "run_recipe"]
