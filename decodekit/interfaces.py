"""The Protocols a component implements. A notebook class satisfies them without inheriting anything.

Required: :class:`Drafter` (``propose``), :class:`Verifier` (``accepts``, ``lossless``, ``verify``) and
:class:`LengthPolicy` (``plan``). Any of the three may also implement the optional hooks below; the loop checks
each with ``isinstance`` once per call and calls what is there:

=====================  ==========================================================================================
:class:`Begins`        ``begin(state)``: once per call, after prefill (reset per-row state, prefill a draft model)
:class:`SharesTarget`  drafters with ``shares_target = True`` get ``begin(state, target, cache)`` instead: the
                       target adapter and its :class:`~decodekit.cache.KVCache` (self-speculation, feature heads);
                       with ``needs`` "prefill" also ``prefill=`` the prefill's output
:class:`Observes`      ``observe(state, round)``: after every round, once the state holds the new tokens
:class:`SelectsRows`   ``select_rows(rows)``: rows finished; keep only ``rows [B']`` of any per-row state
                       (with ``needs`` "host_rows" also ``host_rows=``, the same rows as Python ints)
:class:`Needs`         ``needs``: what the :class:`~decodekit.spec.round.Round` should carry (see its module)
:class:`ReadsLayers`   ``hidden_layers``: the target layers whose hidden states it reads (EAGLE-3's taps)
:class:`DeclaresKind`  ``draft_kind(sampling)`` (drafters): checked against the verifier before anything runs
:class:`HasVocab`      ``vocab_size`` (drafters): checked against the target's
:class:`ChecksSampling` ``check(sampling)`` (verifiers): raise ``ConfigError`` for unsupported settings
:class:`HasDefaultPolicy` ``default_policy()`` (drafters): the length policy a call without one uses (else
                       ``FixedLength(4)``): a lookup drafter that wants long drafts says so here
:class:`ChecksModel`   ``check_model(target)`` (drafters): when the call starts, before any forward: raise
                       ``ConfigError`` for a target it cannot draft for (a head trained for another target)
:class:`ReadsTargetParts` ``target_parts`` (drafters): the target's optional parts it calls (``embed``, ``norm``,
                       ``head``, ``layers``), checked against the target before ``check_model``
:class:`Clears`        ``clear()`` (drafters): forget what is kept across calls; called by you (and by composite
                       drafters for their parts), never by the loop
=====================  ==========================================================================================

A component that defines a method one letter off a hook name (``obsrve``) gets a warning when the call starts
(:func:`warn_near_hooks`, for both wings). The diffusion sampler's roles and hooks are declared in
:mod:`decodekit.dlm.interfaces` (``UnmaskRule``, ``DLMCache``, ``DLMDraft`` and ``RegionSchedule`` are also
importable from here).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.sampling import Generator
from decodekit.types import SamplingParams, Verdict

if TYPE_CHECKING:
    from decodekit.cache import KVCache
    from decodekit.models.base import LanguageModel
    from decodekit.spec.round import Round
    from decodekit.spec.state import DecodeState


@runtime_checkable
class Drafter(Protocol):
    """Proposes a token tree (a chain is a tree) continuing each row's pending token."""

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        """Return a :class:`Draft` within ``budget`` (row ``b``: at most ``nodes[b]`` nodes, depth ``depth[b]``)."""
        ...


@runtime_checkable
class Verifier(Protocol):
    """Decides which path of a draft the target accepts, and the next pending token.

    Attributes:
        accepts: the draft kinds it verifies without bias.
        lossless: whether the output distribution equals the target's (greedy: equals greedy decoding).
    """

    accepts: frozenset[DraftKind]
    lossless: bool

    def verify(
        self,
        draft: Draft,
        logits: torch.Tensor,
        sampling: SamplingParams,
        generator: Generator,
    ) -> Verdict:
        """``logits [B, N + 1, V]``: row 0 follows the pending token, row ``i + 1`` follows draft node ``i``.

        ``generator`` is a ``torch.Generator``, None (torch's global one) or per-row generators (``seed`` given one
        int per row): draw through :func:`decodekit.sampling.sample` / :func:`~decodekit.sampling.uniform` with a
        ``key`` so each row's draws stay its own."""
        ...


@runtime_checkable
class LengthPolicy(Protocol):
    """Decides how much each row drafts this round."""

    def plan(self, state: DecodeState) -> DraftBudget:
        """Return the per-row budget (the loop caps its depth by what each row may still generate)."""
        ...


# ------------------------------------------------------------------------------------------ optional hooks
@runtime_checkable
class Begins(Protocol):
    def begin(self, state: DecodeState) -> None:
        """Called once per call after prefill, with the state holding the first pending token."""
        ...


@runtime_checkable
class SharesTarget(Protocol):
    """A drafter that drafts with the target itself (its first layers, heads on its hidden states)."""

    shares_target: bool

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache) -> None:
        """Receives the target adapter and its cache, committed up to (not including) each pending token.

        The drafter may stage draft tokens into this cache past each row's committed length
        (``cache.stage(n, offset=j)``); the verification forward stages at offset 0 and overwrites them.
        A drafter whose ``needs`` has ``"prefill"`` gets ``begin(state, target, cache, prefill=...)``: the
        prefill's :class:`~decodekit.models.base.ModelOutput` (with ``needs`` "hidden": ``last_hidden [B, T, H]``
        of every prompt token, and the ``hidden_layers`` asked for).
        """
        ...


