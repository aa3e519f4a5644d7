"""The house's layout (issue 56): a small ground floor at the package root, the speculative loop's modules in
``decodekit/spec/``, the draft types in ``decodekit/draft/``; the old module names still import, as the same module
objects; no runtime import cycle among decodekit's modules (imports at module level, outside ``TYPE_CHECKING``), and
nothing below the benchmarks and the training recipes imports them; no module over 300 lines."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import decodekit

PKG = Path(decodekit.__file__).parent


def test_the_root_holds_the_ground_floor_only():
    root = sorted(p.stem for p in PKG.glob("*.py"))
    assert len(root) <= 14, root
    assert {"generate", "state", "round", "draft", "budget", "trees"}.isdisjoint(root)


def test_no_module_is_over_300_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"split these modules by concern (issue 56): {long}"


def test_moved_modules_import_by_their_old_names_as_the_same_objects():
    for old, new in decodekit._MOVED.items():
        assert importlib.import_module(f"decodekit.{old}") is importlib.import_module(f"decodekit.{new}"), old
    from decodekit.state import DecodeState

    from decodekit.draft import Draft

    assert Draft is decodekit.Draft and DecodeState is decodekit.DecodeState


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _runtime_imports(body: list[ast.stmt], modules: dict[str, Path]) -> set[str]:
    """decodekit modules imported when ``body`` runs at module level (``if TYPE_CHECKING:`` bodies skipped)."""
    found: set[str] = set()
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= _runtime_imports(node.orelse, modules)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (getattr(node, "body", []), getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                found |= _runtime_imports(block, modules)
            for handler in getattr(node, "handlers", []):
                found |= _runtime_imports(handler.body, modules)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            }
    return found & modules.keys()


def test_no_runtime_import_cycle():
    modules = _modules()
    graph = {m: _runtime_imports(ast.parse(p.read_text()).body, modules) - {m} for m, p in modules.items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("runtime import cycle: " + " -> ".join(path[path.index(module) :] + [module]))
        if module in done:
            return
        for other in sorted(graph[module]):
            visit(other, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_wings_and_the_ground_floor_import_no_benchmark_or_training_code():
    """Benchmarks and training recipes sit above both wings: nothing a decoding call runs imports them."""
    modules = _modules()
    above = ("decodekit.bench", "decodekit.train", "decodekit.cli", "decodekit.hf")
    for module, path in modules.items():
        if module in ("decodekit", "decodekit.__main__") or module.startswith(above):
            continue
        upward = {m for m in _runtime_imports(ast.parse(path.read_text()).body, modules) if m.startswith(above)}
        assert not upward, f"{module} imports {sorted(upward)} at import time"


def test_the_two_wings_import_each_other_not_at_all():
    """``decodekit.dlm`` and ``decodekit.spec`` stand side by side on the ground floor: what both need (prompts,
    caches, masks, models) lives there, not in either wing."""
    modules = _modules()
    for wing, other in (("decodekit.dlm", "decodekit.spec"), ("decodekit.spec", "decodekit.dlm")):
        for module, path in modules.items():
            if module.startswith(wing):
                crossing = {
                    m for m in _runtime_imports(ast.parse(path.read_text()).body, modules) if m.startswith(other)
                }
                assert not crossing, f"{module} imports {sorted(crossing)}"


def test_the_public_root_is_small_and_the_hooks_stay_importable():
    assert len(decodekit.__all__) <= 35 and all(hasattr(decodekit, name) for name in decodekit.__all__)
    for name in ("Begins", "Observes", "SelectsRows", "SharesTarget", "VocabMismatchError", "UnmaskRule"):
        owner = decodekit.interfaces if hasattr(decodekit.interfaces, name) else decodekit.errors
        assert getattr(decodekit, name) is getattr(owner, name), name
    assert {"UnmaskRule", "DLMCache", "DLMDraft", "RegionSchedule"} <= set(decodekit.dlm.__all__)
