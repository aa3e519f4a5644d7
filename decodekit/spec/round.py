"""The round record: what components observe after each round of :func:`decodekit.generate`.

Components declare what they need beyond the draft and the verdict in a ``needs`` set; the loop computes only the
union of what was asked for, so plain decoding pays nothing. The vocabulary (:data:`NEEDS`):

* ``"target_probs"``: :attr:`Round.target_probs`, the target's probability of every drafted node.
* ``"kl"``: :attr:`Round.kl`, KL(target || drafter) at every drafted node where the drafter reported its
  distribution (``Draft.draft_probs``, or ``q`` of a sampled draft).
* ``"hidden"``: :attr:`Round.hidden`, the target's final hidden states of the tokens the round committed to its
  cache; a component may also list layer indices in ``hidden_layers`` to get :attr:`Round.layer_hidden`.
* ``"logits"``: :attr:`Round.logits`, the verification logits of every scored position (a reference to the
  tensor the verifier read: no copy, no compute), for drafters that learn from the target (Token Recycling).
* ``"timings"``: :attr:`Round.draft_time_s` / :attr:`Round.verify_time_s` of this round. On CUDA this costs one
  synchronisation per round; without it the loop's own timings are read a round late from CUDA events.

Two more names ask for a hook's extra argument (declared, never read off the hook's signature; checked once when
the call resolves its components, :func:`check_hook_needs`):

* ``"prefill"`` (a drafter with ``shares_target``): ``begin(state, target, cache, prefill=...)`` gets the
  prefill's :class:`~decodekit.models.base.ModelOutput` (with ``"hidden"``: ``last_hidden [B, T, H]`` of every
  prompt token, and the ``hidden_layers`` asked for); only then does the prefill keep hidden states.
* ``"host_rows"``: ``select_rows(rows, host_rows=...)`` also gets the kept rows as Python ints (no host sync to
  read them; a draft model's cache then moves only the rows that change place).

The probabilities are the *warped* ones the verifier uses (temperature, top-k, top-p); at temperature 0, where the
warped distribution is a point mass, they come from the plain softmax (temperature 1) instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from decodekit.draft import Draft
from decodekit.errors import ConfigError
from decodekit.interfaces import shares_target
from decodekit.models.base import ModelOutput
from decodekit.sampling import probs_from_logits
from decodekit.types import SamplingParams, Verdict

NEEDS = frozenset({"target_probs", "kl", "hidden", "logits", "timings", "prefill", "host_rows"})
"""Everything a component may ask for in ``needs``."""

_FLOOR = 1e-30  # drafter probabilities are floored here, so a KL stays finite where the drafter gave 0


@dataclass(frozen=True, eq=False)
class Round:
    """One round, for ``observe(state, round)``. ``B`` rows (those live during the round), ``N`` draft nodes,
    ``M`` committed tokens, ``D`` accepted path length, ``H`` hidden size.

    Attributes:
        index: 0-based round number within the call.
        draft: what the drafter proposed (after the loop trimmed unused columns).
        verdict: what the verifier decided.
        tokens: ``[B, M]`` committed tokens: the accepted path, then the new pending token.
        counts: ``[B]`` how many of ``tokens`` each row committed (cut at EOS and at its length limit).
        target_probs: ``[B, N]`` float32, the target's probability of each node's token after its parent
            (``needs`` "target_probs" or "kl"); 0 for invalid nodes.
        kl: ``[B, N]`` float32 KL(target || drafter) at each node's parent (``needs`` "kl"); NaN where the
            drafter reported no distribution, and for invalid nodes.
        logits: ``[B, N + 1, V]`` the verification logits (``needs`` "logits"): row 0 follows the previous pending
            token, row ``i + 1`` follows draft node ``i`` (invalid nodes' rows are meaningless). They are the
            target's raw logits after the call's logits processors (``repetition_penalty``, ...; none by default),
            before temperature / top-k / top-p: exactly what the verifier was given. Do not modify them in place.
        hidden: ``[B, 1 + D, H]`` the target's final hidden states (the output head's input) of the tokens this
            round added to its cache: the previous pending token, then the accepted path; row ``b`` uses the first
            ``verdict.num_accepted[b] + 1`` (``needs`` "hidden").
        layer_hidden: layer index -> ``[B, 1 + D, H]``, the same tokens' outputs of the requested layers.
        draft_time_s, verify_time_s: this round's phase times (``needs`` "timings"), else None.
    """

    index: int
    draft: Draft
    verdict: Verdict
    tokens: torch.Tensor
    counts: torch.Tensor
    target_probs: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    layer_hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    draft_time_s: float | None = None
    verify_time_s: float | None = None


def check_needs(needs: Iterable[str], owner: object) -> frozenset[str]:
    """``needs`` as a frozenset, refusing names outside :data:`NEEDS` (a typo would silently get nothing)."""
    if isinstance(needs, str):
        raise ConfigError(f"{type(owner).__name__}.needs must be a set of names, e.g. frozenset({{{needs!r}}})")
    needs = frozenset(needs)
    unknown = sorted(needs - NEEDS)
    if unknown:
        raise ConfigError(
            f"{type(owner).__name__}.needs asks for {', '.join(map(repr, unknown))}; "
            f"known names: {', '.join(sorted(NEEDS))}"
        )
    return needs


def needs_of(component: object) -> frozenset[str]:
    """A component's declared ``needs`` (empty when it declares none)."""
    return frozenset(getattr(component, "needs", ()) or ())


