"""The self-distilled sequences the trained heads and adapters learn from (the features computed on them:
:mod:`decodekit.train.feature_data`).

The sequences (offline, no benchmark prompts):

- chat: questions about snippets of the Python reference documentation (``pydoc_data``, through the chat template)
  with the target's own greedy responses;
- code: code-completion prompts cut from the standard library's test suite (``Lib/test``) with the target's own
  greedy continuations;
- text: plain ``Lib/test`` source chunks;
- self-instruct (recipes with a ``self_instruct`` key, e.g. ``eagle3``): chat requests the target writes itself
  (Magpie, :mod:`decodekit.train.self_instruct`) with its greedy responses.

The ``stdlib`` benchmark task mines ``Lib`` outside ``test``; HumanEval and MT-Bench are never read. The token
sequences are written to ``<data_dir>/sequences.json`` (and where each response starts to ``starts.json``), which a
later run (``resume=true``, or another recipe with ``data_dir``) reuses; ``plan.json`` records the knobs they were
built with, and a run that asks for others is warned (:func:`check_data_plan`).
"""

from __future__ import annotations

import json
import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_int
from decodekit.errors import ConfigError
from decodekit.models.base import hidden_size_of

DATA_SOURCE = (
    "self-distilled: SmolLM2's greedy responses to questions about pydoc_data snippets and its greedy "
    "continuations of Lib/test code prompts, plus Lib/test source chunks (and, with self_instruct > 0, its greedy "
    "responses to chat requests it wrote itself, Magpie-style)"
)
MODELS_FILE = "models.json"  # in a data directory: the models its data was made with (check_data_models)
PLAN_FILE = "plan.json"  # in a data directory: the knobs its sequences were built with (check_data_plan)
PLAN_KEYS = ("chat_prompts", "code_prompts", "text_chunks", "self_instruct", "max_prompt_tokens", "max_new_tokens")


def model_identity(model: Any) -> dict[str, Any]:
    """What tells models apart in a data directory's :data:`MODELS_FILE`: hidden size, vocabulary and the
    :func:`~decodekit.drafters.head_files.fingerprint` of the embeddings."""
    from decodekit.drafters.head_files import fingerprint

    model = _adapter(model)
    hidden = hidden_size_of(model)
    return {"hidden_size": hidden, "vocab_size": int(model.vocab_size), "fingerprint": round(fingerprint(model), 4)}


def _adapter(model: Any) -> Any:
    """``model`` as a decodekit adapter (a transformers model passed as is gets its adapter)."""
    if hasattr(model, "embed") and hasattr(model, "vocab_size"):
        return model
    from decodekit.models import load_model

    return load_model(model)


def _same(saved: dict[str, Any], mine: dict[str, Any]) -> bool:
    if (saved.get("hidden_size"), saved.get("vocab_size")) != (mine["hidden_size"], mine["vocab_size"]):
        return False
    theirs = saved.get("fingerprint")
    return theirs is None or abs(theirs - mine["fingerprint"]) <= 1e-3 * max(1.0, abs(mine["fingerprint"]))


def _describe(entry: dict[str, Any]) -> str:
    return f"{entry.get('name', '?')!r} (hidden size {entry.get('hidden_size')}, vocabulary {entry.get('vocab_size')})"


def check_data_models(data_dir: Path, models: dict[str, tuple[Any, Any]], record: bool) -> None:
    """Refuse the data in ``data_dir`` when it was made with other models than ``models`` (role -> (name, model):
    ``{"base": ("smollm2-135m-instruct", target)}``), as its :data:`MODELS_FILE` records them: the responses, features
    and states of another model train a head for a model it is not (or fail deep inside with a shape error). With
    ``record``, roles it does not record yet are written there (a new data directory, or one whose data was
    checked against these models).

    Raises:
        ConfigError: naming the directory, the model the data was made with and this run's.
    """
    path = Path(data_dir) / MODELS_FILE
    saved = json.loads(path.read_text()) if path.is_file() else {}
    mine = {role: {"name": str(name), **model_identity(model)} for role, (name, model) in models.items()}
    for role, entry in mine.items():
        if role in saved and not _same(saved[role], entry):
            raise ConfigError(
                f"the data in {data_dir} was made with {_describe(saved[role])} as its {role}, and this run's {role} "
                f"is {_describe(entry)}: a head trained on it would learn another model. Point data_dir at a new "
                f"directory (or delete that one) to build this model's data"
            )
    if record and any(role not in saved for role in mine):
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**mine, **saved}, indent=2))


