"""decodekit: composable decoding algorithms for language models.

>>> import decodekit as dk
>>> model = dk.load_model(hf_model)                                   # doctest: +SKIP
>>> out = dk.generate(model, [[1, 2, 3]], drafter=dk.drafters.NGramDrafter())   # doctest: +SKIP
"""

import importlib as _importlib
import sys as _sys

from decodekit import dlm, drafters, policies, registry, spec, train, verifiers
from decodekit.cache import KVCache
from decodekit.dlm.interfaces import DLMCache, DLMDraft, RegionSchedule, UnmaskRule
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
from decodekit.interfaces import (
    Begins,
    ChecksSampling,
    DeclaresKind,
    Drafter,
    HasDefaultPolicy,
    HasVocab,
    LengthPolicy,
    Needs,
    Observes,
    SelectsRows,
    SharesTarget,
    Verifier,
)
from decodekit.metrics import DLMStats, SpecStats
from decodekit.models import LanguageModel, ModelOutput, load_model
from decodekit.registry import available, build, register
from decodekit.spec import diagnostics
from decodekit.spec.diagnostics import (
    Divergence,
    first_divergence,
    first_divergences,
)
from decodekit.spec.loop import generate
from decodekit.spec.round import NEEDS, Round
from decodekit.spec.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, DraftStep, GenerationOutput, SamplingParams, Verdict

# Modules that moved into the two wings (issue 56) stay importable by their old names, as the same module objects
# (``from decodekit.state import DecodeState`` keeps working, without a file at the root).
_MOVED = {
    "budget": "draft.budget",
    "components": "spec.components",
    "conventions": "spec.conventions",
    "diagnostics": "spec.diagnostics",
    "generate": "spec.loop",
    "options": "spec.options",
    "outputs": "spec.outputs",
    "processors": "spec.processors",
    "prompts": "models.prompts",
    "round": "spec.round",
    "state": "spec.state",
    "trees": "draft.templates",
}
for _old, _new in _MOVED.items():
    _sys.modules.setdefault(f"decodekit.{_old}", _importlib.import_module(f"decodekit.{_new}"))

__version__ = "0.1.0"

# The public root: the loop, the three roles, the draft types, the registry and the packages. The optional-hook
# Protocols (``Begins``, ``Observes``, ...) and the specific errors stay importable here but are listed in
# ``dk.interfaces`` and ``dk.errors``; the diffusion roles in ``dk.dlm``.
__all__ = [
    "NEEDS",
    "ConfigError",
    "DLMStats",
    "DecodeKitError",
    "DecodeState",
    "Draft",
    "DraftBudget",
    "DraftKind",
    "DraftStep",
    "Drafter",
    "GenerationOutput",
    "KVCache",
    "LanguageModel",
    "LengthPolicy",
    "ModelOutput",
    "Round",
    "SamplingParams",
    "SpecStats",
    "Verdict",
    "Verifier",
    "available",
    "build",
    "diagnostics",
    "dlm",
    "drafters",
    "errors",
    "first_divergence",
    "generate",
    "interfaces",
    "load_model",
    "policies",
    "register",
    "registry",
    "train",
    "verifiers",
]
