"""DEL (Entezari Zarch, Gao, Jiang, Annavaram; arXiv 2504.05598): early-exit self-speculation whose exit layer and
draft length follow the acceptance each layer would have had in the current context.

Every verification forward already computes every layer's hidden states of the tokens it commits. For each
candidate exit layer ``l`` the target's own head on them, ``argmax head(norm(h_l[t]))``, is the token an ``l``-layer
draft would have proposed after position ``t`` (DEL's "shadow tokens"); comparing it with the committed token
``x_{t+1}`` gives a per-layer acceptance estimate ``a_l``, kept as a decayed running ratio (the context's recent
tokens count most). Every ``every`` rounds the drafter picks the exit layer and draft length ``g`` maximising DEL's
tokens per layer,

    TPL(l, g) = E[tokens per round] / (l * g + N),   E = (1 - a_l^(g + 1)) / (1 - a_l),

``N`` the target's layers (``g = 0``, plain decoding, scores ``1 / N``: when no layer pays, it stops drafting and
keeps measuring from the tokens it commits). Until the first choice it drafts ``initial_draft`` tokens from the
deepest candidate. Drafting itself is :class:`EarlyExitDrafter`'s, in the target's cache.

Faithfulness: DEL's shadow-token estimate, TPL objective and joint choice of exit layer and length. Differences:
the estimate is argmax agreement at every temperature (a proxy for the acceptance rate when sampling), only
``probes`` candidate layers are scored per round (rotating; scoring a layer is one pass of the output head over
the round's committed tokens, which on a CPU is not free), the choice is batch-wide and refreshed every ``every``
rounds (one host sync each time, none in between), and DEL's confidence-based early stop of a draft is left to a
length policy with a stop rule (``ConfidenceStop``). DEL runs on LayerSkip checkpoints trained for early exit; on
a model that was not, shallow layers rarely agree with the last. Lossless: only the drafts change.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_float, check_int
from decodekit.draft import Draft
from decodekit.draft.budget import DraftBudget
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel
from decodekit.policies.analytic import expected_tokens
from decodekit.registry import register
from decodekit.spec.round import Round
from decodekit.spec.state import DecodeState


def tokens_per_layer(
    accept: Sequence[float] | torch.Tensor, max_draft: int, exit_layers: Sequence[int], num_layers: int
) -> torch.Tensor:
    """DEL's objective for every candidate and length: ``[L, max_draft + 1]`` float64, entry ``(i, g)`` the tokens
    a round commits in expectation (i.i.d. acceptance ``accept[i]`` per drafted token, plus the target's own token)
    per layer computed (``exit_layers[i]`` per drafted token, ``num_layers`` to verify); column 0 is plain decoding,
    ``1 / num_layers``."""
    lengths = torch.arange(max_draft + 1, dtype=torch.float64)
    layers = torch.as_tensor(exit_layers, dtype=torch.float64)
    return expected_tokens(torch.as_tensor(accept), max_draft) / (layers[:, None] * lengths + num_layers)


@register("drafter", "dynamic_exit")
class DynamicExitDrafter(EarlyExitDrafter):
    """Early exit with the exit layer and draft length chosen online from per-layer shadow-token acceptance.

    Args:
        exit_layers: the candidate exit layers (each ``1 <= l < num_layers`` of the target, checked in ``begin``).
        max_draft: the longest draft it picks (the length policy's budget caps it too).
        probes: candidate layers scored per round (rotating); None = all of them every round.
        every: rounds between choices (each choice reads the estimates: one host sync).
        decay: weight of the past per round in the running acceptance ratios, in ``[0, 1)``.
        initial_draft: the draft length before the first choice (from the deepest candidate); 0 = plain decoding.
        temperature: the drafter's sampling temperature; None = the call's.
    """

    target_parts = frozenset({"layers", "norm", "head"})  # the shadow tokens: head(norm(h_l))

    def __init__(
        self,
        exit_layers: Sequence[int],
        max_draft: int = 6,
        probes: int | None = 2,
        every: int = 4,
        decay: float = 0.9,
        initial_draft: int = 1,
        temperature: float | None = None,
    ) -> None:
        if isinstance(exit_layers, (int, str)) or not exit_layers:
            raise ConfigError(f"exit_layers must be a non-empty list of layer indices, got {exit_layers!r}")
        layers = sorted({int(check_int("exit_layers[i]", layer, low=1)) for layer in exit_layers})  # type: ignore[arg-type]
        super().__init__(layers[-1], temperature)
        self.hidden_layers = tuple(layers)  # the verification forward keeps these layers' outputs (Round.layer_hidden)
        self.max_draft = check_int("max_draft", max_draft, low=1)
        self.probes = check_int("probes", probes, low=1, optional=True, hint=" (None = every candidate each round)")
        self.every = check_int("every", every, low=1)
        self.decay = check_float("decay", decay, low=0, high=1, high_open=True)
        self.initial_draft = check_int("initial_draft", initial_draft, low=0)
        self.history: list[tuple[int, int]] = []  # (exit layer, draft length) chosen, one entry per choice

    def check_model(self, target: LanguageModel) -> None:
        """Refuse candidates at or past the target's last layer, by the argument's name (before the loop reads
        them as the layers whose states the verification keeps)."""
        top = target.num_layers
        self.check_depth(top)
        if self.hidden_layers[-1] >= top:
            raise ConfigError(
                f"exit_layers={list(self.hidden_layers)} must all be below the target's {top} layers (drafting with "
                f"all of them costs a full target step per token); pick from 1..{top - 1}"
            )

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache) -> None:
        super().begin(state, target, cache)  # checks the deepest candidate against the target
        n = len(self.hidden_layers)
        self.hits = torch.zeros(n, device=state.device)
        self.seen = torch.zeros(n, device=state.device)
        self.draft_len, self.rounds, self.next_probe = self.initial_draft, 0, 0

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        if self.draft_len == 0:
            return Draft.empty(state.batch_size, state.device)
        return super().propose(state, budget.capped_at(self.draft_len))

    def observe(self, state: DecodeState, round: Round) -> None:
        """Score the probed layers' shadow tokens against the tokens this round committed; choose every ``every``
        rounds."""
        n = len(self.hidden_layers)
        count = n if self.probes is None else min(self.probes, n)
        probed = [(self.next_probe + i) % n for i in range(count)]
        self.next_probe = (self.next_probe + count) % n
        width = round.tokens.shape[1]
        valid = torch.arange(width, device=round.tokens.device) < round.counts[:, None]  # [B, M]
        hidden = torch.stack([round.layer_hidden[self.hidden_layers[i]][:, :width] for i in probed])  # [P, B, M, H]
        with torch.no_grad():
            shadow = self.target.head(self.target.norm(hidden)).argmax(-1)  # [P, B, M]
        hits = ((shadow == round.tokens) & valid).sum((1, 2)).to(self.hits.dtype)
        index = torch.tensor(probed, device=self.hits.device)
        self.hits[index] = self.decay * self.hits[index] + hits
        self.seen[index] = self.decay * self.seen[index] + valid.sum().to(self.seen.dtype)
        self.rounds += 1
        if self.rounds % self.every == 0:
            self._choose()

    def _choose(self) -> None:
        """Pick the exit layer and draft length with the best tokens per layer (one host sync); plain decoding wins
        ties, then the shallower layer and the shorter draft."""
        accept = (self.hits / self.seen.clamp(min=1e-6)).cpu()
        score = tokens_per_layer(accept, self.max_draft, self.hidden_layers, self.target.num_layers)
        best = int(score.argmax())  # the first maximum, in (layer, length) order: column 0 is plain decoding
        row, self.draft_len = divmod(best, self.max_draft + 1)
        if self.draft_len:
            self.layers = self.hidden_layers[row]
        self.history.append((self.layers, self.draft_len))
