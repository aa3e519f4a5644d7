"""How a draft's tokens were drawn: what a verifier must know to verify them losslessly."""

from __future__ import annotations

import enum


class DraftKind(str, enum.Enum):
    """How the tokens of a draft were produced; verifiers declare which kinds they can verify losslessly.

    * ``SAMPLED``: each node was drawn from ``Draft.q`` at that node, siblings independently (i.i.d. from their
      parent's distribution); ``q`` is required and exact.
    * ``SAMPLED_WITHOUT_REPLACEMENT``: siblings were drawn one after another from their parent's distribution
      with the earlier siblings removed (listed in draw order); ``q`` is the parent's distribution *before* any
      removal.
    * ``DETERMINISTIC``: the tokens are a function of the context (lookup, argmax, a static tree); verified as
      point masses.
    """

    SAMPLED = "sampled"
    SAMPLED_WITHOUT_REPLACEMENT = "sampled_without_replacement"
    DETERMINISTIC = "deterministic"

    @property
    def needs_q(self) -> bool:
        return self is not DraftKind.DETERMINISTIC
