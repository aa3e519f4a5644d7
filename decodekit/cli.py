"""Command line: ``python -m decodekit bench [hydra overrides]`` (see ``decodekit/recipes/bench.yaml``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

RECIPES = Path(__file__).parent / "recipes"
COMMANDS = {"bench": "bench"}


def build_component(cfg: Any) -> Any:
    """Instantiate a component config; an empty or null config means "none / the default" (None)."""
    from hydra.utils import instantiate

    if cfg is None or (hasattr(cfg, "keys") and "_target_" not in cfg):
        return None
    return instantiate(cfg)


def run_bench(cfg: Any, out_dir: Path) -> str:
    """Build everything a bench config names, run it, write the reports to ``out_dir``; return the table."""
    from omegaconf import OmegaConf

    from decodekit.bench.methods import Method, Setting, TransformersBaseline
    from decodekit.bench.report import save
    from decodekit.bench.runner import machine_info, run_benchmark
    from decodekit.bench.tasks import load_task

    model = build_component(cfg.model)
    task = cfg.task
    data = load_task(
        task.name,
        model.tokenizer,
        num_prompts=task.num_prompts,
        max_prompt_tokens=task.max_prompt_tokens,
        seed=task.seed,
    )
    methods: list[Method | TransformersBaseline] = []
    for name, spec in cfg.methods.items():
        if spec is None:
            continue
        spec = spec or {}
        parts = {key: build_component(spec.get(key)) for key in ("drafter", "verifier", "policy")}
        methods.append(Method(str(name), **parts))
    by_name = {m.name: m for m in methods}
    for name, spec in (cfg.baselines or {}).items():
        spec = dict(spec)
        source = spec.pop("assistant_from", None)
        if source is not None:
            spec["assistant"] = by_name[source].drafter.model
        methods.append(TransformersBaseline(str(name), **spec))
    results = run_benchmark(
        model,
        data["input_ids"],
        methods,
        settings=[Setting(**s) for s in cfg.settings],
        batch_sizes=list(cfg.batch_sizes),
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        progress=cfg.progress,
        prompt_ids=list(data["id"]),
    )
    info = machine_info(model) | {"task": task.name, "prompts": len(data)}
    return save(results, out_dir, info, OmegaConf.to_container(cfg, resolve=True))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m decodekit bench [hydra overrides, e.g. experiment=smollm2_main policy.k=4]")
        sys.exit(2)
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(version_base="1.3", config_path=str(RECIPES), config_name=COMMANDS[argv[0]])
    def _bench(cfg: Any) -> None:
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        print(run_bench(cfg, out_dir))
        print(f"results: {out_dir}/results.json, results.md, speedup.png")

    sys.argv = [f"{sys.argv[0]} {argv[0]}", *argv[1:]]
    _bench()