def check_data_plan(data_dir: Path, cfg: dict[str, Any], seed: int, record: bool) -> None:
    """Warn when the sequences in ``data_dir`` were built with other data knobs than this run's ``cfg`` and
    ``seed`` (as :data:`PLAN_FILE` records them; a directory without one is not checked): they are reused as they
    are, so the run trains on those, not on what it asked for. ``text_chunks=0`` on data with chunks is no
    difference (such a run takes the responses only). With ``record``, this run's knobs are written there (a new
    data directory)."""
    path = Path(data_dir) / PLAN_FILE
    mine = {key: cfg[key] for key in PLAN_KEYS if key in cfg} | {"seed": seed}
    if record:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(mine, indent=2))
        return
    saved = json.loads(path.read_text()) if path.is_file() else {}
    differ = [
        key
        for key, value in mine.items()
        if key in saved and saved[key] != value and not (key == "text_chunks" and not value)
    ]
    if differ:
        asked = ", ".join(f"{key}={mine[key]}" for key in differ)
        built = ", ".join(f"{key}={saved[key]}" for key in differ)
        warnings.warn(
            f"the sequences in {data_dir} were built with {built}; this run asks for {asked} and reuses them as "
            "they are: point data_dir at a new directory to build the ones asked for",
            stacklevel=2,
        )


def check_token_ids(what: str, largest: int, model: Any, data_dir: Path) -> None:
    """Refuse cached token ids (``largest``, the largest of them) that ``model``'s vocabulary does not have: data
    made with another model before :func:`check_data_models` recorded it."""
    model = _adapter(model)
    if largest >= model.vocab_size:
        raise ConfigError(
            f"the {what} in {data_dir} hold token id {largest}, beyond this model's vocabulary of {model.vocab_size}: "
            "they were made with another model. Point data_dir at a new directory (or delete that one) to build "
            "this model's data"
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
    files: list[tuple[list[str], list[int]]] = []  # (lines, def-line indices): split as the first pass reaches them

    def first_pass() -> Iterator[tuple[list[str], list[int]]]:
        for text in corpus_texts(seed):
            lines = text.splitlines(keepends=True)
            starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
            if starts:
                files.append((lines, starts))
                yield lines, starts

    for later in range(8):
        for lines, starts in files if later else first_pass():
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
    models = {"base": (cfg.get("base", repr(target)), target)}
    check_data_models(data_dir, models, record=not written.is_file())  # a new directory: recorded before the build
    check_data_plan(data_dir, cfg, seed, record=not written.is_file())
    if not written.is_file():
        prompts, chunks = sequence_plan(target.tokenizer, cfg, seed)
        if cfg.get("self_instruct"):  # chat prompts the target writes itself (a recipe that has the key)
            from decodekit.train.self_instruct import self_instruct_prompts

            num = check_int("self_instruct", cfg["self_instruct"], low=0)
            limit = cfg["max_prompt_tokens"]
            prompts += self_instruct_prompts(target, num, 64, limit, seed, cfg["gen_batch_size"], progress)
        return write_sequences(target, prompts, chunks, cfg, data_dir, progress)
    seqs = json.loads(written.read_text())
    check_token_ids("sequences", max((max(s) for s in seqs if s), default=-1), target, data_dir)
    check_data_models(data_dir, models, record=True)  # data made before models.json: checked as far as it can be
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


__all__ = [
    "DATA_KEYS", "DATA_SOURCE", "MODELS_FILE", "SEQUENCES", "answer", "check_data_models", "check_token_ids",
    "code_prompts", "load_sequences", "pad_sequences", "sequence_plan", "training_prompts", "write_sequences",
]  # fmt: skip
