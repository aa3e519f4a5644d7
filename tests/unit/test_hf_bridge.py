"""decodekit inside transformers' generate(custom_generate=decodekit.hf.custom_generate)."""

from __future__ import annotations

import functools

import pytest
import torch
import transformers
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    TopPLogitsWarper,
)
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.streamers import BaseStreamer

import decodekit.hf as bridge
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.errors import ConfigError
from decodekit.hf.options import CRITERIA_OPTIONS, PROCESSOR_OPTIONS, by_class, pad_token
from decodekit.models.tiny import perturbed
from decodekit.policies import FixedLength

MAX_NEW = 40
PAD = 0


@pytest.fixture(scope="module")
def batch(ragged_prompts):
    """Three ragged prompts, left-padded with ``PAD``: ``(input_ids [3, T], attention_mask [3, T])``."""
    prompts = ragged_prompts[:3]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.fixture(scope="module")
def eos(target, batch):
    """A token transformers' greedy decoding produces mid-way in row 0 but never in row 1 (which runs full length)."""
    ids, mask = batch
    free = target.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=PAD)
    rows = free[:, ids.shape[1] :].tolist()
    for j in range(4, MAX_NEW - 4):
        token = rows[0][j]
        if token not in rows[0][:j] and token not in rows[1] and token != PAD:
            return token
    pytest.fail("no usable EOS token in this model's greedy output")


@pytest.fixture(scope="module")
def reference(target, batch, eos):
    """transformers' own batched greedy output: prompt + generated, ``PAD`` after each row's EOS."""
    ids, mask = batch
    out = target.generate(
        ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=PAD
    )
    row0 = out[0, ids.shape[1] :].tolist()
    assert eos in row0 and row0.index(eos) < MAX_NEW - 4 and (out[0, -3:] == PAD).all()  # padding is exercised
    assert out.shape[1] == ids.shape[1] + MAX_NEW  # row 1 runs the full length
    return out


def bridged(model, batch, **kwargs):
    ids, mask = batch
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("pad_token_id", PAD)
    return model.generate(ids, attention_mask=mask, custom_generate=bridge.custom_generate, **kwargs)


@pytest.fixture(scope="module")
def drafters(target):
    return {
        "none": None,
        "ngram": NGramDrafter(),
        "model-noisy": ModelDrafter(perturbed(target, 0.2, seed=1)),  # accepts some
        "model-self": ModelDrafter(target),  # accepts everything
    }


@pytest.mark.parametrize("name", ["none", "ngram", "model-noisy", "model-self"])
def test_greedy_equals_transformers(target, batch, eos, reference, drafters, name):
    out = bridged(target, batch, drafter=drafters[name], policy=FixedLength(3), do_sample=False, eos_token_id=eos)
    assert out.dtype == torch.long
    assert torch.equal(out, reference)
    if name in ("ngram", "model-noisy"):  # the comparison must exercise partial acceptance, not only rejection
        stats = bridged(
            target, batch, drafter=drafters[name], do_sample=False, eos_token_id=eos, return_dict_in_generate=True
        ).stats
        assert 0 < stats.accepted < stats.drafted


def test_return_dict_carries_sequences_and_stats(target, batch, eos, reference, drafters):
    out = bridged(
        target,
        batch,
        drafter=drafters["model-noisy"],
        do_sample=False,
        eos_token_id=eos,
        return_dict_in_generate=True,
    )
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, reference)
    assert out.scores is None and out.logits is None
    assert getattr(out, "cache", None) is None and getattr(out, "past_key_values", None) is None  # 5.24 / older
    assert out.finish_reasons[0] == "eos" and out.finish_reasons[1] == "length"
    rows = reference[:, batch[0].shape[1] :].tolist()
    assert out.stats.generated == sum(r.index(eos) + 1 if eos in r else len(r) for r in rows)
    assert 0 < out.stats.accepted < out.stats.drafted


def test_max_length_counts_from_the_padded_width(target, batch, reference):
    out = bridged(target, batch, max_new_tokens=None, max_length=batch[0].shape[1] + 5, do_sample=False)
    assert out.shape == (3, batch[0].shape[1] + 5)
    free = target.generate(
        batch[0], attention_mask=batch[1], max_length=batch[0].shape[1] + 5, do_sample=False, pad_token_id=PAD
    )
    assert torch.equal(out, free)


def test_sampling_is_reproducible_with_a_seed(target, batch, drafters):
    kwargs = dict(drafter=drafters["model-noisy"], do_sample=True, temperature=0.9, top_p=0.95)
    first = bridged(target, batch, seed=123, **kwargs)
    again = bridged(target, batch, seed=123, **kwargs)
    other = bridged(target, batch, seed=124, **kwargs)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_top_k_one_sampling_is_greedy(target, batch, eos, reference, drafters):
    out = bridged(target, batch, drafter=drafters["ngram"], do_sample=True, top_k=1, eos_token_id=eos, seed=0)
    assert torch.equal(out, reference)


