"""The data of the heads trained on the target's own hidden states (``eagle``, ``medusa``): the self-distilled
sequences (:mod:`decodekit.train.sequences`), the target's features computed on them once and cached, and the draft
vocabulary by frequency (the training loop is :mod:`decodekit.train.feature_heads`).

Each sequence is cut to ``seq_len`` tokens; the target's final (normed) hidden states ``f [N, L, H]`` are stored in
float16 in ``<data_dir>/features.pt``, which a later run (``resume=true``, or another head's recipe with
``data_dir``) reuses.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_float, check_int
from decodekit.errors import ConfigError
from decodekit.models.base import hidden_size_of
from decodekit.train.sequences import (
    DATA_KEYS,
    DATA_SOURCE,
    PLAN_FILE,
    check_data_models,
    check_data_plan,
    check_token_ids,
    load_sequences,
    pad_sequences,
)


def check_cached(data: dict[str, Any], target: Any, data_dir: Path, seq_len: int | None = None) -> None:
    """Refuse a ``features.pt`` whose features or token ids do not fit ``target`` (made with another model); warn
    when its sequences were cut at another length than this run's ``seq_len`` (they are reused as they are, as
    :func:`~decodekit.train.sequences.check_data_plan` warns for the other data knobs)."""
    hidden = hidden_size_of(target)
    feats = data.get("feats")
    if feats is not None and hidden is not None and feats.shape[-1] != hidden:
        raise ConfigError(
            f"the features cached in {data_dir / 'features.pt'} have size {feats.shape[-1]}, and this model's hidden "
            f"size is {hidden}: they were made with another model. Point data_dir at a new directory (or delete "
            "that one) to build this model's data"
        )
    tokens = data.get("tokens")
    if tokens is not None and tokens.numel():
        check_token_ids("cached features' sequences", int(tokens.max()), target, data_dir)
    if tokens is not None and seq_len is not None and tokens.shape[1] != seq_len:
        warnings.warn(
            f"the features in {data_dir / 'features.pt'} were built with seq_len={tokens.shape[1]}; this run asks "
            f"for seq_len={seq_len} and reuses them as they are: point data_dir at a new directory to build the ones "
            "asked for",
            stacklevel=2,
        )


@torch.no_grad()
def target_features(
    target: Any,
    seqs: list[list[int]],
    seq_len: int,
    batch_size: int,
    progress: bool,
    starts: list[int] | None = None,
    layers: Sequence[int] = (),
) -> dict:
    """:func:`pad_sequences` plus the target's final hidden states ``feats [N, L, H]`` (float16, on the CPU; the
    target runs on its own device); with ``layers``, also ``taps [N, L, len(layers) * H]``, their
    :func:`~decodekit.train.layer_features.layer_states`, from the same forward."""
    from decodekit.train.layer_features import final_and_layer_states, final_states

    data = pad_sequences(seqs, seq_len, starts)
    tokens, lengths = data["tokens"], data["lengths"]
    if not layers:
        feats = by_length(tokens, lengths, batch_size, final_states, target, "target features", progress)
        return {**data, "feats": feats}
    feats, taps = by_length(tokens, lengths, batch_size, lambda t, x: final_and_layer_states(t, x, layers), target,
                            "target features and layer states", progress)  # fmt: skip
    return {**data, "feats": feats, "taps": taps}


def by_length(
    tokens: torch.Tensor, lengths: torch.Tensor, batch_size: int, states: Any, target: Any, desc: str, progress: bool
) -> Any:
    """``states(target, tokens[rows, :w]) [b, w, D]`` of every row of the right-padded ``tokens [N, L]``, run on
    the target's device in batches of ``batch_size`` rows of similar length (sorted by ``lengths [N]``; ``w`` the
    batch's longest), so that little of a forward is padding; returned float16 on the CPU as ``[N, L, D]``, zero
    past each row's length. Exact for a causal target: a position never sees the padding after it. ``states`` may
    return a tuple of such tensors (several outputs of one forward): the result is then the tuple of theirs."""
    out: tuple[torch.Tensor, ...] | None = None
    single = True
    order = lengths.argsort(stable=True)
    for rows in tqdm(order.split(batch_size), desc=desc, unit="batch", disable=not progress):
        width = int(lengths[rows].max())
        parts = states(target, tokens[rows, :width].to(target.device))
        single = not isinstance(parts, tuple)
        parts = (parts,) if single else parts
        keep = (torch.arange(width)[None] < lengths[rows, None])[..., None]  # a shorter row's padding: zero
        if out is None:
            out = tuple(torch.zeros(*tokens.shape, p.shape[-1], dtype=torch.float16) for p in parts)
        for o, p in zip(out, parts, strict=True):
            o[rows, :width] = p.half().cpu() * keep
    if out is None:
        raise ValueError(f"no rows to run: tokens has shape {list(tokens.shape)}")
    return out[0] if single else out


@dataclass
class FeatureData:
    """The cached sequences: ``tokens [N, L]`` (0-padded), ``lengths [N]``, ``feats [N, L, H]`` float16 (None when
    a recipe computes them per batch on its device), ``starts [N]`` the first token a loss predicts (the response of
    a prompted sequence: EAGLE's loss mask; 0 for plain text); ``held [N]`` the validation split; ``vocab
    [V_train]`` the most frequent training tokens, most frequent first. All on the CPU. ``plan``: the data knobs
    the sequences were built with (the data directory's ``plan.json``, and ``seq_len`` as cut), which a reused
    directory may hold other than a run asked for: what a head's metadata records as its data."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    feats: torch.Tensor | None
    starts: torch.Tensor
    held: torch.Tensor
    vocab: torch.Tensor
    seconds: float
    plan: dict[str, Any] = field(default_factory=dict)

    def batch(
        self, idx: torch.Tensor, device: torch.device | str = "cpu", target: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """``tokens``, ``feats``, ``lengths`` and ``starts`` of the sequences ``idx``, on ``device``. ``feats`` are
        the cached features, or, with none cached (a recipe run ``online``) and a ``target``, its final states
        computed now (:func:`~decodekit.train.layer_features.final_states`); else None."""
        from decodekit.train.layer_features import final_states

        idx = idx.cpu()
        tokens = self.tokens[idx].to(device)
        if self.feats is not None:
            feats = self.feats[idx].to(device)
        else:
            feats = None if target is None else final_states(target, tokens)
        return tokens, feats, self.lengths[idx].to(device), self.starts[idx].to(device)

    def subset(self, rows: torch.Tensor) -> FeatureData:
        """The sequences ``rows`` (a bool mask or indices), e.g. ``data.subset(data.held)``: the validation split."""
        return FeatureData(
            self.tokens[rows],
            self.lengths[rows],
            None if self.feats is None else self.feats[rows],
            self.starts[rows],
            self.held[rows],
            self.vocab,
            self.seconds,
            self.plan,
        )

    def summary(self) -> dict[str, Any]:
        return {
            "data_source": DATA_SOURCE,
            "sequences": len(self.lengths),
            "train_tokens": int(self.lengths[~self.held].sum()),
            "val_tokens": int(self.lengths[self.held].sum()),
            "data_time_s": round(self.seconds, 1),
            "data_plan": self.plan,
        }


def prepare(
    target: Any,
    cfg: dict[str, Any],
    data_dir: Path,
    *,
    train_vocab: int,
    val_fraction: float,
    seed: int,
    progress: bool,
    features: bool = True,
    layers: Sequence[int] = (),
) -> FeatureData:
    """Build (or load from ``data_dir/features.pt``) the sequences and features, split off the validation
    sequences and count the training vocabulary. ``cfg`` holds :data:`DATA_KEYS` and ``gen_batch_size``.
    ``features=False``: the sequences only (``feats`` None, nothing cached) unless ``features.pt`` is there, for a
    recipe that runs the target on each batch (a GPU makes that cheaper than storing the features). ``layers``:
    the features' forward also caches the states of these target layers
    (:func:`~decodekit.train.layer_features.cached_layer_states` then reads them: EAGLE-3's taps) instead of a
    second pass computing them."""
    for name in DATA_KEYS + ("gen_batch_size",):
        check_int(name, cfg[name], low=0 if name.endswith(("prompts", "chunks")) else 1)
    check_int("train_vocab", train_vocab, low=1)
    check_float("val_fraction", val_fraction, low=0, high=1, low_open=True, high_open=True)
    cached, began = data_dir / "features.pt", time.perf_counter()
    models = {"base": (cfg.get("base", repr(target)), target)}
    check_data_models(data_dir, models, record=not cached.is_file() and not (data_dir / "sequences.json").is_file())
    data_dir.mkdir(parents=True, exist_ok=True)
    if cached.is_file():
        data = torch.load(cached)
        check_data_plan(data_dir, cfg, seed, record=False)  # the features are reused with the sequences they came from
        check_cached(data, target, data_dir, cfg["seq_len"])
        check_data_models(data_dir, models, record=True)  # a cache made before models.json: its shapes fit
    else:
        seqs, starts = load_sequences(target, cfg, data_dir, seed, progress)
        if features:
            data = target_features(target, seqs, cfg["seq_len"], cfg["gen_batch_size"], progress, starts, layers)
            if layers:
                from decodekit.train.layer_features import save_layer_states

                save_layer_states(data_dir, data["tokens"], layers, data.pop("taps"))
            torch.save(data, cached)
        else:
            data = {**pad_sequences(seqs, cfg["seq_len"], starts), "feats": None}
    if "starts" not in data:  # a cache written before the starts were stored: its response (0 for plain text)
        data["starts"] = torch.tensor(load_sequences(target, cfg, data_dir, seed, progress)[1][: len(data["lengths"])])
        torch.save(data, cached)
    n, width = data["tokens"].shape
    held = torch.rand(n, generator=torch.Generator().manual_seed(seed)) < val_fraction
    if held.all() or not held.any():
        raise ConfigError(f"too little data to hold out a validation split: {n} sequences; raise the data sizes")
    real = torch.arange(width)[None] < data["lengths"][:, None]
    counts = torch.bincount(data["tokens"][real & ~held[:, None]], minlength=target.vocab_size)
    vocab = counts.argsort(descending=True)[: min(train_vocab, target.vocab_size)].clone()  # a view would not save
    plan_file = data_dir / PLAN_FILE
    plan = {**(json.loads(plan_file.read_text()) if plan_file.is_file() else {}), "seq_len": width}
    data = FeatureData(
        data["tokens"], data["lengths"], data["feats"], data["starts"], held, vocab, time.perf_counter() - began, plan
    )
    data = data if cfg["text_chunks"] else data.subset(data.starts > 0)  # text_chunks=0: the responses only
    scored = data.lengths - 1 - data.starts  # predictions the loss counts, per sequence
    for split, rows in (("training", ~data.held), ("validation", data.held)):
        if int(scored[rows].clamp(min=0).sum()) == 0:
            raise ConfigError(
                f"the {split} split has no tokens the loss counts ({len(data.lengths)} sequences, "
                f"val_fraction={val_fraction}); raise chat_prompts / code_prompts / text_chunks or change val_fraction"
            )
    return data
