"""Configuration mistakes a researcher makes at the command line or with the registry fail at once, by name
(reliability round 3): a misspelt experiment ran the default benchmark, a component config without ``_target_`` ran
the method with no component under its own name, a repeated layer or a draft vocabulary larger than the training
vocabulary started a long data pass, a non-string or non-callable registration broke the registry for everyone, a
Hydra flag after an override failed on an argument the user never typed."""

from __future__ import annotations

import pytest

import decodekit as dk
from decodekit.cli import _named
from decodekit.drafters.eagle3_head import default_layers
from decodekit.errors import ConfigError, ConfigTypeError, UnknownComponentError
from decodekit.instantiate import build_component
from decodekit.train.arguments import check_arguments, chosen_layers


def test_a_component_config_without_target_is_refused_not_run_as_none():
    assert build_component(None) is None and build_component({}) is None  # "none / the default"
    with pytest.raises(ConfigError, match=r"methods.mine.drafter has no _target_ \(it holds _targt_\)"):
        build_component({"_targt_": "decodekit.drafters.NGramDrafter"}, "methods.mine.drafter")


@pytest.mark.parametrize("recipe", ["bench.yaml", "dlm_bench/dlm_bench.yaml"])
def test_an_unknown_experiment_is_not_optional(recipe):
    """``optional`` made Hydra skip a missing experiment file: the default benchmark ran instead."""
    from importlib.resources import files

    text = (files("decodekit") / "recipes" / recipe).read_text()
    assert "- experiment: null" in text and "optional experiment" not in text


def test_the_app_name_goes_beside_the_users_overrides():
    assert _named(["passes=1", "--cfg", "job"]) == ["hydra.job.name=decodekit", "passes=1", "--cfg", "job"]
    assert _named(["--cfg", "job", "passes=1"]) == ["--cfg", "job", "hydra.job.name=decodekit", "passes=1"]
    assert _named(["--help"]) == ["--help", "hydra.job.name=decodekit"]


def test_training_arguments_that_cannot_mean_what_they_say_are_refused():
    with pytest.raises(ConfigError, match=r"layers names a layer twice \(\[2, 2\]\)"):
        chosen_layers([2, 2], (1,), 30)
    assert chosen_layers([15, 2], (1,), 30) == (2, 15)
    assert chosen_layers(None, default_layers(4), 4) == (1, 2)  # EAGLE-3's defaults coincide on 4 layers: kept once
    with pytest.raises(ConfigError, match="vocab_sizes holds 99999, more than train_vocab=16384"):
        check_arguments({"vocab_sizes": [2048, 99999], "train_vocab": 16384})


def test_registering_needs_a_name_and_something_that_builds():
    with pytest.raises(ConfigTypeError, match="name must be a non-empty string, got 3"):
        dk.register("drafter", 3)
    with pytest.raises(ConfigTypeError, match="decorates a class .* got 42"):
        dk.register("drafter", "number")(42)
    assert "number" not in dk.registry.available("drafter")
    with pytest.raises(UnknownComponentError, match="did you mean 'ngram'"):
        dk.build("drafter", "ngarm")


def test_a_wrong_keyword_in_a_recipe_lists_what_the_component_takes():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"policy": {"_target_": "decodekit.policies.FixedLength", "kk": 3}})
    with pytest.raises(ConfigTypeError, match="unexpected keyword argument 'kk'; it takes k, depth, width"):
        build_component(cfg.policy, "policy")


def test_export_head_refuses_a_file_that_is_no_head(tmp_path):
    """It said the file was an EAGLE-1 head of the fc architecture."""
    (tmp_path / "afile").write_text("hello")
    with pytest.raises(ConfigError, match="is not a head file decodekit wrote"):
        dk.train.export_head(str(tmp_path / "afile"), str(tmp_path / "out"))
    with pytest.raises(ConfigTypeError, match="verifier must be the target's name or path"):
        dk.train.export_head(str(tmp_path / "afile"), str(tmp_path / "out"), verifier=123)


def test_a_directory_that_cannot_be_made_is_named_by_its_key(tmp_path, capsys):
    """An OS error from Hydra or deep in a run named neither ``hydra.run.dir`` nor ``data_dir``."""
    from decodekit.cli import main
    from decodekit.train.arguments import writable_dir

    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(ConfigError, match=r"data_dir=.*file/data cannot be created \(Not a directory\)"):
        writable_dir("data_dir", str(blocked / "data"))
    writable_dir("data_dir", str(tmp_path / "new" / "data"))
    assert (tmp_path / "new" / "data").is_dir()
    with pytest.raises(SystemExit) as exit_:
        main(["bench", f"hydra.run.dir={blocked}/run", "passes=1"])
    assert exit_.value.code == 2 and "error: hydra.run.dir=" in capsys.readouterr().err
