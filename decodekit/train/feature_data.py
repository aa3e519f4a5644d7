"""The data of the heads trained on the target's own hidden states (``eagle``, ``medusa``): the self-distilled
sequences, the target's features computed once and cached, and the draft vocabulary by frequency (the training
loop is :mod:`decodekit.train.feature_heads`).

The sequences (offline, no benchmark prompts):

- chat: questions about snippets of the Python reference documentation (``pydoc_data``, through the chat template)
  with the target's own greedy responses;
- code: code-completion prompts cut from the standard library's test suite (``Lib/test``) with the target's own
  greedy continuations;
- text: plain ``Lib/test`` source chunks;
- self-instruct (recipes with a ``self_instruct`` key, e.g. ``eagle3``): chat requests the target writes itself
  (Magpie, :mod:`decodekit.train.self_instruct`) with its greedy responses.

The ``stdlib`` benchmark task mines ``Lib`` outside ``test``; HumanEval and MT-Bench are never read. Each sequence is
cut to ``seq_len`` tokens; the target's final (normed) hidden states ``f [N, L, H]`` are stored in float16 in
``<data_dir>/features.pt`` (the token sequences in ``sequences.json`` first), which a later run (``resume=true``, or
another head's recipe with ``data_dir``) reuses.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_float, check_int
from decodekit.errors import ConfigError

DATA_SOURCE = (
    "self-distilled: SmolLM2's greedy responses to questions about pydoc_data snippets and its greedy "
    "continuations of Lib/test code prompts, plus Lib/test source chunks (and, with self_instruct > 0, its greedy "
    "responses to chat requests it wrote itself, Magpie-style)"
)


def code_prompts(tokenizer: Any, num: int, max_prompt_tokens: int, seed: int = 0) -> list[list[int]]:
    """``num`` distinct code-completion prompts: up to 30 lines of a ``Lib/test`` file ending at a ``def`` line.

    One prompt per file and pass over the files (the first pass is the recipe's original prompt list, where two
    files can give the same prompt); when ``num`` asks for more prompts than there are files with a ``def``, later
    passes pick other ``def`` lines and skip prompts already taken, up to 8 passes."""
    from decodekit.train.corpus import corpus_texts

    if num <= 0:  # none asked for (the loop below would return every prompt it can make)
        return []
    rng, prompts, seen = random.Random(seed), [], set()
    files = [text.splitlines(keepends=True) for text in corpus_texts(seed)]
    files = [(lines, [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]) for lines in files]
    files = [(lines, starts) for lines, starts in files if starts]
    for later in range(8):
        for lines, starts in files:
            end = rng.choice(starts) + 1
            ids = tokenizer("".join(lines[max(0, end - 30) : end]))["input_ids"][-max_prompt_tokens:]
            if not later or tuple(ids) not in seen:
                seen.add(tuple(ids))
                prompts.append(list(ids))
            if len(prompts) == num:
                return prompts
    return prompts


def training_prompts(tokenizer: Any, cfg: dict[str, int], seed: int) -> list[list[int]]:
    """The chat prompts, then the code prompts, that the target answers."""
    from decodekit.train.acceptance_data import pydoc_prompts

    prompts = pydoc_prompts(tokenizer, cfg["chat_prompts"], cfg["max_prompt_tokens"], seed)
    return prompts + code_prompts(tokenizer, cfg["code_prompts"], cfg["max_prompt_tokens"], seed + 1)


def sequence_plan(tokenizer: Any, cfg: dict[str, int], seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """What :func:`write_sequences` needs from the corpus: the prompts the target answers (chat, then code) and the
    plain text chunks (``seq_len`` tokens each). Built on one machine, they can be answered on another (a GPU
    machine whose Python has a different standard library)."""
    from decodekit.train.corpus import corpus_texts, token_chunks

    chunks = token_chunks(tokenizer, corpus_texts(seed + 2), cfg["seq_len"], cfg["text_chunks"], tokenizer.eos_token_id)
    return training_prompts(tokenizer, cfg, seed), chunks.tolist()


def answer(
    target: Any, prompts: list[list[int]], max_new_tokens: int, batch_size: int, progress: bool
) -> list[list[int]]:
    """The target's greedy responses to ``prompts`` (token ids, up to ``max_new_tokens`` each, its end-of-text
    token kept), in order; the prompts are batched by length (``batch_size`` a batch) to waste little padding."""
    import decodekit as dk

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    responses: list[list[int]] = [[] for _ in prompts]
    bar = tqdm(total=len(prompts), desc="target responses", unit="prompt", disable=not progress)
    for i in range(0, len(order), batch_size):
        rows = order[i : i + batch_size]
        out = dk.generate(target, [prompts[r] for r in rows], max_new_tokens=max_new_tokens)
        for r, response in zip(rows, out.sequences):
            responses[r] = response
        bar.update(len(rows))
    bar.close()
    return responses


def write_sequences(
    target: Any, prompts: list[list[int]], chunks: list[list[int]], cfg: dict[str, int], data_dir: Path, progress: bool
) -> tuple[list[list[int]], list[int]]:
    """Answer ``prompts`` (:func:`answer`), then write the sequences (prompt + response, then the text ``chunks``)
    to ``data_dir/sequences.json`` and where each one's response starts (0 for a chunk) to ``starts.json``."""
    responses = answer(target, prompts, cfg["max_new_tokens"], cfg["gen_batch_size"], progress)
    seqs = [p + r for p, r in zip(prompts, responses)] + chunks
    starts = [len(p) for p in prompts] + [0] * len(chunks)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "sequences.json").write_text(json.dumps(seqs))
    (data_dir / "starts.json").write_text(json.dumps(starts))
    return seqs, starts