class Spy:
    """Records the keyword arguments the bridge passes to decodekit.generate."""

    def __init__(self) -> None:
        self.kwargs: dict = {}
        self.real = bridge.generate

    def __call__(self, *args, **kwargs):
        self.kwargs = kwargs
        return self.real(*args, **kwargs)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (dict(do_sample=False, temperature=0.7, top_k=5), dict(temperature=0.0, top_k=None, top_p=None)),
        (dict(do_sample=True, temperature=0.7, top_k=5, top_p=0.9), dict(temperature=0.7, top_k=5, top_p=0.9)),
        # transformers' global default when sampling is top_k=50; the bridge uses what generation_config says
        (dict(do_sample=True), dict(temperature=1.0, top_k=50, top_p=None)),
        (dict(do_sample=True, top_k=0, top_p=1.0), dict(temperature=1.0, top_k=None, top_p=None)),
        (dict(do_sample=True, max_new_tokens=None, max_length=20), dict(max_new_tokens=20 - 13)),
        (dict(do_sample=False, eos_token_id=[5, 9]), dict(eos_token_id=(5, 9))),
        (dict(do_sample=False, eos_token_id=None), dict(eos_token_id=())),
        (dict(do_sample=True, seed=7), dict(seed=7)),
    ],
)
def test_generation_config_mapping(target, batch, monkeypatch, options, expected):
    spy = Spy()
    monkeypatch.setattr(bridge, "generate", spy)
    bridged(target, batch, **{"max_new_tokens": 4, **options})
    assert {k: spy.kwargs[k] for k in expected} == expected


def test_num_return_sequences_samples_each_copy(target, batch):
    out = bridged(target, batch, do_sample=True, num_return_sequences=2, max_new_tokens=8, seed=3)
    ids = batch[0]
    assert out.shape == (6, ids.shape[1] + 8)
    assert torch.equal(out[:, : ids.shape[1]], ids.repeat_interleave(2, 0))


class Recorder(BaseStreamer):
    def __init__(self) -> None:
        self.puts: list[torch.Tensor] = []
        self.ends = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value)

    def end(self) -> None:
        self.ends += 1


def test_transformers_streamer_batch_one(target, drafters):
    ids = torch.tensor([[5, 17, 3, 99, 5, 17, 3]])
    streamer = Recorder()
    out = target.generate(
        ids,
        custom_generate=bridge.custom_generate,
        drafter=drafters["model-self"],
        max_new_tokens=12,
        do_sample=False,
        streamer=streamer,
    )
    assert torch.equal(streamer.puts[0], ids)  # transformers puts the prompt itself
    assert torch.cat(streamer.puts[1:]).tolist() == out[0, ids.shape[1] :].tolist()
    assert max(len(p) for p in streamer.puts[1:]) > 1  # accepted drafts stream several tokens at once
    assert streamer.ends == 1


@pytest.mark.parametrize("version", ["5.20.0", "5.23.0", "5.99.1.dev0"])
def test_verified_transformers_releases(monkeypatch, target, drafters, version):
    monkeypatch.setattr(transformers, "__version__", version)
    test_transformers_streamer_batch_one(target, drafters)


@pytest.mark.parametrize("version", ["6.0.0", "5.19.1", "4.57.0"])
def test_streamer_on_an_unverified_transformers_is_refused_and_ended(monkeypatch, target, version):
    monkeypatch.setattr(transformers, "__version__", version)
    streamer = Recorder()
    with pytest.raises(ConfigError, match=r"decodekit\.generate\(.*streamer=fn"):
        target.generate(
            torch.tensor([[5, 17, 3]]),
            custom_generate=bridge.custom_generate,
            max_new_tokens=4,
            do_sample=False,
            streamer=streamer,
        )
    assert len(streamer.puts) == 1 and streamer.ends == 1  # only the prompt, then released


def test_unverified_transformers_without_streamer_still_works(monkeypatch, target, batch, eos, reference):
    monkeypatch.setattr(transformers, "__version__", "6.0.0")
    assert torch.equal(bridged(target, batch, do_sample=False, eos_token_id=eos), reference)
    with pytest.raises(ConfigError, match="ModelDrafter"):  # an assistant model is still seen, and refused
        bridged(target, batch, assistant_model=target, do_sample=False)


def foreign_generate(model, input_ids, custom_generate, streamer=None, assistant_model=None):
    """A ``generate`` the bridge cannot verify, which drops ``streamer`` as transformers does."""
    config = GenerationConfig(max_length=input_ids.shape[1] + 4, do_sample=False)
    return custom_generate(model, input_ids, generation_config=config)


@pytest.mark.parametrize("wrap", [lambda f: f, lambda f: functools.partial(f, seed=0)])
def test_streamer_dropped_by_an_unknown_generate_is_refused(target, wrap):
    ids = torch.tensor([[5, 17, 3]])
    with pytest.raises(ConfigError, match="streamer=Recorder"):
        foreign_generate(target, ids, wrap(bridge.custom_generate), streamer=Recorder())
    assert foreign_generate(target, ids, wrap(bridge.custom_generate)).shape == (1, 3 + 4)  # nothing to drop


