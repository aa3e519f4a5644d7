"""``dk.generate(..., compile=True)``: static-shape compiled forwards (decodekit.models.compiled) give eager's tokens,
greedy and sampled, for chains, trees, a draft model and ragged rows that finish apart; later calls with other prompt
lengths compile nothing; what cannot compile runs eager with one warning naming why."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import decodekit as dk
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.errors import ConfigError
from decodekit.models.compiled import capacity_bucket, width_bucket
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength


@pytest.fixture(scope="module")
def llama():
    return dk.load_model(tiny_llama(0, layers=3))


@pytest.fixture(scope="module")
def draft_model(llama):
    """A noisy deep copy of the target, made after the target has compiled (the copy must compile its own step:
    a copied adapter once ran the original's compiled forward, with the original's weights)."""
    dk.generate(llama, [[1, 2, 3]], max_new_tokens=3, compile=True)
    return dk.load_model(perturbed(llama.hf, 0.2, seed=1))


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _both(model, prompts, drafter=None, verifier=None, policy=None, **kwargs):
    """The eager and the compiled output of the same call."""
    eager = dk.generate(model, prompts, drafter, verifier, policy, **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="compile=True")  # a covered model compiles: no fallback
        compiled = dk.generate(model, prompts, drafter, verifier, policy, compile=True, debug=True, **kwargs)
    return eager, compiled


def test_buckets():
    assert [width_bucket(n) for n in (1, 2, 3, 5, 9, 17, 33, 64, 65)] == [1, 2, 4, 8, 16, 32, 64, 64, None]
    assert capacity_bucket(10) == 256 and capacity_bucket(192) == 256 and capacity_bucket(193) == 512


def test_plain_and_chain_drafts_equal_eager_and_later_calls_compile_nothing(llama, ragged_prompts):
    eager, compiled = _both(llama, ragged_prompts, max_new_tokens=20, eos_token_id=())
    assert compiled.sequences == eager.sequences
    drafter = dk.drafters.NGramDrafter()
    eager, compiled = _both(llama, ragged_prompts, drafter, policy=FixedLength(3), max_new_tokens=24, eos_token_id=())
    assert compiled.sequences == eager.sequences and compiled.stats.accepted > 0  # drafts of several widths ran
    others = [[3, 1, 4, 1, 5, 9, 2, 6][: n + 1] for n in range(1, 8, 2)]  # other prompt lengths
    one = [[2, 7, 1, 8, 2, 8, 1, 8, 2, 8]]
    for batch in (ragged_prompts, one):  # dynamo keeps a batch of 1 apart: its graphs compile on its first call
        graphs = _graphs()
        for prompts in (batch, others if len(batch) > 1 else [others[2]]):
            eager, compiled = _both(llama, prompts, drafter, policy=FixedLength(5), max_new_tokens=18, eos_token_id=())
            assert compiled.sequences == eager.sequences
            if prompts is not batch:
                assert _graphs() == graphs  # the second call, other prompt lengths: nothing new compiled
            graphs = _graphs()


def test_rows_that_stop_apart_and_a_draft_model_sampled_equal_eager(llama, draft_model, ragged_prompts):
    eos = 7  # rows end at different rounds: the batch compacts under the compiled step
    eager, compiled = _both(
        llama,
        ragged_prompts,
        dk.drafters.ModelDrafter(draft_model),
        policy=FixedLength(3),
        max_new_tokens=30,
        eos_token_id=eos,
        temperature=1.0,
        seed=[1, 2, 3, 4],
    )
    assert compiled.sequences == eager.sequences
    assert {len(s) for s in eager.sequences} != {30}  # some row did stop at the EOS


def test_tree_drafts_equal_eager(llama, draft_model, ragged_prompts):
    from decodekit.drafters.model_tree import ModelTreeDrafter

    drafter = ModelTreeDrafter(draft_model, shape="iid", branches=2, temperature=1.0)
    for temperature in (0.0, 0.8):
        eager, compiled = _both(
            llama,
            ragged_prompts,
            drafter,
            policy=FixedLength(3),
            max_new_tokens=16,
            eos_token_id=(),
            temperature=temperature,
            seed=5,
        )
        assert compiled.sequences == eager.sequences and compiled.stats.accepted > 0


def test_what_cannot_compile_runs_eager_with_one_warning(llama, ragged_prompts):
    from tests.archs import tiny_model

    gpt2 = dk.load_model(tiny_model("gpt2"))
    reference = dk.generate(gpt2, ragged_prompts, max_new_tokens=6, eos_token_id=())
    with pytest.warns(UserWarning, match="compile=True: GPT2LMHeadModel is not run by decodekit's Llama-family") as w:
        out = dk.generate(gpt2, ragged_prompts, max_new_tokens=6, eos_token_id=(), compile=True)
    assert out.sequences == reference.sequences
    assert sum("compile=True" in str(r.message) for r in w) == 1  # once a call, not once a forward
    reference = dk.generate(llama, ragged_prompts, EarlyExitDrafter(1), max_new_tokens=8, eos_token_id=())
    with pytest.warns(UserWarning, match="early-exit and layer-skipping forwards"):
        out = dk.generate(llama, ragged_prompts, EarlyExitDrafter(1), max_new_tokens=8, eos_token_id=(), compile=True)
    assert out.sequences == reference.sequences


def test_compile_argument_is_checked_and_auto_is_eager_on_the_cpu(llama):
    with pytest.raises(ConfigError, match="compile"):
        dk.generate(llama, [[1, 2]], max_new_tokens=2, compile="yes")
    graphs = _graphs()
    model = dk.load_model(tiny_llama(3))  # a fresh adapter: compiling it would add graphs
    out = dk.generate(model, [[1, 2, 3]], max_new_tokens=6, compile="auto")
    assert out.sequences == dk.generate(model, [[1, 2, 3]], max_new_tokens=6).sequences
    assert _graphs() == graphs and torch.device(model.device).type == "cpu"
