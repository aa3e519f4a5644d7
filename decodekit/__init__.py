"""decodekit: composable decoding algorithms for language models.

>>> import decodekit as dk
>>> model = dk.load_model(hf_model)                                   # doctest: +SKIP
>>> out = dk.generate(model, [[1, 2, 3]], drafter=dk.drafters.NGramDrafter())   # doctest: +SKIP
"""

from decodekit import diagnostics, dlm, drafters, policies, registry, train, verifiers
from decodekit.cache import KVCache
from decodekit.diagnostics import Divergence, first_divergence, first_divergences
from decodekit.errors import (
    ConfigError,
    ContextLengthError,
    DecodeKitError,
    EmptyPromptError,
    IncompatibleDraftError,
    MissingDependencyError,
    UnknownComponentError,
    VocabMismatchError,
)
from decodekit.generate import generate
from decodekit.interfaces import (
    Begins,
    ChecksSampling,
    DeclaresKind,
    DLMCache,
    DLMDraft,
    Drafter,
    HasDefaultPolicy,
    HasVocab,
    LengthPolicy,
    Needs,
    Observes,
    RegionSchedule,
    SelectsRows,
    SharesTarget,
    UnmaskRule,
    Verifier,
)
from decodekit.metrics import DLMStats, SpecStats
from decodekit.models import LanguageModel, ModelOutput, load_model
from decodekit.registry import available, build, register
from decodekit.round import NEEDS, Round
from decodekit.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, DraftStep, GenerationOutput, SamplingParams, Verdict

__version__ = "0.1.0"

__all__ = [
    "NEEDS",
    "Begins",
    "ChecksSampling",
    "DeclaresKind",
    "HasDefaultPolicy",
    "HasVocab",
    "ModelOutput",
    "Needs",
    "Observes",
    "Round",
    "SelectsRows",
    "SharesTarget",
    "ConfigError",
    "ContextLengthError",
    "DecodeKitError",
    "DecodeState",
    "Draft",
    "DraftBudget",
    "DraftKind",
    "DraftStep",
    "Drafter",
    "EmptyPromptError",
    "GenerationOutput",
    "IncompatibleDraftError",
    "KVCache",
    "LanguageModel",
    "LengthPolicy",
    "MissingDependencyError",
    "SamplingParams",
    "SpecStats",
    "DLMStats",
    "UnmaskRule",
    "DLMCache",
    "DLMDraft",
    "RegionSchedule",
    "UnknownComponentError",
    "Verdict",
    "Verifier",
    "VocabMismatchError",
    "available",
    "build",
    "diagnostics",
    "dlm",
    "Divergence",
    "first_divergence",
    "first_divergences",
    "drafters",
    "generate",
    "load_model",
    "policies",
    "register",
    "registry",
    "train",
    "verifiers",
]
