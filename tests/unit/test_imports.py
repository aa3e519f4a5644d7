"""``import decodekit`` stays cheap: transformers' modeling code (about 2 s of a notebook's first cell, and of every
``python -m decodekit --help``) loads only when a model is built or wrapped."""

import subprocess
import sys

HEAVY = ("transformers.modeling_utils", "transformers.generation.utils", "transformers.models.llama")


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint('\\n'.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_import_leaves_transformers_modeling_code_unloaded():
    assert _loaded_after("import decodekit as dk; dk.available('drafter')") == set()


def test_the_probe_sees_modeling_code_once_a_model_is_built():
    """The same probe reports the modules once something needs them, so the test above can fail."""
    loaded = _loaded_after(
        "import decodekit as dk; from decodekit.models.tiny import tiny_llama; dk.load_model(tiny_llama(0))"
    )
    assert {"transformers.modeling_utils", "transformers.models.llama"} <= loaded
