"""The one place a :func:`decodekit.generate` call resolves its parts, as :mod:`decodekit.dlm.parts` does for the
diffusion sampler: the defaults filled in (the verifier for the sampling settings, the drafter's default policy),
then checked alone and together, hooks and declared needs resolved once (:class:`~decodekit.spec.components.
Components`). That the three implement their Protocols is checked first, before the model loads
(:func:`~decodekit.spec.component_checks.check_components`)."""

from __future__ import annotations

from decodekit.interfaces import Drafter, LengthPolicy, Verifier
from decodekit.models.base import LanguageModel
from decodekit.policies.fixed import policy_for
from decodekit.spec.components import Components
from decodekit.types import SamplingParams
from decodekit.verifiers import GreedyVerifier, RejectionVerifier, TraversalVerifier


def resolve_parts(
    model: LanguageModel,
    drafter: Drafter | None,
    verifier: Verifier | None,
    policy: LengthPolicy | None,
    sampling: SamplingParams,
) -> Components:
    """The call's components with their defaults: ``verifier=None`` is greedy at temperature 0, else rejection
    sampling for chain drafts and traversal verification for tree drafts (``tree_verifier``); ``policy=None`` is the
    drafter's ``default_policy()``, else ``FixedLength(4)``. Raises what :class:`Components` refuses."""
    tree_verifier = TraversalVerifier() if verifier is None and not sampling.greedy else None
    if verifier is None:
        verifier = GreedyVerifier() if sampling.greedy else RejectionVerifier()
    policy = policy_for(drafter) if policy is None else policy
    return Components(model, drafter, verifier, policy, sampling, tree_verifier)


__all__ = ["resolve_parts"]
