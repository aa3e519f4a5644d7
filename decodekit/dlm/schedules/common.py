"""What the adaptive region schedules share: per-row rounds and token ids from the tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState
from decodekit.errors import ConfigError


def next_rounds(state: DLMState, start: Callable[[], torch.Tensor]) -> Iterator[None]:
    """Rounds until no slot is masked: before each, every row's region is everything from ``start()[b]`` on (the
    schedule narrows it at the round's first step); one host read per round. The step budget of a round is that of
    a fixed block (``steps / (G / block_length)``)."""
    j = torch.arange(state.gen_length, device=state.device)
    while True:
        state.region = j[None, :] >= start()[:, None]
        if not bool((state.masked & state.region).any()):
            return
        state.block, state.block_steps, state.step = (0, state.gen_length), state.steps_per_block, 0
        yield


def resolve_ids(ids: list[int] | None, dlm: DLMModel, text: str, fix: str) -> torch.Tensor:
    """``ids`` as a tensor, or the tokenizer's ids of ``text`` when None (an error naming ``fix`` without one)."""
    if ids is None:
        if dlm.tokenizer is None:
            raise ConfigError(f"the model has no tokenizer to find the ids of {text!r}: pass {fix}")
        ids = dlm.tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ConfigError(f"no token ids for {text!r}: pass {fix}")
    return torch.tensor(ids, dtype=torch.long)
