"""Self-distilled rows for the DLM adapter (``data=self`` of :mod:`decodekit.train.dlm_adapter`): each row a clean
context and a region the loss denoises, the way the sampler meets them (a prompt, then ``G`` masked slots).

The sequences are the ones the EAGLE, Medusa and exit-head recipes train on (:mod:`decodekit.train.sequences`,
shared through ``data_dir``): SmolLM2's own greedy responses to pydoc_data questions and to ``Lib/test`` code
prompts (region = the response, its prompt the context), and plain ``Lib/test`` chunks (region = a window of ``G``
tokens drawn afresh each time a row is used, the text before it the context). No benchmark prompt set is read.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decodekit.errors import ConfigError


@dataclass
class RegionRows:
    """``seqs[i]`` token ids and ``starts[i]`` where its response starts (None: a text chunk, window drawn per use);
    ``end`` the end-of-text id a finished response's region is padded with (LLaDA's SFT pads with ``EOS``)."""

    seqs: list[list[int]]
    starts: list[int | None]
    end: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.seqs)

    def batch(
        self, idx: list[int], gen_len: int, context: int, rng: random.Random
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows ``idx`` as ``tokens [B, N]`` (0-padded), ``lengths [B]`` and region ``starts [B]``: each row is at
        most ``context`` clean tokens and a region of at most ``gen_len`` (a finished response's padded with its
        end-of-text token to ``gen_len``)."""
        rows, starts = [], []
        for i in idx:
            seq, start = self.seqs[i], self.starts[i]
            if start is None:
                start = rng.randint(1, max(1, len(seq) - gen_len))
            region = seq[start : start + gen_len]
            if region and region[-1] in self.end and self.starts[i] is not None:
                region = region + [region[-1]] * (gen_len - len(region))
            keep = max(0, start - context)
            rows.append(seq[keep:start] + region)
            starts.append(start - keep)
        lengths = torch.tensor([len(r) for r in rows])
        tokens = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = torch.tensor(row)
        return tokens, lengths, torch.tensor(starts)


def region_rows(target: Any, cfg: dict[str, Any], data_dir: Path, seed: int, progress: bool) -> RegionRows:
    """The self-distilled sequences (read from ``data_dir/sequences.json`` or built there: see
    :func:`decodekit.train.sequences.load_sequences`) as :class:`RegionRows`."""
    from decodekit.train.sequences import load_sequences

    seqs, starts = load_sequences(target, cfg, data_dir, seed, progress)
    kept = [(s, st if st else None) for s, st in zip(seqs, starts) if len(s) > max(st, 1) + 1]
    if not kept:
        raise ConfigError(f"no usable sequences in {data_dir}: raise chat_prompts / code_prompts / text_chunks")
    return RegionRows([s for s, _ in kept], [st for _, st in kept], tuple(target.eos_token_ids))