def test_streamer_given_to_the_bridge_itself_is_used(monkeypatch, target):
    monkeypatch.setattr(transformers, "__version__", "6.0.0")  # no frame is read when the bridge gets it
    ids = torch.tensor([[5, 17, 3, 99]])
    streamer = Recorder()
    out = foreign_generate(target, ids, functools.partial(bridge.custom_generate, streamer=streamer))
    assert torch.cat(streamer.puts).tolist() == out[0, ids.shape[1] :].tolist() and streamer.ends == 1


def test_streamer_with_a_batch_is_refused_and_ended(target, batch):
    streamer = Recorder()
    with pytest.raises(ConfigError, match="one prompt"):
        bridged(target, batch, do_sample=False, streamer=streamer)
    assert streamer.ends == 1  # a consumer waiting on the streamer is released


class AddOne(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores + 1


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(repetition_penalty=1.3), "repetition_penalty"),
        (dict(no_repeat_ngram_size=2), "no_repeat_ngram_size"),
        (dict(min_new_tokens=3, eos_token_id=5), "min_new_tokens"),
        (dict(do_sample=True, min_p=0.1), "min_p"),
        (dict(do_sample=True, typical_p=0.5), "typical_p"),
        (dict(logits_processor=LogitsProcessorList([AddOne()])), "AddOne"),
        (dict(num_beams=2), "num_beams"),
        (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha"),
        (dict(prompt_lookup_num_tokens=3), "NGramDrafter"),
        (dict(max_time=10.0), "max_time"),
        (dict(return_dict_in_generate=True, output_scores=True), "output_scores"),
        (dict(do_sample=True, top_k=5, logits_processor=LogitsProcessorList([TopPLogitsWarper(0.9)])), "order"),
    ],
)
def test_unsupported_options_are_refused(target, batch, options, match):
    with pytest.raises(ConfigError, match=match):
        bridged(target, batch, **options)


class MyPenalty(RepetitionPenaltyLogitsProcessor):
    pass


class MyCriterion(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_refusal_advice_is_keyed_by_class(target, batch):
    assert all(isinstance(cls, type) for cls in (*PROCESSOR_OPTIONS, *CRITERIA_OPTIONS))
    assert PROCESSOR_OPTIONS[RepetitionPenaltyLogitsProcessor].startswith("repetition_penalty")
    # a user's subclass is the user's own processor: the advice names it, not the generate() option
    with pytest.raises(ConfigError, match="a MyPenalty in logits_processor"):
        bridged(target, batch, logits_processor=LogitsProcessorList([MyPenalty(1.2)]))
    with pytest.raises(ConfigError, match="a MyCriterion in stopping_criteria"):
        bridged(target, batch, stopping_criteria=[MyCriterion()])


def test_advice_for_classes_missing_from_this_transformers_is_skipped():
    advice = by_class({"MinPLogitsWarper": "min_p (remove it)", "NoSuchLogitsWarper": "gone (remove it)"})
    assert advice == {MinPLogitsWarper: "min_p (remove it)"}


def test_pad_token_falls_back_to_the_first_eos(target, batch, eos):
    ids, mask = batch
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos)
    out = bridged(target, batch, do_sample=False, eos_token_id=[eos, 1000], pad_token_id=None)
    assert torch.equal(out, expected)
    row0 = out[0, ids.shape[1] :].tolist()
    assert row0[row0.index(eos) :] == [eos] * (MAX_NEW - row0.index(eos))  # EOS, then EOS as padding


@pytest.mark.parametrize(
    ("config", "pad"),
    [
        (GenerationConfig(pad_token_id=3, eos_token_id=[5, 9]), 3),
        (GenerationConfig(pad_token_id=0, eos_token_id=5), 0),
        (GenerationConfig(eos_token_id=[5, 9]), 5),
        (GenerationConfig(eos_token_id=7), 7),
        (GenerationConfig(eos_token_id=[]), None),
        (GenerationConfig(), None),
    ],
)
def test_pad_token_from_public_fields(config, pad):
    assert pad_token(config) == pad


def test_inputs_embeds_are_refused(target, batch):
    embeds = target.get_input_embeddings()(batch[0])
    with pytest.raises(ConfigError, match="inputs_embeds"):
        target.generate(
            inputs_embeds=embeds,
            attention_mask=batch[1],
            custom_generate=bridge.custom_generate,
            max_new_tokens=4,
            pad_token_id=PAD,
        )


def test_assistant_model_is_refused(target, batch):
    with pytest.raises(ConfigError, match="ModelDrafter"):
        bridged(target, batch, assistant_model=perturbed(target, 0.1, seed=2), do_sample=False)


def test_right_padding_is_refused(target, batch):
    ids, mask = batch
    with pytest.raises(ConfigError, match="padding_side='left'"):
        bridged(target, (ids, mask.flip(1)), do_sample=False)


def test_direct_call_is_refused(target, batch):
    with pytest.raises(ConfigError, match="custom_generate="):
        bridge.custom_generate(target, batch[0])
