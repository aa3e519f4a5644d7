"""SWIFT (Xia et al., ICLR'25, arXiv 2410.06916): training-free self-speculation that drafts with the target
itself, some of its layers skipped, the skipped set chosen on the fly by a search scored on the context.

Drafting is :class:`~decodekit.drafters.EarlyExitDrafter`'s, in the target's own KV cache, with
``skip_layers`` instead of an exit layer: the skipped layers write nothing, and verification overwrites what the
run layers staged. The search: for the first ``search_rounds`` rounds, after each round one candidate set (the
current one with a skipped layer and a run layer swapped at random, first and last layers always run) is scored
by one forward of the skipped model over the last ``window`` committed tokens (staged past the committed length,
attending to the committed prefix before the window), as the fraction of them whose argmax is the next committed
token; a candidate at least as good as the current set replaces it. Each search round costs that forward and one
host sync; after the search, nothing. The set found is kept for later calls on the same target (``clear()``).

Faithfulness: SWIFT's context-scored search over skipped sets, starting from every other layer skipped at
``skip_ratio``. Differences: whole decoder layers are skipped, not attention and MLP sublayers separately; the
search is random local moves only (SWIFT adds Bayesian optimisation every 25 steps) and stops after
``search_rounds`` rounds (SWIFT: 1000 steps, 300 without improvement, or a score of 0.95); the incumbent keeps the
score it was measured with; SWIFT's confidence-based early stop and top-k draft tree are not here (a length
policy with a stop rule gives the first). Lossless: only the drafts change. Models whose layers do not all attend
alike (sliding windows) are refused.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_float, check_int
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.masks import chain_mask
from decodekit.models.base import LanguageModel
from decodekit.registry import register
from decodekit.round import Round
from decodekit.state import DecodeState


@register("drafter", "layer_skip")
class LayerSkipDrafter(EarlyExitDrafter):
    """Draft with the target, a searched set of its layers skipped (see the module docstring).

    Args:
        skip_ratio: the fraction of the layers between the first and the last that are skipped.
        window: committed tokens a candidate is scored on.
        search_rounds: rounds (over all calls on a target) with a search step.
        seed: the search's random moves.
        temperature: the drafter's sampling temperature; None = the call's.
    """

    def __init__(
        self,
        skip_ratio: float = 0.45,
        window: int = 32,
        search_rounds: int = 32,
        seed: int = 0,
        temperature: float | None = None,
    ) -> None:
        super().__init__(None, temperature)
        self.skip_ratio = check_float("skip_ratio", skip_ratio, low=0, high=1, low_open=True, high_open=True)
        self.window = check_int("window", window, low=2)
        self.search_rounds = check_int("search_rounds", search_rounds, low=0)
        self.seed = check_int("seed", seed)
        self.clear()

    def clear(self) -> None:
        """Forget the searched set (the next call starts the search again)."""
        self.skip: tuple[int, ...] = ()
        self.score = -1.0  # the current set's measured score (-1: not measured yet)
        self.searched = 0
        self.history: list[tuple[float, tuple[int, ...]]] = []  # (score, set) of every adopted set
        self._for: int | None = None
        self._rng = random.Random(self.seed)

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache) -> None:
        if self._for != id(target):
            self.clear()
            middle = list(range(2, target.num_layers))  # 1-based; the first and last layers always run
            count = min(len(middle), max(1, round(self.skip_ratio * len(middle))))
            self.skip = tuple(sorted((middle[::2] + middle[1::2])[:count]))  # every other layer first
            self._for = id(target)
        self.target, self.cache = target, cache

    def layer_args(self) -> dict[str, Any]:
        return {"skip_layers": self.skip}

    def observe(self, state: DecodeState, round: Round) -> None:
        """One search step while the search lasts: score a candidate (or, first, the current set) on the context."""
        if self.searched >= self.search_rounds:
            return
        width = min(self.window, min(state.host_lengths) - 1)
        if width < 2:
            return
        self.searched += 1
        candidate = self.skip if self.score < 0 else self._move()
        score = float(self._score(state, candidate, width))  # the search's one host sync
        if score >= self.score:
            self.skip, self.score = candidate, score
            self.history.append((score, candidate))

    def _move(self) -> tuple[int, ...]:
        """The current set with one skipped layer run and one run layer skipped instead."""
        kept = [i for i in range(2, self.target.num_layers) if i not in self.skip]
        if not kept or not self.skip:
            return self.skip
        out, into = self._rng.choice(self.skip), self._rng.choice(kept)
        return tuple(sorted({*self.skip, into} - {out}))

    @torch.no_grad()
    def _score(self, state: DecodeState, skip: tuple[int, ...], width: int) -> torch.Tensor:
        """Argmax agreement of the skipped model with the last ``width`` committed tokens' successors (a scalar)."""
        committed = state.lengths - 1  # [B] tokens in the target's cache (the pending one is not)
        start = committed - width
        steps = torch.arange(width, device=state.device)
        tokens = state.tokens.gather(1, start[:, None] + steps)  # [B, W] positions c - W .. c - 1
        labels = state.tokens.gather(1, start[:, None] + 1 + steps)  # their successors (the last: the pending token)
        kv_len = self.cache.stage(width)  # staged at c .. c + W - 1, past everything committed
        mask, staged_at = chain_mask(committed, width, kv_len)  # [B, 1, W, S] causal over the staged window
        slots = torch.arange(kv_len, device=state.device)
        window = (slots >= start[:, None]) & (slots < committed[:, None])  # its committed copy (the full model's K/V)
        mask = mask & ~window[:, None, None]
        positions = staged_at - width  # the window's own positions, c - W .. c - 1
        logits = self.target.forward(tokens, positions, mask, self.cache, skip_layers=skip).logits
        return (logits.argmax(-1) == labels).float().mean()
