"""Medusa heads: trained here on tiny targets with the recipe's own loss; greedy output equal to plain decoding,
the exact output law at temperature 1 (deterministic drafts verified as point masses), the refusals."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.draft.templates import TreeTemplate, ranked_tree
from decodekit.drafters.medusa import MedusaDrafter, MedusaHeads
from decodekit.errors import ConfigError
from decodekit.kernels.cpu import PackedLinear
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.train.medusa import medusa_loss
from decodekit.verifiers import RejectionVerifier, TraversalVerifier
from tests.conftest import assert_greedy_twice
from tests.unit.eagle_release import first_round
from tests.unit.test_eagle import head_file, own_samples
from tests.unit.test_lossless import assert_matches, sample_counts


def train_heads(
    lm: dk.LanguageModel, steps: int, num_heads: int = 3, seed: int = 0, data: dict | None = None
) -> MedusaHeads:
    """Heads trained with the recipe's loss on the target's own samples (``data``: :func:`own_samples`)."""
    data = own_samples(lm, seed) if data is None else data
    torch.manual_seed(seed)
    heads = MedusaHeads(lm.hf.config.hidden_size, num_heads, torch.arange(lm.vocab_size))
    optimizer = torch.optim.Adam(heads.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(data["lengths"]), (16,), generator=gen)
        loss, _ = medusa_loss(heads, lm.lm_head.weight, data["feats"][idx], data["lengths"][idx])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return heads.eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0))
    return lm, head_file(tmp_path_factory, lm, train_heads(lm, 100), "tiny")


def test_untrained_heads_are_the_targets_next_token_head():
    """W_k starts at zero: every head first predicts what the output head itself predicts."""
    heads = MedusaHeads(64, 3, torch.arange(128))
    f = torch.randn(5, 64)
    assert torch.equal(heads(f), f[:, None].expand(-1, 3, -1))


def test_training_lowers_the_loss():
    lm = dk.load_model(tiny_llama(3))
    data = own_samples(lm)
    losses = []
    for steps in (0, 150):
        heads = train_heads(lm, steps, data=data)
        with torch.no_grad():  # on training rows: a random tiny target generalises little
            losses.append(float(medusa_loss(heads, lm.lm_head.weight, data["feats"][:32], data["lengths"][:32])[0]))
    assert losses[1] < 0.9 * losses[0], losses


def test_greedy_equals_plain_decoding(tiny, ragged_prompts):
    lm, path = tiny
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    assert_greedy_twice(lm, ragged_prompts, MedusaDrafter(path), FixedLength(3), reference, 40)


def test_sampling_is_lossless(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, init=0.3))
    path = head_file(tmp_path_factory, lm, train_heads(lm, 80, num_heads=2), "tiny8")
    counts, stats = sample_counts(lm, MedusaDrafter(path), RejectionVerifier(), FixedLength(2), "T1", seed=31)
    assert_matches(lm.hf, counts, "T1")
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_refusals(tiny, tmp_path, ragged_prompts):
    _, path = tiny
    with pytest.raises(ConfigError, match="recipe=medusa"):
        MedusaDrafter(tmp_path / "absent.safetensors")
    with pytest.raises(ConfigError, match="other weights"):
        MedusaDrafter(path, target=dk.load_model(tiny_llama(5)))


# -------------------------------------------------------------------------------------------- sparse trees
def test_tree_greedy_equals_plain_decoding_and_beats_the_chain(tiny, ragged_prompts):
    lm, path = tiny
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    drafter = MedusaDrafter(path, template="smollm2_12")
    assert_greedy_twice(lm, ragged_prompts, drafter, FixedLength(10), reference, 40)
    lengths = [
        dk.generate(lm, ragged_prompts, d, policy=p, max_new_tokens=40, eos_token_id=()).stats.mean_acceptance_length
        for d, p in ((MedusaDrafter(path), FixedLength(3)), (drafter, FixedLength(10)))
    ]
    assert lengths[1] > lengths[0], lengths  # the chain is the tree's rank-0 spine


def test_tree_nodes_are_the_heads_ranked_tokens(tiny, ragged_prompts):
    """Node (r1, ..., rd) drafts head d's rd-th token; the budget keeps the shallowest nodes, at most 3 deep."""
    lm, path = tiny
    drafter = MedusaDrafter(path, template=TreeTemplate(((0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0))))
    dk.generate(lm, ragged_prompts[:1], drafter, max_new_tokens=2, eos_token_id=())  # loads the heads, sets f
    state_f = torch.randn(1, lm.hf.config.hidden_size)  # any feature
    budget = dk.DraftBudget(torch.tensor([5]), node_bound=5)
    scores = drafter.trimmed.scores(drafter.heads(state_f)[:, :3])
    draft = ranked_tree(drafter._template, scores, budget, drafter.heads.vocab)
    ranked = scores.topk(2, -1).indices[0]  # [3 heads, 2]
    assert draft.tokens[0].tolist() == [ranked[0, 0], ranked[0, 1], ranked[1, 0], ranked[1, 1], ranked[2, 0]]
    assert draft.parents[0].tolist() == [-1, -1, 0, 0, 2]


