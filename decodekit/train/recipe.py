"""What the training recipes share: the run knobs every recipe has (:class:`RunConfig`: optimisation, the split,
where, threads, seed) and its start (the checked arguments, threads, seed, the recipe record); for the recipes that
train a head on the target's hidden states (``eagle``, ``exit_head``, ``medusa``; ``eagle3`` calls the same parts
around its layer taps), their further knobs (:class:`HeadConfig`: data, epochs, device) and the run itself
(:func:`run_recipe`: device, target and data, fit, held-out split, vocabulary pick, files).

A recipe keeps only what is its own: its knobs (``train(out_dir, *, num_heads=3, decay=0.8, **shared)``, marked
with the config whose knobs ``shared`` holds: :func:`shares`), its defaults for the shared ones and, for a head on
features, the head (``make_head``), the loss on a batch (``loss``) and the draft-vocabulary pick (``pick``). Adding
a head on features is one such ``train`` and a yaml recipe beside the others.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import torch

from decodekit.checks import check_int
from decodekit.errors import ConfigError
from decodekit.train.arguments import check_arguments
from decodekit.train.sequences import SEQUENCES

SCALARS = (str, int, float, bool, type(None))  # the arguments a run records by default (not prompts, models, dicts)
Config = TypeVar("Config", bound="RunConfig")


@dataclasses.dataclass
class RunConfig:
    """The knobs every training recipe has (its yaml recipe, ``decodekit/recipes/train/<name>.yaml``, documents
    each), its own knobs in ``own`` and its ``name``.

    Optimisation (AdamW, linear warm-up then cosine decay to 0): ``batch_size`` (rows a step), ``lr``,
    ``weight_decay``, ``warmup`` (the share of the steps warming up), ``save_every`` (steps between checkpoints in
    ``<out_dir>/checkpoints``, and one at the end), ``resume`` (continue from the last checkpoint). The data:
    ``val_fraction`` (the share held out for the validation loss), ``data_dir`` (where the data is built or read;
    None: ``<out_dir>/data``). The run: ``threads`` (``torch.set_num_threads``; None: torch's default), ``seed``,
    ``progress`` (progress bars).

    A recipe's ``train`` makes its config with :meth:`of` (every argument checked, before any work) and begins the
    run with :meth:`start` (threads, seed, the recipe record).
    """

    out_dir: str | Path
    name: str = "run"
    own: dict[str, Any] = dataclasses.field(default_factory=dict)
    batch_size: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: float = 0.03
    save_every: int = 200
    resume: bool = False
    val_fraction: float = 0.05
    data_dir: str | None = None
    threads: int | None = None
    seed: int = 0
    progress: bool = True

    @classmethod
    def shared(cls) -> tuple[str, ...]:
        """The names of this config's shared knobs (a recipe's ``**shared``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("out_dir", "name", "own"))

    @classmethod
    def of(cls: type[Config], name: str, args: Mapping[str, Any], **defaults: Any) -> Config:
        """The config of recipe ``name``'s ``train(out_dir, *, <own knobs>, **shared)`` call from its ``locals()``
        (``args``): the shared knobs given, else the recipe's ``defaults``, else this class's. Every argument is
        checked (:func:`~decodekit.train.arguments.check_arguments`) before anything is loaded.

        Raises:
            ConfigError: an argument neither the recipe nor this class has (naming it and the recipe's arguments).
        """
        args, shared = dict(args), cls.shared()
        given, out_dir = dict(args.pop("shared", {})), args.pop("out_dir")
        unknown = sorted(set(given) - set(shared))
        if unknown:
            known = ", ".join(sorted({*args, *shared}))
            raise ConfigError(f"the {name} recipe has no argument {', '.join(unknown)}; its arguments: {known}")
        cfg = cls(out_dir=out_dir, name=name, own=args, **{**defaults, **given})
        check_arguments(cfg.recipe())
        return cfg

    def recipe(self) -> dict[str, Any]:
        """Every argument by name (shared and own, without ``out_dir``)."""
        return {**{key: getattr(self, key) for key in self.shared()}, **self.own}

    @property
    def data_path(self) -> Path:
        """Where the run's data is: ``data_dir``, else ``<out_dir>/data``."""
        return Path(self.data_dir) if self.data_dir else Path(self.out_dir) / "data"

    def start(self, kinds: tuple[type, ...] = SCALARS) -> dict[str, Any]:
        """Begin the run: ``threads`` (``torch.set_num_threads``) and the ``seed`` (accelerate's ``set_seed``:
        Python, NumPy and torch). Returns the recipe the run records in its files: the arguments whose values are
        of ``kinds`` (plain values, not prompts or loaded models)."""
        from accelerate.utils import set_seed

        if self.threads is not None:
            torch.set_num_threads(check_int("threads", self.threads, low=1))
        set_seed(self.seed)
        return {k: v for k, v in self.recipe().items() if isinstance(v, kinds)}


