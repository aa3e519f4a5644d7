"""The ``dflash`` drafter (a block-diffusion head on the target's fused features, one forward a block): its block
logits and greedy acceptance lengths equal a hand transcription of the authors' code; greedy output equals plain
decoding with drafts accepted and rejected on ragged rows; sampled output keeps the target's exact law, and a
variant that misreports ``q`` fails that test; the training loss learns on self-distilled data; its refusals.

The reference read: z-lab/dflash @ 44947fb, ``dflash/model.py`` (``DFlashDraftModel.forward``,
``Qwen3DFlashAttention``, ``dflash_generate``). The transcription below is ours: the reference's order of
operations (the fused context projected by every layer's ``k_proj`` / ``v_proj`` next to the block's, per-head
norms, RoPE over the context's and the block's positions, attention without a mask, the final norm and the target's
output head) and its greedy loop (a block of the pending token and mask slots, acceptance by matching the target's
argmax); the target's cache is replaced by a full forward each round (the same numbers).
"""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters.dflash import DFlashDrafter
from decodekit.drafters.dflash_head import DFlashHead, default_layers
from decodekit.drafters.feature_queue import requeue
from decodekit.drafters.head_files import head_metadata
from decodekit.errors import ConfigError
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.train.blocks import BlockObjective, sample_anchors
from decodekit.train.dflash import block_mask, block_outputs
from decodekit.train.layer_features import final_states, layer_states
from decodekit.train.recipe import Batch
from decodekit.verifiers import RejectionVerifier
from tests.unit.test_host_syncs import count_syncs
from tests.unit.test_lossless import MisreportsQ, assert_detected, assert_matches, sample_counts

LAYERS, BLOCK = (1, 2), 4


def save(head: DFlashHead, target, path) -> str:
    head.save(path, head_metadata(target, **head.file_fields()))
    return str(path)


def fit(head: DFlashHead, target, steps: int, seed: int = 0) -> list[dict[str, float]]:
    """``steps`` of the recipe's loss on the target's own greedy continuations of random prompts."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, target.vocab_size, (6,), generator=gen).tolist() for _ in range(48)]
    outs = dk.generate(target, prompts, max_new_tokens=34, eos_token_id=()).sequences
    tokens = torch.tensor([p + s for p, s in zip(prompts, outs)])
    lengths, starts = torch.full((len(tokens),), tokens.shape[1]), torch.full((len(tokens),), 6)
    taps, feats = layer_states(target, tokens, head.target_layers), final_states(target, tokens)
    w = target.lm_head.weight.detach()
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    stats = []
    for _ in range(steps):
        idx = torch.randint(0, len(tokens), (16,), generator=gen)
        blocks = sample_anchors(lengths[idx], starts[idx], 8, gen)
        batch = Batch(tokens[idx], feats[idx], lengths[idx], starts[idx])
        outputs = lambda t, a: block_outputs(head, target.embed, t, taps[idx], a)  # noqa: B023, E731
        loss, st = BlockObjective(8, 2.0).loss(outputs, batch, w, blocks)
        opt.zero_grad()
        loss.backward()
        opt.step()
        stats.append({"loss": float(loss.detach()), **st})
    return stats


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target (32 tokens) and a DFlash head trained on it for a few steps: drafts accepted and rejected. Three
    layers: the head reads layers 1 and 2, never the last, whose output transformers returns normed (the reference
    reads ``hidden_states[i]``, decodekit every layer's output before the final norm)."""
    target = dk.load_model(tiny_llama(0, vocab=32, layers=3, init=0.4))
    torch.manual_seed(0)
    head = DFlashHead(target.hf.config, LAYERS, 1, BLOCK)
    head.init_from(target)
    stats = fit(head, target, 150)
    return target, head.eval(), save(head, target, tmp_path_factory.mktemp("dflash") / "head.safetensors"), stats


def test_training_learns_on_self_distilled_data(trained):
    stats = trained[3]
    first, last = stats[:5], stats[-10:]
    assert sum(s["loss"] for s in last) / len(last) < 0.8 * sum(s["loss"] for s in first) / len(first)


