"""The lean forward (decodekit/models/lean.py: Llama, Mistral, Qwen2 / 3, Gemma 2 / 3) is transformers' forward
bit for bit: logits, hidden states and cache contents equal on ragged prefills, tree-shaped verifications, one-token
steps, early exits, skipped layers and per-head restricted attention, for every family it serves; anything that
hooks into the modules it bypasses sends the forward back to transformers' path (and the hook fires)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import decodekit as dk
from decodekit.masks import chain_mask

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
WINDOWED = {  # sliding-window layers: the adapter's masks, one per layer type (Gemma 3: local and global rotary too)
    "mistral-window": ("mistral", dict(sliding_window=4)),
    "qwen2-window": ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    "gemma2-window": (
        "gemma2",
        dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"] * 2, num_hidden_layers=4),
    ),
    "gemma3-window": (
        "gemma3_text",
        dict(sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    ),
}


def family_model(model_type: str, **overrides: object) -> torch.nn.Module:
    """A tiny random float32 model of the family (3 layers, 4 query heads, 2 key/value heads, no sliding window)."""
    fields = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        initializer_range=0.2,
        sliding_window=None,
        attention_bias=model_type == "llama",  # Qwen2 has biases built in; Llama's are optional
    )
    if model_type.startswith("gemma"):  # every layer full attention unless overridden
        fields |= dict(layer_types=["full_attention"] * 3)
    if model_type == "gemma3_text":
        fields |= dict(attn_logit_softcapping=None, final_logit_softcapping=None)
    torch.manual_seed(0)
    config = CONFIG_MAPPING[model_type](**(fields | overrides))
    attention = "eager" if model_type == "gemma2" else "sdpa"  # Gemma 2's logit softcap: transformers' eager attention
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention).eval()


def run(lm: dk.LanguageModel, lean: bool) -> list[object]:
    """Everything a sequence of forwards returns: a ragged prefill (7, 2, 5 tokens), a 4-node tree verification
    (the last node a sibling of the one before it) asking for block 1's output, a one-token step exiting after
    block 2 with the embeddings and block 2 recorded, a step skipping block 2, a step under per-head restricted
    attention, and the cache's keys and values after all of them."""
    keep = lm._lean
    lm._lean = keep if lean else None
    try:
        gen = torch.Generator().manual_seed(0)
        cache = lm.new_cache(3, 32)
        seen: list[object] = []
        with torch.no_grad():
            first = lm.extend(cache, torch.randint(0, 128, (3, 7), generator=gen), torch.tensor([7, 2, 5]))
            seen.append(first.logits)
            steps = (
                (4, dict(hidden_layers=(1,), return_hidden=True)),
                (1, dict(exit_layer=2, hidden_layers=(0, 2))),
                (1, dict(skip_layers=(2,))),
                (1, dict(attend="restricted")),
            )
            if not lm.attention.plain:  # layers that attend differently: no skipping, no restricted attention
                steps = steps[:2]
            for new, kwargs in steps:
                view = cache.stage(new)
                mask, positions = chain_mask(cache.lengths, new, view.kv_len)
                if new > 2:
                    mask[:, :, new - 1, cache.lengths.max() + new - 2] = False
                if kwargs.get("attend") == "restricted":  # [L, B, Hkv, S]: each layer's slots per key/value head
                    kwargs = dict(attend=torch.rand(3, 3, 2, view.kv_len, generator=gen) > 0.3)
                out = lm.forward(torch.randint(0, 128, (3, new), generator=gen), positions, mask, view, **kwargs)
                seen += [out.logits, out.hidden, out.last_hidden]
                cache.keep(torch.full((3,), new))
        return seen + cache.keys + cache.values
    finally:
        lm._lean = keep


def assert_identical(lean: list[object], reference: list[object]) -> None:
    assert len(lean) == len(reference)
    for i, (a, b) in enumerate(zip(lean, reference)):
        if isinstance(a, dict):
            assert a.keys() == b.keys(), f"item {i}: hidden layers {sorted(a)} != {sorted(b)}"
            a, b = list(a.values()), list(b.values())
        else:
            a, b = [a], [b]
        for x, y in zip(a, b):
            if x is None or y is None:
                assert x is y, f"item {i}"
            else:
                torch.testing.assert_close(x, y, rtol=0, atol=0, msg=lambda m, i=i: f"item {i}: {m}")


@pytest.mark.parametrize("name", FAMILIES + tuple(WINDOWED))
def test_lean_forward_is_transformers_bit_for_bit(name):
    model_type, overrides = WINDOWED.get(name, (name, {}))
    lm = dk.load_model(family_model(model_type, **overrides))
    assert lm._lean is not None, f"{name} does not run lean"
    assert lm.attention.plain == (name in FAMILIES)  # the windowed variants do get per-type or windowed masks
    assert_identical(run(lm, lean=True), run(lm, lean=False))


def test_a_biased_variant_fails_the_same_comparison(monkeypatch):
    """The comparison can fail: a lean forward whose rotation is off by one part in ten thousand differs."""
    lm = dk.load_model(family_model("llama"))
    reference = run(lm, lean=False)
    rotate = lm._lean.rotate
    monkeypatch.setattr(lm._lean, "rotate", lambda q, k, cos, sin: rotate(q, k, cos, sin * 1.0001))
    with pytest.raises(AssertionError):
        assert_identical(run(lm, lean=True), reference)


def test_hooks_on_bypassed_modules_take_transformers_path():
    lm = dk.load_model(family_model("llama"))
    reference = run(lm, lean=False)
    fired: list[int] = []
    for where in (lm.layers[1], lm.layers[1].self_attn, lm.decoder):
        handle = where.register_forward_hook(lambda *_: fired.append(1))
        assert not lm._lean.ready()
        before = len(fired)
        assert_identical(run(lm, lean=True), reference)
        handle.remove()
        assert len(fired) > before, f"a hook on {type(where).__name__} did not fire"
    assert lm._lean.ready()


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [("llama", dict(attn_implementation="eager")), ("gpt2", {})],
)
def test_other_models_keep_transformers_forward(model_type, overrides):
    if model_type == "gpt2":
        from decodekit.models.tiny import tiny_llama

        model = tiny_llama(0)
        model.config.model_type = "gpt2"  # a family name it does not serve
    else:
        attn = overrides.pop("attn_implementation", "sdpa")
        model = family_model(model_type, **overrides)
        model.set_attn_implementation(attn)
    assert dk.load_model(model)._lean is None