def shares(config: type[RunConfig]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a recipe's ``train(out_dir, *, <own knobs>, **shared)`` as taking ``config``'s shared knobs in
    ``shared`` (what :func:`recipe_arguments` reads)."""

    def mark(train: Callable[..., Any]) -> Callable[..., Any]:
        train.shares = config  # type: ignore[attr-defined]
        return train

    return mark


@dataclasses.dataclass
class HeadConfig(RunConfig):
    """The knobs every head-on-features recipe shares: :class:`RunConfig`'s and those below
    (``decodekit/recipes/train/<name>.yaml`` documents each); ``name`` is the file it writes
    (``<name>_<base>.safetensors``).

    Data (:mod:`decodekit.train.feature_data`): ``base`` (the target), ``chat_prompts``, ``code_prompts``,
    ``text_chunks``, ``max_prompt_tokens``, ``max_new_tokens``, ``seq_len``, ``gen_batch_size`` (defaults:
    :data:`~decodekit.train.sequences.SEQUENCES`), ``train_vocab`` (the tokens the loss scores), ``vocab_sizes`` (the
    draft vocabularies picked among). Optimisation (:func:`~decodekit.train.feature_heads.fit`): ``epochs``,
    ``time_budget_s``. Where: ``device`` (None: CUDA when there is one), ``online`` (None: features per batch on a
    GPU, cached on the CPU).
    """

    name: str = "head"
    base: Any = "smollm2-135m-instruct"
    chat_prompts: int = SEQUENCES["chat_prompts"]
    code_prompts: int = SEQUENCES["code_prompts"]
    text_chunks: int = SEQUENCES["text_chunks"]
    max_prompt_tokens: int = SEQUENCES["max_prompt_tokens"]
    max_new_tokens: int = SEQUENCES["max_new_tokens"]
    seq_len: int = SEQUENCES["seq_len"]
    gen_batch_size: int = SEQUENCES["gen_batch_size"]
    train_vocab: int = 16384
    vocab_sizes: Sequence[int] = (2048, 4096, 8192, 16384)
    epochs: int = 3
    device: str | None = None
    online: bool | None = None
    time_budget_s: float | None = None

    def fit_args(self) -> dict[str, Any]:
        """The optimisation knobs, as :func:`~decodekit.train.feature_heads.fit` takes them."""
        keys = ("epochs", "batch_size", "lr", "weight_decay", "warmup", "save_every", "resume", "seed", "progress")
        return {key: getattr(self, key) for key in keys} | {"time_budget_s": self.time_budget_s}


class Batch(NamedTuple):
    """One training batch of sequences: ``tokens [B, L]``, the target's final features ``feats [B, L, H]``,
    ``lengths [B]``, the first response position ``starts [B]`` and which of the data's sequences they are
    (``rows [B]``, on the CPU: to read what a recipe cached per sequence)."""

    tokens: torch.Tensor
    feats: torch.Tensor
    lengths: torch.Tensor
    starts: torch.Tensor
    rows: torch.Tensor | None = None


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
    check_target: Callable[[Any], Sequence[int] | None] | None = None,
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
        check_target: raises for a target the recipe cannot train on, before the data is built (an hour on a CPU);
            it may return target layers (1-based) whose states the data's features pass caches too (the recipe's
            :func:`~decodekit.train.layer_features.cached_layer_states` then reads them instead of a second pass).
        summary: more fields for the summary; ``metadata`` (fields the drafter reads from the head file) may be a
            callable of the trained head.
    """
    from decodekit.drafters.head_files import head_rows
    from decodekit.train.feature_heads import device_settings, finish_run, fit, held_out, start_run

    dev, online = device_settings(cfg.device, cfg.online, cfg.time_budget_s)

    def check(target: Any) -> Sequence[int] | None:
        if head_rows(target, torch.zeros(1, dtype=torch.long)) is None:
            raise ConfigError(
                f"the {cfg.name} recipe scores a trimmed vocabulary with rows of the target's output head, and "
                f"{type(getattr(target, 'hf', target)).__name__} has no plain linear lm_head (weight [V, H]): "
                "use a target whose output head is a linear layer"
            )
        return check_target(target) if check_target is not None else None

    recipe, out, target, data = start_run(cfg, check, device=dev, features=not online)
    rows = head_rows(target, data.vocab)[0]
    head = make_head(target, data).to(dev)

    def batch_loss(idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        return loss(head, target, rows, Batch(*data.batch(idx, dev, target), rows=idx.cpu()))

    trained, history, numbers = fit(head, batch_loss, data, out, **cfg.fit_args(), desc=f"training {title}", device=dev)
    val = held_out(target, data, online, cfg.gen_batch_size)
    if callable(summary.get("metadata")):
        summary["metadata"] = summary["metadata"](trained)
    return finish_run(
        trained, data, out, target, recipe, pick=lambda sizes: pick(trained, target, val, sizes),
        vocab_sizes=tuple(cfg.vocab_sizes), history=history, numbers=numbers, name=cfg.name, title=title,
        loss_label=loss_label, **summary,
    )  # fmt: skip


def recipe_arguments(train: Callable[..., Any]) -> set[str]:
    """The argument names a recipe's ``train`` takes: its own parameters and, for one that takes ``**shared``, the
    shared knobs of the config it is marked with (:func:`shares`; unmarked: :class:`HeadConfig`)."""
    parameters = inspect.signature(train).parameters
    shared = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    config = getattr(train, "shares", HeadConfig)
    return {n for n, p in parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD} | (
        set(config.shared()) if shared else set()
    )


__all__ = ["Batch", "HeadConfig", "RunConfig", "recipe_arguments", "run_recipe", "shares"]
