"""Checks of a call's components before anything runs (their Protocols, a verifier's ``accepts`` and the draft
kind, ``hidden_layers``) and, after a failure deep inside torch, the component whose output explains it."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

import torch

from decodekit.checks import check_instance, describe, is_int
from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.errors import (
    ComponentOutputError,
    ConfigTypeError,
    IncompatibleDraftError,
    NoProgressError,
)
from decodekit.interfaces import (
    Drafter,
    LengthPolicy,
    ReadsTargetParts,
    Verifier,
    hidden_layers_of,
)
from decodekit.models.base import TARGET_PARTS, LanguageModel, missing_parts, num_layers_of
from decodekit.spec.round import needs_of
from decodekit.spec.state import DecodeState
from decodekit.types import Verdict

if TYPE_CHECKING:
    from decodekit.spec.components import Components

WHAT = {
    "drafter": (Drafter, "a propose(state, budget) method"),
    "verifier": (Verifier, "accepts, lossless and a verify(draft, logits, sampling, generator) method"),
    "policy": (LengthPolicy, "a plan(state) method"),
}


def check_components(drafter: Any, verifier: Any, policy: Any) -> None:
    """Refuse a component that does not implement its Protocol, or a class passed instead of an instance (None
    is fine: the default)."""
    for name, value in (("drafter", drafter), ("verifier", verifier), ("policy", policy)):
        protocol, what = WHAT[name]
        check_instance(name, value, protocol, what=what)


def check_accepts(verifier: Any) -> None:
    """Refuse a verifier whose ``accepts`` is not a collection of :class:`DraftKind` (a string would be searched
    for substrings: ``"sampled"`` in ``"sampled_without_replacement"``)."""
    accepts = verifier.accepts
    if (
        isinstance(accepts, (str, bytes))
        or not isinstance(accepts, Collection)
        or not all(isinstance(k, DraftKind) for k in accepts)
    ):
        raise ConfigTypeError(
            f"{type(verifier).__name__}.accepts must be a set of DraftKind (e.g. frozenset({{DraftKind.DETERMINISTIC}})"
            f" or frozenset(DraftKind)), got {describe(accepts)}"
        )


def check_hidden_layers(component: Any, model: LanguageModel) -> tuple[int, ...]:
    """``component.hidden_layers`` (the target layers whose hidden states it asks for; none without it), refused
    unless it is a collection of layer indices within the target's layers (0 = embeddings, ``L`` = the last)."""
    layers = hidden_layers_of(component)
    count = num_layers_of(model)  # None: a model without a layer list, only the types are checked
    bad = isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable)
    bad = bad or not all(is_int(i) and (count is None or 0 <= i <= count) for i in layers)
    if bad:
        within = "" if count is None else f" in [0, {count}]"
        raise ConfigTypeError(
            f"{type(component).__name__}.hidden_layers must be a collection of layer indices{within} (0 = the "
            f"embeddings), got {describe(layers)}"
        )
    return tuple(int(i) for i in layers)


def check_target_parts(drafter: Any, model: LanguageModel) -> None:
    """Refuse ``model`` when it leaves a part ``drafter`` declares in ``target_parts`` unimplemented (a hand-written
    :class:`~decodekit.models.base.LanguageModel`), naming the drafter, the members to implement and what they give.

    Raises:
        IncompatibleDraftError: a declared part missing (before any forward).
        ConfigError: ``target_parts`` names a part that does not exist.
    """
    if not isinstance(drafter, ReadsTargetParts):
        return
    owner = type(drafter).__name__
    missing = missing_parts(model, drafter.target_parts, owner)
    if missing:
        members = "; ".join(f"LanguageModel.{TARGET_PARTS[p][0]} ({TARGET_PARTS[p][1]})" for p in missing)
        raise IncompatibleDraftError(
            f"{owner} calls the target's {', '.join(sorted(drafter.target_parts))}, which {type(model).__name__} "
            f"leaves unimplemented: {members}. Implement them on the adapter, or use a drafter that needs only the "
            "target's tokens (ngram, suffix, recycling, model)"
        )


def check_hidden_output(
    model: LanguageModel,
    out: Any,
    shape: tuple[int, int],
    return_hidden: bool,
    hidden_layers: tuple[int, ...],
    components: list[Any],
) -> None:
    """Refuse a forward's output that lacks the hidden states this call asked of ``model`` (a hand-written adapter
    ignoring ``return_hidden`` or ``hidden_layers``): ``out.last_hidden`` with ``return_hidden`` and
    ``out.hidden[i]`` for each of ``hidden_layers``, each ``[B, N, H]`` for a forward of ``shape = (B, N)`` tokens.
    Those of the call's ``components`` that asked for hidden states are named. Metadata only: no host sync."""
    wanted = [("last_hidden", out.last_hidden, "return_hidden=True")] if return_hidden else []
    layers = out.hidden if isinstance(out.hidden, dict) else {}
    wanted += [(f"hidden[{i}]", layers.get(i), f"hidden_layers including {i}") for i in hidden_layers]
    for name, value, asked in wanted:
        if not isinstance(value, torch.Tensor) or value.dim() != 3 or tuple(value.shape[:2]) != tuple(shape):
            got = "nothing" if value is None else describe(value)
            askers = [c for c in components if "hidden" in needs_of(c) or hidden_layers_of(c)]
            who = ", ".join(sorted({type(c).__name__ for c in askers}))
            raise ComponentOutputError(
                f"{type(model).__name__}.forward returned {got} as ModelOutput.{name} when asked with {asked}, "
                f"which {who} reads: return the [B, N, H] hidden states of the forward's {tuple(shape)} tokens "
                "(ModelOutput(logits, hidden={layer: states}, last_hidden=the output head's input))"
            )


