"""The exit-head recipe on SmolLM2 cut to 8 layers (``smollm2_cut``; a smoke run: files, numbers, the vocabulary pick)
and the shipped head on the full SmolLM2 (greedy output equal to plain decoding; teacher-forced, it agrees with the
target more often than the untrained exit at the same layer)."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.drafters.exit_head import default_weights, load_exit_head
from decodekit.drafters.head_files import TrimmedHead
from decodekit.train.exit_head import exit_states, train
from tests.conftest import CUT
from tests.integration.head_prompts import HEAD_NEW
from tests.integration.test_eagle_recipe import SMALL

pytestmark = pytest.mark.slow


def test_smoke_run_trains_and_picks_a_vocabulary(tmp_path, smollm2_cut):
    small = {**SMALL, "text_chunks": 12}  # the exit head's validation loss needs 12 chunks to fall in 2 epochs
    summary = train(tmp_path, base=smollm2_cut, exit_layer=3, width=64, epochs=2, **small)
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    assert summary["vocab"]["picked"] in (256, 1024) and summary["exit_layer"] == 3
    for name in (f"exit_head_{CUT}.safetensors", "loss.png", "summary.json", "history.json"):
        assert (tmp_path / name).is_file()
    head, meta = load_exit_head(tmp_path / f"exit_head_{CUT}.safetensors", dk.load_model(smollm2_cut))
    assert head.exit_layer == 3 and len(head.vocab) == summary["vocab"]["picked"] and meta["width"] == 64


def test_shipped_head_is_greedy_decoding_and_beats_the_untrained_exit(smollm2, head_plain):
    """Greedy output is plain decoding's, with drafts accepted; teacher-forced on that output, the head's draft
    agrees with the target's next token more often than the untrained exit at the same layer (the target's own norm
    and head on that layer's state: what ``EarlyExitDrafter(layer)`` drafts), i.e. its first draft token is
    accepted more often."""
    assert default_weights().is_file()
    ids, plain = head_plain
    trained = EarlyExitDrafter(exit_head=True)
    out = dk.generate(smollm2, ids, trained, max_new_tokens=HEAD_NEW, debug=True)
    assert out.sequences == plain
    assert out.stats.mean_acceptance_length > 1.05  # measured 1.28 (the untrained exit: 1.07)

    head, _ = load_exit_head(default_weights(), smollm2)
    trimmed = TrimmedHead(smollm2, head.vocab)
    agree = {"trained": 0, "untrained": 0}
    for prompt, continuation in zip(ids, plain):
        tokens = torch.tensor([prompt + continuation])
        with torch.no_grad():
            n = exit_states(smollm2, tokens, head.exit_layer)[0, len(prompt) - 1 : -1]  # predicts each new token
            drafts = {
                "trained": head.vocab[trimmed.scores(head(n)).argmax(-1)],
                "untrained": smollm2.head(n).argmax(-1),
            }
        for name, draft in drafts.items():
            agree[name] += int((draft == torch.tensor(continuation)).sum())
    assert agree["trained"] > agree["untrained"] + 3, agree  # measured 9 and 2 of the 48 new tokens (14, 2 of 64)


def test_an_exit_layer_past_the_target_is_refused_before_any_data_is_built(tmp_path):
    from decodekit.errors import ConfigError

    with pytest.raises(ConfigError, match="exit_layer=30 must be below the target's 30 layers"):
        train(tmp_path, exit_layer=30, chat_prompts=2, code_prompts=2, text_chunks=4, progress=False)
    assert not (tmp_path / "data").exists()


def test_a_target_without_a_linear_output_head_is_refused_before_any_data_is_built(tmp_path, monkeypatch):
    import decodekit.drafters.head_files as recipe
    from decodekit.errors import ConfigError

    monkeypatch.setattr(recipe, "head_rows", lambda target, ids: None)  # as for a target whose head is not linear
    with pytest.raises(ConfigError, match="no plain linear lm_head"):
        train(tmp_path, chat_prompts=2, code_prompts=2, text_chunks=4, progress=False)
    assert not (tmp_path / "data").exists()
