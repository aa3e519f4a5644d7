"""Command line: ``python -m decodekit bench [hydra overrides]`` (see ``decodekit/recipes/bench.yaml``),
``python -m decodekit train recipe=<name> [hydra overrides]`` (``decodekit/recipes/train/<name>.yaml``),
``python -m decodekit dlm-bench [hydra overrides]`` (``decodekit/recipes/dlm_bench/dlm_bench.yaml``);
``python -m decodekit --help`` lists the commands."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from decodekit.checks import check_bool, check_choice, check_int
from decodekit.errors import ConfigError, ConfigTypeError, DecodeKitError, MissingDependencyError

RECIPES = Path(__file__).parent / "recipes"
COMMANDS = {"bench": "bench", "train": "train", "dlm-bench": "dlm_bench"}
TRAIN_RECIPES = RECIPES / "train"


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


def build_component(cfg: Any, key: str = "component") -> Any:
    """Instantiate a component config; an empty or null config means "none / the default" (None).

    A constructor's error (a wrong-typed override such as ``policy.k=abc``) is raised as a
    :class:`~decodekit.errors.ConfigError` naming the config key, e.g. ``policy.k must be an integer >= 0, got
    'abc' (str)``, instead of Hydra's wrapped traceback.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    if cfg is None or (isinstance(cfg, Mapping) and "_target_" not in cfg):
        return None
    if not isinstance(cfg, Mapping):
        raise ConfigTypeError(f"{key} must be a config group option or a mapping with _target_, got {cfg!r}")
    try:
        return instantiate(cfg)
    except InstantiationException as error:
        raise _keyed_error(key, cfg, error) from error


def _keyed_error(key: str, cfg: Any, error: Exception) -> Exception:
    """``error``'s cause with its message prefixed by the config key it came from (``key`` plus Hydra's
    ``full_key`` of a nested config); decodekit's own error classes are kept."""
    cause: BaseException = error
    full_key = ""
    while cause.__cause__ is not None and type(cause).__name__ == "InstantiationException":
        match = re.search(r"full_key: (\S+)", str(cause))
        full_key = match[1] if match else full_key
        cause = cause.__cause__
    if isinstance(cause, MissingDependencyError):
        return cause
    from omegaconf import OmegaConf

    where = full_key or key  # Hydra's full_key is the path from the root config
    root = cfg._get_root() if OmegaConf.is_config(cfg) else cfg
    node = OmegaConf.select(root, full_key) if full_key and OmegaConf.is_config(root) else cfg
    message = str(cause) if isinstance(cause, DecodeKitError) else f"{type(cause).__name__}: {cause}"
    first = message.split(" ", 1)[0]
    keys = {str(k) for k in node} if isinstance(node, Mapping) else set()
    text = f"{where}.{message}" if first in keys else f"{where}: {message}"
    if isinstance(cause, DecodeKitError):
        try:
            return type(cause)(text)
        except TypeError:  # an error class with another constructor
            pass
    return ConfigTypeError(text) if isinstance(cause, TypeError) else ConfigError(text)


def check_bench_config(cfg: Any) -> None:
    """Check a bench config's plain values (types and ranges) before anything is loaded; each error names its
    key (e.g. ``max_new_tokens must be an integer >= 1, got 'abc' (str)``). Components are checked by their
    constructors when :func:`build_component` instantiates them."""
    from decodekit.bench.methods import Setting
    from decodekit.bench.tasks import TASKS

    check_int("max_new_tokens", cfg.get("max_new_tokens"), low=1)
    check_int("passes", cfg.get("passes", 3), low=1)
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
    task = cfg.get("task")
    if not isinstance(task, Mapping):
        raise ConfigTypeError(f"task must be a task config (task=mixed, ...), got {task!r}")
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
_METHOD_KEYS = {"drafter", "verifier", "policy", "max_batch", "fresh"}
_BASELINE_KINDS = ("greedy", "prompt_lookup", "assisted", "early_exit")


def run_bench(cfg: Any, out_dir: Path) -> str:
    """Build everything a bench config names, run it, write the reports to ``out_dir``; return the table."""
    from decodekit.bench.distributed import init_process
    from decodekit.bench.sweep import build_baselines, build_methods, measure

    check_bench_config(cfg)
    init_process()  # one of several processes (accelerate launch): join them, on this one's device; alone: nothing
    methods = build_methods(cfg)  # the components first: their errors come before the model loads
    return measure(cfg, [*methods.values(), *build_baselines(cfg, methods)], out_dir, ran_config(cfg))


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


USAGE = """usage: python -m decodekit <command> [options]

commands:
  bench    benchmark decoding methods on real prompts (Hydra: group=option and key=value overrides, -m to sweep)
           e.g. python -m decodekit bench experiment=smollm2_main
                python -m decodekit bench drafter=model policy.k=3
                python -m decodekit bench -m policy.k=1,2,4,8   (one benchmark, one table: a row per k)

  train    train a component's weights from a recipe in decodekit/recipes/train/ (Hydra key=value overrides)
           e.g. python -m decodekit train recipe=threshold_head
                python -m decodekit train recipe=threshold_head labels=sampled hydra.run.dir=results/my_head
                python -m decodekit train recipe=threshold_head resume=true   (continue the last run)

  dlm-bench  benchmark diffusion-LM samplers and caches against the base sampler (Hydra key=value overrides)
           e.g. python -m decodekit dlm-bench gen_lengths=[128,256] num_prompts=8
           or a protocol of recipes/dlm_bench/experiment: dlm-bench experiment=bdlm_g256

python -m decodekit <command> --help lists a command's config groups and options."""

