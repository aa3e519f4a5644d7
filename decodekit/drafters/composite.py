"""A drafter made of other drafters: every hook the loop calls passed on to each part that declares it, and what the
loop reads of a drafter the union of the parts'. :class:`~decodekit.drafters.FallbackDrafter` is one; an ensemble of
your own is another (subclass, call :meth:`Composite.compose` in ``__init__``, write ``propose``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from decodekit.errors import ConfigError
from decodekit.interfaces import (
    ChecksModel,
    Clears,
    HasVocab,
    Needs,
    Observes,
    ReadsTargetParts,
    SelectsRows,
    hidden_layers_of,
)
from decodekit.interfaces import shares_target as part_shares_target
from decodekit.spec.hooks import begin_component, select_component_rows
from decodekit.spec.state import DecodeState

if TYPE_CHECKING:
    from decodekit.cache import KVCache
    from decodekit.interfaces import Drafter
    from decodekit.models.base import LanguageModel, ModelOutput
    from decodekit.spec.round import Round


class Composite:
    """The hooks of a drafter whose ``parts`` draft for it. Each part sees every hook it declares (``begin``,
    ``observe``, ``select_rows``, ``check_model``, ``clear``) whichever part drafted a round, so each keeps its own
    state. A part that drafts from the target (``shares_target``) gets the target, its cache and the prefill's
    output in ``begin``; ``needs`` (plus ``"host_rows"``, which :meth:`select_rows` passes on), ``hidden_layers``
    and ``shares_target`` are the union of the parts'; ``vocab_size`` is theirs where any declares one."""

    parts: tuple[Drafter, ...]

    def compose(self, parts: Sequence[Drafter], name: str) -> None:
        """Set ``parts`` and the declarations the loop reads from them; ``name`` for messages.

        Raises:
            ConfigError: the parts declare different vocabularies.
        """
        self.parts = tuple(parts)
        self.shares_target = any(part_shares_target(p) for p in self.parts)
        self.needs = frozenset({"host_rows"}).union(*(p.needs for p in self.parts if isinstance(p, Needs)))
        self.hidden_layers = tuple(sorted({int(i) for p in self.parts for i in hidden_layers_of(p)}))
        self.target_parts = frozenset().union(*(p.target_parts for p in self.parts if isinstance(p, ReadsTargetParts)))
        sizes = {int(p.vocab_size) for p in self.parts if isinstance(p, HasVocab)}
        if len(sizes) > 1:
            raise ConfigError(f"{name}'s drafters have different vocabularies: {sorted(sizes)} tokens")
        if sizes:  # checked against the target's by generate(); model-free drafters take any vocabulary
            self.vocab_size = sizes.pop()

    def check_model(self, target: LanguageModel) -> None:
        """Each part's own refusal of ``target`` (an EAGLE-3 head trained for another), before any forward."""
        for part in self.parts:
            if isinstance(part, ChecksModel):
                part.check_model(target)

    def begin(
        self,
        state: DecodeState,
        target: LanguageModel | None = None,
        cache: KVCache | None = None,
        prefill: ModelOutput | None = None,
    ) -> None:
        """Begin every part; one that shares the target gets it, its cache and the prefill's output (the loop
        passes them when any part shares the target)."""
        for part in self.parts:
            begin_component(part, state, target, cache, prefill)  # type: ignore[arg-type]

    def observe(self, state: DecodeState, round: Round) -> None:
        for part in self.parts:
            if isinstance(part, Observes):
                part.observe(state, round)

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        for part in self.parts:
            if isinstance(part, SelectsRows):
                select_component_rows(part, rows, host_rows)

    def clear(self) -> None:
        """Clear what each part keeps across calls (a suffix cache, a successor matrix)."""
        for part in self.parts:
            if isinstance(part, Clears):
                part.clear()


__all__ = ["Composite"]
