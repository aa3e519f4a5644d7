"""A released diffusion LM's tokenizer, read from its own files (:func:`checkpoint_tokenizer`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decodekit.errors import ConfigError

if TYPE_CHECKING:
    from decodekit.dlm.families import Family

__all__ = ["TOKENIZER_FILES", "checkpoint_tokenizer"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_TOKENIZER_ERRORS = (OSError, ValueError, AttributeError, KeyError, TypeError)  # what a tokenizer load may raise


def checkpoint_tokenizer(root: Path, family: Family) -> Any:
    """The checkpoint's tokenizer, from its own files (never with ``trust_remote_code``), or None without them."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not any((root / f).is_file() for f in TOKENIZER_FILES):
        return None
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # it reads config.json as a generic config: warnings about the family's keys
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            try:
                return AutoTokenizer.from_pretrained(str(root), local_files_only=True, trust_remote_code=False)
            except _TOKENIZER_ERRORS:  # config.json as a generic config may not parse (Qwen's YaRN rope_scaling)
                if family.tokenizer is not None:
                    return family.tokenizer(root)
                if not (root / "tokenizer.json").is_file():
                    raise
                from transformers import PreTrainedTokenizerFast

                return PreTrainedTokenizerFast.from_pretrained(str(root), local_files_only=True)
    except _TOKENIZER_ERRORS as error:
        raise ConfigError(
            f"{family.name} checkpoint {root}: its tokenizer does not load without the repository's own code "
            f"({error}); load one yourself and pass it to dk.dlm.load_model(..., tokenizer=...)"
        ) from error
    finally:
        hf_logging.set_verbosity(verbosity)
