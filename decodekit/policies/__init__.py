"""Length policies: one file per algorithm, each registered under ``build("policy", name)``."""

from decodekit.policies.confidence import ConfidenceStop
from decodekit.policies.fixed import FixedLength
from decodekit.policies.heuristic import HeuristicLength

__all__ = ["ConfidenceStop", "FixedLength", "HeuristicLength"]
