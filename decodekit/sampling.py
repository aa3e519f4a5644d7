"""The one implementation of logit warping and seeded sampling, used by the target, drafters and verifiers.

Warping follows transformers' order and semantics: temperature, then top-k, then top-p (nucleus). Greedy
decoding (``temperature == 0``) is a point mass on the argmax (first index on ties, as ``torch.argmax``).
All probabilities are float32.

Randomness comes from a ``torch.Generator`` shared by the whole batch (an int ``seed``; None = torch's global
one), or from :class:`RowGenerators`, one seed per caller row, whose draws are keyed so that a row's values
depend only on its seed, its length and the draw's key, never on the other rows of the batch. Every draw goes
through :func:`sample` or :func:`uniform` (``next_token`` uses :func:`sample`), which accept either.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from decodekit.checks import describe, int_list, is_int, is_numpy_array
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.types import SamplingParams

SEED_RANGE = (-(2**63), 2**64)
"""Seeds ``torch.Generator.manual_seed`` takes: ``[-2**63, 2**64)``."""


def check_seed(seed: Any, num_prompts: int) -> Any:
    """Refuse a ``seed`` other than None, an integer, or one integer per prompt (a list / tuple or a 1-D integer
    tensor of length ``num_prompts``). Returns the seed unchanged, except an integer scalar (numpy's too) as an
    ``int``."""
    expected = f"None, an integer, or a list of {num_prompts} integers (one per prompt)"
    if seed is None:
        return None
    if is_int(seed):
        values = [seed]
    elif isinstance(seed, torch.Tensor) or (isinstance(seed, Sequence) and not isinstance(seed, (str, bytes))):
        values = int_list("seed", seed, expected)
        if len(values) != num_prompts and not (isinstance(seed, torch.Tensor) and seed.ndim == 0):
            raise ConfigError(f"seed has {len(values)} values for {num_prompts} prompts; pass one per prompt")
    else:
        hint = "; use seed.tolist()" if is_numpy_array(seed) else ""
        raise ConfigTypeError(f"seed must be {expected}, got {describe(seed)}{hint}")
    low, high = SEED_RANGE
    bad = next((s for s in values if not low <= s < high), None)
    if bad is not None:
        raise ConfigError(f"seed must be in [-2**63, 2**64) (what torch.Generator takes), got {bad}")
    return int(seed) if is_int(seed) else seed


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k and top-p to logits ``[..., V]``; removed entries become ``-inf`` (float32).

    Not defined for greedy params (use :func:`probs_from_logits`, which returns the argmax point mass).
    """
    scores = logits.float() / params.temperature
    if params.top_k is not None and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1.0 - params.top_p)
        remove[..., -1] = False  # always keep the most likely token
        scores = scores.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return scores


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution plain decoding samples from: ``[..., V]`` float32 probabilities.

    Greedy params give a one-hot at the argmax.
    """
    if params.greedy:
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return warp_logits(logits, params).softmax(-1)


def sample(
    probs: torch.Tensor, generator: torch.Generator | RowGenerators | None = None, key: Hashable = "next"
) -> torch.Tensor:
    """Draw one token per row from ``probs [..., V]`` (need not be normalised; must have positive mass).

    Uses the exponential race ``argmax(p / E)``, ``E ~ Exp(1)``: exact, batched, and reproducible with
    ``generator``. With :class:`RowGenerators`, ``probs`` is ``[B, ..., V]`` (``B`` live rows) and ``key`` names
    the draw (distinct draws of one round need distinct keys); a plain generator ignores ``key``.
    Returns ``[...]`` long.
    """
    if isinstance(generator, RowGenerators):
        noise = generator.draw(key, tuple(probs.shape), probs.device, _exponential)
    else:
        noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return (probs.float() / noise.clamp_(min=1e-30)).argmax(-1)


def next_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | RowGenerators | None = None,
    key: Hashable = "next",
) -> torch.Tensor:
    """Plain decoding of one token from ``logits [..., V]``: argmax when greedy, else a warped sample."""
    if params.greedy:
        return logits.argmax(-1)
    return sample(probs_from_logits(logits, params), generator, key)


def uniform(
    shape: tuple[int, ...],
    generator: torch.Generator | RowGenerators | None,
    device: torch.device,
    key: Hashable = "coins",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``U[0, 1)`` draws of ``shape`` from ``generator`` (the accept coins of verifiers; a diffusion sampler's
    Gumbel noise, in float64).

    With :class:`RowGenerators`, ``shape[0]`` is the number of live rows and row ``b`` gets
    ``torch.rand(shape[1:])`` from its own keyed generator; see :class:`RowGenerators` for when a row's first
    values do not depend on ``shape[1:]`` (the draft width, which is the batch's widest row).
    """
    if isinstance(generator, RowGenerators):
        return generator.draw(key, tuple(shape), torch.device(device), functools.partial(_uniform, dtype=dtype))
    return torch.rand(shape, generator=generator, device=device, dtype=dtype)


def make_generator(seed: int | Sequence[int] | torch.Tensor | None, device: torch.device) -> Generator:
    """The randomness of a :func:`decodekit.generate` call.

    ``None``: torch's global generator; an int (or a 0-d tensor): one ``torch.Generator`` for the whole batch;
    a sequence of ints or a 1-D tensor ``[B]``, one per prompt: :class:`RowGenerators` (the caller validates
    the length).
    """
    if seed is None:
        return None
    if isinstance(seed, torch.Tensor):
        seed = seed.tolist()
    if isinstance(seed, Sequence) and not isinstance(seed, (str, bytes)):
        return RowGenerators(seed)
    return torch.Generator(device).manual_seed(seed)


