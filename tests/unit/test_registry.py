"""The registry resolves names to the same classes the package exports."""

from __future__ import annotations

import pytest

import decodekit as dk


@pytest.mark.parametrize(
    ("kind", "name", "cls"),
    [
        ("drafter", "ngram", dk.drafters.NGramDrafter),
        ("drafter", "model", dk.drafters.ModelDrafter),
        ("verifier", "greedy", dk.verifiers.GreedyVerifier),
        ("verifier", "rejection", dk.verifiers.RejectionVerifier),
        ("policy", "fixed", dk.policies.FixedLength),
        ("policy", "heuristic", dk.policies.HeuristicLength),
        ("policy", "confidence", dk.policies.ConfidenceStop),
    ],
)
def test_names_resolve_to_classes(kind, name, cls):
    assert dk.registry.resolve(kind, name) is cls


def test_build_passes_arguments():
    drafter = dk.build("drafter", "ngram", max_ngram=5)
    assert isinstance(drafter, dk.drafters.NGramDrafter) and drafter.max_ngram == 5
    assert isinstance(drafter, dk.Drafter)


@pytest.mark.parametrize(
    "name, kwargs, says",
    [
        ("pillar", {"target": 1}, r"drafter 'pillar' \(PillarDrafter\): got an unexpected keyword argument 'target'; "
         r"it takes keep, fraction, temperature"),
        ("ngram", {"max_ngarm": 3}, r"unexpected keyword argument 'max_ngarm'; it takes max_ngram, min_ngram"),
        ("dflash", {}, r"drafter 'dflash' \(DFlashDrafter\): missing a required argument: 'weights'"),
    ],
)  # fmt: skip
def test_build_names_the_arguments_a_component_takes(name, kwargs, says):
    with pytest.raises(dk.errors.ConfigTypeError, match=says):
        dk.build("drafter", name, **kwargs)
    with pytest.raises(dk.errors.ConfigTypeError, match=r"policy 'gammatune_plus' .*'foo'; it takes initial, eta"):
        dk.build("policy", "gammatune_plus", foo=1)  # a preset: its class's signature with the preset's defaults


def test_register_a_user_component():
    @dk.register("policy", "always-two")
    class AlwaysTwo(dk.policies.FixedLength):
        def __init__(self):
            super().__init__(2)

    assert dk.build("policy", "always-two").k == 2
    with pytest.raises(ValueError, match="already taken"):
        dk.register("policy", "always-two")(dk.policies.FixedLength)


def test_a_preset_builds_its_class_with_its_defaults():
    """``gammatune_plus`` and ``adaedl`` are presets (:func:`decodekit.registry.preset`), not subclasses: they build
    the class itself with other defaults, each still overridable, and their signature shows those defaults."""
    import inspect

    from decodekit.policies import AdaEDL, EntropyStop, GammaTune, GammaTunePlus
    from decodekit.registry import Preset, built_class, preset

    plus = dk.build("policy", "gammatune_plus", max_len=6)
    assert type(plus) is GammaTune and plus.threshold == 0.4 and plus.max_len == 6
    assert GammaTunePlus(threshold=0.3).threshold == 0.3 and GammaTune().threshold is None
    edl = AdaEDL(max_len=6)
    assert type(edl) is EntropyStop and edl.adaptive and edl.scale == 0.2 and edl.max_len == 6
    assert inspect.signature(AdaEDL).parameters["threshold"].default == 0.5
    assert built_class(dk.registry.resolve("policy", "adaedl")) is EntropyStop
    assert isinstance(GammaTunePlus, Preset) and repr(plus).startswith("GammaTune(")
    assert dk.registry.name_of("policy", plus) == "gammatune_plus" and dk.registry.name_of("policy", edl) == "adaedl"
    assert dk.registry.name_of("policy", GammaTune()) == "gammatune"
    with pytest.raises(TypeError, match="GammaTune has no parameter thresold"):
        preset("policy", "typo_preset", GammaTune, public="Typo", module=__name__, doc="", thresold=0.4)
    assert "typo_preset" not in dk.available("policy")