def test_greedy_equals_plain_decoding(trained, ragged_prompts):
    target, _, path, _ = trained
    ragged_prompts = [[t % 32 for t in p] for p in ragged_prompts]
    plain = dk.generate(target, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    for k in (1, 3, 5):  # 5: more than the block's mask slots (capped at 3)
        out = dk.generate(target, ragged_prompts, DFlashDrafter(path), policy=FixedLength(k), max_new_tokens=24,
                          eos_token_id=(), debug=True)  # fmt: skip
        assert out.sequences == plain, k
        assert 0 < out.stats.accepted < out.stats.drafted, k
        assert len(out.stats.drafted_per_pos) <= BLOCK - 1


class EveryOther(FixedLength):
    """``k`` drafts every other round, none between: the rounds without a draft leave the committed tokens'
    features queued for the next draft (:func:`~decodekit.drafters.feature_queue.requeue`)."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.round = 0

    def plan(self, state):
        self.round += 1
        return dk.DraftBudget.uniform(state.lengths, self.k if self.round % 2 else 0)


class Logged(DFlashDrafter):
    """Keeps each drafted round's block logits with the committed tokens they were drafted after (batch 1)."""

    def _block_logits(self, state):
        logits = super()._block_logits(state)
        self.log.append((state.tokens[0, : int(state.lengths[0])].tolist(), logits[0]))
        return logits


def test_rounds_without_a_draft_keep_the_features_queued(trained):
    """Drafting every other round, each block's logits are the reference forward's on the whole committed context
    (the features of the rounds without a draft stayed queued, in order)."""
    target, head, path, _ = trained
    drafter = Logged(path)
    drafter.log = []
    out = dk.generate(target, [[5, 17, 2, 29, 30, 3]], drafter, policy=EveryOther(3), max_new_tokens=24,
                      eos_token_id=(), debug=True)  # fmt: skip
    assert out.sequences == dk.generate(target, [[5, 17, 2, 29, 30, 3]], max_new_tokens=24, eos_token_id=()).sequences
    assert len(drafter.log) > 4
    for committed, logits in drafter.log:
        with torch.no_grad():
            states = target.hf(torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states
            taps = torch.cat([states[i] for i in LAYERS], -1)
            want = reference_draft_logits(head, target, taps, torch.tensor([committed[-1:] + [0] * (BLOCK - 1)]))
        torch.testing.assert_close(logits, want[0], rtol=1e-3, atol=1e-2)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), -1)


def reference_draft_logits(head: DFlashHead, target, context_taps: torch.Tensor, block_ids: torch.Tensor):
    """The reference's ``target.lm_head(model(target_hidden, noise_embedding, position_ids)[:, 1 - bs:])`` for one
    row: ``context_taps [1, S, k H]`` the tapped states of positions ``0 .. S - 1``, ``block_ids [1, bs]`` the
    pending token then mask slots (here: the head's mask embedding) at positions ``S ..``."""
    eps = head.norm.eps
    hidden = head.hidden_norm.weight.shape[0]
    noise = torch.cat(
        [target.embed(block_ids[:, :1]), head.mask_embedding.expand(1, block_ids.shape[1] - 1, hidden)], 1
    )
    target_hidden = _rms(context_taps @ head.fc.weight.T, head.hidden_norm.weight, eps)
    ctx_len, q_len = target_hidden.shape[1], noise.shape[1]
    position_ids = torch.arange(ctx_len + q_len)[None]
    cos, sin = head.rotary(noise, position_ids)
    cos, sin = cos[:, None], sin[:, None]
    h = noise
    for layer in head.layers:
        residual, x = h, _rms(h, layer.input_layernorm.weight, eps)
        d = layer.head_dim
        q = _rms((x @ layer.q_proj.weight.T).view(1, q_len, -1, d), layer.q_norm.weight, eps).transpose(1, 2)
        k = torch.cat([target_hidden @ layer.k_proj.weight.T, x @ layer.k_proj.weight.T], 1)
        v = torch.cat([target_hidden @ layer.v_proj.weight.T, x @ layer.v_proj.weight.T], 1)
        k = _rms(k.view(1, ctx_len + q_len, -1, d), layer.k_norm.weight, eps).transpose(1, 2)
        v = v.view(1, ctx_len + q_len, -1, d).transpose(1, 2)
        q = q * cos[..., -q_len:, :] + _rotate_half(q) * sin[..., -q_len:, :]
        k = k * cos + _rotate_half(k) * sin
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        attn = ((q @ k.transpose(2, 3)) * d**-0.5).softmax(-1) @ v  # no mask: the block sees everything
        h = residual + attn.transpose(1, 2).reshape(1, q_len, -1) @ layer.o_proj.weight.T
        residual, x = h, _rms(h, layer.post_attention_layernorm.weight, eps)
        mlp = torch.nn.functional.silu(x @ layer.gate_proj.weight.T) * (x @ layer.up_proj.weight.T)
        h = residual + mlp @ layer.down_proj.weight.T
    return target.hf.lm_head(_rms(h, head.norm.weight, eps)[:, 1 - block_ids.shape[1] :])


