"""Bridge: run decodekit's speculative loop inside transformers' ``generate(custom_generate=...)``.

transformers prepares the inputs and the generation config as usual, then hands over to
:func:`custom_generate`, which runs :func:`decodekit.generate` with the drafter / verifier / policy given as extra
keyword arguments and returns what ``model.generate`` returns::

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import decodekit.hf
    from decodekit.drafters import ModelDrafter, NGramDrafter

    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path)
    batch = tok(["Hello", "The capital of France is"], return_tensors="pt", padding=True)
    out = model.generate(
        **batch,
        custom_generate=decodekit.hf.custom_generate,
        drafter=NGramDrafter(),              # or ModelDrafter(small_model), None = plain decoding
        max_new_tokens=64,
        do_sample=False,                     # greedy; do_sample=True uses temperature / top_k / top_p
        return_dict_in_generate=True,
    )
    out.sequences                            # [B, T + G]: prompt (left-padded, as given) + generated, pad after EOS
    out.stats.mean_acceptance_length         # decodekit's SpecStats of the call
    out.finish_reasons                       # per row, "eos" or "length"

Mapping from the prepared ``GenerationConfig`` (and the processors / criteria transformers built from it):

* ``do_sample=False`` -> greedy (decodekit temperature 0). ``do_sample=True`` -> decodekit sampling with exactly
  the temperature / top-k / top-p warpers transformers built: temperature 1.0 when it added no temperature warper,
  and top-k / top-p only when it added those warpers. Note that transformers fills in its global defaults when
  sampling (``top_k=50`` unless the call or the model's generation config says otherwise); the bridge uses that
  value, as ``model.generate(do_sample=True)`` would. Pass ``top_k=0`` / ``top_p=1.0`` to turn them off.
* ``max_new_tokens`` / ``max_length`` -> decodekit ``max_new_tokens = max_length - input_ids.shape[1]``
  (transformers counts ``max_length`` from the padded width, so every row gets the same budget, as in HF).
* ``eos_token_id`` -> decodekit ``eos_token_id`` (none = never stop early); ``pad_token_id`` (transformers falls
  back to the first EOS id) fills each row after it ends.
* ``seed`` (bridge argument) -> decodekit ``seed``; without it sampling draws from torch's global generator.
* ``num_return_sequences > 1`` with sampling is honoured: transformers has already repeated each prompt, and every
  copy is sampled independently.
* A transformers streamer (``streamer=``) works for batch size 1: transformers itself has put the prompt; the
  bridge puts each round's committed tokens as a 1-D tensor (several tokens when drafts are accepted), then calls
  ``end()``. transformers 5.x does not pass ``streamer`` on to a callable ``custom_generate``, so the bridge reads
  it from the calling ``GenerationMixin.generate`` frame.

Refused with :class:`~decodekit.errors.ConfigError` (the message says what to change), because decodekit's loop
cannot honour them and silently ignoring them would change the output: any logits processor other than the
temperature / top-k / top-p warpers (``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``,
``bad_words_ids``, ``min_p``, ``typical_p``, ``logits_processor=...``, ...), stopping criteria other than max length
and EOS (``stop_strings``, ``max_time``, ``stopping_criteria=...``), generation modes other than greedy / sampling
(``num_beams > 1``, ``penalty_alpha``, ``dola_layers``, ``assistant_model`` / ``prompt_lookup_num_tokens`` -- pass
a decodekit ``drafter`` instead), ``output_scores`` / ``output_logits`` / ``output_attentions`` /
``output_hidden_states`` (decodekit does not keep per-step scores), right or gapped padding, custom position ids,
a pre-filled ``past_key_values``, extra model inputs (``inputs_embeds``, ``token_type_ids``, ...), and a streamer
with batch size > 1.

The returned ``past_key_values`` is always None (decodekit's cache is not a transformers cache).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.configuration_utils import GenerationConfig, GenerationMode
from transformers.generation.logits_process import (
    LogitNormalization,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin

from decodekit.errors import ConfigError
from decodekit.generate import generate
from decodekit.interfaces import Drafter, LengthPolicy, Verifier
from decodekit.metrics import SpecStats
from decodekit.models import LanguageModel, load_model

__all__ = ["DecodeKitGenerateOutput", "custom_generate"]


@dataclass
class DecodeKitGenerateOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` (``sequences`` only: no scores, logits, attentions, hidden states or cache)
    plus decodekit's record of the call.

    Attributes:
        stats: the :class:`~decodekit.metrics.SpecStats` of the call (acceptance, tokens per step, timings).
        finish_reasons: per row, ``"eos"`` or ``"length"``.
    """

    stats: SpecStats | None = None
    finish_reasons: list[str] | None = None


