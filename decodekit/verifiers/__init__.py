"""Verifiers: one file per algorithm, each registered under ``build("verifier", name)``."""

from decodekit.verifiers.greedy import GreedyVerifier
from decodekit.verifiers.rejection import RejectionVerifier

__all__ = ["GreedyVerifier", "RejectionVerifier"]
