"""A model adapter written by hand, not through transformers: what a contributor bringing another family writes.

:meth:`LanguageModel.forward` gets the tokens, their positions, a boolean mask ``[B, 1, N, S]`` and the cache's
:class:`~decodekit.cache.CacheView` for this forward; the model hands each layer's new keys and values to
``view.update`` and attends to what it returns. Nothing else about the cache is its business: ragged rows, trees,
staged drafts, compaction and rollback happen outside. The loop runs such a model as it runs transformers' (greedy
output equal to a recomputation from scratch, with drafts of every kind), and a model that hands its K/V to the
cache instead of the view is told what to pass.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import decodekit as dk
from decodekit.policies import FixedLength

VOCAB, HIDDEN = 24, 16


class OneLayerLM(dk.LanguageModel):
    """Embeddings plus a learned position table, one single-head attention layer, an output head."""

    def __init__(self, seed: int = 0, through_cache: bool = False) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(VOCAB, HIDDEN, generator=gen)
        self.pos = 0.3 * torch.randn(256, HIDDEN, generator=gen)
        self.wq, self.wk, self.wv = (torch.randn(HIDDEN, HIDDEN, generator=gen) / HIDDEN**0.5 for _ in range(3))
        self.out = torch.randn(HIDDEN, VOCAB, generator=gen)
        self.vocab_size, self.through_cache = VOCAB, through_cache

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    gives_hidden = False  # whether forward honours hidden_layers and return_hidden (WithHidden below)

    def forward(self, tokens, positions, mask, view, logits_at=None, *, hidden_layers=(), return_hidden=False, **_):
        x = self.emb[tokens] + self.pos[positions]  # [B, N, H]
        q, k, v = (x @ w for w in (self.wq, self.wk, self.wv))
        sink = view.cache if self.through_cache else view  # the first is the mistake this test expects refused
        keys, values = sink.update(k[:, None], v[:, None], 0)  # [B, 1, S, H]: every key this forward may see
        h = x + F.scaled_dot_product_attention(q[:, None], keys, values, attn_mask=mask)[:, 0]  # [B, N, H]
        logits = h @ self.out  # [B, N, V]
        if logits_at is not None:
            logits = logits.gather(1, logits_at[..., None].expand(-1, -1, VOCAB))
        if not self.gives_hidden:
            return dk.ModelOutput(logits)
        return dk.ModelOutput(logits, {i: (x, h)[i] for i in hidden_layers}, h if return_hidden else None)


def recomputed_greedy(model: OneLayerLM, prompt: list[int], new: int) -> list[int]:
    """Plain greedy decoding recomputing the whole sequence at each step (a fresh cache, no reuse)."""
    seq = list(prompt)
    for _ in range(new):
        cache = model.new_cache(1, len(seq))
        out = model.extend(cache, torch.tensor([seq]), torch.tensor([len(seq)]))
        seq.append(int(out.logits[0].argmax()))
    return seq[len(prompt) :]


def test_a_hand_written_model_runs_in_the_loop_with_every_kind_of_draft():
    model = OneLayerLM()
    prompts = [[1, 2, 3, 1, 2, 3, 1], [5, 9], [7, 7, 7, 7, 7]]
    want = [recomputed_greedy(model, p, 12) for p in prompts]
    assert dk.generate(model, prompts, max_new_tokens=12, eos_token_id=()).sequences == want
    draft_model = OneLayerLM(seed=1)
    for drafter, policy in (
        (dk.drafters.NGramDrafter(), FixedLength(3)),  # chains, ragged acceptance
        (dk.drafters.ModelDrafter(draft_model), FixedLength(3)),  # a second hand-written model drafting
        (dk.build("drafter", "model_tree", model=draft_model, shape="iid", branches=2), FixedLength(6, depth=3)),
    ):
        out = dk.generate(model, prompts, drafter, policy=policy, max_new_tokens=12, eos_token_id=())
        assert out.sequences == want and out.stats.drafted > 0, type(drafter).__name__
    # compile=True: its own forward cannot read the switch; the call says so once and runs it as it is
    with pytest.warns(UserWarning, match="compile=True: OneLayerLM's forward does not read compile=") as caught:
        out = dk.generate(model, prompts, max_new_tokens=12, eos_token_id=(), compile=True)
    assert out.sequences == want and sum("compile=True" in str(w.message) for w in caught) == 1


def test_a_model_writing_to_the_cache_itself_is_told_to_use_the_view():
    with pytest.raises(TypeError, match="CacheView that cache.stage"):
        dk.generate(OneLayerLM(through_cache=True), [[1, 2, 3]], max_new_tokens=4)


class CountingLM(OneLayerLM):
    """:class:`OneLayerLM` counting its forwards."""

    forwards = 0

    def forward(self, *args, **kwargs) -> dk.ModelOutput:
        self.forwards += 1
        return super().forward(*args, **kwargs)


class WithEmbeddings(OneLayerLM):
    """:class:`OneLayerLM` exposing its input embeddings (one of the optional parts)."""

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.emb[tokens]


@pytest.mark.parametrize(
    "name, kwargs, parts, takes_target",
    [
        ("eagle", {}, "config, embed, head", True),
        ("medusa", {}, "embed, head", True),
        ("early_exit", {}, "layers", False),  # no head file: nothing to load at build
        ("early_exit", {"exit_head": True}, "embed, head, layers, norm", True),
        ("dynamic_exit", {"exit_layers": [1]}, "head, layers, norm", False),
        ("lookup_eagle3", {}, "config, embed, head", False),  # a composite: its parts' union
    ],
)
def test_a_drafter_calling_parts_the_model_lacks_is_refused_before_any_forward(name, kwargs, parts, takes_target):
    model = CountingLM()
    refused = f"calls the target's {parts}, which CountingLM leaves unimplemented"
    with pytest.raises(dk.errors.IncompatibleDraftError, match=refused) as err:
        dk.generate(model, [[1, 2, 3]], dk.build("drafter", name, **kwargs), max_new_tokens=4)
    assert model.forwards == 0
    first = {"config": "config", "embed": "embed", "head": "head", "layers": "num_layers", "norm": "norm"}[
        parts.split(", ")[0]
    ]
    assert f"LanguageModel.{first} (" in str(err.value)  # what to implement, and what it gives
    if takes_target:  # built for the model: refused there, before a head file is read against it
        with pytest.raises(dk.errors.IncompatibleDraftError, match=refused):
            dk.build("drafter", name, target=model, **kwargs)


def test_declared_target_parts_are_checked_for_a_notebook_drafter():
    class Embeds:  # a drafter written in a notebook, reading the target's embeddings
        target_parts = frozenset({"embed"})

        def propose(self, state, budget):
            return dk.Draft.empty(state.batch_size, state.device)

    dk.generate(WithEmbeddings(), [[1, 2, 3]], Embeds(), max_new_tokens=2)  # implemented: runs
    with pytest.raises(dk.errors.IncompatibleDraftError, match="Embeds calls the target's embed, which OneLayerLM"):
        dk.generate(OneLayerLM(), [[1, 2, 3]], Embeds(), max_new_tokens=2)
    Embeds.target_parts = frozenset({"embeds"})  # a typo checks nothing: refused, naming the known parts
    with pytest.raises(dk.errors.ConfigError, match=r"Embeds.target_parts names 'embeds'; known parts: embed, norm"):
        dk.generate(WithEmbeddings(), [[1, 2, 3]], Embeds(), max_new_tokens=2)
    Embeds.target_parts = "embed"
    with pytest.raises(dk.errors.ConfigError, match="must be a set of names"):
        dk.generate(WithEmbeddings(), [[1, 2, 3]], Embeds(), max_new_tokens=2)


class WithHidden(OneLayerLM):
    """:class:`OneLayerLM` returning the hidden states it is asked for (layer 0: the embeddings, 1: its output)."""

    gives_hidden = True


class ReadsHidden:
    """A notebook drafter reading the target's hidden states (never drafting)."""

    needs = frozenset({"hidden", "prefill"})
    shares_target = True
    hidden_layers = (1,)
    seen: list[tuple[int, ...]] = []

    def begin(self, state, target, cache, prefill):
        self.seen.append(tuple(prefill.last_hidden.shape))

    def propose(self, state, budget):
        return dk.Draft.empty(state.batch_size, state.device)