def custom_generate(
    model: Any,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig | None = None,
    drafter: Drafter | None = None,
    verifier: Verifier | None = None,
    policy: LengthPolicy | None = None,
    seed: int | None = None,
    **model_kwargs: Any,
) -> torch.LongTensor | DecodeKitGenerateOutput:
    """Decode with decodekit from ``model.generate(..., custom_generate=custom_generate)``; see the module docstring.

    transformers calls this after preparing the inputs; do not call it directly.

    Args:
        model: the target, a transformers causal LM (the model ``generate`` was called on).
        input_ids: ``[B, T]`` prompts, left-padded; ``model_kwargs["attention_mask"]`` marks the real tokens
            (None when there is no padding).
        logits_processor, stopping_criteria, generation_config: prepared by ``generate``.
        drafter: a decodekit drafter (e.g. ``NGramDrafter()``, ``ModelDrafter(small_model)``); None = plain decoding.
        verifier: a decodekit verifier; default greedy when ``do_sample=False``, else rejection sampling.
        policy: a decodekit length policy; default ``FixedLength(4)``.
        seed: seeds decodekit's generator; the same seed gives the same output.
        **model_kwargs: the model inputs ``generate`` prepared (attention mask, position ids, an empty cache).

    Returns:
        ``LongTensor [B, T + G]``: ``input_ids`` followed by the generated tokens, right-padded with
        ``pad_token_id`` after each row's end (``G`` = the longest row's generation), as transformers returns; or
        a :class:`DecodeKitGenerateOutput` (``sequences``, ``stats``, ``finish_reasons``) when
        ``return_dict_in_generate=True``.
    """
    caller = _generate_call_locals()
    hf_streamer = caller.get("streamer")
    adapter = _StreamerAdapter(hf_streamer) if hf_streamer is not None else None
    try:
        return _run(
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            drafter,
            verifier,
            policy,
            seed,
            adapter,
            caller.get("assistant_model"),
            model_kwargs,
        )
    finally:
        if adapter is not None:
            adapter.end()  # also on errors, so a consumer of e.g. TextIteratorStreamer does not wait forever


