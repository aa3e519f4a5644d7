"""transformers' generate() conventions in decodekit.generate: GenerationConfig, do_sample, max_length,
input_ids / attention_mask, padded output, transformers streamers, stop_strings, and refusals by name."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.models.tiny import tiny_llama

MAX_NEW = 16


def greedy(target, prompts, **kwargs):
    kwargs.setdefault("eos_token_id", ())
    return dk.generate(target, prompts, **kwargs)


def test_a_generation_config_gives_what_its_keywords_give(target, ragged_prompts):
    config = GenerationConfig(max_new_tokens=MAX_NEW, repetition_penalty=1.5, do_sample=False)
    by_config = greedy(target, ragged_prompts, generation_config=config)
    by_keywords = greedy(target, ragged_prompts, max_new_tokens=MAX_NEW, repetition_penalty=1.5)
    assert by_config.sequences == by_keywords.sequences
    assert by_config.sequences != greedy(target, ragged_prompts, max_new_tokens=MAX_NEW).sequences
    overridden = greedy(target, ragged_prompts, generation_config=config, max_new_tokens=5, repetition_penalty=1.0)
    assert overridden.sequences == greedy(target, ragged_prompts, max_new_tokens=5).sequences


def test_do_sample(target, ragged_prompts):
    sampled = greedy(target, ragged_prompts, max_new_tokens=MAX_NEW, do_sample=True, seed=3)
    at_one = greedy(target, ragged_prompts, max_new_tokens=MAX_NEW, temperature=1.0, seed=3)
    assert sampled.sequences == at_one.sequences  # do_sample=True without a temperature samples at 1.0
    assert sampled.sequences != greedy(target, ragged_prompts, max_new_tokens=MAX_NEW).sequences
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=5)
    with_config = greedy(target, ragged_prompts, generation_config=config, max_new_tokens=MAX_NEW, seed=3)
    assert (
        with_config.sequences
        == greedy(target, ragged_prompts, max_new_tokens=MAX_NEW, temperature=0.7, top_k=5, seed=3).sequences
    )
    off = greedy(target, ragged_prompts, max_new_tokens=MAX_NEW, do_sample=False, temperature=0.7, top_k=5, seed=3)
    assert off.sequences == greedy(target, ragged_prompts, max_new_tokens=MAX_NEW).sequences  # greedy, as in HF
    with pytest.raises(ConfigError, match="do_sample=True needs temperature > 0"):
        greedy(target, ragged_prompts, do_sample=True, temperature=0.0)


def test_max_length_counts_from_the_longest_prompt(target, ragged_prompts):
    longest = max(map(len, ragged_prompts))
    out = greedy(target, ragged_prompts, max_length=longest + 7)
    assert [len(s) for s in out.sequences] == [7] * len(ragged_prompts)
    assert greedy(target, ragged_prompts, max_length=longest + 50, max_new_tokens=3).sequences == (
        greedy(target, ragged_prompts, max_new_tokens=3).sequences
    )  # max_new_tokens wins, as in transformers
    with pytest.raises(ConfigError, match="max_length=13 leaves no room after the longest prompt"):
        greedy(target, ragged_prompts, max_length=longest)


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` ``[B, T]`` of ``prompts``, left-padded with 0, as a tokenizer gives."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    return ids, torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])


def test_input_ids_and_attention_mask_keywords(target, ragged_prompts):
    ids, mask = left_padded(ragged_prompts)
    out = greedy(target, None, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW)
    assert out.sequences == greedy(target, ragged_prompts, max_new_tokens=MAX_NEW).sequences
    assert out.prompts == ragged_prompts
    with pytest.raises(ConfigError, match="not both"):
        greedy(target, ragged_prompts, input_ids=ids)
    with pytest.raises(ConfigError, match="attention_mask goes with input_ids"):
        greedy(target, ragged_prompts, attention_mask=mask)


def test_padded_output_is_what_model_generate_returns(target, ragged_prompts):
    ids, mask = left_padded(ragged_prompts)
    eos = greedy(target, ragged_prompts, max_new_tokens=MAX_NEW).sequences[1][4]  # row 1 stops early
    expected = target.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    out = dk.generate(target, ragged_prompts, NGramDrafter(), max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert "eos" in out.finish_reasons
    assert torch.equal(out.padded(pad_token_id=0), expected)
    assert out.pad_token_id == eos  # without a pad id, the first EOS id, as transformers falls back
    with pytest.raises(ConfigError, match="needs a pad id"):
        greedy(target, ragged_prompts, max_new_tokens=2).padded()


class Recorder(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended += 1


def test_a_transformers_streamer_is_fed_as_model_generate_feeds_it(target, ragged_prompts):
    prompt = ragged_prompts[2]
    expected = Recorder()
    target.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, streamer=expected, pad_token_id=0)
    streamer = Recorder()
    out = greedy(target, [prompt], drafter=ModelDrafter(target), max_new_tokens=MAX_NEW, streamer=streamer)
    assert streamer.puts[0] == expected.puts[0] == [prompt]  # the prompt first, as a [1, T] tensor
    assert sum(streamer.puts[1:], []) == sum(expected.puts[1:], []) == out.sequences[0]
    assert max(map(len, streamer.puts[1:])) > 1  # several tokens per put when drafts are accepted
    assert streamer.ended == expected.ended == 1
    with pytest.raises(ConfigError, match="takes one sequence, but the call has 4 prompts"):
        greedy(target, ragged_prompts, streamer=Recorder())
    failing = Recorder()
    with pytest.raises(ConfigError):
        greedy(target, [prompt], streamer=failing, policy=dk.policies.FixedLength(2), drafter=Exploding())
    assert failing.ended == 1  # released on errors too


class Exploding:
    def propose(self, state, budget):
        raise ConfigError("boom")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(num_beams=4), ConfigError, "does not take num_beams: decodekit decodes one sequence per prompt"),
        (dict(assistant_model=object()), ConfigError, r"ModelDrafter\(assistant_model\)"),
        (dict(prompt_lookup_num_tokens=3), ConfigError, "NGramDrafter"),
        (dict(output_scores=True), ConfigError, "observe"),
        (dict(num_return_sequences=2), ConfigError, "repeat each prompt"),
        (dict(min_length=4), ConfigError, "min_new_tokens"),
        (dict(stopping_criteria=[]), ConfigError, "stop_strings"),
        (dict(min_p=0.1), ConfigError, "MinPLogitsWarper"),
        (dict(return_dict_in_generate=True), ConfigError, r"out.padded\(\)"),
        (dict(max_new_token=4), ConfigTypeError, "did you mean 'max_new_tokens'"),
        (dict(frobnicate=1), ConfigTypeError, "unexpected keyword argument 'frobnicate'"),
        (dict(generation_config=GenerationConfig(num_beams=3)), ConfigError, "num_beams=3: decodekit decodes one"),
        (dict(generation_config=GenerationConfig(penalty_alpha=0.6, top_k=4)), ConfigError, "penalty_alpha"),
        (dict(generation_config={"do_sample": True}), ConfigTypeError, "must be a transformers GenerationConfig"),
        (dict(repetition_penalty=0.0), ConfigError, "repetition_penalty"),
        (dict(no_repeat_ngram_size=-1), ConfigError, "no_repeat_ngram_size"),
        (dict(bad_words_ids=[[]]), ConfigTypeError, "bad_words_ids"),
        (dict(bad_words_ids=[[500]]), ConfigError, "bad_words_ids holds 500, outside the model's vocabulary"),
        (dict(suppress_tokens="3"), ConfigTypeError, "suppress_tokens"),
        (dict(logits_processor=[3]), ConfigTypeError, r"logits_processor\[0\]"),
        (dict(min_new_tokens=-2), ConfigError, "min_new_tokens"),
        (dict(stop_strings=["x"]), ConfigError, "stop_strings needs the model's tokenizer"),
        (dict(stop_strings=[""]), ConfigTypeError, "stop_strings"),
        (dict(do_sample="yes"), ConfigTypeError, "do_sample"),
    ],
)
def test_refused_by_name(target, ragged_prompts, kwargs, error, match):
    with pytest.raises(error, match=match):
        greedy(target, ragged_prompts, max_new_tokens=2, **kwargs)


def test_refused_processors(target, ragged_prompts):
    from transformers.generation import MinNewTokensLengthLogitsProcessor, PrefixConstrainedLogitsProcessor

    for processor, match in [
        (MinNewTokensLengthLogitsProcessor(3, 5, 0), "pass min_new_tokens= instead"),
        (PrefixConstrainedLogitsProcessor(lambda b, ids: [0], 1), "batch index"),
    ]:
        with pytest.raises(ConfigError, match=match):
            greedy(target, ragged_prompts, logits_processor=[processor])


def test_a_model_generation_config_is_accepted(target, ragged_prompts):
    """What a checkpoint's generation_config holds (ids, use_cache, output flags off) changes nothing."""
    config = GenerationConfig(
        bos_token_id=1, eos_token_id=2, pad_token_id=2, use_cache=True, output_attentions=False, num_beams=1
    )
    out = dk.generate(target, ragged_prompts, generation_config=config, max_new_tokens=4)
    assert out.sequences == dk.generate(target, ragged_prompts, eos_token_id=2, max_new_tokens=4).sequences
    assert out.pad_token_id == 2


