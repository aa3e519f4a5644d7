"""The draft types every drafter, verifier and policy shares (the ground floor of both wings):

* :mod:`~decodekit.draft.tree`: :class:`Draft`, the token tree a drafter proposes (checked by
  :mod:`~decodekit.draft.validate`), and :mod:`~decodekit.draft.kind`: :class:`DraftKind`, how its tokens were drawn;
* :mod:`~decodekit.draft.budget`: :class:`DraftBudget`, how much each row may draft in a round, and
  :class:`DraftStep`, the record a stop rule reads;
* :mod:`~decodekit.draft.templates`: static token-tree templates (:class:`TreeTemplate`, ``TEMPLATES``).
"""

from decodekit.draft.budget import DraftBudget, DraftStep
from decodekit.draft.templates import TEMPLATES, TreeTemplate
from decodekit.draft.tree import Draft, DraftKind

__all__ = ["TEMPLATES", "Draft", "DraftBudget", "DraftKind", "DraftStep", "TreeTemplate"]
