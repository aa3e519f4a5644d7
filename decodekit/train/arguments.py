"""Every training recipe's arguments, checked by name before any model, data or file work.

A recipe's ``train()`` calls :func:`check_arguments` with its arguments first, so a bad override
(``python -m decodekit train recipe=medusa decay=-1``) fails in a second, naming the key, what it must be and what it
got, instead of after the data pass (up to an hour on a CPU) or not at all (a negative loss weight trains heads to
maximise their loss). The recipes share their knobs' names and meanings, so one table (:data:`RULES`) covers them
all; a recipe's own cross-checks (``init_vocab`` without ``init``) stay in the recipe, and what needs the model
(``exit_layer`` below its layer count, ``mask_token_id`` in its vocabulary) is checked once the model is loaded,
still before any data.

:func:`file_stem` turns a ``base`` (a zoo name, a Hub id or a local directory) into the name part of the files a run
writes (``eagle_<stem>.safetensors``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from decodekit.checks import check_bool, check_choice, check_float, check_int, describe, parse_device
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.kernels.cpu import KERNELS

__all__ = ["RULES", "check_arguments", "file_stem"]

Rule = Callable[[str, Any], Any]


def _int(**bounds: Any) -> Rule:
    """A rule checking an int with :func:`~decodekit.checks.check_int`'s keywords (``low``, ``optional``, ``hint``)."""
    return lambda name, value: check_int(name, value, **bounds)


def _float(**bounds: Any) -> Rule:
    """A rule checking a float with :func:`~decodekit.checks.check_float`'s keywords (``low``, ``high``,
    ``low_open``, ``high_open``, ``optional``, ``hint``)."""
    return lambda name, value: check_float(name, value, **bounds)


def _bool(optional: bool = False) -> Rule:
    return lambda name, value: None if value is None and optional else check_bool(name, value)


def _choice(*choices: Any) -> Rule:
    return lambda name, value: check_choice(name, value, choices)


def _text(optional: bool = False, what: str = "a non-empty string") -> Rule:
    def rule(name: str, value: Any) -> None:
        if value is None and optional:
            return
        if not isinstance(value, (str, Path)) or not str(value).strip():
            raise ConfigTypeError(f"{name} must be {'None or ' if optional else ''}{what}, got {describe(value)}")

    return rule


def writable_dir(name: str, value: Any) -> None:
    """Refuse a directory (None: none) that cannot be created or written, naming the key, before any model loads
    (an OS error from deep in a run would name neither the key nor what to change)."""
    _text(optional=True, what="a directory")(name, value)
    if value is None:
        return
    path = Path(str(value)).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"{name}={value} cannot be created ({error.strerror or error}); pick another directory"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}={value} is not writable; pick another directory")


def _ints(low: int, optional: bool = False, what: str = "") -> Rule:
    """A non-empty list of integers, each at least ``low``."""

    def rule(name: str, value: Any) -> None:
        if value is None and optional:
            return
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or not value:
            raise ConfigTypeError(
                f"{name} must be {'null or ' if optional else ''}a non-empty list of integers >= {low}{what}, "
                f"got {describe(value)}"
            )
        for i, item in enumerate(value):
            check_int(f"{name}[{i}]", item, low=low, hint=what)

    return rule


def _file(name: str, value: Any) -> None:
    """None, or an existing file (a head to start from)."""
    if value is None:
        return
    _text()(name, value)
    if not Path(value).is_file():
        raise ConfigError(f"{name}={value!r}: no such file (a head file written by a training run, or null)")


def _stem(name: str, value: Any) -> None:
    """A file stem: no path separators (the run writes ``<value>.safetensors`` in its directory)."""
    _text()(name, value)
    if re.search(r"[/\\]", str(value)) or str(value) in (".", ".."):
        raise ConfigError(f"{name} names the file the run writes (<{name}>.safetensors): no '/' in it, got {value!r}")


def _model(name: str, value: Any) -> None:
    """A model :func:`~decodekit.load_model` takes: a zoo name, a Hub id or a local directory (or, from Python, a
    loaded model)."""
    from decodekit.checks import check_model_spec

    check_model_spec(name, value)
    if isinstance(value, str) and not value.strip():
        raise ConfigError(f"{name} must name a model (a zoo name, a Hub id or a local model directory), got ''")


def _data(name: str, value: Any) -> None:
    if value not in ("corpus", "self"):
        raise ConfigError(f"{name} must be 'corpus' or 'self'; got {value!r}")


def _device(name: str, value: Any) -> None:
    if value is not None:
        parse_device(name, value)


def _sequences(name: str, value: Any) -> None:
    """The dlm adapter's self-distilled data settings: a mapping over the sequence keys."""
    from decodekit.train.sequences import SEQUENCES

    if value is None:
        return
    if not isinstance(value, Mapping):
        raise ConfigTypeError(f"{name} must be null or a mapping of {', '.join(SEQUENCES)}, got {describe(value)}")
    unknown = sorted(set(value) - set(SEQUENCES))
    if unknown:
        raise ConfigError(f"{name} has unknown keys {unknown}; it takes {', '.join(SEQUENCES)}")
    for key, item in value.items():
        RULES[key](f"{name}.{key}", item)


