"""How one bench config runs: ``python -m decodekit bench ...`` builds the config's methods (:func:`build_methods`)
and transformers baselines (:func:`build_baselines`) and measures them in one interleaved benchmark
(:func:`measure`), with the oracle column's measured costs where asked (:func:`add_oracle_costs`). A sweep
(:class:`~decodekit.bench.sweep.Sweep`) builds each job's methods the same way and measures them all at once; the
names are also importable from :mod:`decodekit.bench.sweep`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decodekit.bench.config import COMPONENTS, GENERIC_METHOD, method_label
from decodekit.bench.load import RETRIES
from decodekit.errors import ConfigError
from decodekit.instantiate import build_component

if TYPE_CHECKING:
    from decodekit.bench.methods import Method, TransformersBaseline

__all__ = ["add_oracle_costs", "build_baselines", "build_methods", "measure"]


def build_methods(cfg: Any, build: Callable[[Any, str], Any] = build_component) -> dict[str, Method]:
    """The enabled decodekit methods of ``cfg.methods`` by config name, their components built by ``build``;
    ``speculative`` (the one built from the drafter / verifier / policy groups) is labelled by what runs. A verifier
    that refuses one of ``cfg.settings`` (``verifier=greedy`` with a sampled setting) is refused here, before the
    model loads."""
    from decodekit.bench.methods import Method, Setting
    from decodekit.interfaces import ChecksSampling

    methods = {}
    for name, spec in cfg.methods.items():
        if spec is None:
            continue
        parts = {key: build(spec.get(key), f"methods.{name}.{key}") for key in COMPONENTS}
        if isinstance(parts["verifier"], ChecksSampling):
            for setting in cfg.get("settings") or ():
                try:
                    parts["verifier"].check(Setting(**setting))
                except ConfigError as error:
                    raise ConfigError(
                        f"methods.{name}.verifier cannot run settings {setting['name']}: {error}"
                    ) from None
        label = method_label(parts) if name == GENERIC_METHOD else str(name)
        methods[str(name)] = Method(
            label,
            **parts,
            max_batch=spec.get("max_batch"),
            fresh=bool(spec.get("fresh")),
            compile=spec.get("compile") or False,
        )
    return methods


def build_baselines(cfg: Any, methods: Mapping[str, Method]) -> list[TransformersBaseline]:
    """``cfg.baselines`` as transformers baselines; ``assistant_from`` names a method of ``methods`` (by config
    name) whose draft model assisted generation uses."""
    from decodekit.bench.methods import TransformersBaseline

    baselines = []
    for name, spec in (cfg.baselines or {}).items():
        spec = dict(spec)
        source = spec.pop("assistant_from", None)
        if source is not None:
            draft_model = getattr(methods[source].drafter, "model", None)
            if draft_model is None:
                raise ConfigError(f"baselines.{name}.assistant_from={source!r} names a method without a draft model")
            spec["assistant"] = draft_model
        baselines.append(TransformersBaseline(str(name), **spec))
    return baselines


def measure(cfg: Any, methods: Sequence[Method | TransformersBaseline], out_dir: Path, config: dict[str, Any]) -> str:
    """Load ``cfg``'s model and task, run ``methods`` (the first is the reference) in one interleaved benchmark
    with ``cfg``'s settings, write the reports (``config`` into ``results.json``) to ``out_dir``; return the table."""
    from decodekit.bench.machine import machine_info
    from decodekit.bench.methods import Setting
    from decodekit.bench.report import save
    from decodekit.bench.runner import run_benchmark
    from decodekit.bench.tasks import load_task
    from decodekit.policies.analytic import wants_measured_costs

    measured = [m.name for m in methods if wants_measured_costs(getattr(m, "policy", None))]
    if measured and not cfg.get("oracle"):
        raise ConfigError(
            f"{', '.join(measured)}: a policy with costs='measured' takes the costs the benchmark profiles for the "
            "oracle column; set oracle=<the longest draft length to profile>, e.g. oracle=8"
        )
    model = build_component(cfg.model, "model")
    if model is None:
        raise ConfigError("model must be a model config (model=smollm2, or a mapping with _target_)")
    task = cfg.task
    data = load_task(
        task.name,
        model.tokenizer,
        num_prompts=task.num_prompts,
        max_prompt_tokens=task.max_prompt_tokens,
        seed=task.seed,
    )
    info = machine_info(model) | {"task": task.name, "prompts": len(data)}
    if cfg.get("oracle"):
        add_oracle_costs(methods, model, data["input_ids"], cfg.oracle, list(cfg.batch_sizes), info, cfg.progress)
    results = run_benchmark(
        model,
        data["input_ids"],
        methods,
        settings=[Setting(**s) for s in cfg.settings],
        batch_sizes=list(cfg.batch_sizes),
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        passes=cfg.get("passes", 3),
        progress=cfg.progress,
        reruns=cfg.get("reruns", RETRIES),
        prompt_ids=list(data["id"]),
    )
    tasks = list(data["task"]) if "task" in data.column_names else None
    return save(results, out_dir, info, config, tasks)


def add_oracle_costs(
    methods: Sequence[Any],
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_len: int,
    batch_sizes: list[int],
    machine: dict[str, Any],
    progress: bool,
) -> None:
    """Give every speculative method without costs its drafter's measured costs (the oracle column), and its policy
    too where it was built with ``costs="measured"``: profiled once per distinct drafter
    (:func:`~decodekit.bench.costs.measured_costs`, cached on disk)."""
    from decodekit.bench.costs import fingerprint, measured_costs
    from decodekit.policies.analytic import use_measured_costs

    measured: dict[str, Any] = {}
    for method in methods:
        drafter = getattr(method, "drafter", None)
        if drafter is None or getattr(method, "costs", True) is not None:
            continue  # autoregressive decoding, transformers baselines, costs given
        key = fingerprint(drafter)
        if key not in measured:
            measured[key] = measured_costs(model, drafter, prompts, max_len, batch_sizes, machine, progress=progress)
        method.costs = measured[key]
        use_measured_costs(method.policy, method.costs)
