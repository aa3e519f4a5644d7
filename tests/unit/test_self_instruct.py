"""Self-instruct prompts (Magpie): the target samples the user's message after its template's pre-query part; the
prompts are distinct chat prompts, reproducible from the seed, and unfinished or short requests are dropped."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import decodekit as dk
from decodekit.models.tiny import tiny_llama
from decodekit.train.self_instruct import pre_query_ids, self_instruct_prompts

TEMPLATE = (
    "sys hi end {% for m in messages %}u {{ m['content'] }} end {% endfor %}{% if add_generation_prompt %}a{% endif %}"
)


def word_tokenizer(vocab: int, template: str | None = TEMPLATE) -> PreTrainedTokenizerFast:
    special = ["sys", "hi", "u", "a", "end"]
    words = {f"t{i}": i for i in range(vocab - len(special))}
    words |= {w: vocab - len(special) + i for i, w in enumerate(special)}
    tok = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="end")
    out.chat_template = template
    return out


def test_prompts_are_the_targets_own_requests_in_the_template():
    hf = tiny_llama(0)
    tok = word_tokenizer(hf.config.vocab_size)
    lm = dk.load_model(hf, tokenizer=tok)
    pre = pre_query_ids(tok)
    assert tok.decode(pre) == "sys hi end u"
    prompts = self_instruct_prompts(lm, 24, 6, 64, seed=0, batch_size=8, progress=False)
    assert 0 < len(prompts) < 24  # a random tiny model often runs past 6 tokens without ending its turn
    assert len({tuple(p) for p in prompts}) == len(prompts)
    for p in prompts:
        assert p[: len(pre)] == pre and p[-2:] == tok("end a")["input_ids"]
        assert len(p) - len(pre) - 2 >= 4  # at least 4 request tokens
    assert self_instruct_prompts(lm, 24, 6, 64, seed=0, batch_size=5, progress=False) == prompts  # per-row seeds
    assert self_instruct_prompts(lm, 24, 6, 64, seed=1, batch_size=8, progress=False) != prompts


def test_a_template_without_the_users_message_is_refused():
    with pytest.raises(ValueError, match="user's message"):
        pre_query_ids(word_tokenizer(64, template="sys hi end"))
