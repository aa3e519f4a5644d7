"""``import decodekit`` stays cheap: transformers' modeling code (about 2 s of a notebook's first cell, and of every
``python -m decodekit --help``) loads only when a model is built or wrapped."""

import subprocess
import sys

HEAVY = ("transformers.modeling_utils", "transformers.generation.utils", "transformers.models.llama")


def _loaded_after(*steps: str) -> list[set[str]]:
    """One fresh interpreter runs ``steps`` in order; after each, the ``HEAVY`` modules it has loaded."""
    report = f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules) + ' |')"
    probe = "\n".join(["import sys", *(f"{step}\n{report}" for step in steps)])
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return [set(part.split()) for part in done.stdout.split("|")[: len(steps)]]


def test_import_leaves_transformers_modeling_code_unloaded_until_a_model_is_built():
    """The same probe then reports the modules once something needs them, so the first check can fail."""
    imported, built = _loaded_after(
        "import decodekit as dk; dk.available('drafter')",
        "from decodekit.models.tiny import tiny_llama; dk.load_model(tiny_llama(0))",
    )
    assert imported == set()
    assert {"transformers.modeling_utils", "transformers.models.llama"} <= built
