"""Verifiers: one file per algorithm, each registered under ``build("verifier", name)``."""

from decodekit.verifiers.block import BlockVerifier
from decodekit.verifiers.greedy import GreedyVerifier
from decodekit.verifiers.rejection import RejectionVerifier
from decodekit.verifiers.specinfer import SpecInferVerifier
from decodekit.verifiers.spectr import SpecTrVerifier
from decodekit.verifiers.traversal import TraversalVerifier
from decodekit.verifiers.typical import TypicalAcceptanceVerifier

__all__ = [
    "BlockVerifier",
    "GreedyVerifier",
    "RejectionVerifier",
    "SpecInferVerifier",
    "SpecTrVerifier",
    "TraversalVerifier",
    "TypicalAcceptanceVerifier",
]
