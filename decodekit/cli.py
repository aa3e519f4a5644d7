"""Command line: ``python -m decodekit bench [hydra overrides]`` (see ``decodekit/recipes/bench.yaml``),
``python -m decodekit train recipe=<name> [hydra overrides]`` (``decodekit/recipes/train/<name>.yaml``),
``python -m decodekit dlm-bench [hydra overrides]`` (``decodekit/recipes/dlm_bench/dlm_bench.yaml``);
``python -m decodekit --help`` lists the commands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from decodekit.bench.config import check_bench_config, ran_config
from decodekit.errors import ConfigError
from decodekit.instantiate import keyed_error
from decodekit.train.arguments import writable_dir

RECIPES = Path(__file__).parent / "recipes"
COMMANDS = {"bench": "bench", "train": "train", "dlm-bench": "dlm_bench"}
TRAIN_RECIPES = RECIPES / "train"


def run_bench(cfg: Any, out_dir: Path) -> str:
    """Build everything a bench config names, run it, write the reports to ``out_dir``; return the table."""
    from decodekit.bench.distributed import init_process
    from decodekit.bench.sweep import build_baselines, build_methods, measure

    check_bench_config(cfg)
    init_process()  # one of several processes (accelerate launch): join them, on this one's device; alone: nothing
    methods = build_methods(cfg)  # the components first: their errors come before the model loads
    return measure(cfg, [*methods.values(), *build_baselines(cfg, methods)], out_dir, ran_config(cfg))


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

    _check_run_dirs(argv[1:])
    sys.argv = [f"{sys.argv[0]} {argv[0]}", *_named(argv[1:])]
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
        raise keyed_error(command, cfg, error) from error


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

    _check_run_dirs(overrides)
    sys.argv = [f"{sys.argv[0]} {command}", *_named(overrides)]
    _main()


def _check_run_dirs(overrides: list[str]) -> None:
    """A literal ``hydra.run.dir=`` / ``hydra.sweep.dir=`` that cannot be made or written exits with a message
    naming the key, not with Hydra's bare OS error."""
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value and "${" not in value:
            _or_exit(lambda key=key, value=value: writable_dir(key, value))


def _named(overrides: list[str]) -> list[str]:
    """``overrides`` with ``hydra.job.name=decodekit`` (Hydra names the app after the calling file, cli; its --help and
    log file should say decodekit), placed beside the user's overrides so that a flag after them (``--cfg job``)
    still parses."""
    if any(arg.startswith("hydra.job.name=") for arg in overrides):
        return overrides
    at = next((i for i, arg in enumerate(overrides) if "=" in arg and not arg.startswith("-")), len(overrides))
    return [*overrides[:at], f"hydra.job.name={APP_NAME}", *overrides[at:]]


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
