"""Value types shared by every component: sampling parameters, verdicts, outputs (drafts: :mod:`decodekit.draft`).

Shapes: ``B`` live rows, ``N`` draft nodes, ``V`` vocabulary size, ``D`` accepted path length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_float, check_int, describe
from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget, DraftStep
from decodekit.errors import ComponentOutputError, ConfigError

if TYPE_CHECKING:
    from decodekit.metrics import SpecStats

__all__ = ["Draft", "DraftBudget", "DraftKind", "DraftStep", "GenerationOutput", "SamplingParams", "Verdict"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling applied to the target distribution (and, by default, to the drafter's).

    ``temperature == 0`` means greedy decoding. ``top_k`` / ``top_p`` are applied after temperature, in that
    order, as transformers does.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        checked = {
            "temperature": check_float("temperature", self.temperature, low=0, hint=" (0 = greedy)"),
            "top_k": check_int("top_k", self.top_k, low=1, optional=True),
            "top_p": check_float("top_p", self.top_p, low=0, high=1, low_open=True, optional=True),
        }
        for name, value in checked.items():  # numpy scalars and ints become plain floats / ints
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, eq=False)
class Verdict:
    """A verifier's decision for one round.

    Attributes:
        accepted: ``[B, D]`` accepted node indices along one root-to-leaf path, in order; ``-1`` pads.
        num_accepted: ``[B]`` length of that path (0 = every draft token rejected).
        next_token: ``[B]`` the new pending token: a correction (after a rejection) or a bonus token.
    """

    accepted: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor

    def __post_init__(self) -> None:
        """Shapes and dtypes (host metadata, no sync); :meth:`check` validates the values."""
        for name, ndim, shape in (("accepted", 2, "[B, D]"), ("num_accepted", 1, "[B]"), ("next_token", 1, "[B]")):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor) or value.ndim != ndim or value.dtype != torch.long:
                got = describe(value)
                raise ComponentOutputError(f"Verdict.{name} must be a torch.long tensor {shape}, got {got}")
        batch = self.accepted.shape[0]
        if self.num_accepted.shape[0] != batch or self.next_token.shape[0] != batch:
            raise ComponentOutputError(
                "Verdict.accepted [B, D], num_accepted [B] and next_token [B] must have the same B, got "
                f"{tuple(self.accepted.shape)}, {tuple(self.num_accepted.shape)}, {tuple(self.next_token.shape)}"
            )

    def check(self, draft: Draft, vocab_size: int, source: str = "the verifier") -> None:
        """Raise :class:`~decodekit.errors.ComponentOutputError` unless this verdict's values fit ``draft``:
        ``num_accepted`` in ``[0, draft's valid nodes]`` per row, ``accepted`` a root-to-leaf path of valid nodes
        of that length (entries after it in ``[-1, N)``), ``next_token`` in ``[0, vocab_size)``. One host sync;
        :func:`decodekit.generate` runs it every round with ``debug=True``. ``source`` names who returned it."""
        oks, messages = self.problems(draft, vocab_size)
        raise_problems(oks.tolist(), messages, source)

    def problems(self, draft: Draft, vocab_size: int) -> tuple[torch.Tensor, list[str]]:
        """What :meth:`check` checks, without reading it: ``[C]`` bool on the device (True: fine) and the message
        of each check (for a caller that reads them later, with another read)."""
        n, width = draft.num_nodes, self.accepted.shape[1]
        num, accepted, nxt = self.num_accepted, self.accepted, self.next_token
        checks = [
            (((num >= 0) & (num <= draft.num_valid)).all(), "num_accepted must be in [0, the row's valid draft nodes]"),
            (((nxt >= 0) & (nxt < vocab_size)).all(), f"next_token must be in [0, {vocab_size}) (the vocabulary)"),
            ((num <= width).all(), f"num_accepted must be <= accepted.shape[1] = {width}"),
            (((accepted >= -1) & (accepted < max(n, 1))).all(), f"accepted must hold -1 or node indices in [0, {n})"),
        ]
        if n and width:
            on_path = torch.arange(width, device=num.device) < num[:, None]
            node = accepted.clamp(0, n - 1)
            previous = torch.cat([torch.full_like(accepted[:, :1], -1), accepted[:, :-1]], 1)
            path = (accepted >= 0) & draft.valid.gather(1, node) & (draft.parents.gather(1, node) == previous)
            checks.append(((path | ~on_path).all(), "accepted must list a root-to-leaf path of valid nodes, in order"))
        return torch.stack([ok for ok, _ in checks]), [message for _, message in checks]


def raise_problems(oks: list[bool], messages: list[str], source: str) -> None:
    """Raise the first failed check of :meth:`Verdict.problems` (read: ``oks``), naming ``source``."""
    for ok, message in zip(oks, messages):
        if not ok:
            raise ComponentOutputError(f"{source} returned a malformed Verdict: {message}")


@dataclass(frozen=True)
class GenerationOutput:
    """Result of :func:`decodekit.generate`.

    Attributes:
        sequences: generated tokens per row (prompt excluded), stopped at EOS (included), at the token that
            completes a stop string (included) or at max_new_tokens. Ragged: decodekit's native form.
        finish_reasons: per row, ``"eos"``, ``"stop_string"`` or ``"length"``.
        stats: counters and timings of the run.
        prompts: each row's prompt ids, as decoded (padding stripped).
        pad_token_id: the call's pad id (:meth:`padded`'s default): its ``pad_token_id``, else the
            tokenizer's, else the first EOS id, as transformers falls back; None if there was none.
        inputs: the ``[B, T]`` batch the call was given (a tensor, an array or a tokenizer's output), padding
            included, on the CPU; None when it was given as lists or strings.
    """

    sequences: list[list[int]]
    finish_reasons: list[str]
    stats: SpecStats = field(repr=False)
    prompts: list[list[int]] = field(default_factory=list, repr=False)
    pad_token_id: int | None = field(default=None, repr=False)
    inputs: torch.Tensor | None = field(default=None, repr=False)

    def padded(self, pad_token_id: int | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[B, T + G]`` long, as ``model.generate`` returns it: the input batch as it was given (:attr:`inputs`:
        its width and padding kept; else each prompt left-padded to the longest ``T``), then each row's generated
        tokens right-padded to the longest ``G``, with ``pad_token_id`` (default: the call's :attr:`pad_token_id`)."""
        pad = self.pad_token_id if pad_token_id is None else check_int("pad_token_id", pad_token_id, low=0)
        if pad is None:
            raise ConfigError(
                "padded() needs a pad id: the call had none (no pad_token_id, tokenizer or EOS id); "
                "pass padded(pad_token_id=...)"
            )
        if len(self.prompts) != len(self.sequences):
            raise ConfigError("padded() needs the prompts, which this GenerationOutput was built without")
        generated = max(map(len, self.sequences), default=0)
        tail = torch.full((len(self.sequences), generated), pad, dtype=torch.long)
        for b, tokens in enumerate(self.sequences):
            tail[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        if self.inputs is not None:
            return torch.cat([self.inputs, tail], 1).to(device)
        width = max(map(len, self.prompts), default=0)
        head = torch.full((len(self.prompts), width), pad, dtype=torch.long)
        for b, prompt in enumerate(self.prompts):
            head[b, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        return torch.cat([head, tail], 1).to(device)
