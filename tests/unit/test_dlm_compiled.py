"""``dk.dlm.generate(..., compile=True)``: the diffusion half's forwards (canvas-wide recomputes, the prefix, dual,
dKV and block-causal caches, self-speculative drafts) run compiled, every one of them, with eager's tokens; a later
call with other prompt lengths and batch sizes compiles nothing; a model outside the covered families warns once."""

from __future__ import annotations

import warnings

import pytest
from torch._dynamo.utils import counters

import decodekit as dk
from decodekit.errors import ConfigError
from decodekit.models.compile_switch import capacity_bucket, width_bucket
from decodekit.models.compiled import StaticForward
from tests.unit.dlm_common import MASK, peaked_llama


@pytest.fixture(scope="module")
def dlm():
    return dk.dlm.load_model(peaked_llama(), mask_token_id=MASK)


@pytest.fixture
def forwards(monkeypatch):
    """Every covered forward's ``(width, ran compiled)``, in order."""
    seen: list[tuple[int, bool]] = []
    call = StaticForward.__call__

    def spy(self, tokens, *args, **kwargs):
        out = call(self, tokens, *args, **kwargs)
        seen.append((tokens.shape[1], out is not None))
        return out

    monkeypatch.setattr(StaticForward, "__call__", spy)
    return seen


CASES = {  # name -> generate's keywords (the parts built fresh for each call)
    "recompute": lambda: {},
    "prefix": lambda: {"cache": dk.build("dlm_cache", "prefix"), "rule": dk.build("dlm_rule", "threshold")},
    "dual": lambda: {"cache": dk.build("dlm_cache", "dual")},
    "dkv": lambda: {"cache": dk.build("dlm_cache", "dkv", refresh=3)},
    "block_causal_spiffy": lambda: {
        "cache": dk.build("dlm_cache", "block_causal"),
        "draft": dk.build("dlm_draft", "spiffy"),
    },
    "sampled": lambda: {"temperature": 1.0},
}


def _both(dlm, prompts, case, **kwargs):
    kwargs = dict(gen_length=32, block_length=8, steps=32, seed=list(range(len(prompts))), **kwargs)
    eager = dk.dlm.generate(dlm, prompts, **CASES[case](), **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="compile=True")  # a covered model compiles: no fallback
        compiled = dk.dlm.generate(dlm, prompts, **CASES[case](), compile=True, debug=True, **kwargs)
    return eager, compiled


def test_canvas_buckets():
    assert [width_bucket(n, canvas=True) for n in (3, 64, 65, 96, 97)] == [4, 64, 96, 96, 128]
    assert capacity_bucket(40, canvas=True) == 64 and capacity_bucket(64, canvas=True) == 64


def test_every_cache_compiled_equals_eager_and_later_calls_compile_nothing(dlm, forwards):
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
    widths = {}
    for case in CASES:
        forwards.clear()
        eager, compiled = _both(dlm, prompts, case)
        assert compiled.sequences == eager.sequences, case
        assert forwards and all(ran for _, ran in forwards), case  # every forward of the call ran compiled
        widths[case] = {w for w, _ in forwards}
    assert widths["recompute"] == {43}  # the canvas: 11 prompt + 32 slots, padded to 64 in the forward
    assert len(widths["dkv"]) > 3 and max(widths["block_causal_spiffy"]) > 64  # narrow rewrites, wide drafts
    graphs = counters["stats"]["unique_graphs"]
    later = [[2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2], [4]]  # other lengths, another batch size
    for case in CASES:
        eager, compiled = _both(dlm, later, case)
        assert compiled.sequences == eager.sequences, case
    assert counters["stats"]["unique_graphs"] == graphs  # nothing new compiled


def test_a_dream_style_qwen2_compiles_and_an_uncovered_model_warns_once():
    from tests.archs import tiny_model

    qwen2 = dk.dlm.load_model(tiny_model("qwen2"), mask_token_id=MASK, shift_logits=True)  # Dream's layout loads so
    eager, compiled = _both(qwen2, [[5, 6, 7]], "recompute")  # one row, one graph: the arithmetic is the point
    assert compiled.sequences == eager.sequences and "default" in qwen2.lm._static._compiled
    gpt2 = dk.dlm.load_model(tiny_model("gpt2"), mask_token_id=MASK)
    reference = dk.dlm.generate(gpt2, [[5, 6, 7]], gen_length=8, block_length=8, steps=8)
    with pytest.warns(UserWarning, match="compile=True: GPT2LMHeadModel is not run by decodekit's") as caught:
        out = dk.dlm.generate(gpt2, [[5, 6, 7]], gen_length=8, block_length=8, steps=8, compile=True)
    assert out.sequences == reference.sequences
    assert sum("compile=True" in str(w.message) for w in caught) == 1  # one warning a call, not one a forward


def test_compile_argument_is_checked_and_auto_is_eager_on_the_cpu(dlm, forwards):
    with pytest.raises(ConfigError, match="compile"):
        dk.dlm.generate(dlm, [[1, 2]], gen_length=8, block_length=8, steps=8, compile="fast")
    dk.dlm.generate(dlm, [[1, 2]], gen_length=8, block_length=8, steps=8, compile="auto")
    assert forwards == []  # "auto" on the CPU: eager, nothing tried