def test_the_models_own_generation_config_is_named_once_and_applied_when_passed(ragged_prompts):
    """model.generate starts from the model's own GenerationConfig (a checkpoint's generation_config.json);
    decodekit.generate takes its EOS and pad ids and names once what else it sets that would change the output."""
    model = tiny_llama(0)
    model.generation_config.repetition_penalty = 1.5
    model.generation_config.no_repeat_ngram_size = 2
    model.generation_config.temperature = 0.6  # without do_sample transformers ignores it too: not named
    model.generation_config.pad_token_id = 3
    with pytest.warns(UserWarning, match=r"sets repetition_penalty=1.5, no_repeat_ngram_size=2, which") as caught:
        plain = greedy(model, ragged_prompts, max_new_tokens=MAX_NEW)
    assert "temperature" not in str(caught[0].message) and plain.pad_token_id == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        greedy(model, ragged_prompts, max_new_tokens=2)
    ids, mask = left_padded(ragged_prompts)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, eos_token_id=None)
    config, new = model.generation_config, MAX_NEW
    with pytest.warns(UserWarning, match="temperature=0.6 but not do_sample=True"):  # transformers ignores it too
        applied = greedy(model, None, input_ids=ids, attention_mask=mask, generation_config=config, max_new_tokens=new)
    assert torch.equal(applied.padded(), expected) and applied.sequences != plain.sequences