APP_NAME = "decodekit"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0)
    if argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    if argv[0] == "train":
        train_main(argv[1:])
        return
    if argv[0] == "dlm-bench":
        dlm_bench_main(argv[1:])
        return
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from decodekit.bench.sweep import Sweep

    sweep = Sweep()

    @hydra.main(version_base="1.3", config_path=str(RECIPES), config_name=COMMANDS[argv[0]])
    def _bench(cfg: Any) -> None:
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode == RunMode.MULTIRUN:  # each job only checks and builds; the sweep runs once, below
            _or_exit(lambda: sweep.add(cfg, hydra_cfg))
            return
        out_dir = Path(hydra_cfg.runtime.output_dir)
        print(_or_exit(lambda: run_bench(cfg, out_dir)))
        print(f"results: {out_dir}/results.json, results.md, speedup.png")

    overrides = argv[1:]
    if not any(arg.startswith("hydra.job.name=") for arg in overrides):
        # Hydra names the app after the calling file (cli); its --help and log file should say decodekit
        overrides = [*overrides, f"hydra.job.name={APP_NAME}"]
    sys.argv = [f"{sys.argv[0]} {argv[0]}", *overrides]
    _bench()
    if sweep.jobs:  # a multirun: all its jobs as one interleaved benchmark
        print(_or_exit(sweep.run))
        print(f"results: {sweep.out_dir}/results.json, results.md, speedup.png")


def train_recipe(args: list[str]) -> tuple[str, list[str]]:
    """The ``recipe=<name>`` argument of ``train`` (a file in ``decodekit/recipes/train/``) and the other args."""
    names = sorted(p.stem for p in TRAIN_RECIPES.glob("*.yaml"))
    given = [a for a in args if a.startswith("recipe=")]
    if len(given) != 1 or given[0].split("=", 1)[1] not in names:
        what = "no recipe=<name>" if not given else ", ".join(given)
        raise ConfigError(f"train needs one recipe=<name>, one of {', '.join(names)}; got {what}")
    return given[0].split("=", 1)[1], [a for a in args if a not in given]


def run_recipe(cfg: Any, out_dir: Path, command: str = "train") -> Any:
    """Call the recipe's ``_target_`` function with its keys and ``out_dir``; returns what it returns (a bad key's
    error names it, or ``command`` for the recipe's own arguments)."""
    from hydra.errors import InstantiationException
    from hydra.utils import call

    try:
        return call(cfg, out_dir=str(out_dir), _convert_="all")
    except InstantiationException as error:
        raise _keyed_error(command, cfg, error) from error


def _hydra_run(
    config_path: Path, config_name: str, command: str, overrides: list[str], body: Callable[[Any, Path], None]
) -> None:
    """Run ``body(cfg, run_dir)`` under Hydra with the recipe ``config_path/config_name`` and ``overrides``
    (``command`` is what Hydra's messages show as the program)."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(version_base="1.3", config_path=str(config_path), config_name=config_name)
    def _main(cfg: Any) -> None:
        body(cfg, Path(HydraConfig.get().runtime.output_dir))

    if not any(arg.startswith("hydra.job.name=") for arg in overrides):
        overrides = [*overrides, f"hydra.job.name={APP_NAME}"]
    sys.argv = [f"{sys.argv[0]} {command}", *overrides]
    _main()


def train_main(args: list[str]) -> None:
    """``python -m decodekit train recipe=<name> [overrides]``: one training run in the recipe's ``hydra.run.dir``."""
    if any(a in ("-h", "--help") for a in args) and not any(a.startswith("recipe=") for a in args):
        print(USAGE)
        return
    name, overrides = _or_exit(lambda: train_recipe(args))

    def train(cfg: Any, out_dir: Path) -> None:
        result = _or_exit(lambda: run_recipe(cfg, out_dir))
        if isinstance(result, Mapping):
            print("\n".join(f"{key}: {value}" for key, value in result.items()))
        print(f"results: {out_dir}")

    _hydra_run(TRAIN_RECIPES, name, f"train recipe={name}", overrides, train)


def dlm_bench_main(args: list[str]) -> None:
    """``python -m decodekit dlm-bench [overrides]``: the diffusion-LM benchmark (``recipes/dlm_bench/dlm_bench.yaml``,
    in a folder of its own so that ``model=`` and ``task=`` are its plain keys, not the bench's config groups)."""

    def bench(cfg: Any, out_dir: Path) -> None:
        print(_or_exit(lambda: run_recipe(cfg, out_dir, "dlm-bench")))
        print(f"results: {out_dir}/results.json, results.md")

    _hydra_run(RECIPES / "dlm_bench", "dlm_bench", "dlm-bench", args, bench)


def _or_exit(call: Callable[[], Any]) -> Any:
    """``call()``; a bad config value or override exits with its message (which says which and what to change)."""
    try:
        return call()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