def _run(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList | None,
    stopping_criteria: StoppingCriteriaList | None,
    config: GenerationConfig | None,
    drafter: Drafter | None,
    verifier: Verifier | None,
    policy: LengthPolicy | None,
    seed: int | None,
    streamer: _StreamerAdapter | None,
    assistant_model: Any,
    model_kwargs: dict[str, Any],
) -> torch.Tensor | DecodeKitGenerateOutput:
    if config is None:
        raise ConfigError(
            "decodekit.hf.custom_generate is called by transformers: use "
            "model.generate(input_ids, custom_generate=decodekit.hf.custom_generate, ...), or decodekit.generate()"
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise ConfigError("the decodekit bridge supports decoder-only causal LMs, not encoder-decoder models")
    if input_ids.ndim != 2:
        raise ConfigError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    _check_mode(config, assistant_model)
    _check_outputs(config)
    _check_model_kwargs(model_kwargs)
    temperature, top_k, top_p = _sampling(config, logits_processor or LogitsProcessorList())
    max_length, eos = _stopping(config, stopping_criteria or StoppingCriteriaList())
    mask = _attention_mask(input_ids, model_kwargs.get("attention_mask"))
    _check_positions(mask, model_kwargs.get("position_ids"))
    batch, width = input_ids.shape
    max_new_tokens = max_length - width
    if max_new_tokens < 1:
        raise ConfigError(
            f"max_length={max_length} leaves no room after the {width}-token input; set max_new_tokens instead"
        )
    if streamer is not None and batch != 1:
        raise ConfigError(
            f"a transformers streamer takes one sequence, but the batch has {batch} rows: pass one prompt "
            "(and num_return_sequences=1), or call decodekit.generate(..., streamer=fn) with fn(row, tokens)"
        )
    target = load_model(model)
    prompts = [row[m].tolist() for row, m in zip(input_ids, mask.to(input_ids.device))]
    pad = _pad_token(config)
    if pad is None:
        _check_no_padding_needed(target, prompts, max_new_tokens, eos)

    out = generate(
        target,
        prompts,
        drafter,
        verifier,
        policy,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos,
        seed=seed,
        streamer=streamer,
    )

    generated = max(len(s) for s in out.sequences)
    sequences = input_ids.new_full((batch, width + generated), pad if pad is not None else 0)
    sequences[:, :width] = input_ids
    for b, tokens in enumerate(out.sequences):
        sequences[b, width : width + len(tokens)] = torch.tensor(tokens, dtype=sequences.dtype)
    if not config.return_dict_in_generate:
        return sequences
    return DecodeKitGenerateOutput(sequences=sequences, stats=out.stats, finish_reasons=out.finish_reasons)


# --------------------------------------------------------------------------------------------------- mapping
_ALLOWED_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)


def _check_mode(config: GenerationConfig, assistant_model: Any) -> None:
    """Greedy or sampling with one beam and no transformers-side drafting; anything else is refused."""
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


def _check_outputs(config: GenerationConfig) -> None:
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


_MODEL_KWARGS_HANDLED = {"attention_mask", "position_ids", "past_key_values", "use_cache", "logits_to_keep"}


def _check_model_kwargs(model_kwargs: dict[str, Any]) -> None:
    extra = sorted(k for k, v in model_kwargs.items() if k not in _MODEL_KWARGS_HANDLED and v is not None)
    if extra:
        raise ConfigError(
            f"the decodekit bridge feeds the model input_ids only and cannot pass {', '.join(extra)}; remove "
            f"{'it' if len(extra) == 1 else 'them'} from the generate() call"
        )
    cache = model_kwargs.get("past_key_values")
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise ConfigError(
            "the decodekit bridge cannot continue from a filled past_key_values (decodekit keeps its own cache); "
            "pass the full prompt in input_ids without past_key_values"
        )


# processor class name -> the generate() option that adds it and how to turn it off
_PROCESSOR_OPTIONS = {
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
_WARPER_ORDER = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)


def _unsupported(items: list[Any], allowed: tuple[type, ...], options: dict[str, str], where: str) -> list[str]:
    """How to turn off each item whose type is not ``allowed``: its generate() option, or removing it from ``where``."""
    return [
        options.get(type(i).__name__, f"a {type(i).__name__} in {where} (remove it)")
        for i in items
        if not isinstance(i, allowed)
    ]


