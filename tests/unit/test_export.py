"""decodekit's EAGLE-3 head of the released architecture (``architecture=eagle3``) is the authors' head: exported to
the EAGLE authors' and vLLM ``speculators``' layouts (:func:`decodekit.train.export.export_head`), it drafts what
the head file drafts and what a port of the authors' head code drafts from the exported tensors; greedy output is
plain decoding's and sampling keeps the target's law; heads that cannot be written in those layouts are refused.

The head here is the recipe's start (:func:`~decodekit.train.eagle3.new_head`, ``init_from`` the target) with its
weights moved by noise, on a tiny 8-layer target (its default taps 2, 4, 5, which the authors' code reads too)."""

from __future__ import annotations

import json

import pytest
import torch

import decodekit as dk
from decodekit.drafters.eagle3 import DEFAULT_WEIGHTS, Eagle3Drafter
from decodekit.drafters.eagle3_head import default_layers
from decodekit.drafters.head_files import head_metadata
from decodekit.errors import ConfigError
from decodekit.models.checkpoint_files import read_state
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.train.eagle3 import new_head, release_metadata
from decodekit.train.export import export_head
from tests.unit.eagle_release import first_draft3, first_round


def release_head(lm: dk.LanguageModel, vocab: torch.Tensor, seed: int = 0, noise: float = 0.3):
    """The recipe's starting head for ``lm`` over ``vocab`` (the target's three default taps) with its weights
    moved by ``noise`` (relative), so that every part changes the drafts."""
    torch.manual_seed(seed)
    layers = default_layers(lm.num_layers)
    head = new_head(lm, vocab, len(layers), release=True)
    head.init_from(lm)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(noise * p.std().clamp(min=0.1) * torch.randn_like(p))
    return head, list(layers)


def save_release(tmp_path, lm: dk.LanguageModel, vocab: torch.Tensor, **kwargs):
    head, layers = release_head(lm, vocab, **kwargs)
    path = tmp_path / "eagle3_tiny.safetensors"
    head.save(path, head_metadata(lm, base="tiny-llama-8", layers=layers, **release_metadata(lm)))
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny 8-layer target, its head file (a draft vocabulary of 48 ids, out of order) and the file exported in
    both formats."""
    root = tmp_path_factory.mktemp("export")
    hf = tiny_llama(0, layers=8)
    lm = dk.load_model(hf)
    vocab = torch.randperm(lm.vocab_size, generator=torch.Generator().manual_seed(1))[:48]
    path = save_release(root, lm, vocab)
    dirs = {fmt: export_head(path, root / fmt, format=fmt) for fmt in ("eagle", "speculators")}
    return hf, lm, path, dirs


def test_an_export_drafts_as_the_head_file_and_the_authors_code(exported, ragged_prompts):
    """The first round's chain from each export equals the head file's and the authors' head (ported) on the
    exported tensors; greedy output, chains and trees, equals plain decoding."""
    hf, lm, path, dirs = exported
    prompt = ragged_prompts[0]
    mine = first_round(lm, Eagle3Drafter(path), prompt, 4)
    authors = read_state(dirs["eagle"] / "model.safetensors")
    assert mine == first_draft3({k: v.float() for k, v in authors.items()}, hf, prompt, 4)
    assert len(set(mine)) > 1  # a chain the head's every part moves, not one repeated token
    for fmt, where in dirs.items():
        assert first_round(lm, Eagle3Drafter(str(where)), prompt, 4) == mine, fmt
    plain = dk.generate(lm, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    for shape, policy in (("chain", FixedLength(4)), ("dynamic", FixedLength(8))):
        for source in (path, dirs["speculators"]):
            out = dk.generate(lm, ragged_prompts, Eagle3Drafter(str(source), shape=shape), policy=policy,
                              max_new_tokens=24, eos_token_id=())  # fmt: skip
            assert out.sequences == plain and out.stats.drafted > 0, (shape, source)


def test_the_layouts_hold_what_vllm_reads(exported):
    """The authors' keys and tensors (draft vocabulary ascending, ``d2t`` / ``t2d``), and speculators' config: the
    layer's Llama config, the layers read, the verifier."""
    _, lm, path, dirs = exported
    mine = read_state(path)
    authors = read_state(dirs["eagle"] / "model.safetensors")
    assert {k for k in authors if k.startswith("midlayer.")} and "fc.weight" in authors
    ids = torch.arange(48) + authors["d2t"]
    assert torch.equal(ids, mine["vocab"].sort().values) and int(authors["t2d"].sum()) == 48
    assert authors["t2d"].shape == (lm.vocab_size,) and bool(authors["t2d"][ids].all())
    assert torch.equal(authors["lm_head.weight"][0], mine["lm_head.weight"][int(mine["vocab"].argmin())])
    config = json.loads((dirs["eagle"] / "config.json").read_text())
    assert config["draft_vocab_size"] == 48 and config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["hidden_size"] == lm.hf.config.hidden_size and config["num_hidden_layers"] == 1
    spec = json.loads((dirs["speculators"] / "config.json").read_text())
    assert spec["speculators_model_type"] == "eagle3" and spec["draft_vocab_size"] == 48
    assert spec["transformer_layer_config"]["model_type"] == "llama"
    assert spec["speculators_config"]["verifier"] == {"name_or_path": "tiny-llama-8",
                                                      "architectures": ["LlamaForCausalLM"]}  # fmt: skip
    tensors = read_state(dirs["speculators"] / "model.safetensors")
    assert {k.replace("layers.0.", "midlayer.") for k in tensors} == set(authors)


