"""The paired verifier comparison (decodekit.bench.verifier_order): its estimate is each verifier's expectation."""

from __future__ import annotations

import pytest
import torch

from decodekit.bench.verifier_order import PairedVerifiers
from decodekit.draft import Draft
from decodekit.errors import ConfigError
from decodekit.types import SamplingParams
from decodekit.verifiers import BlockVerifier, RejectionVerifier, TypicalAcceptanceVerifier


def test_paired_estimates_are_the_verifiers_expectations():
    """A sampled chain of 3 on a 4-token vocabulary: token-wise rejection accepts
    ``sum_k prod_{i <= k} min(1, p_i / q_i)`` tokens in expectation; the paired estimate over 3,000 repeats is within
    4 standard errors of it, and block verification (never below token-wise in expectation) is at least as high."""
    torch.manual_seed(0)
    q = torch.softmax(torch.randn(1, 3, 4) * 1.5, -1)
    tokens = torch.tensor([[2, 0, 3]])
    logits = torch.randn(1, 4, 4) * 1.5
    p = torch.softmax(logits[:, :3], -1)
    ratio = (p[0, torch.arange(3), tokens[0]] / q[0, torch.arange(3), tokens[0]]).clamp(max=1.0)
    exact = float(ratio.cumprod(0).sum())
    paired = PairedVerifiers({"rejection": RejectionVerifier(), "block": BlockVerifier()}, "rejection", repeats=3000)
    verdict = paired.verify(Draft.chain(tokens, q=q), logits, SamplingParams(temperature=1.0), None)
    assert int(verdict.num_accepted[0]) in range(4)
    samples = torch.tensor(paired.samples["rejection"])
    per_repeat_sd = (exact * (3 - exact)) ** 0.5 / 3000**0.5  # a loose bound on the estimate's spread
    assert abs(float(samples[0]) - exact) < 4 * max(per_repeat_sd, 1e-3)
    assert paired.samples["block"][0] >= paired.samples["rejection"][0] - 4 * per_repeat_sd
    summary = paired.summary()
    assert summary["rejection"]["minus_primary"] == 0.0 and summary["block"]["n"] == 1


def test_paired_refuses_lossy_verifiers_and_an_unknown_primary():
    with pytest.raises(ConfigError, match="lossless"):
        PairedVerifiers({"typical": TypicalAcceptanceVerifier()}, "typical")
    with pytest.raises(ConfigError, match="primary"):
        PairedVerifiers({"rejection": RejectionVerifier()}, "block")