def check_kind(verifier: Verifier, kind: DraftKind, drafter: Any) -> None:
    """The one draft-kind check: refuse a verifier that cannot verify ``kind`` drafts without bias."""
    if kind not in verifier.accepts:
        raise IncompatibleDraftError(
            f"{type(verifier).__name__} cannot verify {kind.value} drafts from {type(drafter).__name__} "
            f"(it accepts: {', '.join(sorted(k.value for k in verifier.accepts))}); choose a verifier that does"
        )


def explain_failure(
    components: Components,
    error: BaseException,
    state: DecodeState,
    draft: Draft | None = None,
    verdict: Verdict | None = None,
    round_index: int | None = None,
) -> None:
    """After ``error`` surfaced deep inside torch (the target's forward, a draft model's, the cache's
    bookkeeping), raise a :class:`ComponentOutputError` naming the component whose output explains it: a pending
    token outside the vocabulary (the last verifier's ``next_token``), a draft token outside it or a malformed
    draft (the drafter), a malformed verdict (the verifier). Their values are checked on the first rounds only,
    so a later round's are found here, on the error path (host syncs). Returns when none explains it (the
    caller re-raises ``error``), or when the device cannot be read any more (a CUDA assert)."""
    where = "" if round_index is None else f" on round {round_index}"
    failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    debug = (
        "outputs' values are checked on the first rounds only; run with debug=True to check every round's "
        "budget, draft and verdict where it is made"
    )
    vocab = components.vocab_size
    try:
        checks = [((state.pending < 0) | (state.pending >= vocab)).any()]
        if draft is not None and draft.num_nodes:
            checks.append((draft.valid & ((draft.tokens < 0) | (draft.tokens >= vocab))).any())
        bad = torch.stack(checks).tolist()
    except Exception:  # the device is unusable: nothing more to learn from it
        return
    if bad[0]:
        raise ComponentOutputError(
            f"{type(components.current_verifier).__name__}.verify returned a next_token outside the vocabulary "
            f"[0, {vocab}){where}; it became the pending token the model failed on ({failed}). {debug}"
        ) from error
    drafter = type(components.drafter).__name__
    if len(bad) > 1 and bad[1]:
        raise ComponentOutputError(
            f"{drafter}.propose returned draft token ids outside the target's vocabulary [0, {vocab}){where}; the "
            f"target's forward failed on them ({failed}). {debug}"
        ) from error
    try:
        if draft is not None and draft.num_nodes:
            anything = DraftBudget.uniform(state.lengths, draft.num_nodes)  # the structure only, not the budget
            draft.check(state.batch_size, vocab, anything, f"{drafter}.propose")
        if verdict is not None and draft is not None:
            verdict.check(draft, vocab, f"{type(components.current_verifier).__name__}.verify")
    except ComponentOutputError as found:
        raise ComponentOutputError(f"{found}{where} ({failed}). {debug}") from error
    except Exception:
        return


STAMPED = ("state.tokens", "state.lengths", "state.prompt_lengths", "state.max_lengths", "state.pending")
STAMPED_DRAFT = ("draft.tokens", "draft.parents", "draft.valid")


def check_untouched(
    before: tuple[tuple[int, int], ...], state: DecodeState, who: Any, method: str, draft: Draft | None = None
) -> None:
    """Refuse a component's call that wrote the loop's tensors in place or replaced them (``before``:
    :meth:`~decodekit.spec.state.DecodeState.stamp` taken before it, with ``draft``'s): the loop would go on from a
    state it did not make, silently wrong or stuck (host ints, no sync)."""
    names = STAMPED if draft is None else STAMPED + STAMPED_DRAFT
    changed = [name for name, old, new in zip(names, before, state.stamp(draft)) if old != new]
    if changed:
        raise ComponentOutputError(
            f"{type(who).__name__}.{method} changed {', '.join(changed)} in place (or replaced it); components read "
            "the loop's tensors and must not write them: work on a copy (e.g. state.lengths.clone())"
        )


def check_progress(verifier: Any, before: list[int], after: list[int], verdict: Verdict) -> None:
    """Refuse a round that committed nothing to a live row (host lengths only: no sync); the loop would never end.
    Every valid verdict commits ``num_accepted + 1 >= 1`` tokens to each row, so where the verifier accepted that
    many, something else rewrote the loop's state in place."""
    stuck = [b for b, (old, new) in enumerate(zip(before, after)) if new <= old]
    if not stuck:
        return
    num = verdict.num_accepted.tolist()  # raising anyway: read what the verifier said
    said = [num[b] for b in stuck[:8]]
    name = f"{type(verifier).__name__}.verify"
    if min(said) >= 0:
        raise NoProgressError(
            f"round committed no token to live row(s) {stuck[:8]} although {name} accepted {said} (+ 1 each): a "
            "component changed the loop's state in place (a drafter, policy, verifier or observer must not write "
            "state.tokens, state.lengths or state.pending; copy them first)"
        )
    raise NoProgressError(
        f"round committed no token to live row(s) {stuck[:8]}: {name} returned num_accepted={said} (each row must "
        "get num_accepted + 1 >= 1 tokens); run with debug=True to validate every verdict"
    )
