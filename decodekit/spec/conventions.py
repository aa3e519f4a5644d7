"""transformers' ``generate()`` conventions for :func:`decodekit.generate`.

Accepted, as in ``model.generate``: a ``GenerationConfig`` (its set fields are the defaults; keywords override
them), ``do_sample``, ``max_length``, ``min_new_tokens``, ``repetition_penalty``, ``no_repeat_ngram_size``,
``bad_words_ids``, ``suppress_tokens``, ``logits_processor``, ``stop_strings`` (with ``tokenizer``),
``pad_token_id``, ``input_ids`` / ``attention_mask`` (so ``decodekit.generate(model, **tokenizer(texts))`` works) and
a transformers streamer. Differences, each deliberate:

* keywords alone never add transformers' sampling defaults: ``do_sample=True`` samples at temperature 1.0 with no
  top-k unless ``top_k`` is given (a ``GenerationConfig`` brings the values it holds);
* processors see each position's exact context, never padding (:mod:`decodekit.spec.processors`).

Every other ``generate()`` option is refused by name with what to do instead (:data:`ADVICE`), and so is a
``GenerationConfig`` field that would change the output; fields and keywords that cannot change it
(``bos_token_id``, ``use_cache``, ``num_beams=1``, ``output_scores=False``, ...) are ignored. A model's own
``GenerationConfig`` (``model.generation_config``) gives its EOS and pad ids; what else it sets that would change the
output is named in one warning per model, with how to apply it (``generation_config=model.generation_config``).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from decodekit.checks import describe, did_you_mean
from decodekit.errors import ConfigError, ConfigTypeError

__all__ = [
    "ADVICE",
    "CONFIG_KEYWORDS",
    "REFUSED_PROCESSORS",
    "WARPING",
    "config_fields",
    "refuse_extra",
    "warn_model_config",
]

_PROCESSOR = "pass a LogitsProcessor for it in logits_processor=[...] (called as f(input_ids, scores))"
_WARPER = (
    "pass transformers' {cls} in logits_processor=[...]; decodekit applies processors before temperature, so use "
    "it with temperature=1.0 to get transformers' result"
)
ADVICE: dict[str, str] = {
    "num_beams": "decodekit decodes one sequence per prompt, greedily or by sampling: remove it (num_beams=1)",
    "num_beam_groups": "beam search is not supported: remove it",
    "diversity_penalty": "beam search is not supported: remove it",
    "penalty_alpha": "contrastive search is not supported: remove it",
    "dola_layers": "DoLa decoding is not supported: remove it",
    "constraints": "constrained beam search is not supported: remove it",
    "force_words_ids": "constrained beam search is not supported: remove it",
    "num_return_sequences": "repeat each prompt in prompts, with seed=[...] (one seed per row) for independent samples",
    "assistant_model": "pass drafter=decodekit.drafters.ModelDrafter(assistant_model)",
    "prompt_lookup_num_tokens": "pass drafter=decodekit.drafters.NGramDrafter(), "
    "policy=decodekit.policies.FixedLength(k)",
    "assistant_early_exit": "pass a decodekit drafter (drafter=...)",
    "output_scores": "decodekit returns no per-step scores; read dk.Round (target_probs) in an observe() hook",
    "output_logits": "decodekit returns no per-step logits; read dk.Round in an observe() hook",
    "output_attentions": "decodekit returns no attentions: remove it",
    "output_hidden_states": "decodekit returns no hidden states; read dk.Round (hidden) in an observe() hook",
    "return_dict_in_generate": "decodekit.generate always returns a GenerationOutput; out.padded() is model.generate's "
    "[B, T + G] tensor",
    "min_length": "use min_new_tokens (counted per row from its own prompt)",
    "max_time": "bound rows with max_new_tokens, eos_token_id or stop_strings",
    "stopping_criteria": "stop rows with eos_token_id, stop_strings or max_new_tokens",
    "prefix_allowed_tokens_fn": "write a processor f(input_ids, scores) -> scores and pass logits_processor=[f]",
    "past_key_values": "decodekit keeps its own cache: remove it",
    "cache": "decodekit keeps its own cache: remove it",
    "use_cache": "decodekit always uses its own KV cache: remove it",
    "synced_gpus": "decodekit does not shard one generation over processes: remove it",
    "guidance_scale": "classifier-free guidance is not supported: remove it",
    "min_p": _WARPER.format(cls="MinPLogitsWarper"),
    "typical_p": _WARPER.format(cls="TypicalLogitsWarper"),
    "epsilon_cutoff": _WARPER.format(cls="EpsilonLogitsWarper"),
    "eta_cutoff": _WARPER.format(cls="EtaLogitsWarper"),
    "top_h": _WARPER.format(cls="TopHLogitsWarper"),
    "sequence_bias": "pass SequenceBiasLogitsProcessor(sequence_bias) in logits_processor=[...]",
    "encoder_repetition_penalty": "decodekit runs decoder-only models: remove it",
    "encoder_no_repeat_ngram_size": "decodekit runs decoder-only models: remove it",
    "forced_bos_token_id": _PROCESSOR,
    "forced_eos_token_id": _PROCESSOR,
    "begin_suppress_tokens": _PROCESSOR,
    "exponential_decay_length_penalty": _PROCESSOR,
    "renormalize_logits": "decodekit normalises after warping anyway: remove it",
    "remove_invalid_values": _PROCESSOR,
    "watermarking_config": "pass transformers' watermark processor in logits_processor=[...]",
    "cache_implementation": "decodekit keeps its own cache: remove it",
}

# GenerationConfig fields that cannot change decodekit's output: ignored (value -> whether it is harmless)
_HARMLESS: dict[str, Callable[[Any], bool]] = {
    "bos_token_id": lambda v: True,
    "decoder_start_token_id": lambda v: True,
    "use_cache": lambda v: True,
    "cache_implementation": lambda v: True,
    "return_dict_in_generate": lambda v: True,
    "transformers_version": lambda v: True,
    "_from_model_config": lambda v: True,
    "length_penalty": lambda v: True,  # beam search only
    "early_stopping": lambda v: True,  # beam search only
    "renormalize_logits": lambda v: True,
    "num_beams": lambda v: v == 1,
    "num_beam_groups": lambda v: v == 1,
    "num_return_sequences": lambda v: v == 1,
    "diversity_penalty": lambda v: v == 0,
    "min_length": lambda v: v == 0,
    "typical_p": lambda v: v == 1,
    "epsilon_cutoff": lambda v: v == 0,
    "eta_cutoff": lambda v: v == 0,
    "guidance_scale": lambda v: v == 1,
    "encoder_repetition_penalty": lambda v: v == 1,
    "encoder_no_repeat_ngram_size": lambda v: v == 0,
    "output_scores": lambda v: not v,
    "output_logits": lambda v: not v,
    "output_attentions": lambda v: not v,
    "output_hidden_states": lambda v: not v,
    "remove_invalid_values": lambda v: not v,
}

# what a GenerationConfig may set, as decodekit.generate's keyword of the same name
CONFIG_KEYWORDS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "max_new_tokens",
    "max_length",
    "eos_token_id",
    "pad_token_id",
    "min_new_tokens",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "suppress_tokens",
    "stop_strings",
)


def config_fields(config: Any) -> dict[str, Any]:
    """The fields ``config`` (a ``GenerationConfig``, or None) sets; refuses those decodekit cannot honour."""
    if config is None:
        return {}
    from transformers import GenerationConfig

    if not isinstance(config, GenerationConfig):
        raise ConfigTypeError(f"generation_config must be a transformers GenerationConfig, got {describe(config)}")
    fields = {k: v for k, v in config.to_diff_dict().items() if v is not None}
    refused = [k for k, v in fields.items() if k not in CONFIG_KEYWORDS and not _HARMLESS.get(k, _never)(v)]
    if refused:
        advice = "; ".join(
            f"{k}={fields[k]!r}: {ADVICE.get(k, 'not supported by decodekit: unset it')}" for k in refused
        )
        raise ConfigError(f"generation_config sets options decodekit.generate cannot honour: {advice}")
    return {k: v for k, v in fields.items() if k in CONFIG_KEYWORDS}


def _never(value: Any) -> bool:
    return False


def refuse_extra(extra: Mapping[str, Any]) -> None:
    """Refuse keywords :func:`decodekit.generate` does not take, by name with what to do instead; a value that
    cannot change its output (``use_cache=True``, ``num_beams=1``, ``output_scores=False``, ...) is ignored, as in a
    ``GenerationConfig``, except ``return_dict_in_generate=True`` (the result is a ``GenerationOutput`` either way)."""
    for name, value in extra.items():
        harmless = _HARMLESS.get(name, _never)
        if name == "return_dict_in_generate":
            harmless = _never if value else harmless
        if harmless(value):
            continue
        if name in ADVICE:
            raise ConfigError(f"decodekit.generate does not take {name}: {ADVICE[name]}")
        hint = did_you_mean(name, [*_KEYWORDS, *ADVICE])
        raise ConfigTypeError(f"decodekit.generate() got an unexpected keyword argument {name!r}{hint}")


_KEYWORDS = (
    *CONFIG_KEYWORDS,
    "generation_config",
    "logits_processor",
    "tokenizer",
    "input_ids",
    "attention_mask",
    "streamer",
    "seed",
    "debug",
)


REFUSED_PROCESSORS = {
    "PrefixConstrainedLogitsProcessor": "reads the batch index of each row, which decodekit's per-position calls do "
    "not keep: write a processor f(input_ids, scores) instead",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "runs the model with its own cache, once per step: not supported",
    "MinNewTokensLengthLogitsProcessor": "counts from one prompt length for the whole batch: pass min_new_tokens= "
    "instead (counted per row)",
    "MinLengthLogitsProcessor": "counts from one padded length for the whole batch: pass min_new_tokens= instead",
}


WARPING = ("temperature", "top_k", "top_p")  # what shapes sampling (and changes nothing without it)
_WARNED: weakref.WeakSet = weakref.WeakSet()  # models whose own GenerationConfig was reported
_TAKEN = ("eos_token_id", "pad_token_id")  # what decodekit.generate reads of a model's own GenerationConfig


def warn_model_config(model: Any, generation_config: Any, keywords: Mapping[str, Any]) -> None:
    """Say once per model which options its own ``GenerationConfig`` (a checkpoint's ``generation_config.json``,
    what ``model.generate`` starts from) sets that change the output and that this call, given no
    ``generation_config``, does not apply: ``decodekit.generate`` takes only its EOS and pad ids."""
    own = model.generation_config
    if own is None or generation_config is not None or model in _WARNED:
        return
    _WARNED.add(model)
    try:
        fields = {k: v for k, v in own.to_diff_dict().items() if v is not None}
    except (AttributeError, TypeError):  # not a transformers GenerationConfig
        return
    skipped = [k for k in CONFIG_KEYWORDS if k in fields and keywords.get(k) is None and k not in _TAKEN]
    if not fields.get("do_sample"):  # without sampling transformers ignores these too
        skipped = [k for k in skipped if k not in (*WARPING, "do_sample")]
    if skipped:
        warnings.warn(
            f"{type(model).__name__}'s own generation_config sets "
            + ", ".join(f"{k}={fields[k]!r}" for k in skipped)
            + ", which model.generate applies and decodekit.generate does not (its defaults are its own: greedy, 64 "
            "new tokens); pass generation_config=model.generation_config to apply them",
            stacklevel=3,
        )