def reference_generate(head: DFlashHead, target, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list]:
    """The reference's ``dflash_generate`` at temperature 0 for one row: its tokens and acceptance lengths."""
    bs, start = head.block_size, len(prompt)
    ids = list(prompt)
    with torch.no_grad():
        out = target.hf(torch.tensor([ids]), output_hidden_states=True)
        ids.append(int(out.logits[0, -1].argmax()))
        lengths = []
        while len(ids) - len(prompt) < max_new_tokens:
            full = target.hf(torch.tensor([ids[:start]]), output_hidden_states=True)
            taps = torch.cat([full.hidden_states[i] for i in head.target_layers], -1)
            draft = reference_draft_logits(head, target, taps, torch.tensor([ids[start : start + 1] + [0] * (bs - 1)]))
            block = ids[start : start + 1] + draft[0].argmax(-1).tolist()
            posterior = target.hf(torch.tensor([ids[:start] + block])).logits[0, start:].argmax(-1).tolist()
            accepted = 0
            while accepted < bs - 1 and block[accepted + 1] == posterior[accepted]:
                accepted += 1
            ids = ids[:start] + block[: accepted + 1] + [posterior[accepted]]
            start += accepted + 1
            lengths.append(accepted + 1)
    return ids[len(prompt) :], lengths


def test_block_logits_equal_the_reference_forward(trained):
    target, head, _, _ = trained
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 32, (1, 9), generator=gen)
    with torch.no_grad():
        taps = torch.cat([target.hf(ids, output_hidden_states=True).hidden_states[i] for i in LAYERS], -1)
        want = reference_draft_logits(head, target, taps[:, :8], ids[:, 8:].expand(1, BLOCK))
        c = head.context(taps[:, :8])
        past = head.context_kv(c, torch.arange(8)[None])
        x = head.block_inputs(target.embed(ids[:, 8:])[:, 0], BLOCK)
        mask = torch.ones(1, 1, BLOCK, 8 + BLOCK, dtype=torch.bool)
        got = target.hf.lm_head(head(x, torch.arange(8, 8 + BLOCK)[None], past, mask)[:, 1:])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class Recording(DFlashDrafter):
    """Records each round's accepted count (batch 1)."""

    def begin(self, state, target, cache, prefill):
        self.accepted = []
        super().begin(state, target, cache, prefill)

    def observe(self, state, round):
        self.accepted.append(int(round.verdict.num_accepted[0]))
        super().observe(state, round)


def test_greedy_rounds_equal_the_reference_loop(trained):
    """Batch 1, every mask slot drafted: the same tokens and the same acceptance length in every round."""
    target, head, path, _ = trained
    for prompt in ([5, 17, 2, 29, 30, 3], [7, 7, 12]):
        tokens, lengths = reference_generate(head, target, prompt, 30)
        drafter = Recording(path)
        out = dk.generate(target, [prompt], drafter, policy=FixedLength(BLOCK - 1), max_new_tokens=len(tokens),
                          eos_token_id=())  # fmt: skip
        assert out.sequences[0] == tokens
        ours = [a + 1 for a in drafter.accepted]
        assert ours[:-1] == lengths[: len(ours) - 1] and max(lengths) > 1  # the last round: capped by the length


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The lossless harness's 8-token target and a random DFlash head for it."""
    model = tiny_llama(0, vocab=8, hidden=32, init=0.3)
    target = dk.load_model(model)
    torch.manual_seed(4)
    head = DFlashHead(model.config, (1,), 1, 3)
    head.init_from(target)
    return model, save(head, target, tmp_path_factory.mktemp("dflash_small") / "head.safetensors")


@pytest.mark.parametrize("setting", ["T1", "T0.7-p0.9"])
def test_sampling_is_lossless(small, setting):
    model, path = small
    counts, stats = sample_counts(model, DFlashDrafter(path), RejectionVerifier(), FixedLength(2), setting, seed=41)
    assert_matches(model, counts, setting)
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_a_misreported_q_is_detected(small):
    model, path = small
    counts, _ = sample_counts(model, MisreportsQ(DFlashDrafter(path)), RejectionVerifier(), FixedLength(2), "T1", 43)
    assert_detected(model, counts, "T1")


