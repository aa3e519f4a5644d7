"""Measured round costs for the benchmark's oracle column, profiled once per drafter and machine and cached on disk."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from decodekit.policies.analytic import CostModel

CACHE_DIR = Path(os.environ.get("DECODEKIT_CACHE", Path.home() / ".cache" / "decodekit")) / "costs"


def fingerprint(obj: Any) -> str:
    """What identifies a drafter or model for the cache: its repr, and for a model its class, its parameters'
    count, dtypes and modules' classes (int8 kernels, a cut to fewer layers), its device and the CPU or GPU."""
    parts = [repr(obj)]
    module = getattr(obj, "hf", None) or getattr(getattr(obj, "model", None), "hf", None)
    if isinstance(module, torch.nn.Module):
        params = list(module.parameters())
        parts += [
            str(sum(p.numel() for p in params)),
            ",".join(sorted({str(p.dtype) for p in params})),
            ",".join(sorted({type(m).__name__ for m in module.modules()})),
        ]
    return "|".join(parts)


def measured_costs(
    model: Any,
    drafter: Any,
    prompts: Sequence[Sequence[int]],
    max_len: int,
    batch_sizes: Sequence[int],
    machine: dict[str, Any],
    cache_dir: Path | None = None,
    progress: bool = True,
) -> dict[int, CostModel]:
    """``{batch size: CostModel}`` of ``drafter`` on ``model`` (:func:`~decodekit.policies.profile_costs`), read from
    ``cache_dir`` when this drafter, model, lengths, batch sizes and machine (``machine``: CPU, device, versions)
    were profiled before; written there otherwise. Delete the directory to re-measure."""
    from decodekit.policies import profile_costs

    keyed = {k: machine.get(k) for k in ("cpu", "cpus_usable", "torch_threads", "device", "gpu", "torch")}
    key = json.dumps(
        [fingerprint(model), fingerprint(drafter), max_len, sorted(batch_sizes), keyed, len(prompts)], sort_keys=True
    )
    path = (cache_dir or CACHE_DIR) / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if path.is_file():
        stored = json.loads(path.read_text())["costs"]
        return {int(b): CostModel(tuple(c["draft"]), tuple(c["verify"]), c["overhead"]) for b, c in stored.items()}
    costs = profile_costs(model, drafter, prompts, max_len, batch_sizes, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = {b: {"draft": c.draft, "verify": c.verify, "overhead": c.overhead} for b, c in costs.items()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": json.loads(key), "costs": table}, indent=1))
    tmp.replace(path)  # never a half-written cache file
    return costs