def test_a_model_ignoring_return_hidden_is_named_with_the_drafter_that_reads_them():
    refused = "OneLayerLM.forward returned nothing as ModelOutput.last_hidden when asked with return_hidden=True, "
    with pytest.raises(dk.errors.ComponentOutputError, match=refused + "which ReadsHidden reads"):
        dk.generate(OneLayerLM(), [[1, 2, 3]], ReadsHidden(), max_new_tokens=3)

    class NoLayers(WithHidden):  # the final states, but not the layers asked for
        def forward(self, *args, hidden_layers=(), **kwargs):
            return super().forward(*args, **kwargs)

    with pytest.raises(dk.errors.ComponentOutputError, match=r"NoLayers.forward returned nothing as "
                       r"ModelOutput.hidden\[1\] when asked with hidden_layers including 1"):  # fmt: skip
        dk.generate(NoLayers(), [[1, 2, 3]], ReadsHidden(), max_new_tokens=3)
    ReadsHidden.seen.clear()
    assert dk.generate(WithHidden(), [[1, 2, 3], [4, 5]], ReadsHidden(), max_new_tokens=3).sequences
    assert ReadsHidden.seen == [(2, 3, HIDDEN)]  # what the check lets through: the prompt's states, every position


def test_hidden_states_asked_only_by_an_observer_are_checked_on_the_first_scored_round():
    class Watches(FixedLength):  # a policy reading the verified positions' final states in its round record
        needs = frozenset({"hidden"})

        def observe(self, state, round):
            pass

    ngram = dk.drafters.NGramDrafter()
    with pytest.raises(dk.errors.ComponentOutputError, match=r"Watches reads: .* forward's \(1, \d\) tokens"):
        dk.generate(OneLayerLM(), [[1, 2, 1, 2, 1]], ngram, policy=Watches(2), max_new_tokens=3)  # 1 + drafted
    out = dk.generate(WithHidden(), [[1, 21, 21, 21]], ngram, policy=Watches(2), max_new_tokens=6)
    assert out.stats.drafted > 0


