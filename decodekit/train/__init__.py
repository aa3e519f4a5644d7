"""Training recipes run by ``python -m decodekit train recipe=<name>`` (``decodekit/recipes/train/<name>.yaml``
names the training function in ``_target_``); see docs/training.md. :func:`export_head` writes a trained EAGLE-3
head in the layouts vLLM serves (:mod:`decodekit.train.export`), :func:`export_dflash` a DFlash head in the one z-lab
releases and vLLM serves (:mod:`decodekit.drafters.dflash_release`)."""

from __future__ import annotations

from typing import Any

__all__ = ["export_dflash", "export_head"]


def __getattr__(name: str) -> Any:  # the recipes' modules load only when used
    if name == "export_head":
        from decodekit.train.export import export_head

        return export_head
    if name == "export_dflash":
        from decodekit.drafters.dflash_release import export_dflash

        return export_dflash
    raise AttributeError(f"module 'decodekit.train' has no attribute {name!r}")