def test_heads_take_the_targets_cpu_kernels(tiny, ragged_prompts):
    """A target with packed oneDNN linears gets packed heads (trimmed output head included), same greedy output."""
    lm, path = tiny
    packed = dk.load_model(tiny_llama(0), kernels="onednn")
    drafter = MedusaDrafter(path, target=packed)
    assert type(drafter.trimmed.proj) is PackedLinear
    assert not any(type(m) is torch.nn.Linear for m in drafter.heads.modules())
    reference = dk.generate(packed, ragged_prompts, max_new_tokens=30, eos_token_id=()).sequences
    out = dk.generate(packed, ragged_prompts, drafter, policy=FixedLength(3), max_new_tokens=30, eos_token_id=())
    assert out.sequences == reference and out.stats.accepted > 0


def test_tree_sampling_is_lossless(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, init=0.3))
    path = head_file(tmp_path_factory, lm, train_heads(lm, 80, num_heads=2), "tiny8t")
    drafter = MedusaDrafter(path, template=TreeTemplate(((0,), (1,), (0, 0), (1, 0))))
    counts, stats = sample_counts(lm, drafter, TraversalVerifier(), FixedLength(4, depth=2), "T0.7-p0.9", seed=32)
    assert_matches(lm.hf, counts, "T0.7-p0.9")
    assert stats.accepted > 0


class ResBlock(torch.nn.Module):
    """Medusa's ``ResBlock`` (``medusa/model/medusa_model.py``): ``x + SiLU(linear(x))``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden)
        self.act = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


def reference_medusa_head(hidden: int, vocab: int, heads: int, layers: int, seed: int) -> torch.nn.ModuleList:
    """``MedusaModel.medusa_head`` as its authors build it: per head ``[ResBlock(H)] * layers`` (one block, repeated)
    and an output layer ``H -> V`` without bias; random weights (the blocks large enough to move the argmax)."""
    torch.manual_seed(seed)
    module = torch.nn.ModuleList(
        torch.nn.Sequential(*([ResBlock(hidden)] * layers), torch.nn.Linear(hidden, vocab, bias=False))
        for _ in range(heads)
    )
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.5)
    return module


def write_medusa_release(path, module: torch.nn.ModuleList, layers: int, fmt: str) -> None:
    """A Medusa-1 release directory: ``config.json`` and ``medusa_lm_head.pt`` (``torch.save`` of the head's state, as
    the authors' training script writes it) or ``medusa_lm_head.safetensors`` (every tensor, or as ``save_model``
    writes it: a head's repeated block once)."""
    import json

    path.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": len(module), "medusa_num_layers": layers, "base_model_name_or_path": "tiny"}
    (path / "config.json").write_text(json.dumps(config))
    state = module.state_dict()
    if fmt == "pt":
        torch.save(state, path / "medusa_lm_head.pt")
    elif fmt == "save_model":  # safetensors' own writer for a module: the repeated block's tensors kept once
        from safetensors.torch import save_model

        save_model(module, str(path / "medusa_lm_head.safetensors"))
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path / "medusa_lm_head.safetensors"))


@pytest.mark.parametrize(("layers", "fmt"), [(1, "safetensors"), (2, "pt"), (2, "save_model")])
def test_released_medusa_heads_draft_what_the_reference_heads_predict(tmp_path, ragged_prompts, layers, fmt):
    """A Medusa-1 release (``medusa_lm_head.*`` + ``config.json``) for a tiny target: the first round's draft is each
    reference head's argmax on the target's final hidden state at the last prompt token; greedy output equals plain
    decoding, chains and trees; a head file for another target is refused with both shapes."""
    lm = dk.load_model(tiny_llama(0))
    hidden, vocab = lm.hf.config.hidden_size, lm.vocab_size
    reference = reference_medusa_head(hidden, vocab, 3, layers, seed=layers)
    write_medusa_release(tmp_path / "medusa", reference, layers, fmt)
    prompt = ragged_prompts[0]
    with torch.no_grad():
        f = lm.hf.model(torch.tensor([prompt])).last_hidden_state[0, -1]
        want = [int(head(f).argmax()) for head in reference]
    assert first_round(lm, MedusaDrafter(tmp_path / "medusa", target=lm), prompt, 3) == want
    plain = dk.generate(lm, ragged_prompts, max_new_tokens=20, eos_token_id=()).sequences
    for template, policy in ((None, FixedLength(3)), ("smollm2_8", FixedLength(8))):
        drafter = MedusaDrafter(tmp_path / "medusa", target=lm, template=template)
        out = dk.generate(lm, ragged_prompts, drafter, policy=policy, max_new_tokens=20, eos_token_id=())
        assert out.sequences == plain and out.stats.drafted > 0
    other = reference_medusa_head(hidden, vocab + 4, 3, layers, seed=0)
    write_medusa_release(tmp_path / "other", other, layers, fmt)
    with pytest.raises(ConfigError, match=rf"\({vocab + 4}, {hidden}\).*\({vocab}, {hidden}\)"):
        MedusaDrafter(tmp_path / "other", target=lm)
