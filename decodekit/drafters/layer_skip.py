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

Every ``bayes_every``-th search step proposes its candidate by Bayesian optimisation instead, as SWIFT does
(every 25 steps there): a Gaussian process (Matern 5/2 kernel, noise 1e-2, normalised scores, its length scale
chosen by marginal likelihood on a grid) over every set scored so far as a 0/1 vector of the middle layers, the
upper confidence bound ``mu + 2.5 sigma`` maximised over 4096 uniform points of ``[0, 1]^D``, the best point's
top-``k`` coordinates the candidate (:func:`bayes_candidate`).

Faithfulness: SWIFT's context-scored search over skipped sets, starting from every other layer skipped at
``skip_ratio``, with its GP-UCB step (the settings of the ``bayes_opt`` package SWIFT uses, except that the
acquisition is maximised over random points only, without L-BFGS). Differences: whole decoder layers are skipped,
not attention and MLP sublayers separately; the random steps are local moves from the incumbent (SWIFT draws each
candidate uniformly); the scored set, not the continuous suggestion, is what the GP sees; a candidate at least as
good replaces the incumbent (SWIFT: strictly better); the search stops after ``search_rounds`` rounds (SWIFT: 1000
steps, 300 without improvement, or a score of 0.95) and scores the last ``window`` tokens (SWIFT: the first ones
of the current prompt). SWIFT's confidence-based early stop and top-k draft tree are not here (a length policy
with a stop rule gives the first). Lossless: only the drafts change. Models whose layers do not all attend alike
(sliding windows) are refused.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_float, check_int
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.errors import ConfigError
from decodekit.masks import chain_mask
from decodekit.models.base import LanguageModel
from decodekit.registry import register
from decodekit.spec.round import Round
from decodekit.spec.state import DecodeState


@register("drafter", "layer_skip")
class LayerSkipDrafter(EarlyExitDrafter):
    """Draft with the target, a searched set of its layers skipped (see the module docstring).

    Args:
        skip_ratio: the fraction of the layers between the first and the last that are skipped.
        window: committed tokens a candidate is scored on.
        search_rounds: rounds (over all calls on a target) with a search step.
        bayes_every: every this many search steps, the candidate comes from Bayesian optimisation over the sets
            scored so far (None: random moves only).
        seed: the search's random moves and the optimiser's sample points.
        temperature: the drafter's sampling temperature; None = the call's.
    """

    def __init__(
        self,
        skip_ratio: float = 0.45,
        window: int = 32,
        search_rounds: int = 32,
        bayes_every: int | None = 8,
        seed: int = 0,
        temperature: float | None = None,
    ) -> None:
        super().__init__(None, temperature)
        self.skip_ratio = check_float("skip_ratio", skip_ratio, low=0, high=1, low_open=True, high_open=True)
        self.window = check_int("window", window, low=2)
        self.search_rounds = check_int("search_rounds", search_rounds, low=0)
        self.bayes_every = check_int(
            "bayes_every", bayes_every, low=1, optional=True, hint=" (None = random moves only)"
        )
        self.seed = check_int("seed", seed)
        self.clear()

    def clear(self) -> None:
        """Forget the searched set (the next call starts the search again)."""
        self.skip: tuple[int, ...] = ()
        self.score = -1.0  # the current set's measured score (-1: not measured yet)
        self.searched = 0
        self.history: list[tuple[float, tuple[int, ...]]] = []  # (score, set) of every adopted set
        self.scored: list[tuple[float, tuple[int, ...]]] = []  # (score, set) of every scored candidate
        self._for: int | None = None
        self._rng = random.Random(self.seed)

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache) -> None:
        if self._for != id(target):
            if target.num_layers < 3:
                raise ConfigError(
                    f"{type(self).__name__} skips middle layers (the first and last always run), so it needs a target "
                    f"of 3 layers or more; this one has {target.num_layers}"
                )
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
        if self.score < 0:
            candidate = self.skip
        elif self.bayes_every is not None and self.searched % self.bayes_every == 0 and len(self.scored) > 1:
            candidate = bayes_candidate(self.scored, self.target.num_layers, len(self.skip), self._rng)
        else:
            candidate = self._move()
        score = float(self._score(state, candidate, width))  # the search's one host sync
        self.scored.append((score, candidate))
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
        view = self.cache.stage(width)  # staged at c .. c + W - 1, past everything committed
        mask, staged_at = chain_mask(committed, width, view.kv_len)  # [B, 1, W, S] causal over the staged window
        slots = torch.arange(view.kv_len, device=state.device)
        window = (slots >= start[:, None]) & (slots < committed[:, None])  # its committed copy (the full model's K/V)
        mask = mask & ~window[:, None, None]
        positions = staged_at - width  # the window's own positions, c - W .. c - 1
        logits = self.target.forward(tokens, positions, mask, view, skip_layers=skip).logits
        return (logits.argmax(-1) == labels).float().mean()


def bayes_candidate(
    scored: list[tuple[float, tuple[int, ...]]],
    num_layers: int,
    count: int,
    rng: random.Random,
    kappa: float = 2.5,
    points: int = 4096,
) -> tuple[int, ...]:
    """SWIFT's Bayesian-optimisation step: the ``count`` middle layers (1-based, ``2 .. num_layers - 1``) to skip
    next, from a Gaussian process fitted to every ``(score, skipped set)`` scored so far.

    The sets are 0/1 vectors over the ``D = num_layers - 2`` middle layers; the scores are normalised; the kernel is
    Matern 5/2 with noise 1e-2 and the length scale of highest marginal likelihood on a grid. The upper confidence
    bound ``mu + kappa * sigma`` is maximised over ``points`` uniform points of ``[0, 1]^D`` (drawn from ``rng``),
    and the best point's ``count`` largest coordinates are the candidate."""
    middle = num_layers - 2
    x = torch.zeros(len(scored), middle, dtype=torch.float64)
    for row, (_, skip) in enumerate(scored):
        x[row, [i - 2 for i in skip]] = 1.0
    y = torch.tensor([score for score, _ in scored], dtype=torch.float64)
    y = (y - y.mean()) / (y.std() if len(y) > 1 and y.std() > 0 else 1.0)
    noise = 1e-2 * torch.eye(len(y), dtype=torch.float64)

    def fit(scale: float) -> tuple[float, torch.Tensor, torch.Tensor]:
        chol = torch.linalg.cholesky(_matern52(x, x, scale) + noise)
        alpha = torch.cholesky_solve(y[:, None], chol)
        evidence = -0.5 * float(y @ alpha[:, 0]) - float(chol.diagonal().log().sum())
        return evidence, chol, alpha

    scale = max((0.25, 0.5, 1.0, 2.0, 4.0), key=lambda s: fit(s * middle**0.5)[0]) * middle**0.5
    _, chol, alpha = fit(scale)
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    grid = torch.rand(points, middle, generator=gen, dtype=torch.float64)
    cross = _matern52(grid, x, scale)  # [P, n]
    mean = (cross @ alpha)[:, 0]
    spread = (1.0 - torch.linalg.solve_triangular(chol, cross.T, upper=False).square().sum(0)).clamp(min=0).sqrt()
    best = grid[int((mean + kappa * spread).argmax())]
    return tuple(sorted(int(i) + 2 for i in best.topk(count).indices))


def _matern52(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``[Na, Nb]`` Matern 5/2 kernel (unit variance) between the rows of ``a`` and ``b``."""
    r = torch.cdist(a, b) * (5.0**0.5) / scale
    return (1.0 + r + r.square() / 3.0) * torch.exp(-r)
