"""Entropy stops (SVIP; AdaEDL): end a chain draft once the drafter's entropy says the next token would likely fail."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_bool, check_float, check_int
from decodekit.errors import ConfigError
from decodekit.registry import preset, register
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget, DraftStep

if TYPE_CHECKING:
    from decodekit.spec.round import Round


class EntropyRule:
    """One round's stop rule (:attr:`DraftBudget.stop`) for :class:`EntropyStop`; no host sync."""

    def __init__(self, policy: EntropyStop) -> None:
        self.policy = policy

    def __call__(self, step: DraftStep) -> torch.Tensor:
        """``[B]`` bool: stop after ``step.tokens`` (kept) where ``1 - sqrt(scale * H) < threshold``, ``H`` the
        entropy (nats) of the distribution the token was drawn from, once ``min_len`` tokens are drafted."""
        if step.probs is None:
            raise ConfigError(
                "entropy_stop needs the drafter's full distribution at each step (DraftStep.probs), which this "
                "drafter does not give; use a draft model (drafter=model) or another policy"
            )
        p = self.policy
        entropy = torch.special.entr(step.probs.float()).sum(-1)  # [B], nats
        bound = 1 - torch.sqrt(p.scale * entropy)  # a lower bound on the token's acceptance probability
        threshold = p.lam if p.lam is not None and p.lam.shape == bound.shape else p.threshold
        return (bound < threshold) & (step.index + 1 >= p.min_len)


@register("policy", "entropy_stop")
class EntropyStop:
    """Stop drafting when the drafter's entropy is high (SVIP; AdaEDL).

    After drafting ``x_j`` from the draft distribution ``q_j``, a row stops (``x_j`` kept) once
    ``1 - sqrt(scale * H(q_j)) < threshold``: the left side is a lower-bound estimate of ``x_j``'s acceptance
    probability, so drafting stops where the next position would likely fail. With the defaults
    (``scale = 0.15``, ``threshold = 0.7``) this is SVIP's rule ``sqrt(0.15 H) > 0.3``, i.e. ``H > 0.6`` nats. At most
    ``max_len`` tokens per round (SVIP caps at 40).

    ``adaptive=True`` is AdaEDL: each row's threshold is steered so that its acceptance rate approaches ``target``.
    After a round that drafted ``n`` tokens and accepted ``a``: ``r <- 0.5 r + 0.5 a / n`` (``r`` starts at
    ``target``); ``lambda' = lambda + step`` if ``r < target`` (stop sooner), ``lambda - step`` if ``r >= target`` and
    the round stopped short of ``max_len`` (draft longer), else ``lambda``; then ``lambda <- 0.9 lambda + 0.1
    lambda'`` (so about 0.001 a round). AdaEDL's settings: ``scale = 0.2``, ``target = 0.9``, ``step = 0.01``;
    the start ``threshold`` is free (the paper sweeps 0.3-0.9; recipe ``policy=adaedl`` uses 0.5).

    Faithfulness: SVIP's rule and constants are those of its authors' code (``vanilla-sd/eval_specbench.py``; there
    the entropy is always that of the temperature-1 distribution, here that of the distribution the token was drawn
    from: the same at temperature 1 and in greedy decoding). AdaEDL's stop criterion and ``scale`` agree across
    several secondary accounts; **the threshold update follows a public reimplementation of the paper's Algorithm 1,
    not the paper's text** (which could not be read), so treat its constants as a reconstruction.

    Works with step-wise chain drafters that report their distribution (``ModelDrafter``); drafters that draft no
    step-wise chain (n-gram, trees) are bounded by ``max_len`` only. In greedy decoding the entropy is that of the
    drafter's temperature-1 distribution.

    Args:
        scale: ``gamma_e`` in ``1 - sqrt(gamma_e H)``.
        threshold: the stop threshold ``lambda`` (AdaEDL: its start value).
        adaptive: adapt ``lambda`` per row (AdaEDL).
        target, step: AdaEDL's target acceptance rate and threshold step.
        min_len, max_len: the bounds of a round's draft (both included).
    """

    def __init__(
        self,
        scale: float = 0.15,
        threshold: float = 0.7,
        adaptive: bool = False,
        target: float = 0.9,
        step: float = 0.01,
        min_len: int = 1,
        max_len: int = 20,
    ) -> None:
        self.scale = check_float("scale", scale, low=0.0, low_open=True, hint=" (gamma_e in 1 - sqrt(gamma_e H))")
        self.threshold = check_float("threshold", threshold, low=0.0, high=1.0, hint=" (lambda, a probability)")
        self.adaptive = check_bool("adaptive", adaptive)
        self.target = check_float("target", target, low=0.0, high=1.0, hint=" (an acceptance rate)")
        self.step = check_float("step", step, low=0.0, high=1.0)
        self.min_len = check_int("min_len", min_len, low=1)
        self.max_len = check_int("max_len", max_len, low=1)
        if self.min_len > self.max_len:
            raise ConfigError(f"min_len={self.min_len} exceeds max_len={self.max_len}; lower min_len")
        self.rate: torch.Tensor | None = None  # [B] smoothed acceptance rate (adaptive only)
        self.lam: torch.Tensor | None = None  # [B] per-row threshold (adaptive only)

    def begin(self, state: DecodeState) -> None:
        if self.adaptive:
            self.rate = torch.full(state.lengths.shape, self.target, device=state.device)
            self.lam = torch.full(state.lengths.shape, self.threshold, device=state.device)

    def plan(self, state: DecodeState) -> DraftBudget:
        if self.adaptive and (self.lam is None or self.lam.shape[0] != state.batch_size):
            self.begin(state)
        return DraftBudget.uniform(state.lengths, self.max_len, stop=EntropyRule(self))

    def observe(self, state: DecodeState, round: Round) -> None:
        if not self.adaptive:
            return
        drafted, accepted = round.draft.num_valid, round.verdict.num_accepted
        drew = drafted > 0
        rate = 0.5 * self.rate + 0.5 * (accepted / drafted.clamp(min=1)).float()
        self.rate = torch.where(drew, rate, self.rate)
        low, short = self.rate < self.target, accepted < self.max_len
        moved = torch.where(low, self.lam + self.step, torch.where(short, self.lam - self.step, self.lam))
        self.lam = torch.where(drew, 0.9 * self.lam + 0.1 * moved, self.lam).clamp(0.0, 1.0)

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.rate is not None and self.lam is not None:
            self.rate, self.lam = self.rate[rows], self.lam[rows]


AdaEDL = preset(
    "policy", "adaedl", EntropyStop, public="AdaEDL", module=__name__, scale=0.2, threshold=0.5, adaptive=True,
    doc="""AdaEDL: :class:`EntropyStop` with ``adaptive=True`` and AdaEDL's settings (``scale = 0.2``, start threshold
    0.5, target acceptance rate 0.9); the rule, its update and how faithful they are: :class:`EntropyStop`. A preset
    (:func:`decodekit.registry.preset`): it builds an ``EntropyStop``.""",
)  # fmt: skip