_WEIGHT = " (a loss weight: a negative one trains to maximise that loss)"
_DECAY = " (head or step k's loss weight is decay^k; a negative one trains to maximise that loss)"
RULES: dict[str, Rule] = {
    # the model and where things go
    "base": _model,
    "target": _model,
    "draft": _model,
    "draft_kernels": lambda name, value: None if value is None else _choice(*KERNELS)(name, value),
    "device": _device,
    "online": _bool(optional=True),
    "data_dir": writable_dir,
    "init": _file,
    "init_vocab": _bool(),
    "architecture": _choice("eagle3", "fc"),
    "export": _choice(None, "speculators", "eagle"),
    "name": _stem,
    "threads": _int(low=1, optional=True),
    "seed": _int(low=0),
    "progress": _bool(),
    "resume": _bool(),
    # the data
    "chat_prompts": _int(low=0),
    "code_prompts": _int(low=0),
    "text_chunks": _int(low=0),
    "self_instruct": _int(low=0),
    "num_prompts": _int(low=1),
    "max_prompt_tokens": _int(low=1),
    "max_new_tokens": _int(low=1),
    "seq_len": _int(low=2, hint=" (tokens per sequence: a prediction needs two)"),
    "gen_batch_size": _int(low=1),
    "shard_size": _int(low=1),
    "train_chunks": _int(low=1),
    "val_chunks": _int(low=1),
    "val_fraction": _float(low=0, high=1, low_open=True, high_open=True, hint=" (the share held out)"),
    "train_vocab": _int(low=1),
    "vocab_sizes": _ints(1, what=" (draft vocabulary sizes)"),
    "mixing": _float(low=0, high=1, high_open=True, hint=" (the share of positions left unlabelled)"),
    "labels": _choice("greedy", "sampled", "both"),
    "data": _data,
    "sequences": _sequences,
    "gen_len": _int(low=1),
    "context": _int(low=1),
    "block_length": _int(low=1, optional=True),
    "mask_token_id": _int(low=0),
    "objective": _choice("diffusion", "draft"),
    "draft_length": _int(low=1),
    "draft_decay": _float(low=0, high=1, low_open=True, hint=" (slot j's loss weight is draft_decay ** j)"),
    # the head
    "num_heads": _int(low=1),
    "exit_layer": _int(low=1, hint=" (1-based)"),
    "layers": _ints(1, optional=True, what=" (1-based target layers)"),
    "width": _int(low=1),
    "blocks": _int(low=1),
    "rank": _int(low=1),
    "alpha": _float(low=0, low_open=True),
    "draft_len": _int(low=1),
    "ttt_steps": _int(low=1),
    "fuse_sequences": _int(low=1),
    "head_layers": _int(low=1),
    "block_size": _int(low=2, hint=" (the pending token and at least one mask slot)"),
    "anchors": _int(low=1, hint=" (blocks per sequence a step)"),
    "gamma": _float(low=0, low_open=True, optional=True, hint=" (slot j's loss weight is exp(-(j - 1) / gamma))"),
    "tuned_layers": _int(low=1, hint=" (the last layers whose attention projections are tuned)"),
    # the loss
    "decay": _float(low=0, high=1, low_open=True, hint=_DECAY),
    "ce_weight": _float(low=0, hint=_WEIGHT),
    "reject_weight": _float(low=0, low_open=True, hint=_WEIGHT),
    "noise": _float(low=0, hint=" (the half-width of the uniform feature noise)"),
    # the optimisation
    "epochs": _int(low=1),
    "batch_size": _int(low=1),
    "max_steps": _int(low=1, optional=True),
    "lr": _float(low=0, low_open=True),
    "weight_decay": _float(low=0),
    "warmup": _float(low=0, high=1, high_open=True, hint=" (the share of the steps that warm up)"),
    "save_every": _int(low=1),
    "eval_every": _int(low=1),
    "time_budget_s": _float(low=0, low_open=True, optional=True),
    "mixed_precision": _choice("no", "bf16", "fp16"),
}


def check_arguments(args: Mapping[str, Any], skip: Sequence[str] = ("out_dir",)) -> None:
    """Check each of a recipe's ``args`` (its ``train()`` arguments, by name) against :data:`RULES`, before anything
    is loaded or built.

    Raises:
        ConfigTypeError: a value of the wrong type (``epochs=abc``).
        ConfigError: a value out of range or not among the choices, naming the key and what it must be.
    """
    for name, value in args.items():
        rule = RULES.get(name)
        if rule is not None and name not in skip:
            rule(name, value)
    sizes, train_vocab = args.get("vocab_sizes"), args.get("train_vocab")
    if sizes and train_vocab and max(sizes) > train_vocab:  # the head is trained over train_vocab tokens at most
        raise ConfigError(
            f"vocab_sizes holds {max(sizes)}, more than train_vocab={train_vocab} (the draft vocabularies are chosen "
            "among the train_vocab most frequent tokens): lower it or raise train_vocab"
        )


def chosen_layers(layers: Sequence[int] | None, default: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """The target layers a recipe taps: ``layers`` (None: ``default``, whose coinciding layers on a shallow target
    are kept once), sorted; refuses a repeated layer the user named and any outside the target's decoder layers
    ``1 .. num_layers``."""
    given = [int(i) for i in (layers or default)]
    picked = tuple(sorted(set(given)))
    if not picked or picked[0] < 1 or picked[-1] > num_layers:
        raise ConfigError(f"layers must be decoder layers 1 .. {num_layers} of the target; got {layers or given}")
    if layers and len(picked) != len(given):  # a head's width follows how many layers it reads: a repeat is a typo
        raise ConfigError(f"layers names a layer twice ({layers}); name each layer once")
    return picked


def file_stem(base: Any) -> str:
    """The part of a run's file names that says which model it was for (``eagle_<stem>.safetensors``): a zoo name
    as it is, a local model directory's own name, a Hub id with ``--`` for ``/``; characters other than letters,
    digits, ``.``, ``_`` and ``-`` become ``-``."""
    text = str(base).strip()
    path = Path(text).expanduser()
    parts = [part for part in re.split(r"[/\\]+", text) if part]
    text = path.resolve().name if path.exists() else "--".join(parts)  # a local model: its directory's name
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return stem or "model"
