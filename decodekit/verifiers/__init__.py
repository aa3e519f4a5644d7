"""Verifiers: one file per algorithm, each registered under ``build("verifier", name)``."""

from decodekit.verifiers.block import BlockVerifier
from decodekit.verifiers.greedy import GreedyVerifier
from decodekit.verifiers.rejection import RejectionVerifier

__all__ = ["BlockVerifier", "GreedyVerifier", "RejectionVerifier"]
