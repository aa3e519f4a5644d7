"""A word-level tokenizer written to a model directory as ``save_pretrained`` writes one: what tests that save tiny
checkpoints give them (no download)."""

from __future__ import annotations

from pathlib import Path


def save_word_tokenizer(path: Path, words: list[str], **special: str) -> None:
    """``words`` (id = position; the first is the unknown token), split on whitespace, saved under ``path`` with
    the ``special`` tokens given (``bos_token="<s>"``, ...)."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=words[0], **special).save_pretrained(path)