def test_the_training_mask_and_anchors():
    mask = block_mask(torch.tensor([[2, 4]]), 2, 5)[0, 0]  # two blocks of two slots over a context of 5
    assert mask[:2, :5].tolist() == [[True, True, False, False, False]] * 2
    assert mask[2:, :5].tolist() == [[True, True, True, True, False]] * 2
    assert mask[:, 5:].tolist() == [[True, True, False, False]] * 2 + [[False, False, True, True]] * 2
    anchors, valid = sample_anchors(torch.tensor([9, 3, 2]), torch.tensor([4, 0, 2]), 4, torch.Generator())
    assert anchors[0].tolist() == [4, 5, 6, 7] and valid[0].all()  # distinct response tokens, ascending
    assert anchors[1, :2].tolist() == [0, 1] and valid[1].tolist() == [True, True, False, False]
    assert not valid[2].any()
    picked, _ = sample_anchors(torch.tensor([40]), torch.tensor([4]), 8, torch.Generator().manual_seed(1))
    assert len(set(picked[0].tolist())) == 8 and picked[0].tolist() == sorted(picked[0].tolist())
    assert default_layers(30, 1) == (16,) and default_layers(30, 2) == (2, 28)


def test_requeue_places_new_features_after_the_unseen_ones():
    queued = torch.arange(6.0).view(2, 3, 1)
    new = torch.tensor([[[10.0], [11.0]], [[20.0], [21.0]]])
    out = requeue(queued, torch.tensor([1, 3]), new)
    assert out[0, :3, 0].tolist() == [0.0, 10.0, 11.0] and out[1, :5, 0].tolist() == [3.0, 4.0, 5.0, 20.0, 21.0]


def test_refusals(trained, small, tmp_path):
    target, _, path, _ = trained
    with pytest.raises(ConfigError, match="no DFlash head at"):
        DFlashDrafter(tmp_path / "missing.safetensors")
    with pytest.raises(ConfigError, match="trained for"):
        DFlashDrafter(small[1], target=target)  # the 8-token target's head on the 128-token target
    with pytest.raises(ConfigError, match="temperature must be"):
        DFlashDrafter(path, temperature=-1)


class CountsSyncs(DFlashDrafter):
    """Counts the host syncs inside ``propose`` and ``observe``."""

    syncs = 0

    def propose(self, state, budget):
        with count_syncs() as counter:
            draft = super().propose(state, budget)
        self.syncs += counter[0]
        return draft

    def observe(self, state, round):
        with count_syncs() as counter:
            super().observe(state, round)
        self.syncs += counter[0]


def test_drafting_reads_nothing_from_the_device(trained, ragged_prompts):
    """No host sync in a round of its own: the lengths' host mirrors size the context writes and the block."""
    target, _, path, _ = trained
    drafter = CountsSyncs(path)
    out = dk.generate(target, [[t % 32 for t in p] for p in ragged_prompts[:2]], drafter, policy=FixedLength(3),
                      max_new_tokens=16, eos_token_id=())  # fmt: skip
    assert out.stats.num_drafts > 5 and drafter.syncs == 0


