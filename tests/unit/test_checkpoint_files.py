"""Checkpoint directories that are not what they should be (reliability round 3): code shipped with a model is never
run, whichever loader meets it; a malformed config, index or weights file is refused with the file named; tensors the
config gives no place are reported, not dropped in silence; settings that cannot work together are refused when the
checkpoint loads, not at the first forward inside transformers."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import decodekit as dk
from decodekit.errors import ConfigError, UnsupportedModelError
from tests.unit.dlm_families import write_llada
from tests.unit.dlm_llada2 import LLADA2_CONFIG, write_llada2


def edit_config(path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


# ----------------------------------------------------------------------------------------------- shipped code
def test_a_model_that_needs_its_shipped_code_is_refused_without_running_it(tmp_path):
    """A family decodekit does not know (here LLaDA's files under a new model_type), whose config's auto_map points at
    its own (poisoned) code: transformers would ask whether to run it, or run it when told to; decodekit never asks."""
    write_llada(tmp_path)
    edit_config(tmp_path, model_type="llada_next", architectures=["LLaDANextLM"])
    with pytest.raises(UnsupportedModelError, match="decodekit never executes"):
        dk.load_model(str(tmp_path))
    with pytest.raises(UnsupportedModelError, match=r"dk.dlm.load_model\(path\)"):
        dk.dlm.load_model(str(tmp_path), mask_token_id=127)


def test_a_directory_of_no_family_says_so_when_it_lacks_a_mask_id(tmp_path):
    write_llada(tmp_path / "other")
    edit_config(tmp_path / "other", model_type="llada_next", architectures=["LLaDANextLM"])
    with pytest.raises(ConfigError, match="model_type 'llada_next'.* none of the published DLM families"):
        dk.dlm.load_model(str(tmp_path / "other"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="a directory without a config.json"):
        dk.dlm.load_model(str(tmp_path / "empty"))


def test_a_family_default_mask_id_outside_the_vocabulary_says_where_it_came_from(tmp_path):
    """A tiny or re-sized LLaDA without mask_token_id in its config gets LLaDA's 126336."""
    write_llada(tmp_path)
    edit_config(tmp_path, mask_token_id=None)
    with pytest.raises(ConfigError, match="mask id 126336 .config.json names no mask_token_id.* LLaDA's default"):
        dk.dlm.load_model(str(tmp_path))
    assert dk.dlm.load_model(str(tmp_path), mask_token_id=127).mask_token_id == 127


# ----------------------------------------------------------------------------------------- malformed files
def test_a_config_that_is_not_an_object_is_refused(tmp_path):
    write_llada(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="config.json holds a JSON list"):
        dk.dlm.load_model(str(tmp_path))


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ({"metadata": {}}, "has no weight_map"),
        ([1, 2], "is not a readable JSON object"),
        ({"weight_map": {"model.transformer.wte.weight": "../outside.safetensors"}}, "names shards outside"),
    ],
)
def test_a_shard_index_that_cannot_be_followed_is_refused(tmp_path, index, message):
    write_llada(tmp_path / "ckpt", layout="shards")
    (tmp_path / "ckpt" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=message):
        dk.dlm.load_model(str(tmp_path / "ckpt"))


def test_a_truncated_weights_file_is_named(tmp_path):
    write_llada(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ConfigError, match=r"cannot read .*model.safetensors .*is it complete"):
        dk.dlm.load_model(str(tmp_path))


def test_a_legacy_pickled_state_dict_loads_as_the_zip_format_does(tmp_path):
    """torch's pre-1.6 format cannot be memory-mapped: read it without (still weights_only)."""
    tensors = write_llada(tmp_path / "zip", layout="bin")
    write_llada(tmp_path / "legacy", layout="bin")
    torch.save(tensors, tmp_path / "legacy" / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    ids = torch.tensor([[5, 9, 14, 2]])
    zipped, legacy = (dk.dlm.load_model(str(tmp_path / d)) for d in ("zip", "legacy"))
    assert torch.equal(zipped.lm.hf(ids).logits, legacy.lm.hf(ids).logits)


# ------------------------------------------------------------------------------ configs that do not fit the weights
def test_tensors_the_config_gives_no_place_are_reported(tmp_path):
    """LLaDA 2 without num_shared_experts in its config builds no shared experts: their tensors were dropped in
    silence and the output changed."""
    write_llada2(tmp_path)
    edit_config(tmp_path, num_shared_experts=None)
    with pytest.warns(UserWarning, match=r"tensor\(s\) its config.json gives no place .*shared_experts"):
        dk.dlm.load_model(str(tmp_path))
    write_llada(tmp_path / "llada")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a complete checkpoint warns nothing
        dk.dlm.load_model(str(tmp_path / "llada"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_group": None}, r"topk_group \(2\) must be in 1 .. n_group \(1\)"),
        ({"n_group": 3}, r"num_experts \(8\) must split into n_group \(3\) groups"),
        ({"topk_group": 5}, r"topk_group \(5\) must be in 1 .. n_group \(4\)"),
        ({"num_experts_per_tok": 9}, r"num_experts_per_tok \(9\) must be in 1 .. num_experts \(8\)"),
    ],
)
def test_llada2_router_settings_that_do_not_fit_are_refused_when_loading(tmp_path, changes, message):
    assert LLADA2_CONFIG["topk_group"] == 2 and LLADA2_CONFIG["n_group"] == 4  # what the messages say
    write_llada2(tmp_path)
    edit_config(tmp_path, **changes)
    with pytest.raises(UnsupportedModelError, match=message):
        dk.dlm.load_model(str(tmp_path))