def load_sequences(
    target: Any, cfg: dict[str, Any], data_dir: Path, seed: int, progress: bool
) -> tuple[list[list[int]], list[int]]:
    """The self-distilled sequences (token ids: prompts with the target's greedy responses, then plain text chunks)
    and where each one's response starts, read from ``data_dir`` when a run (of any recipe sharing ``data_dir``)
    wrote them, else built and written there (the responses take the longest)."""
    data_dir = Path(data_dir)
    written = data_dir / "sequences.json"
    if not written.is_file():
        prompts, chunks = sequence_plan(target.tokenizer, cfg, seed)
        if cfg.get("self_instruct"):  # chat prompts the target writes itself (a recipe that has the key)
            from decodekit.train.self_instruct import self_instruct_prompts

            num = check_int("self_instruct", cfg["self_instruct"], low=0)
            limit = cfg["max_prompt_tokens"]
            prompts += self_instruct_prompts(target, num, 64, limit, seed, cfg["gen_batch_size"], progress)
        return write_sequences(target, prompts, chunks, cfg, data_dir, progress)
    seqs = json.loads(written.read_text())
    if (data_dir / "starts.json").is_file():
        return seqs, json.loads((data_dir / "starts.json").read_text())
    prompts = [len(p) for p in training_prompts(target.tokenizer, cfg, seed)]  # a cache written before starts.json
    return seqs, prompts + [0] * (len(seqs) - len(prompts))


def pad_sequences(seqs: list[list[int]], seq_len: int, starts: list[int] | None = None) -> dict:
    """``tokens [N, L]`` (0-padded) and ``lengths [N]`` of the sequences, each cut to ``L = seq_len`` tokens
    (sequences of fewer than 3 tokens are dropped); with ``starts`` (one per sequence: where its response starts),
    also ``starts [N]`` of the sequences kept."""
    kept = [i for i, s in enumerate(seqs) if len(s) >= 3]
    cut = [seqs[i][:seq_len] for i in kept]
    tokens = torch.zeros(len(cut), seq_len, dtype=torch.long)
    for i, s in enumerate(cut):
        tokens[i, : len(s)] = torch.tensor(s)
    data = {"tokens": tokens, "lengths": torch.tensor([len(s) for s in cut])}
    return data if starts is None else {**data, "starts": torch.tensor([starts[i] for i in kept])}


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
    [V_train]`` the most frequent training tokens, most frequent first. All on the CPU."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    feats: torch.Tensor | None
    starts: torch.Tensor
    held: torch.Tensor
    vocab: torch.Tensor
    seconds: float

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
        )

    def summary(self) -> dict[str, Any]:
        return {
            "data_source": DATA_SOURCE,
            "sequences": len(self.lengths),
            "train_tokens": int(self.lengths[~self.held].sum()),
            "val_tokens": int(self.lengths[self.held].sum()),
            "data_time_s": round(self.seconds, 1),
        }


DATA_KEYS = ("chat_prompts", "code_prompts", "text_chunks", "max_prompt_tokens", "max_new_tokens", "seq_len")
SEQUENCES = {  # the EAGLE recipe's sequences (its defaults), which other recipes share through its data_dir
    "chat_prompts": 256,
    "code_prompts": 256,
    "text_chunks": 1024,
    "max_prompt_tokens": 320,
    "max_new_tokens": 128,
    "seq_len": 384,
    "gen_batch_size": 8,
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
    data_dir.mkdir(parents=True, exist_ok=True)
    cached, began = data_dir / "features.pt", time.perf_counter()
    if cached.is_file():
        data = torch.load(cached)
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
    data = FeatureData(
        data["tokens"], data["lengths"], data["feats"], data["starts"], held, vocab, time.perf_counter() - began
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
