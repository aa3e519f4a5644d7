"""Length policies: one file per algorithm, each registered under ``build("policy", name)``; the analytic speed
model they share (:mod:`decodekit.policies.analytic`) and its measured costs (:func:`profile_costs`)."""

from decodekit.policies.acceptance import AcceptanceTracker
from decodekit.policies.analytic import CostModel
from decodekit.policies.batch_aware import BatchAwareLength
from decodekit.policies.confidence import ConfidenceStop
from decodekit.policies.entropy_stop import AdaEDL, EntropyStop
from decodekit.policies.fixed import FixedLength
from decodekit.policies.gammatune import GammaTune, GammaTunePlus
from decodekit.policies.goodput import GoodputLength
from decodekit.policies.heuristic import HeuristicLength
from decodekit.policies.kld_stability import KLDStability
from decodekit.policies.profile import profile_costs
from decodekit.policies.stack import Stack
from decodekit.policies.threshold_head import ThresholdHeadStop

__all__ = [
    "AcceptanceTracker",
    "AdaEDL",
    "BatchAwareLength",
    "ConfidenceStop",
    "CostModel",
    "EntropyStop",
    "FixedLength",
    "GammaTune",
    "GammaTunePlus",
    "GoodputLength",
    "HeuristicLength",
    "KLDStability",
    "Stack",
    "ThresholdHeadStop",
    "profile_costs",
]
