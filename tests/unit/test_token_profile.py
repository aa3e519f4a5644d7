"""decodekit.bench.token_profile: a token's time split by category (nested events counted once) and its distance
to the memory-bandwidth bound."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import decodekit as dk
from decodekit.bench.token_profile import split, token_profile, weight_bytes
from decodekit.models.tiny import tiny_llama


def _event(name, ms, parent=None):
    return SimpleNamespace(name=name, cpu_time_total=ms * 1e3, cpu_parent=parent)


def test_nested_events_count_for_the_outermost_category():
    region = _event("Torch-Compiled Region: 0/1", 10.0)
    inner = _event("aten::linear", 4.0, parent=_event("aten::something", 5.0, parent=region))
    eager = _event("aten::linear", 3.0, parent=_event("decode", 20.0))
    attention = _event("aten::scaled_dot_product_attention", 2.0)
    out = split([region, inner, eager, attention, _event("aten::add", 1.0)])
    assert out == {"compiled step": 10.0, "linear layers": 3.0, "attention": 2.0}


def test_a_profile_adds_up_and_states_its_bound():
    model = dk.load_model(tiny_llama(0, layers=2))
    result = token_profile(model, [1, 2, 3], tokens=4)
    assert result["weight_mb"] == pytest.approx(weight_bytes(model) / 1e6)
    parts = result["linear layers"] + result["attention"] + result["compiled step"] + result["other"]
    assert result["linear layers"] > 0 and result["compiled step"] == 0  # eager: no compiled region
    assert parts == pytest.approx(result["ms_per_token"], rel=1e-6)
    assert result["bound_ms"] == pytest.approx(result["weight_mb"] / result["bandwidth_gbs"])
    assert 0 < result["of_bound"] < 1