def test_speculators_reads_the_exported_config(exported):
    """vLLM's ``speculators`` package (``pip install --no-deps speculators``) parses the exported config as its
    ``Eagle3SpeculatorConfig``, where it imports with the installed transformers."""
    try:
        from speculators import SpeculatorModelConfig
    except Exception as error:  # not installed, or its own dependencies / transformers pin do not import
        pytest.skip(f"speculators does not import here: {type(error).__name__}: {error}")
    config = SpeculatorModelConfig.from_pretrained(str(exported[3]["speculators"]))
    assert type(config).__name__ == "Eagle3SpeculatorConfig"
    assert config.draft_vocab_size == 48 and config.eagle_aux_hidden_state_layer_ids == [2, 4, 5]
    assert config.transformer_layer_config.hidden_size == exported[1].hf.config.hidden_size


def test_sampling_with_an_exported_head_keeps_the_target_law(tmp_path):
    """Rejection sampling on drafts from the head's own output rows (a draft vocabulary of 5 of 8 ids): the exact
    law of the first tokens (the test's biased controls live in test_lossless.py)."""
    from decodekit.verifiers import RejectionVerifier
    from tests.unit.test_lossless import assert_matches, sample_counts

    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, init=0.3, layers=8))
    path = save_release(tmp_path, lm, torch.tensor([6, 1, 2, 4, 7]), noise=0.1)
    where = export_head(path, tmp_path / "out", format="eagle")
    counts, stats = sample_counts(lm, Eagle3Drafter(str(where)), RejectionVerifier(), FixedLength(2), "T1", seed=3)
    assert_matches(lm.hf, counts, "T1")
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_heads_that_have_no_such_layout_are_refused(exported, tmp_path):
    _, _, path, dirs = exported
    with pytest.raises(ConfigError, match="fc architecture.*architecture=eagle3"):
        export_head(DEFAULT_WEIGHTS, tmp_path / "shipped")  # the shipped head, until it is retrained
    assert not (tmp_path / "shipped").exists()
    with pytest.raises(ConfigError, match="not an empty directory"):
        export_head(path, dirs["eagle"])
    with pytest.raises(ConfigError, match="format"):
        export_head(path, tmp_path / "x", format="medusa")
    with pytest.raises(ConfigError, match="no head file"):
        export_head(tmp_path / "missing.safetensors", tmp_path / "y")
