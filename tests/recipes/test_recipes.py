"""Every recipe composes and instantiates: each option of each config group, and each experiment.

The zoo model loader is replaced by a tiny random model so this stays fast; tests/integration runs a recipe on
the real model end to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import decodekit as dk
from decodekit.bench.methods import TransformersBaseline
from decodekit.cli import RECIPES, build_component
from decodekit.models.tiny import tiny_llama

GROUPS = ("model", "drafter", "verifier", "policy", "task")
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((RECIPES / g).glob("*.yaml"))]
EXPERIMENTS = sorted(p.stem for p in (RECIPES / "experiment").glob("*.yaml"))


@pytest.fixture(autouse=True)
def tiny_zoo(monkeypatch):
    """Zoo names load a tiny random model instead of SmolLM2."""
    from decodekit.models import zoo

    def fake(name, num_layers=None, dtype=None, device=None, kernels=None):
        assert name in zoo.ZOO
        return dk.load_model(tiny_llama(0, layers=num_layers or 2), kernels=kernels)

    monkeypatch.setattr(zoo, "load_zoo_model", fake)
    monkeypatch.setattr(dk.models, "load_zoo_model", fake, raising=False)


def compose_bench(overrides: list[str]):
    with initialize_config_dir(config_dir=str(Path(RECIPES)), version_base="1.3"):
        return compose("bench", overrides=overrides)


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_every_group_option_instantiates(group, option):
    cfg = compose_bench([f"{group}={option}"])
    if group == "task":
        assert cfg.task.name == option and cfg.task.num_prompts > 0
        return
    component = build_component(cfg[group])
    expected = {
        "model": dk.LanguageModel,
        "drafter": dk.Drafter,
        "verifier": dk.Verifier,
        "policy": dk.LengthPolicy,
    }[group]
    if option in ("none", "default"):
        assert component is None
    else:
        assert isinstance(component, expected)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_instantiates(experiment):
    cfg = compose_bench([f"experiment={experiment}"])
    OmegaConf.resolve(cfg)
    assert isinstance(build_component(cfg.model), dk.LanguageModel)
    methods = {name: spec for name, spec in cfg.methods.items() if spec is not None}
    assert "autoregressive" in methods and len(methods) >= 2
    for spec in methods.values():
        for key in ("drafter", "verifier", "policy"):
            build_component((spec or {}).get(key))
    for name, spec in (cfg.baselines or {}).items():
        spec = dict(spec)
        spec.pop("assistant_from", None)
        assert isinstance(TransformersBaseline(str(name), **spec), TransformersBaseline)


def test_overrides_reach_the_components():
    cfg = compose_bench(["drafter=ngram", "drafter.max_ngram=5", "policy=heuristic", "policy.initial=3"])
    method = cfg.methods.speculative
    assert build_component(method.drafter).max_ngram == 5
    assert build_component(method.policy).initial == 3