def begin_round(generator: Generator, host_lengths: list[int]) -> None:
    """Tell a :class:`RowGenerators` each live row's length at the start of a round (a no-op otherwise)."""
    if isinstance(generator, RowGenerators):
        generator.begin_round(host_lengths)


class RowGenerators:
    """One seed per caller row, with keyed (counter-based) draws: vLLM's per-request generators, batched.

    The number of values a row consumes per round depends on the batch (coins are drawn for the batch's widest
    draft; a draft model runs as many steps as the deepest row; a round where no row drafted draws no coins), so
    one running generator per row would make a row's output depend on its neighbours. Instead every draw
    re-seeds: row ``b``'s slice of a draw comes from a ``torch.Generator`` on the draw's device seeded with a
    64-bit mix (splitmix64) of ``(seed of b, length of b at the start of the round, key)``. A row's length grows
    every round, so the seeds never repeat within a row, and its values depend only on its seed, its history and
    the draw's key, not on the batch's size, order or other rows. Seeding uses host ints only (no host sync).

    Keys in use: ``"next"`` (the pending token: plain decoding, a verifier's correction or bonus token),
    ``"coins"`` (a verifier's accept coins), ``("draft", j)`` (a draft model's step ``j``).

    Shapes: a row's slice has the draw's shape minus its leading batch dim. For coins that is ``[n]``, ``n`` the
    batch's widest draft, and only the first ``num_valid[b]`` values may matter: ``torch.rand(n)`` is
    prefix-stable (its first ``k`` values do not depend on ``n``) on the CPU (mt19937 fills in order;
    ``tests/unit/test_seeds.py`` checks it). On CUDA, a freshly seeded Philox ``torch.rand(n)`` gives element ``i``
    the first value of thread ``i`` while ``n`` fits in one pass of its launch grid (for small ``n``, such as
    draft widths); this follows from the kernel's layout, is not a documented guarantee of torch, and is not
    tested on a GPU here.

    Args:
        seeds: one int per caller row. Draws run on the device of the tensors they are for.
    """

    def __init__(self, seeds: Sequence[int]) -> None:
        self.seeds = [operator.index(s) for s in seeds]
        self.rows = list(range(len(self.seeds)))  # caller index of each live row
        self.lengths: list[int] | None = None  # each live row's length this round
        self._pool: dict[torch.device, list[torch.Generator]] = {}

    def begin_round(self, host_lengths: list[int]) -> None:
        """Start a round: ``host_lengths [B]``, each live row's current length (``DecodeState.host_lengths``)."""
        if len(host_lengths) != len(self.rows):
            raise ValueError(f"{len(host_lengths)} row lengths for {len(self.rows)} live rows of RowGenerators")
        self.lengths = list(host_lengths)

    def select_rows(self, host_rows: list[int]) -> None:
        """Keep only the live rows ``host_rows [B']`` (indices into the current batch), as the state does."""
        self.rows = [self.rows[b] for b in host_rows]
        if self.lengths is not None:
            self.lengths = [self.lengths[b] for b in host_rows]

    def row_seeds(self, key: Hashable) -> list[int]:
        """The 64-bit generator seed of each live row for the draw named ``key`` this round."""
        if self.lengths is None:
            raise RuntimeError("RowGenerators.begin_round(host_lengths) must be called before drawing")
        code = _key_code(key)
        return [_mix(_mix(_mix(self.seeds[r]) ^ n) ^ code) for r, n in zip(self.rows, self.lengths)]

    def draw(
        self,
        key: Hashable,
        shape: tuple[int, ...],
        device: torch.device,
        fill: Callable[[tuple[int, ...], torch.Generator, torch.device], torch.Tensor],
    ) -> torch.Tensor:
        """``[B, *shape[1:]]`` in ``fill``'s dtype: row ``b`` is ``fill(shape[1:], generator_b, device)``,
        ``generator_b`` seeded from :meth:`row_seeds`."""
        seeds = self.row_seeds(key)
        if not shape or shape[0] != len(seeds):
            raise ValueError(f"a per-row draw needs one leading row per live row ({len(seeds)}), got shape {shape}")
        pool = self._pool.setdefault(device, [])
        pool.extend(torch.Generator(device) for _ in range(len(seeds) - len(pool)))
        rest = tuple(shape[1:])
        if not seeds:
            return fill(tuple(shape), torch.Generator(device), device)
        return torch.stack([fill(rest, g.manual_seed(s), device) for g, s in zip(pool, seeds)])


Generator = torch.Generator | RowGenerators | None


def _exponential(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.float32, device=device).exponential_(generator=generator)


def _uniform(
    shape: tuple[int, ...], generator: torch.Generator, device: torch.device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=device, dtype=dtype)


_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit mix of ``x`` (host int)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=256)
def _key_code(key: Hashable) -> int:
    """A 64-bit code of a draw key, stable across processes (``hash`` of a str is not): str and bytes by their
    digest, ints as themselves, tuples by folding their parts."""
    if isinstance(key, tuple):
        code = _mix(len(key))
        for part in key:
            code = _mix(code ^ _key_code(part))
        return code
    if isinstance(key, int):
        return key & _MASK64
    data = key if isinstance(key, bytes) else str(key).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