def test_export_to_the_released_layout_drafts_what_the_file_drafts(trained, ragged_prompts, tmp_path):
    """Exported (``export_dflash``) and read back from the directory, a head drafts exactly what its file drafts,
    with a trimmed draft vocabulary too; the directory holds what vLLM's loader reads."""
    import copy
    import json

    from safetensors import safe_open

    from decodekit.drafters.dflash_release import export_dflash, load_dflash_release

    target, head, path, _ = trained
    trimmed = copy.deepcopy(head)
    trimmed.vocab = torch.tensor([5, 1, 30, 2, 17, 9, 0, 12, 3, 29, 7, 21])  # by frequency, as the recipe orders it
    files = {"full": path, "trimmed": save(trimmed, target, tmp_path / "trimmed.safetensors")}
    prompts = [[t % 32 for t in p] for p in ragged_prompts]
    for name, file in files.items():
        out = export_dflash(file, tmp_path / name, target)
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
        assert config["dflash_config"] == {"mask_token_id": 31, "target_layer_ids": [i - 1 for i in LAYERS]}
        assert config["block_size"] == BLOCK and config["num_hidden_layers"] == 1
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
        assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight",
                "layers.0.mlp.down_proj.weight", "layers.0.input_layernorm.weight"} <= keys  # fmt: skip
        assert not any(k.startswith("model.") for k in keys) and ("d2t" in keys) == (name == "trimmed")
        runs = [dk.generate(target, prompts, DFlashDrafter(w), policy=FixedLength(3), max_new_tokens=20,
                            eos_token_id=()) for w in (file, out)]  # fmt: skip
        assert runs[0].sequences == runs[1].sequences
        assert runs[0].stats.accepted_per_pos == runs[1].stats.accepted_per_pos and runs[1].stats.accepted > 0
    (tmp_path / "full" / "mask_embedding.pt").unlink()  # a release without one: the target's embedding of the id
    released, fields = load_dflash_release(tmp_path / "full", target)
    torch.testing.assert_close(released.mask_embedding, target.embed(torch.tensor([31]))[0])
    assert fields["layers"] == list(LAYERS) and fields["block_size"] == BLOCK
    with pytest.raises(ConfigError, match="not an empty directory"):
        export_dflash(path, tmp_path / "full", target)
    with pytest.raises(ConfigError, match="released for another target"):
        load_dflash_release(tmp_path / "trimmed", dk.load_model(tiny_llama(0, vocab=8, hidden=32)))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"block_size": 1}, "block_size=1 .*block_size >= 2"),
        ({"dflash_config": {"mask_token_id": 999, "target_layer_ids": [0, 1]}}, "mask_token_id=999, outside"),
        ({"num_target_layers": 36}, "of a 36-layer target; this target has"),
        (
            {"dflash_config": {"mask_token_id": 31, "target_layer_ids": [-1, 1]}},
            r"target_layer_ids=\[-1, 1\].*count from 0",
        ),
    ],
)
def test_a_release_config_that_does_not_fit_is_refused_by_its_key(trained, tmp_path, edit, match):
    """Each once failed deep in a forward (an embedding lookup, an empty block) or loaded without a word (another
    target's layer count; layer id -1 read as the embeddings)."""
    import json

    from decodekit.drafters.dflash_release import export_dflash

    target, _, path, _ = trained
    out = export_dflash(path, tmp_path / "release", target)
    (out / "mask_embedding.pt").unlink()
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | edit))
    with pytest.raises(ConfigError, match=match):
        dk.generate(target, [[1, 2, 3, 4, 5]], DFlashDrafter(out), max_new_tokens=6, eos_token_id=())


def test_sizes_the_drafters_cannot_run_are_refused_when_built(trained):
    from decodekit.drafters.flexdraft_head import FlexDraftHead

    target = trained[0]
    with pytest.raises(ConfigError, match="block_size must be an integer >= 2"):
        DFlashHead(target.hf.config, LAYERS, 1, 1)
    with pytest.raises(ConfigError, match="num_layers must be an integer >= 1"):
        DFlashHead(target.hf.config, LAYERS, 0, BLOCK)
    with pytest.raises(ConfigError, match="block_size must be an integer >= 1"):
        FlexDraftHead(target, 1, 0)
    with pytest.raises(
        dk.errors.ConfigTypeError, match="weights must be the path of a DFlash head file or release directory"
    ):
        DFlashDrafter(None)


def test_the_exported_tensors_run_in_the_reference_forward(trained, tmp_path):
    """The reference forward (the transcription above) run on the exported directory's tensors, taken by their
    released names, gives the head file's block logits: each tensor went where the released model reads it."""
    from types import SimpleNamespace

    from safetensors.torch import load_file

    from decodekit.drafters.dflash_release import export_dflash

    target, head, path, _ = trained
    out = export_dflash(path, tmp_path / "export", target)
    tensors = {k: v.float() for k, v in load_file(str(out / "model.safetensors")).items()}

    def weight(name: str) -> SimpleNamespace:
        return SimpleNamespace(weight=tensors[name])

    parts = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
    layer = SimpleNamespace(
        head_dim=head.layers[0].head_dim,
        input_layernorm=weight("layers.0.input_layernorm.weight"),
        post_attention_layernorm=weight("layers.0.post_attention_layernorm.weight"),
        **{p: weight(f"layers.0.self_attn.{p}.weight") for p in parts},
        **{p: weight(f"layers.0.mlp.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj")},
    )
    mask = torch.load(out / "mask_embedding.pt", weights_only=True)["embedding"]
    released = SimpleNamespace(norm=SimpleNamespace(weight=tensors["norm.weight"], eps=head.norm.eps),
                               hidden_norm=weight("hidden_norm.weight"), fc=weight("fc.weight"), mask_embedding=mask,
                               rotary=head.rotary, layers=[layer])  # fmt: skip
    ids = torch.randint(0, 32, (1, 9), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        taps = torch.cat([target.hf(ids, output_hidden_states=True).hidden_states[i] for i in LAYERS], -1)
        block = ids[:, 8:].expand(1, BLOCK)
        want = reference_draft_logits(head, target, taps[:, :8], block)
        got = reference_draft_logits(released, target, taps[:, :8], block)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)  # the export is float16
    assert (got.argmax(-1) == want.argmax(-1)).all()
