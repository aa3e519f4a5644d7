"""The bench config: its plain values checked before anything loads, method labels, and the config as it ran."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from decodekit.bench.load import RETRIES
from decodekit.checks import check_bool, check_choice, check_int, did_you_mean
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.models.compile_switch import CHOICES as COMPILE_CHOICES

GENERIC_METHOD = "speculative"  # bench.yaml's method built from the drafter / verifier / policy groups


def method_label(parts: dict[str, Any]) -> str:
    """Name a method by what runs: ``ngram k=4``, ``model k=3 rejection``; ``autoregressive`` without a drafter."""
    from decodekit.registry import name_of

    drafter, verifier, policy = parts.get("drafter"), parts.get("verifier"), parts.get("policy")
    if drafter is None:
        return "autoregressive"
    label = [name_of("drafter", drafter)]
    if policy is not None:
        k = getattr(policy, "k", None)
        label.append(f"k={k}" if k is not None else name_of("policy", policy))
    if verifier is not None:
        label.append(name_of("verifier", verifier))
    return " ".join(label)


def check_bench_config(cfg: Any) -> None:
    """Check a bench config's plain values (types and ranges) before anything is loaded; each error names its
    key (e.g. ``max_new_tokens must be an integer >= 1, got 'abc' (str)``). Components are checked by their
    constructors when :func:`~decodekit.instantiate.build_component` instantiates them."""
    from decodekit.bench.methods import Setting
    from decodekit.bench.tasks import TASKS

    check_int("max_new_tokens", cfg.get("max_new_tokens"), low=1)
    check_int("passes", cfg.get("passes", 3), low=1)
    check_int("reruns", cfg.get("reruns", RETRIES), low=0, hint=" (re-runs of a timed call other processes disturbed)")
    check_int("seed", cfg.get("seed"))
    check_bool("progress", cfg.get("progress"))
    check_int("oracle", cfg.get("oracle"), low=1, optional=True, hint=" (the longest draft length to profile)")
    sizes = cfg.get("batch_sizes")
    if not _is_list(sizes) or not sizes:
        raise ConfigTypeError(f"batch_sizes must be a non-empty list of integers >= 1, e.g. [1, 8], got {sizes!r}")
    for i, size in enumerate(sizes):
        check_int(f"batch_sizes[{i}]", size, low=1)
    settings = cfg.get("settings")
    if not _is_list(settings) or not settings:
        raise ConfigTypeError(
            f"settings must be a non-empty list of {{name, temperature, top_k, top_p}}, got {settings!r}"
        )
    for i, setting in enumerate(settings):
        where = f"settings[{i}]"
        if not isinstance(setting, Mapping) or not isinstance(setting.get("name"), str):
            raise ConfigTypeError(
                f"{where} must be a mapping with a string name, e.g. {{name: greedy, temperature: 0}}"
            )
        extra = sorted(set(map(str, setting)) - _SETTING_KEYS)
        if extra:
            raise ConfigError(f"{where} has unknown keys {extra}; allowed: {', '.join(sorted(_SETTING_KEYS))}")
        try:
            Setting(**setting)
        except ConfigError as error:
            raise type(error)(f"{where}.{error}") from None
    unknown = sorted(set(map(str, cfg)) - _TOP_KEYS - experiment_keys())
    if unknown:  # a key added with +key=..., which nothing reads
        raise ConfigError(f"the bench config has unknown keys {unknown}{did_you_mean(unknown[0], _TOP_KEYS)}")
    task = cfg.get("task")
    if not isinstance(task, Mapping):
        raise ConfigTypeError(f"task must be a task config (task=mixed, ...), got {task!r}")
    extra = sorted(set(map(str, task)) - _TASK_KEYS)
    if extra:
        hint = did_you_mean(extra[0], _TASK_KEYS)
        raise ConfigError(f"task has unknown keys {extra}{hint}; allowed: {', '.join(sorted(_TASK_KEYS))}")
    check_choice("task.name", task.get("name"), TASKS)
    check_int("task.num_prompts", task.get("num_prompts"), low=1, optional=True)
    check_int("task.max_prompt_tokens", task.get("max_prompt_tokens"), low=1)
    check_int("task.seed", task.get("seed"))
    methods = cfg.get("methods")
    if not isinstance(methods, Mapping) or not any(spec is not None for spec in methods.values()):
        raise ConfigTypeError(
            f"methods must map names to {{drafter, verifier, policy}} (at least one), got {methods!r}"
        )
    for name, spec in methods.items():
        if spec is None:
            continue
        if not isinstance(spec, Mapping):
            raise ConfigTypeError(f"methods.{name} must be a mapping of drafter / verifier / policy, got {spec!r}")
        extra = sorted(set(map(str, spec)) - _METHOD_KEYS)
        if extra:
            raise ConfigError(f"methods.{name} has unknown keys {extra}; allowed: {', '.join(sorted(_METHOD_KEYS))}")
        check_int(f"methods.{name}.max_batch", spec.get("max_batch"), low=1, optional=True)
        if spec.get("fresh") is not None:
            check_bool(f"methods.{name}.fresh", spec.get("fresh"))
        if spec.get("compile") is not None:
            check_choice(f"methods.{name}.compile", spec.get("compile"), COMPILE_CHOICES)
    baselines = cfg.get("baselines") or {}
    if not isinstance(baselines, Mapping):
        raise ConfigTypeError(
            f"baselines must map names to {{kind, k, max_ngram, exit_layer, assistant_from}}, got {baselines!r}"
        )
    for name, spec in baselines.items():
        if not isinstance(spec, Mapping):
            raise ConfigTypeError(f"baselines.{name} must be a mapping (kind: {' | '.join(_BASELINE_KINDS)})")
        check_choice(f"baselines.{name}.kind", spec.get("kind", "greedy"), _BASELINE_KINDS)
        for field in ("k", "max_ngram", "exit_layer"):
            check_int(f"baselines.{name}.{field}", spec.get(field), low=1, optional=True)
        source = spec.get("assistant_from")
        if source is not None and methods.get(source) is None:
            raise ConfigError(f"baselines.{name}.assistant_from must name a method, got {source!r}")


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


COMPONENTS = ("drafter", "verifier", "policy")
_SETTING_KEYS = {"name", "temperature", "top_k", "top_p"}
_METHOD_KEYS = {"drafter", "verifier", "policy", "max_batch", "fresh", "compile"}
_BASELINE_KINDS = ("greedy", "static_compiled", "prompt_lookup", "assisted", "early_exit")
_TASK_KEYS = {"name", "num_prompts", "max_prompt_tokens", "seed"}
_TOP_KEYS = {  # bench.yaml's keys and groups
    "model", "task", "drafter", "verifier", "policy", "methods", "baselines", "settings", "batch_sizes",
    "max_new_tokens", "seed", "passes", "reruns", "oracle", "progress",
}  # fmt: skip


@functools.cache
def experiment_keys() -> frozenset[str]:
    """The top-level keys the packaged experiments add (``candidate``, ``dflash_weights``, ...: interpolated into
    their methods)."""
    import yaml

    folder = Path(__file__).resolve().parent.parent / "recipes" / "experiment"
    return frozenset(k for f in folder.glob("*.yaml") for k in (yaml.safe_load(f.read_text()) or {}) if k != "defaults")


def ran_config(cfg: Any) -> dict[str, Any]:
    """The bench config as it ran, for ``results.json``: resolved, without the disabled (null) methods and without
    the component groups (``drafter`` / ``verifier`` / ``policy``) that nothing that ran refers to (e.g. under
    ``experiment=smollm2_main``, whose methods spell out their components)."""
    from omegaconf import OmegaConf

    def enabled(config: dict[str, Any]) -> dict[str, Any]:
        methods = config.get("methods") or {}
        return config | {"methods": {name: spec for name, spec in methods.items() if spec is not None}}

    raw = enabled(OmegaConf.to_container(cfg, resolve=False))
    referenced = {root for key, value in raw.items() if key not in COMPONENTS for root in _interpolated(value)}
    resolved = enabled(OmegaConf.to_container(cfg, resolve=True))
    return {key: value for key, value in resolved.items() if key not in COMPONENTS or key in referenced}


_INTERPOLATION = re.compile(r"\$\{\s*\.*([A-Za-z_]\w*)")


def _interpolated(value: Any) -> set[str]:
    """The top-level keys that the interpolations (``${drafter}``, ``${policy.k}``) inside ``value`` start from."""
    if isinstance(value, str):
        return set(_INTERPOLATION.findall(value))
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else ()
    return set().union(*map(_interpolated, items)) if items else set()


__all__ = ["COMPONENTS", "GENERIC_METHOD", "check_bench_config", "method_label", "ran_config"]
