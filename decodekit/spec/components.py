"""The drafter, verifier and policy of one :func:`decodekit.generate` call, checked together and with their
optional hooks resolved once (see :mod:`decodekit.interfaces`)."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_instance, describe, is_int
from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.errors import (
    ComponentOutputError,
    ConfigTypeError,
    ContextLengthError,
    IncompatibleDraftError,
    VocabMismatchError,
)
from decodekit.interfaces import (
    HOOKS,
    ChecksModel,
    ChecksSampling,
    DeclaresKind,
    Drafter,
    HasVocab,
    LengthPolicy,
    Needs,
    Observes,
    SelectsRows,
    Verifier,
    shares_target,
    warn_near_hooks,
)
from decodekit.models.base import LanguageModel, ModelOutput
from decodekit.spec.component_checks import (
    WHAT,
    check_accepts,
    check_hidden_layers,
    check_hidden_output,
    check_kind,
    check_target_parts,
)
from decodekit.spec.hooks import begin_component, check_signatures, select_component_rows
from decodekit.spec.round import Round, check_hook_needs, check_needs, needs_of
from decodekit.spec.state import DecodeState
from decodekit.types import SamplingParams, Verdict, raise_problems

LATER_VERDICTS = 16  # non-empty rounds after the first whose verdicts are checked on the device, read at the end


class Components:
    """Validates the components of a call before any compute and dispatches their hooks.

    Attributes:
        needs: the union of what the components asked the round record to carry.
        hidden_layers: the union of the target layers whose hidden states they asked for.
    """

    def __init__(
        self,
        model: LanguageModel,
        drafter: Drafter | None,
        verifier: Verifier,
        policy: LengthPolicy,
        sampling: SamplingParams,
        tree_verifier: Verifier | None = None,
    ) -> None:
        # their Protocols were checked before the model loaded (generate: check_components); the defaults are filled
        # in (spec.parts.resolve_parts): a verifier is required here
        check_instance("verifier", verifier, Verifier, what=WHAT["verifier"][1], optional=False)
        self.drafter, self.verifier, self.policy = drafter, verifier, policy
        roles = {"drafter": drafter, "verifier": verifier, "policy": policy if drafter is not None else None}
        self.all = [c for c in roles.values() if c is not None]
        for role, component in roles.items():
            if component is not None:
                warn_near_hooks(component, HOOKS[role])
                check_hook_needs(component, role)  # a declared hook argument its hook takes
                check_signatures(component, role)  # every method takes what the loop will pass
        for v in (verifier, tree_verifier):
            if v is not None:
                check_accepts(v)
        if isinstance(verifier, ChecksSampling):
            verifier.check(sampling)
        self.declared_kind = self._check_drafter(model, sampling)
        self.needs = frozenset().union(*(check_needs(c.needs, c) for c in self.all if isinstance(c, Needs)))
        self.hidden_layers = tuple(sorted({i for c in self.all for i in check_hidden_layers(c, model)}))
        self.observers = [c for c in self.all if isinstance(c, Observes)]
        self.row_selectors = [c for c in self.all if isinstance(c, SelectsRows)]
        self.vocab_size = model.vocab_size
        self.unchecked = drafter is not None  # until the first non-empty draft has been validated
        self.budget_unchecked = drafter is not None  # until the first budget's values have been validated
        self.hidden_unchecked = True  # until a scored round's hidden states were checked
        self.verdict_unchecked = True  # until a verdict for a non-empty draft (plain decoding: any) was validated
        self.later_verdicts: list[tuple[int, torch.Tensor, list[str]]] = []  # checked on the device, read at the end
        self.tree_verifier = tree_verifier  # generate()'s default for tree drafts at temperature > 0
        self.current_verifier: Verifier = verifier  # the last round's (its next_token is the pending token)

    def verifier_for(self, draft: Draft) -> Verifier:
        """The verifier of this round's draft: ``tree_verifier`` for a tree when the call chose its verifier by
        default (rejection sampling verifies chains only), else the call's verifier."""
        tree = self.tree_verifier is not None and draft.num_nodes and not draft.is_chain
        self.current_verifier = self.tree_verifier if tree else self.verifier  # type: ignore[assignment]
        return self.current_verifier

    def _check_drafter(self, model: LanguageModel, sampling: SamplingParams) -> DraftKind | None:
        drafter = self.drafter
        if drafter is None:
            return None
        check_target_parts(drafter, model)  # the target's parts it calls, implemented (a hand-written adapter)
        if isinstance(drafter, ChecksModel):
            drafter.check_model(model)  # its own refusal of this target (a head made for another), before any forward
        if isinstance(drafter, HasVocab) and not is_int(drafter.vocab_size):
            raise ConfigTypeError(
                f"{type(drafter).__name__}.vocab_size must be an int (the drafter's vocabulary size, checked against "
                f"the target's), got {describe(drafter.vocab_size)}"
            )
        if isinstance(drafter, HasVocab) and drafter.vocab_size != model.vocab_size:
            raise VocabMismatchError(
                f"the drafter's vocabulary has {drafter.vocab_size} tokens but the target's has {model.vocab_size}; "
                "use a drafter trained with the target's tokenizer, with an output layer of the same size (a "
                "LanguageModel whose output rows are only padded to another size: decodekit.models.ResizedVocab)"
            )
        if not isinstance(drafter, DeclaresKind):
            return None
        kind = drafter.draft_kind(sampling)
        if not isinstance(kind, DraftKind):
            try:
                kind = DraftKind(kind)
            except ValueError:
                kinds = ", ".join(k.value for k in DraftKind)
                raise ComponentOutputError(
                    f"{type(drafter).__name__}.draft_kind must return a DraftKind ({kinds}), got {describe(kind)}"
                ) from None
        check_kind(self.verifier, kind, drafter)
        return kind

    @property
    def shares_target(self) -> bool:
        return shares_target(self.drafter)

    @property
    def takes_prefill(self) -> bool:
        """Whether the drafter shares the target and asks for the prefill's output (``needs`` "prefill"; only then
        does the prefill keep hidden states)."""
        return self.shares_target and "prefill" in needs_of(self.drafter)

    # ---------------------------------------------------------------------------------------------- hooks
    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache, prefill: ModelOutput) -> None:
        """Call every ``begin`` hook; a target-sharing drafter whose ``needs`` has ``"prefill"`` also gets
        the prefill's :class:`~decodekit.models.base.ModelOutput` (hidden states of every prompt token when
        ``needs`` has ``"hidden"``: feature-level heads need the prompt's)."""
        for component in self.all:
            begin_component(component, state, target, cache, prefill, drafter=component is self.drafter)

    def observe(self, state: DecodeState, round: Round) -> None:
        for component in self.observers:
            component.observe(state, round)

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        """Rows finished: keep ``rows [B']``; a component whose ``needs`` has ``"host_rows"`` also gets the same
        indices on the host, which spares it a host sync."""
        for component in self.row_selectors:
            select_component_rows(component, rows, host_rows)

    # ------------------------------------------------------------------------------------------ context
    def check_context(self, max_length: int) -> None:
        """Refuse a draft model (a drafter's ``model``) whose context is shorter than the ``max_length`` tokens a
        row of this call may reach (it would run past its position table, or extrapolate silently)."""
        draft_model = getattr(self.drafter, "model", None)
        if not isinstance(draft_model, LanguageModel):  # a diffusion LM (the diffusion drafter's) wraps its decoder
            draft_model = getattr(draft_model, "lm", None)
        context = getattr(draft_model, "max_context", None) if isinstance(draft_model, LanguageModel) else None
        if context is not None and context < max_length:
            raise ContextLengthError(
                f"the draft model of {type(self.drafter).__name__} has a context of {context} tokens but this call "
                f"needs {max_length} (longest prompt + max_new_tokens, within the target's context); use a draft model "
                "with a context at least as long as the target's, or shorten the prompts or max_new_tokens"
            )

    # ----------------------------------------------------------------------------------- component outputs
    def plan(self, state: DecodeState, validate: bool = False) -> DraftBudget:
        """The policy's budget for this round, checked (shape, dtype, device; values on the call's first round and
        when ``validate``: a host sync). The loop caps its depth."""
        budget = self.policy.plan(state)
        source = f"{type(self.policy).__name__}.plan"
        if not isinstance(budget, DraftBudget):
            raise ComponentOutputError(f"{source} must return a DraftBudget, got {describe(budget)}")
        budget.check(state.batch_size, state.device, source, values=validate or self.budget_unchecked)
        self.budget_unchecked = False
        return budget

    def hidden_asked(self, prefill: bool) -> dict[str, Any]:
        """What a forward of this call asks the target for: ``hidden_layers`` and ``return_hidden``, the union of the
        components' (the prefill's only for a drafter that takes it)."""
        asks = self.takes_prefill or not prefill
        return {"hidden_layers": self.hidden_layers if asks else (), "return_hidden": asks and "hidden" in self.needs}

    def check_hidden(
        self, model: LanguageModel, out: ModelOutput, shape: tuple[int, int], asked: dict[str, Any], prefill: bool
    ) -> None:
        """Refuse a forward of ``shape = (B, N)`` tokens, run with ``asked`` (:meth:`hidden_asked`), whose output
        lacks those hidden states (:func:`~decodekit.spec.component_checks.check_hidden_output`): the prefill's and
        the first scored round's (shapes only: no sync); a later round returns at once."""
        if not self.hidden_unchecked:
            return
        if asked["return_hidden"] or asked["hidden_layers"]:
            check_hidden_output(model, out, shape, asked["return_hidden"], asked["hidden_layers"], self.all)
        self.hidden_unchecked = prefill  # after the prefill, the first scored round is still checked

    def check_budget_size(self, budget: DraftBudget) -> None:
        """Refuse a negative node budget once its maximum is on the host (``budget`` capped by the loop, which
        reads ``max_len`` anyway when ``max_depth > 0``)."""
        if budget.max_depth > 0 and budget.max_len < 0:
            raise ComponentOutputError(
                f"{type(self.policy).__name__}.plan returned a malformed DraftBudget: nodes must be >= 0 "
                f"(0 = do not draft), got a row with {budget.max_nodes}"
            )

    def check_draft(self, draft: Draft, state: DecodeState, budget: DraftBudget, values: bool = True) -> None:
        """Check a draft: its type, batch size and device always (host metadata); its values with ``values`` (a
        host sync: the loop validates until a first non-empty draft passed, and every round in debug mode)."""
        source = f"{type(self.drafter).__name__}.propose"
        if not isinstance(draft, Draft):
            raise ComponentOutputError(f"{source} must return a Draft, got {describe(draft)}")
        if draft.batch_size != state.batch_size or draft.tokens.device != state.device:
            raise ComponentOutputError(
                f"{source} returned a draft of {draft.batch_size} rows on {draft.tokens.device}; the batch has "
                f"{state.batch_size} rows on {state.device}"
            )
        for name in ("q", "draft_probs"):  # a distribution over another vocabulary: a shape, no sync
            value = getattr(draft, name)
            if value is not None and value.shape[-1] != self.vocab_size:
                raise ComponentOutputError(
                    f"{source} returned a draft whose {name} covers {value.shape[-1]} tokens, but the target's "
                    f"vocabulary has {self.vocab_size}: Draft.{name} must be [B, N, V] over the target's vocabulary "
                    f"(V = {self.vocab_size})"
                )
        if not values:
            return
        if self.declared_kind is None and draft.num_nodes:
            check_kind(self.verifier, draft.kind, self.drafter)
        elif draft.num_nodes and draft.kind != self.declared_kind:
            raise IncompatibleDraftError(
                f"{type(self.drafter).__name__}.draft_kind() said {self.declared_kind.value} but it returned a "
                f"{draft.kind.value} draft; make the two agree"
            )
        draft.check(state.batch_size, self.vocab_size, budget, source)
        self.unchecked = self.unchecked and draft.num_nodes == 0

    def check_verdict(self, verdict: Verdict, draft: Draft, index: int, values: bool = False) -> None:
        """Check a verdict: its type and batch size always (host metadata; dtypes and shapes are checked when it
        is built); its values (``num_accepted`` within the draft, ``next_token`` in the vocabulary, the accepted
        path valid: one host sync) on the call's first round with a non-empty draft (plain decoding: its first round),
        and every round with ``values`` (debug mode). The next :data:`LATER_VERDICTS` non-empty rounds (round
        ``index``) are checked on the device and read when the call ends (:meth:`check_output`): a first verdict
        that accepted nothing left its path unchecked."""
        source = f"{type(self.current_verifier).__name__}.verify"
        if not isinstance(verdict, Verdict):
            raise ComponentOutputError(f"{source} must return a Verdict, got {describe(verdict)}")
        if verdict.num_accepted.shape[0] != draft.batch_size or verdict.next_token.device != draft.tokens.device:
            raise ComponentOutputError(
                f"{source} returned a verdict of {verdict.num_accepted.shape[0]} rows on {verdict.next_token.device} "
                f"for a draft of {draft.batch_size} rows on {draft.tokens.device}"
            )
        if values or (self.verdict_unchecked and (draft.num_nodes or self.drafter is None)):
            verdict.check(draft, self.vocab_size, source)
            self.verdict_unchecked = False
        elif draft.num_nodes and len(self.later_verdicts) < LATER_VERDICTS:  # the first may have accepted nothing
            self.later_verdicts.append((index, *verdict.problems(draft, self.vocab_size)))

    def check_output(self, sequences: list[list[int]]) -> None:
        """Refuse an output after a malformed verdict checked on the device (:meth:`check_verdict`: one host read),
        or holding a token outside the vocabulary (host ints, read out anyway: no sync). Every other
        round's tokens went through a forward, which fails on them (and
        :func:`~decodekit.spec.component_checks.explain_failure` names who returned them); the last round's
        ``next_token`` is the one no forward reads."""
        if self.later_verdicts:  # one host read for all of them
            reads = torch.cat([oks for _, oks, _ in self.later_verdicts]).tolist()
            source = f"{type(self.current_verifier).__name__}.verify"
            for index, oks, messages in self.later_verdicts:
                read, reads = reads[: len(oks)], reads[len(oks) :]
                raise_problems(read, messages, f"{source} (round {index}; its output is not returned)")
        low = min((min(row) for row in sequences if row), default=0)
        high = max((max(row) for row in sequences if row), default=0)
        if low < 0 or high >= self.vocab_size:
            raise ComponentOutputError(
                f"{type(self.current_verifier).__name__}.verify returned a next_token outside the vocabulary "
                f"[0, {self.vocab_size}) on the last round (the output holds {low if low < 0 else high}); run with "
                "debug=True to check every round's verdict where it is made"
            )


__all__ = ["Components"]