@runtime_checkable
class Observes(Protocol):
    def observe(self, state: DecodeState, round: Round) -> None:
        """Called after every round, once ``state`` holds the round's committed tokens."""
        ...


@runtime_checkable
class SelectsRows(Protocol):
    def select_rows(self, rows: torch.Tensor) -> None:
        """Rows finished: keep only ``rows [B']`` (indices into the current batch) of any per-row state. A
        component whose ``needs`` has ``"host_rows"`` gets ``select_rows(rows, host_rows=...)``: the same indices as
        Python ints (no host sync needed to read them; ``ModelDrafter`` hands them to its cache)."""
        ...


@runtime_checkable
class Needs(Protocol):
    needs: frozenset[str]


@runtime_checkable
class ReadsLayers(Protocol):
    """A component that asks for the target's hidden states of these layers (0 = the embeddings, ``L`` = the
    last): the prefill's ``hidden`` and :attr:`Round.layer_hidden <decodekit.spec.round.Round.layer_hidden>`."""

    hidden_layers: Sequence[int]


def shares_target(component: object) -> bool:
    """Whether ``component`` declared ``shares_target = True`` (:class:`SharesTarget`)."""
    return bool(isinstance(component, SharesTarget) and component.shares_target)


def hidden_layers_of(component: object) -> Sequence[int]:
    """``component``'s declared ``hidden_layers`` (:class:`ReadsLayers`; none when it declares none)."""
    return component.hidden_layers if isinstance(component, ReadsLayers) else ()


@runtime_checkable
class ReadsTargetParts(Protocol):
    """A drafter that calls optional parts of the target's :class:`~decodekit.models.base.LanguageModel` beyond
    ``forward``: names of :data:`~decodekit.models.base.TARGET_PARTS` (``"embed"``, ``"norm"``, ``"head"``,
    ``"layers"``), checked against the target when the call starts (a hand-written adapter without them is refused
    there, naming what to implement)."""

    target_parts: frozenset[str]


@runtime_checkable
class DeclaresKind(Protocol):
    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        """The kind of every draft this drafter will produce under ``sampling``."""
        ...


@runtime_checkable
class HasVocab(Protocol):
    vocab_size: int


@runtime_checkable
class ChecksModel(Protocol):
    def check_model(self, target: LanguageModel) -> None:
        """Raise :class:`~decodekit.errors.ConfigError` if this drafter cannot draft for ``target`` (called when a
        call starts, before any forward)."""
        ...


@runtime_checkable
class Clears(Protocol):
    def clear(self) -> None:
        """Forget what this drafter keeps across calls (a suffix cache, a successor matrix). Called by you, and by
        a composite drafter for its parts (:class:`~decodekit.drafters.composite.Composite`), never by the loop."""
        ...


@runtime_checkable
class HasDefaultPolicy(Protocol):
    def default_policy(self) -> LengthPolicy:
        """The length policy :func:`decodekit.generate` uses with this drafter when the call names none."""
        ...


@runtime_checkable
class ChecksSampling(Protocol):
    def check(self, sampling: SamplingParams) -> None:
        """Raise :class:`~decodekit.errors.ConfigError` if this verifier cannot honour ``sampling``."""
        ...


_COMMON = ("begin", "observe", "select_rows", "needs", "hidden_layers")
HOOKS = {
    "drafter": (
        "propose",
        *_COMMON,
        "shares_target",
        "draft_kind",
        "vocab_size",
        "default_policy",
        "check_model",
        "target_parts",
    ),
    "verifier": ("verify", "accepts", "lossless", "check", *_COMMON),
    "policy": ("plan", *_COMMON),
}
"""Every method or attribute name the loop looks for, per role (typo warnings compare against these)."""


# ------------------------------------------------------------------------------------------ typo warnings
_WARNED: set[tuple[type, str]] = set()


def warn_near_hooks(component: object, hooks: tuple[str, ...]) -> None:
    """Warn (once per class and name) about public names one edit away from a hook (of ``hooks``, the names the
    loop looks for on a component of this role) that the component lacks."""
    cls = type(component)
    names = {n for n in dir(cls) if not n.startswith("_")} | {
        n for n in getattr(component, "__dict__", {}) if not n.startswith("_")
    }
    for name in sorted(names - set(hooks)):
        for hook in hooks:
            if hook not in names and _one_edit(name, hook) and (cls, name) not in _WARNED:
                _WARNED.add((cls, name))
                warnings.warn(
                    f"{cls.__name__}.{name} looks like the hook {hook!r}, which {cls.__name__} does not define; "
                    f"decodekit will not call it. Rename it to {hook!r} if that was meant.",
                    stacklevel=4,
                )


def _one_edit(a: str, b: str) -> bool:
    """True when ``a`` becomes ``b`` by one insertion, deletion, substitution or swap of adjacent letters."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        return len(diff) == 1 or (
            len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
        )
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((i for i, (x, y) in enumerate(zip(short, long)) if x != y), len(short))
    return short[i:] == long[i + 1 :]


_DLM_ROLES = ("UnmaskRule", "DLMCache", "DLMDraft", "RegionSchedule")


def __getattr__(name: str) -> object:
    """The diffusion roles' Protocols, declared in :mod:`decodekit.dlm.interfaces` (imported when first asked for:
    this ground-floor module imports nothing of the diffusion wing)."""
    if name in _DLM_ROLES:
        from decodekit.dlm import interfaces

        return getattr(interfaces, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
