"""decodekit: composable decoding algorithms for language models.

>>> import decodekit as dk
>>> model = dk.load_model(hf_model)                                   # doctest: +SKIP
>>> out = dk.generate(model, [[1, 2, 3]], drafter=dk.drafters.NGramDrafter())   # doctest: +SKIP
"""

from decodekit import drafters, policies, registry, verifiers
from decodekit.cache import KVCache
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
from decodekit.interfaces import Drafter, LengthPolicy, Verifier
from decodekit.metrics import SpecStats
from decodekit.models import LanguageModel, load_model
from decodekit.registry import available, build, register
from decodekit.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, DraftStep, GenerationOutput, SamplingParams, Verdict

__version__ = "0.1.0"

__all__ = [
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
    "UnknownComponentError",
    "Verdict",
    "Verifier",
    "VocabMismatchError",
    "available",
    "build",
    "drafters",
    "generate",
    "load_model",
    "policies",
    "register",
    "registry",
    "verifiers",
]
