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
* ``eos_token_id`` -> decodekit ``eos_token_id`` (none = never stop early); ``pad_token_id`` fills each row after
  it ends (without one, the first EOS id, as transformers does).
* ``seed`` (bridge argument) -> decodekit ``seed``; without it sampling draws from torch's global generator.
* ``num_return_sequences > 1`` with sampling is honoured: transformers has already repeated each prompt, and every
  copy is sampled independently.
* A transformers streamer (``streamer=``) works for batch size 1: transformers itself has put the prompt; the
  bridge puts each round's committed tokens as a 1-D tensor (several tokens when drafts are accepted), then calls
  ``end()``. transformers does not pass ``streamer`` (nor ``assistant_model``) on to a callable
  ``custom_generate``, and offers no supported way to receive them: ``GenerationMixin.generate`` replaces the
  generation-mode arguments it built (streamer and assistant model included) by the callable's own extra keyword
  arguments found in ``**kwargs``, which never hold its named parameters. The bridge therefore reads both from the
  calling ``GenerationMixin.generate`` frame, on the transformers releases where that was verified
  (:data:`VERIFIED_TRANSFORMERS`). Elsewhere, a streamer given to ``generate()`` is refused with a
  :class:`~decodekit.errors.ConfigError` rather than silently dropped: stream with
  ``decodekit.generate(..., streamer=fn)`` instead.

Refused with :class:`~decodekit.errors.ConfigError` (the message says what to change), because decodekit's loop
cannot honour them and silently ignoring them would change the output: any logits processor other than the
temperature / top-k / top-p warpers (``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``,
``bad_words_ids``, ``min_p``, ``typical_p``, ``logits_processor=...``, ...), stopping criteria other than max length
and EOS (``stop_strings``, ``max_time``, ``stopping_criteria=...``), generation modes other than greedy / sampling
(``num_beams > 1``, ``penalty_alpha``, ``dola_layers``, ``assistant_model`` / ``prompt_lookup_num_tokens`` -- pass
a decodekit ``drafter`` instead), ``output_scores`` / ``output_logits`` / ``output_attentions`` /
``output_hidden_states`` (decodekit does not keep per-step scores), right or gapped padding, custom position ids,
a pre-filled cache (``cache``; ``past_key_values`` before transformers 5.24), extra model inputs
(``inputs_embeds``, ``token_type_ids``, ...), and a streamer with batch size > 1.

The returned cache (``cache`` / ``past_key_values``) is always None (decodekit's cache is not a transformers cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.configuration_utils import GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from decodekit.checks import describe
from decodekit.errors import ConfigError
from decodekit.hf.inputs import check_model_kwargs, check_no_padding_needed, check_positions, real_token_mask
from decodekit.hf.options import check_mode, check_outputs, pad_token, sampling_options, stopping_options
from decodekit.hf.streaming import VERIFIED_TRANSFORMERS, StreamerAdapter, check_streamer, dropped_generate_arguments
from decodekit.interfaces import Drafter, LengthPolicy, Verifier
from decodekit.metrics import SpecStats
from decodekit.models import load_model
from decodekit.sampling import check_seed
from decodekit.spec.component_checks import check_components
from decodekit.spec.loop import generate

__all__ = ["VERIFIED_TRANSFORMERS", "DecodeKitGenerateOutput", "custom_generate"]


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
    seed: int | Sequence[int] | None = None,
    streamer: Any = None,
    assistant_model: Any = None,
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
        seed: seeds decodekit's generator (one int per row: per-row seeds); the same seed gives the same output.
        streamer, assistant_model: used when passed here; transformers (5.20 - 5.x) does not pass them to a
            callable ``custom_generate``, so by default they are read from the calling ``generate`` (see the module
            docstring).
        **model_kwargs: the model inputs ``generate`` prepared (attention mask, position ids, an empty cache).

    Returns:
        ``LongTensor [B, T + G]``: ``input_ids`` followed by the generated tokens, right-padded with
        ``pad_token_id`` after each row's end (``G`` = the longest row's generation), as transformers returns; or
        a :class:`DecodeKitGenerateOutput` (``sequences``, ``stats``, ``finish_reasons``) when
        ``return_dict_in_generate=True``.
    """
    if streamer is None and assistant_model is None:
        streamer, assistant_model = dropped_generate_arguments(custom_generate)
    check_streamer(streamer)
    adapter = StreamerAdapter(streamer) if streamer is not None else None
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
            assistant_model,
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
    seed: int | Sequence[int] | None,
    streamer: StreamerAdapter | None,
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
    check_components(drafter, verifier, policy)  # before any work, as decodekit.generate does
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or not _integer(input_ids):
        raise ConfigError(f"input_ids must be an integer tensor [batch, length], got {describe(input_ids)}")
    check_seed(seed, input_ids.shape[0])
    check_mode(config, assistant_model)
    check_outputs(config)
    check_model_kwargs(model_kwargs)
    temperature, top_k, top_p = sampling_options(config, logits_processor or LogitsProcessorList())
    max_length, eos = stopping_options(config, stopping_criteria or StoppingCriteriaList())
    mask = real_token_mask(input_ids, model_kwargs.get("attention_mask"))
    check_positions(mask, model_kwargs.get("position_ids"))
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
    eos = tuple(t for t in eos if 0 <= t < target.vocab_size)  # transformers allows others; they never occur
    prompts = [row[m].tolist() for row, m in zip(input_ids, mask.to(input_ids.device))]
    pad = pad_token(config)
    if pad is None:
        check_no_padding_needed(target, prompts, max_new_tokens, eos)

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


def _integer(tensor: torch.Tensor) -> bool:
    return not (tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool)