def test_a_generation_config_without_do_sample_decodes_greedily_as_in_transformers(target, ragged_prompts):
    config = GenerationConfig(temperature=0.7, top_p=0.9, max_new_tokens=MAX_NEW)
    with pytest.warns(UserWarning, match=r"sets temperature=0.7, top_p=0.9 but not do_sample=True: decoding is greedy"):
        out = greedy(target, ragged_prompts, generation_config=config, seed=1)
    assert out.sequences == greedy(target, ragged_prompts, max_new_tokens=MAX_NEW).sequences
    sampled = greedy(target, ragged_prompts, generation_config=config, temperature=0.7, seed=1)  # the keyword samples
    assert sampled.sequences != out.sequences


def test_a_batch_padded_wider_than_its_longest_prompt_keeps_transformers_lengths_and_layout(target, ragged_prompts):
    """A tokenizer's ``padding="max_length"`` or ``pad_to_multiple_of``: ``max_length`` counts from the padded width
    and ``padded()`` keeps the input as it was given, its pad ids included."""
    ids, mask = left_padded(ragged_prompts)
    ids, mask = torch.cat([torch.full((len(ids), 3), 9), ids], 1), torch.cat([torch.zeros(len(ids), 3).long(), mask], 1)
    width = ids.shape[1]
    for kwargs in (dict(max_length=width + 5), dict(max_new_tokens=6)):
        expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=0, **kwargs)
        out = dk.generate(target, input_ids=ids, attention_mask=mask, pad_token_id=0, eos_token_id=(), **kwargs)
        assert torch.equal(out.padded(), expected), kwargs


def test_a_streamer_is_released_when_the_call_is_refused_before_it_starts(target, ragged_prompts):
    for kwargs in (dict(repetition_penalty=-1.0), dict(prompts=ragged_prompts)):
        streamer = Recorder()
        with pytest.raises(ConfigError):
            greedy(target, kwargs.pop("prompts", ragged_prompts[:1]), streamer=streamer, max_new_tokens=2, **kwargs)
        assert streamer.ended == 1, kwargs


def test_keywords_that_cannot_change_the_output_are_ignored(target, ragged_prompts):
    harmless = dict(use_cache=True, num_beams=1, output_scores=False, return_dict_in_generate=False)
    out = greedy(target, ragged_prompts, max_new_tokens=4, **harmless)
    assert out.sequences == greedy(target, ragged_prompts, max_new_tokens=4).sequences


# ------------------------------------------------------------------------------ stop strings (real tokenizer)
@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from decodekit.models.zoo import cached_model_dir

    return AutoTokenizer.from_pretrained(cached_model_dir("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def stop_case(tokenizer):
    """A tiny model over SmolLM2's vocabulary, three prompts, a stop string per prompt spanning the boundary of its
    generated tokens 9 and 10 (overhanging both), and transformers' greedy output with those stop strings."""
    model = tiny_llama(3, vocab=len(tokenizer), hidden=32, init=0.5)
    prompts = [tokenizer(t)["input_ids"] for t in ("def add(a, b):", "The capital of France", "1, 2, 3, 4")]
    free = [model.generate(torch.tensor([p]), max_new_tokens=30, do_sample=False)[0, len(p) :] for p in prompts]
    stops = []
    for tokens in free:
        head, both = tokenizer.decode(tokens[:10]), tokenizer.decode(tokens[:11])
        stops.append(both[len(head) - 2 : len(head) + 1])
    expected = [
        model.generate(torch.tensor([p]), max_new_tokens=30, do_sample=False, stop_strings=stops, tokenizer=tokenizer)[
            0, len(p) :
        ].tolist()
        for p in prompts
    ]
    assert any(len(e) < 30 for e in expected)
    return model, prompts, stops, expected


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["none", "ngram", "model-self"])
def test_stop_strings_stop_where_transformers_stops(tokenizer, stop_case, drafter):
    model, prompts, stops, expected = stop_case
    make = {"none": lambda: None, "ngram": NGramDrafter, "model-self": lambda: ModelDrafter(model)}[drafter]
    out = dk.generate(
        model, prompts, make(), max_new_tokens=30, eos_token_id=(), stop_strings=stops, tokenizer=tokenizer
    )
    assert out.sequences == expected
    assert out.finish_reasons == ["stop_string" if len(e) < 30 else "length" for e in expected]
