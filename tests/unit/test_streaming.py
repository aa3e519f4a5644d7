"""Streaming, per-row output bookkeeping and stats."""

from __future__ import annotations

from collections import defaultdict

import decodekit as dk
from decodekit.drafters import ModelDrafter


class Collect:
    def __init__(self):
        self.tokens, self.calls, self.ended = defaultdict(list), [], False

    def __call__(self, row, tokens):
        self.tokens[row].extend(tokens)
        self.calls.append(len(tokens))

    def end(self):
        self.ended = True


def test_streamer_receives_every_committed_token(target, ragged_prompts):
    streamer = Collect()
    out = dk.generate(
        target, ragged_prompts, ModelDrafter(target), max_new_tokens=20, eos_token_id=(), streamer=streamer
    )
    assert [streamer.tokens[r] for r in range(4)] == out.sequences
    assert max(streamer.calls) > 1  # several tokens per round when drafts are accepted
    assert streamer.ended


def test_stats_are_consistent(target, ragged_prompts):
    out = dk.generate(
        target,
        ragged_prompts,
        ModelDrafter(target),
        policy=dk.policies.FixedLength(3),
        max_new_tokens=21,
        eos_token_id=(),
    )
    s = out.stats
    assert s.generated == sum(len(x) for x in out.sequences) == 84
    assert s.accepted == sum(s.accepted_per_pos) and s.drafted == sum(s.drafted_per_pos)
    assert s.mean_acceptance_length == 1 + s.accepted / s.num_drafts
    assert s.acceptance_rate_per_pos == [1.0] * 3  # the draft is the target
    assert s.tokens_per_step == 4.0  # 20 tokens after prefill in 5 rounds of k + 1
    assert s.total_time_s >= s.prefill_time_s + s.draft_time_s + s.verify_time_s > 0
    merged = s.merge(s)
    assert merged.accepted == 2 * s.accepted and merged.accepted_per_pos == [2 * a for a in s.accepted_per_pos]
    assert set(s.to_dict()) >= {"mean_acceptance_length", "acceptance_rate_per_pos", "draft_time_s"}


def test_string_prompts_use_the_tokenizer(target):
    class Tokenizer:
        def __call__(self, text):
            return {"input_ids": [ord(c) % 128 for c in text]}

    model = dk.models.HFCausalLM(target, Tokenizer())  # a fresh adapter: the session's target keeps its own (none)
    out = dk.generate(model, ["hello", "hi"], max_new_tokens=4, eos_token_id=())
    ref = dk.generate(model, [[ord(c) for c in "hello"], [ord(c) for c in "hi"]], max_new_tokens=4, eos_token_id=())
    assert out.sequences == ref.sequences
