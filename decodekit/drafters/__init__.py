"""Drafters: one file per algorithm, each registered under ``build("drafter", name)``."""

from decodekit.drafters.model import ModelDrafter
from decodekit.drafters.ngram import NGramDrafter

__all__ = ["ModelDrafter", "NGramDrafter"]
