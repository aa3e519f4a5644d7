"""transformers' prepared generation options mapped to decodekit's, and the refusal of those decodekit cannot honour.

The bridge reads what ``GenerationMixin.generate`` built (the ``GenerationConfig``, the logits processors and the
stopping criteria), maps greedy / sampling, temperature / top-k / top-p, max length and EOS to decodekit's
arguments, and refuses everything else with a :class:`~decodekit.errors.ConfigError` naming the ``generate()``
option to drop (see :mod:`decodekit.hf`).
"""

from __future__ import annotations

from typing import Any

import torch
import transformers.generation
from transformers.generation.configuration_utils import GenerationConfig, GenerationMode
from transformers.generation.logits_process import (
    LogitNormalization,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from decodekit.errors import ConfigError

__all__ = [
    "CRITERIA_OPTIONS",
    "PROCESSOR_OPTIONS",
    "by_class",
    "check_mode",
    "check_outputs",
    "pad_token",
    "sampling_options",
    "stopping_options",
]

_ALLOWED_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)


def check_mode(config: GenerationConfig, assistant_model: Any) -> None:
    """Greedy or sampling with one beam and no transformers-side drafting; anything else is refused.

    ``assistant_model`` is the one ``generate()`` was given (transformers keeps it out of ``config``)."""
    if assistant_model is not None or config.get_generation_mode() == GenerationMode.ASSISTED_GENERATION:
        raise ConfigError(
            "assisted generation (assistant_model / prompt_lookup_num_tokens / assistant_early_exit / use_mtp) "
            "cannot run through the decodekit bridge: remove it and pass a decodekit drafter instead, e.g. "
            "drafter=decodekit.drafters.ModelDrafter(assistant_model) or drafter=decodekit.drafters.NGramDrafter()"
        )
    mode = config.get_generation_mode()
    if mode not in _ALLOWED_MODES:
        raise ConfigError(
            f"generation mode {mode.value!r} is not supported by the decodekit bridge (num_beams={config.num_beams}, "
            f"penalty_alpha={config.penalty_alpha}, dola_layers={config.dola_layers}, "
            f"constraints/force_words_ids set={config.constraints is not None or config.force_words_ids is not None})"
            ": decodekit decodes one sequence per prompt, greedily (do_sample=False) or by sampling (do_sample=True); "
            "set num_beams=1 and remove penalty_alpha / dola_layers / constraints / force_words_ids"
        )


def check_outputs(config: GenerationConfig) -> None:
    """Refuse per-step outputs (scores, logits, attentions, hidden states) that decodekit does not keep."""
    if not config.return_dict_in_generate:
        return  # transformers also ignores these flags without return_dict_in_generate
    asked = [
        name
        for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
        if getattr(config, name, False)
    ]
    if asked:
        raise ConfigError(
            f"{', '.join(asked)} cannot be returned by the decodekit bridge (decodekit does not keep per-step scores, "
            "logits, attentions or hidden states); set them to False -- the output has sequences, stats and "
            "finish_reasons"
        )


def by_class(advice: dict[str, str]) -> dict[type, str]:
    """``advice`` keyed by the ``transformers.generation`` classes it names; names this release lacks are skipped."""
    return {
        cls: text
        for name, text in advice.items()
        if isinstance(cls := getattr(transformers.generation, name, None), type)
    }


# processor class -> the generate() option that adds it and how to turn it off
PROCESSOR_OPTIONS = by_class(
    {
        "RepetitionPenaltyLogitsProcessor": "repetition_penalty (pass repetition_penalty=1.0)",
        "EncoderRepetitionPenaltyLogitsProcessor": "encoder_repetition_penalty (pass encoder_repetition_penalty=1.0)",
        "NoRepeatNGramLogitsProcessor": "no_repeat_ngram_size (pass no_repeat_ngram_size=0)",
        "EncoderNoRepeatNGramLogitsProcessor": "encoder_no_repeat_ngram_size (pass encoder_no_repeat_ngram_size=0)",
        "MinLengthLogitsProcessor": "min_length (pass min_length=0)",
        "MinNewTokensLengthLogitsProcessor": "min_new_tokens (pass min_new_tokens=0)",
        "NoBadWordsLogitsProcessor": "bad_words_ids (remove it)",
        "SequenceBiasLogitsProcessor": "sequence_bias (remove it)",
        "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn (remove it)",
        "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id (remove it)",
        "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id (remove it)",
        "InfNanRemoveLogitsProcessor": "remove_invalid_values (pass remove_invalid_values=False)",
        "ExponentialDecayLengthPenalty": "exponential_decay_length_penalty (remove it)",
        "SuppressTokensLogitsProcessor": "suppress_tokens (remove it)",
        "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens (remove it)",
        "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale (pass guidance_scale=1.0)",
        "MinPLogitsWarper": "min_p (remove it)",
        "TypicalLogitsWarper": "typical_p (pass typical_p=1.0)",
        "EpsilonLogitsWarper": "epsilon_cutoff (pass epsilon_cutoff=0.0)",
        "EtaLogitsWarper": "eta_cutoff (pass eta_cutoff=0.0)",
        "TopHLogitsWarper": "top_h (remove it)",
        "WatermarkLogitsProcessor": "watermarking_config (remove it)",
        "SynthIDTextWatermarkLogitsProcessor": "watermarking_config (remove it)",
    }
)
_WARPER_ORDER = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)


