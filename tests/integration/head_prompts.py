"""The two prompts the shipped heads' tests draft on: a code completion and a chat question (token ids)."""

from __future__ import annotations

from typing import Any

CODE = 'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same backwards."""\n'
CHAT = "Hi! Can you explain what a Python list comprehension is?"
HEAD_NEW = 24  # tokens each head test generates (every head's acceptance bound holds with margin at 24, 32 and 48)


def head_prompts(tokenizer: Any) -> list[list[int]]:
    """``CODE`` as plain text and ``CHAT`` through the chat template, as token ids."""
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": CHAT}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    return [tokenizer(CODE)["input_ids"], list(chat)]