def check_hook_needs(component: object, role: str) -> None:
    """Refuse a declared hook argument the component's hook cannot take, when the call starts: ``"prefill"`` on a
    component that is not a target-sharing drafter, or whose ``begin`` has no ``prefill`` keyword; ``"host_rows"``
    on one whose ``select_rows`` has no ``host_rows`` keyword (a subclass that overrode the hook without it)."""
    import inspect

    needs, name = needs_of(component), type(component).__name__
    if "prefill" in needs and not (role == "drafter" and shares_target(component)):
        raise ConfigError(
            f"{name}.needs has 'prefill', which only a drafter with shares_target = True gets (in begin(state, "
            "target, cache, prefill=)); drop it, or set shares_target = True on the drafter"
        )
    for need, hook in (("prefill", "begin"), ("host_rows", "select_rows")):
        method = getattr(component, hook, None)
        if need not in needs or method is None:
            continue
        try:
            takes = need in inspect.signature(method).parameters
        except (TypeError, ValueError):  # a builtin: nothing to check
            continue
        if not takes:
            raise ConfigError(
                f"{name}.needs has {need!r} but {name}.{hook} takes no {need}= keyword; add it to {hook} "
                f"(e.g. {need}=None), or drop {need!r} from needs"
            )


def node_probs(logits: torch.Tensor, draft: Draft, sampling: SamplingParams) -> torch.Tensor:
    """``[B, N, V]`` float32 target distribution at each node's parent, from the scoring logits ``[B, N + 1, V]``."""
    rows = logits.gather(1, (draft.parents + 1)[..., None].expand(-1, -1, logits.shape[-1]))
    return rows.float().softmax(-1) if sampling.greedy else probs_from_logits(rows, sampling)


def round_extras(
    needs: frozenset[str],
    hidden_layers: tuple[int, ...],
    draft: Draft,
    out: ModelOutput,
    verdict: Verdict,
    sampling: SamplingParams,
) -> dict[str, object]:
    """The optional :class:`Round` fields that ``needs`` asks for (device ops only, no host sync)."""
    extras: dict[str, object] = {}
    if needs & {"target_probs", "kl"}:
        p = node_probs(out.logits, draft, sampling)
        extras["target_probs"] = p.gather(-1, draft.tokens.where(draft.valid, 0)[..., None])[..., 0] * draft.valid
        if "kl" in needs:
            extras["kl"] = _kl(p, draft)
    if "logits" in needs:
        extras["logits"] = out.logits
    if "hidden" in needs or hidden_layers:
        kept = kept_inputs(verdict)
        if out.last_hidden is not None:
            extras["hidden"] = _rows(out.last_hidden, kept)
        extras["layer_hidden"] = {i: _rows(h, kept) for i, h in out.hidden.items()}
    return extras


def kept_inputs(verdict: Verdict) -> torch.Tensor:
    """``[B, 1 + D]`` the scored inputs a round keeps: input 0 (the pending token), then each accepted node ``i``
    (input ``i + 1``); entries past ``num_accepted + 1`` point at input 0 (callers mask them by counts)."""
    return torch.cat([torch.zeros_like(verdict.num_accepted)[:, None], verdict.accepted + 1], 1)


def _kl(p: torch.Tensor, draft: Draft) -> torch.Tensor:
    q = draft.reported_probs()
    if q is None:
        return torch.full(draft.tokens.shape, float("nan"), device=p.device)
    q = q.float().clamp(min=_FLOOR)
    kl = (torch.xlogy(p, p) - p * q.log()).sum(-1)
    return kl.masked_fill(~draft.valid, float("nan"))


def _rows(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``hidden [B, N, H]`` at ``index [B, M]`` (clamped into range; callers mask by counts)."""
    return hidden.gather(1, index.clamp(0, hidden.shape[1] - 1)[..., None].expand(-1, -1, hidden.shape[-1]))