def _sampling(config: GenerationConfig, processors: LogitsProcessorList) -> tuple[float, int | None, float | None]:
    """decodekit's ``(temperature, top_k, top_p)`` from the processors transformers built (greedy: temperature 0)."""
    names = _unsupported(processors, (*_WARPER_ORDER, LogitNormalization), _PROCESSOR_OPTIONS, "logits_processor")
    if names:
        raise ConfigError(
            "the decodekit bridge applies only temperature, top_k and top_p; this call also asks for "
            f"{'; '.join(names)}. Drop those options (from the call or the model's generation_config), or use "
            "model.generate without custom_generate"
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


_CRITERIA_OPTIONS = {
    "MaxTimeCriteria": "max_time (remove it)",
    "StopStringCriteria": "stop_strings (remove it; cut the decoded text instead)",
    "ConfidenceCriteria": "assistant_confidence_threshold (remove it)",
}


def _stopping(config: GenerationConfig, criteria: StoppingCriteriaList) -> tuple[int, tuple[int, ...]]:
    """``(max_length, eos ids)`` from the stopping criteria transformers built; other criteria are refused."""
    names = _unsupported(criteria, (MaxLengthCriteria, EosTokenCriteria), _CRITERIA_OPTIONS, "stopping_criteria")
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


def _pad_token(config: GenerationConfig) -> int | None:
    pad = getattr(config, "_pad_token_tensor", None)
    if pad is None:
        pad = config.pad_token_id
    return None if pad is None else int(torch.as_tensor(pad).flatten()[0])


# ----------------------------------------------------------------------------------------------------- inputs
def _attention_mask(input_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]`` bool mask of real tokens; refuses anything but left padding."""
    if mask is None:
        return torch.ones(input_ids.shape, dtype=torch.bool)
    if mask.shape != input_ids.shape:
        raise ConfigError(
            f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(mask.shape)}"
        )
    mask = mask.detach().cpu()
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ConfigError("attention_mask must hold 0 (padding) and 1 (token) only")
    mask = mask.bool()
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()):
        raise ConfigError(
            "the decodekit bridge needs left padding (each row: padding, then its tokens, no gaps); "
            "tokenize with padding_side='left'"
        )
    return mask


def _check_positions(mask: torch.Tensor, position_ids: torch.Tensor | None) -> None:
    """decodekit numbers each row's tokens 0, 1, ... after its padding, as transformers does from the mask."""
    if position_ids is None:
        return
    expected = mask.long().cumsum(-1) - 1
    given = position_ids.detach().cpu().expand(mask.shape)
    if not bool((given == expected)[mask].all()):
        raise ConfigError(
            "the decodekit bridge numbers positions 0, 1, ... from each row's first real token; "
            "remove position_ids from the generate() call"
        )


def _check_no_padding_needed(
    target: LanguageModel, prompts: list[list[int]], max_new_tokens: int, eos: tuple[int, ...]
) -> None:
    """Without a pad token every row must generate the same number of tokens (no EOS, no context cap)."""
    limit = target.max_context
    if eos or (limit is not None and any(len(p) + max_new_tokens > limit for p in prompts)):
        raise ConfigError(
            "rows may end at different lengths but there is no pad_token_id to fill them; pass pad_token_id=..."
        )


# -------------------------------------------------------------------------------------------------- streamer
class _StreamerAdapter:
    """decodekit's ``streamer(row, tokens)`` callback on top of a transformers streamer (``put`` / ``end``)."""

    def __init__(self, streamer: Any) -> None:
        self.streamer = streamer
        self.ended = False

    def __call__(self, row: int, tokens: list[int]) -> None:
        self.streamer.put(torch.tensor(tokens, dtype=torch.long))

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.streamer.end()


_GENERATE_CODE = inspect.unwrap(GenerationMixin.generate).__code__


def _generate_call_locals(max_depth: int = 8) -> dict[str, Any]:
    """``streamer`` and ``assistant_model`` of the ``GenerationMixin.generate`` call that invoked the bridge.

    transformers 5.x does not forward them to a callable ``custom_generate``; empty when not called from there.
    """
    frame = sys._getframe(1)
    try:
        for _ in range(max_depth):
            frame = frame.f_back
            if frame is None:
                return {}
            if frame.f_code is _GENERATE_CODE:
                return {name: frame.f_locals.get(name) for name in ("streamer", "assistant_model")}
        return {}
    finally:
        del frame
