"""A draft model whose output layer is padded to another size than the target's (Qwen2.5-0.5B for 7B) drafts for it:
taken when the tokenizers show the extra rows to be padding, refused otherwise; greedy output equals plain decoding,
and sampled output keeps the target's law (the chi-square harness of ``test_lossless.py``, with its biased controls)."""

from __future__ import annotations

import pytest
import tokenizers
import torch
from transformers import PreTrainedTokenizerFast

import decodekit as dk
from decodekit.drafters import ModelDrafter, ModelTreeDrafter
from decodekit.errors import VocabMismatchError
from decodekit.models import ResizedVocab
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.verifiers import RejectionVerifier
from tests.unit.test_lossless import assert_matches, sample_counts

VOCAB, TOKENS = 64, 60  # the target's output rows; the tokenizer's tokens (rows 60..63 are padding)
PROMPTS = [[5, 9, 14, 3, 9, 14], [7, 2, 2, 40, 41]]


def word_tokenizer(size: int, prefix: str = "w") -> PreTrainedTokenizerFast:
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"{prefix}{i}": i for i in range(size)}, "w0"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")


def resized_copy(model: torch.nn.Module, rows: int, padding_logit: float = 0.0) -> torch.nn.Module:
    """``model`` with ``rows`` output and embedding rows: its own where both have them; new rows (padding) get an
    embedding of zeros and an output row that gives ``padding_logit`` plus a large bias (so an uncut logit would
    win every argmax)."""
    copy = tiny_llama(0, vocab=rows, hidden=model.config.hidden_size)
    copy.load_state_dict(
        {k: v for k, v in model.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k},
        strict=False,
    )
    n = min(rows, model.config.vocab_size)
    with torch.no_grad():
        for ours, theirs in ((copy.model.embed_tokens, model.model.embed_tokens), (copy.lm_head, model.lm_head)):
            ours.weight.zero_()
            ours.weight[:n] = theirs.weight[:n]
        copy.lm_head.weight[n:] = 10.0  # hidden states of norm ~8: padding rows would dominate if kept
    return copy


@pytest.fixture(scope="module")
def target():
    return dk.load_model(tiny_llama(3, vocab=VOCAB, hidden=32, init=0.3), word_tokenizer(TOKENS))


@pytest.fixture(scope="module")
def plain(target):
    return dk.generate(target, PROMPTS, max_new_tokens=16, eos_token_id=()).sequences


@pytest.mark.parametrize("rows", [72, 62])
@pytest.mark.parametrize("tree", [False, True])
def test_a_padded_copy_of_the_target_drafts_its_greedy_tokens(target, plain, rows, tree):
    # the draft is the target with its output layer padded (72) or cut (62): greedy output is plain decoding's,
    # and a larger draft's padding rows (logits that win every argmax if kept) are never proposed
    draft = dk.load_model(resized_copy(target.hf, rows), word_tokenizer(TOKENS))
    drafter = ModelTreeDrafter(draft, shape="iid", branches=2) if tree else ModelDrafter(draft)
    out = dk.generate(target, PROMPTS, drafter, policy=FixedLength(3), max_new_tokens=16, eos_token_id=())
    assert out.sequences == plain
    assert isinstance(drafter.model, ResizedVocab) and drafter.vocab_size == VOCAB
    if rows > VOCAB and not tree:  # the same model: every draft token is accepted
        assert out.stats.draft_acceptance_rate == 1.0


def test_a_draft_of_the_target_size_is_left_as_it_is(target):
    drafter = ModelDrafter(dk.load_model(tiny_llama(4, vocab=VOCAB, hidden=32), word_tokenizer(TOKENS)))
    dk.generate(target, PROMPTS[:1], drafter, max_new_tokens=4, eos_token_id=())
    assert not isinstance(drafter.model, ResizedVocab)


@pytest.mark.parametrize(
    ("draft_tokenizer", "target_tokenizer", "match"),
    [
        (None, None, "neither carries a tokenizer.*ResizedVocab"),
        (word_tokenizer(63), None, "the tokenizer has 63 tokens: the smaller model lacks real tokens"),
        (word_tokenizer(TOKENS, prefix="v"), word_tokenizer(TOKENS), "map tokens to different ids"),
    ],
)
def test_a_draft_of_another_tokenizer_is_refused(draft_tokenizer, target_tokenizer, match):
    target = dk.load_model(tiny_llama(3, vocab=VOCAB, hidden=32), target_tokenizer)
    drafter = ModelDrafter(dk.load_model(tiny_llama(5, vocab=62, hidden=32), draft_tokenizer))
    with pytest.raises(VocabMismatchError, match=f"ModelDrafter's draft model has 62 output rows.*{match}"):
        dk.generate(target, PROMPTS[:1], drafter, max_new_tokens=4)


def test_sampled_drafts_of_a_resized_model_keep_the_target_law():
    # the lossless harness's target (8 tokens) and a random draft of 6 rows, resized by hand (tiny models carry no
    # tokenizer): q is 0 on ids 6 and 7, which only the residual gives; the first three tokens' law is the target's
    target = tiny_llama(0, vocab=8, hidden=32, init=0.3)
    draft = ResizedVocab(dk.load_model(tiny_llama(7, vocab=6, hidden=32, init=0.3)), 8)
    counts, stats = sample_counts(target, ModelDrafter(draft), RejectionVerifier(), FixedLength(2), "T1", seed=21)
    assert_matches(target, counts, "T1")
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_a_draft_of_the_same_size_with_another_tokenizer_is_named(target):
    """Only the sizes were compared: a draft model numbering its tokens otherwise drafted nothing accepted, silently."""
    draft = dk.load_model(tiny_llama(4, vocab=VOCAB, hidden=32), word_tokenizer(TOKENS, prefix="v"))
    with pytest.warns(UserWarning, match=f"ModelDrafter's draft model has a tokenizer that maps {TOKENS} of the"):
        dk.generate(target, PROMPTS[:1], ModelDrafter(draft), max_new_tokens=4, eos_token_id=())
