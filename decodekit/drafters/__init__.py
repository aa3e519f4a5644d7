"""Drafters: one file per algorithm, each registered under ``build("drafter", name)``."""

from decodekit.drafters.delayed import DelayedTreeDrafter
from decodekit.drafters.dflash import DFlashDrafter
from decodekit.drafters.diffusion import DiffusionDrafter
from decodekit.drafters.dynamic_exit import DynamicExitDrafter
from decodekit.drafters.eagle import EagleDrafter, EagleHead
from decodekit.drafters.eagle3 import Eagle3Drafter
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.drafters.exit_head import ExitHead
from decodekit.drafters.fallback import FallbackDrafter
from decodekit.drafters.flexdraft import FlexDraftDrafter
from decodekit.drafters.layer_skip import LayerSkipDrafter
from decodekit.drafters.lookup_eagle3 import LookupEagle3Drafter
from decodekit.drafters.medusa import MedusaDrafter, MedusaHeads
from decodekit.drafters.model import ModelDrafter
from decodekit.drafters.model_tree import ModelTreeDrafter
from decodekit.drafters.ngram import NGramDrafter
from decodekit.drafters.pillar import PillarDrafter
from decodekit.drafters.recycling import RecyclingDrafter
from decodekit.drafters.suffix import SuffixDrafter

__all__ = [
    "DelayedTreeDrafter",
    "DFlashDrafter",
    "DiffusionDrafter",
    "EagleDrafter",
    "Eagle3Drafter",
    "DynamicExitDrafter",
    "EarlyExitDrafter",
    "ExitHead",
    "FallbackDrafter",
    "FlexDraftDrafter",
    "LayerSkipDrafter",
    "LookupEagle3Drafter",
    "EagleHead",
    "MedusaDrafter",
    "MedusaHeads",
    "ModelDrafter",
    "ModelTreeDrafter",
    "NGramDrafter",
    "PillarDrafter",
    "RecyclingDrafter",
    "SuffixDrafter",
]
