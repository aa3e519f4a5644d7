"""The offline training corpus of the recipes: the Python standard library's own test suite (``Lib/test``) and the
``pydoc_data`` topics, shipped with CPython. Neither is a benchmark prompt source: the ``stdlib`` benchmark task mines
``Lib`` outside ``test`` and ``pydoc_data``; HumanEval and MT-Bench are never read."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path
from typing import Any

import torch

from decodekit.errors import ConfigError


def corpus_texts(seed: int = 0) -> list[str]:
    """The training texts: every ``Lib/test`` source file and each ``pydoc_data`` topic, in a seeded order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted((root / "test").rglob("*.py")):
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    try:
        from pydoc_data.topics import topics

        texts += [topics[k] for k in sorted(topics)]
    except ImportError:
        pass
    if not texts:
        raise ConfigError(
            f"no training text: this Python has neither {root / 'test'} nor pydoc_data (some distributions strip "
            "them; install the full standard library, e.g. the python3-test package)"
        )
    random.Random(seed).shuffle(texts)
    return texts


def token_chunks(tokenizer: Any, texts: list[str], seq_len: int, max_chunks: int, eos: int) -> torch.Tensor:
    """``[N, seq_len]`` long: the texts tokenized, joined by ``eos``, cut into chunks (``N <= max_chunks``)."""
    ids: list[int] = []
    need = max_chunks * seq_len
    for text in texts:
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        if len(ids) >= need:
            break
    n = min(len(ids) // seq_len, max_chunks)
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)