def _unsupported(items: list[Any], allowed: tuple[type, ...], options: dict[type, str], where: str) -> list[str]:
    """How to turn off each item whose type is not ``allowed``: its generate() option, or removing it from ``where``."""
    return [
        options.get(type(i), f"a {type(i).__name__} in {where} (remove it)")
        for i in items
        if not isinstance(i, allowed)
    ]


def sampling_options(
    config: GenerationConfig, processors: LogitsProcessorList
) -> tuple[float, int | None, float | None]:
    """decodekit's ``(temperature, top_k, top_p)`` from the processors transformers built (greedy: temperature 0)."""
    names = _unsupported(processors, (*_WARPER_ORDER, LogitNormalization), PROCESSOR_OPTIONS, "logits_processor")
    if names:
        raise ConfigError(
            "the decodekit bridge applies only temperature, top_k and top_p; this call also asks for "
            f"{'; '.join(names)}. Drop those options (from the call or the model's generation_config), call "
            "decodekit.generate(model, prompts, drafter, ...) with them (it applies repetition_penalty, "
            "no_repeat_ngram_size, bad_words_ids, suppress_tokens, min_new_tokens and logits_processor to target "
            "and drafter alike), or use model.generate without custom_generate"
        )
    if not config.do_sample:
        return 0.0, None, None  # warpers cannot change the argmax: greedy ignores them, as transformers does
    warpers = [p for p in processors if isinstance(p, _WARPER_ORDER)]
    ranks = [next(i for i, kind in enumerate(_WARPER_ORDER) if isinstance(p, kind)) for p in warpers]
    if ranks != sorted(ranks):
        raise ConfigError(
            "decodekit warps logits in the order temperature, top_k, top_p, but this call applies "
            f"{[type(p).__name__ for p in warpers]}; pass temperature / top_k / top_p as generate() options instead "
            "of logits_processor"
        )
    temperature, top_k, top_p = 1.0, None, None
    for p in warpers:
        if getattr(p, "min_tokens_to_keep", 1) != 1:
            raise ConfigError(f"{type(p).__name__} with min_tokens_to_keep != 1 is not supported; use the default 1")
        if isinstance(p, TemperatureLogitsWarper):
            temperature = float(p.temperature)
        elif isinstance(p, TopKLogitsWarper):
            top_k = int(p.top_k)
        else:
            top_p = float(p.top_p)
    if temperature <= 0:
        raise ConfigError(f"do_sample=True needs temperature > 0, got {temperature}; use do_sample=False for greedy")
    return temperature, top_k, top_p


# stopping criterion class -> the generate() option that adds it and how to turn it off
CRITERIA_OPTIONS = by_class(
    {
        "MaxTimeCriteria": "max_time (remove it)",
        "StopStringCriteria": "stop_strings (remove it; cut the decoded text instead)",
        "ConfidenceCriteria": "assistant_confidence_threshold (remove it)",
    }
)


def stopping_options(config: GenerationConfig, criteria: StoppingCriteriaList) -> tuple[int, tuple[int, ...]]:
    """``(max_length, eos ids)`` from the stopping criteria transformers built; other criteria are refused."""
    names = _unsupported(criteria, (MaxLengthCriteria, EosTokenCriteria), CRITERIA_OPTIONS, "stopping_criteria")
    if names:
        raise ConfigError(
            "the decodekit bridge stops rows only at max_new_tokens / max_length and at eos_token_id; this call also "
            f"asks for {'; '.join(names)}"
        )
    lengths = [c.max_length for c in criteria if isinstance(c, MaxLengthCriteria)]
    max_length = min(lengths) if lengths else config.max_length
    if max_length is None:
        raise ConfigError("set max_new_tokens (or max_length) to bound the generation")
    eos: list[int] = []
    for c in criteria:
        if isinstance(c, EosTokenCriteria):
            eos.extend(int(t) for t in torch.as_tensor(c.eos_token_id).flatten().tolist())
    return int(max_length), tuple(dict.fromkeys(eos))


def pad_token(config: GenerationConfig) -> int | None:
    """``pad_token_id``, else the first EOS id (transformers' own fallback when it prepares special tokens)."""
    for ids in (config.pad_token_id, config.eos_token_id):
        flat = torch.as_tensor(ids if ids is not None else []).flatten()
        if flat.numel():
            return int(flat[0])
    return None