class WithHeadParts(WithHidden):
    """:class:`WithHidden` exposing what an EAGLE head is built from and calls: a transformers config of its sizes,
    its embeddings and its output head."""

    def __init__(self, seed: int = 0) -> None:
        from transformers import LlamaConfig

        super().__init__(seed)
        sizes = {"hidden_size": HIDDEN, "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2}
        self.config = LlamaConfig(vocab_size=VOCAB, num_hidden_layers=1, max_position_embeddings=256, **sizes)

    config = None  # set per instance; a class attribute declares the part implemented

    def embed(self, tokens):
        return self.emb[tokens]

    def head(self, hidden):
        return hidden @ self.out


def test_an_eagle_head_runs_on_a_hand_written_model_that_declares_its_parts(tmp_path):
    from decodekit.drafters.eagle_head import EagleHead
    from decodekit.drafters.head_files import head_metadata

    model = WithHeadParts()
    torch.manual_seed(0)
    EagleHead(model.config).save(tmp_path / "head.safetensors", head_metadata(model))  # an untrained head for it
    with pytest.raises(dk.errors.IncompatibleDraftError, match="calls the target's config, embed, head, which "
                       "WithHidden leaves unimplemented: LanguageModel.config"):  # fmt: skip
        dk.build("drafter", "eagle", target=WithHidden(), weights=tmp_path / "head.safetensors")
    drafter = dk.build("drafter", "eagle", target=model, weights=tmp_path / "head.safetensors")
    prompts = [[1, 2, 3, 1, 2, 3, 1], [5, 9]]
    want = [recomputed_greedy(model, p, 10) for p in prompts]
    out = dk.generate(model, prompts, drafter, policy=FixedLength(3), max_new_tokens=10, eos_token_id=())
    assert out.sequences == want and out.stats.drafted > 0
