"""Argument checks shared by decodekit's entry points (:func:`~decodekit.generate`, :func:`~decodekit.load_model`,
component constructors, the transformers bridge, the command line).

Each check raises a :class:`~decodekit.errors.ConfigError` (a ``ValueError``) whose message names the argument,
what was given and what is allowed, e.g. ``max_new_tokens must be an integer >= 1, got 2.5 (float)``; a value of
the wrong type raises :class:`~decodekit.errors.ConfigTypeError`, which is also a ``TypeError``. bools are not
integers; numpy integers are. The checks run on host values before any model work: none reads a device tensor
in the decoding loop.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from decodekit.errors import ConfigError, ConfigTypeError

if TYPE_CHECKING:
    pass

__all__ = [
    "check_bool",
    "check_callable",
    "check_float",
    "check_instance",
    "check_int",
    "check_model_spec",
    "check_signature",
    "check_seed",
    "describe",
    "describe_on",
    "eos_ids",
    "int_array",
    "is_numpy_array",
    "is_int",
    "parse_device",
    "tensor_fits",
]

SEED_RANGE = (-(2**63), 2**64)
"""Seeds ``torch.Generator.manual_seed`` takes: ``[-2**63, 2**64)``."""

INT64_RANGE = (-(2**63), 2**63 - 1)
"""What :func:`check_int` accepts at most, both ends included: a 64-bit integer, what a torch.long tensor holds."""


# ------------------------------------------------------------------------------------------------- values
def describe(value: Any) -> str:
    """``value`` for an error message: a short repr and its type, e.g. ``2.5 (float)``, ``the class FixedLength``."""
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    if isinstance(value, torch.Tensor) or is_numpy_array(value):
        kind = "tensor" if isinstance(value, torch.Tensor) else "numpy array"
        dtype = str(value.dtype).removeprefix("torch.")
        return f"a {value.ndim}-D {dtype} {kind} of shape {tuple(value.shape)}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__qualname__})"


def describe_on(value: Any) -> str:
    """:func:`describe`, with the device when ``value`` is a tensor (a component output's message)."""
    return f"{describe(value)} on {value.device}" if isinstance(value, torch.Tensor) else describe(value)


def tensor_fits(value: Any, shapes: Sequence[tuple[int, ...]], device: torch.device, dtype: Any) -> bool:
    """Whether ``value`` is a tensor on ``device`` with one of ``shapes`` and of ``dtype`` (``"float"``: any floating
    point dtype): the host-metadata test of a component's output, no device read."""
    if not isinstance(value, torch.Tensor) or value.device != device or tuple(value.shape) not in shapes:
        return False
    return value.dtype.is_floating_point if dtype == "float" else value.dtype == dtype


def is_int(value: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not _is_numpy_bool(value)


def _is_numpy_bool(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.bool_)


def is_numpy_array(value: Any) -> bool:
    numpy = sys.modules.get("numpy")  # not imported: the value cannot be a numpy array
    return numpy is not None and isinstance(value, numpy.ndarray)


def int_array(array: Any, allow_bool: bool = False) -> bool:
    """Whether a tensor or numpy array holds integers (bools only when ``allow_bool``)."""
    if isinstance(array, torch.Tensor):
        dtype = array.dtype
        return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool) or (
            allow_bool and dtype == torch.bool
        )
    return array.dtype.kind in ("iub" if allow_bool else "iu")


def _bounds(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def check_int(
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    optional: bool = False,
    hint: str = "",
) -> int | None:
    """``value`` as an ``int``, refusing anything but an integer in ``[low, high]`` (None too when ``optional``) that
    fits in 64 bits (:data:`INT64_RANGE`: every int argument may end up in a ``torch.long`` tensor).

    Raises:
        ConfigTypeError: not an integer (a float, a bool, a string, ...).
        ConfigError: out of range, or beyond 64 bits.
    """
    if value is None and optional:
        return None
    expected = f"{'None or ' if optional else ''}an integer{_bounds(low, high)}"
    if not is_int(value):
        raise ConfigTypeError(f"{name} must be {expected}{hint}, got {describe(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(f"{name} must be {expected}{hint}, got {value!r}")
    if not INT64_RANGE[0] <= value <= INT64_RANGE[1]:  # would overflow a torch.long tensor deep in the loop
        raise ConfigError(f"{name} must be {expected}{hint} that fits in 64 bits, in [-2**63, 2**63), got {value!r}")
    return int(value)


def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
    hint: str = "",
) -> float | None:
    """``value`` as a finite ``float`` in the given range (integers are accepted; NaN, infinities and bools are not).

    Raises:
        ConfigTypeError: not a real number.
        ConfigError: NaN, infinite or out of range.
    """
    if value is None and optional:
        return None
    expected = f"{'None or ' if optional else ''}a finite number{_bounds(low, high, low_open, high_open)}"
    if not _is_real(value):
        raise ConfigTypeError(f"{name} must be {expected}{hint}, got {describe(value)}")
    number = float(value)
    out_of_range = (
        not math.isfinite(number)
        or (low is not None and (number <= low if low_open else number < low))
        or (high is not None and (number >= high if high_open else number > high))
    )
    if out_of_range:
        raise ConfigError(f"{name} must be {expected}{hint}, got {value!r}")
    return number


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a ``bool``; refuses anything but True / False (numpy bools included)."""
    if not isinstance(value, bool) and not _is_numpy_bool(value):
        raise ConfigTypeError(f"{name} must be True or False, got {describe(value)}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` if it is one of ``choices``; else a :class:`ConfigError` that lists them."""
    if value not in tuple(choices):
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_callable(name: str, value: Any, *, optional: bool = True, expected: str = "a callable") -> None:
    """Refuse a ``value`` that cannot be called (None is fine when ``optional``)."""
    if value is None and optional:
        return
    if not callable(value):
        none = "None or " if optional else ""
        raise ConfigTypeError(f"{name} must be {none}{expected}, got {describe(value)}")


def check_signature(name: str, value: Any, positional: int, expected: str) -> None:
    """Refuse a callable ``value`` that cannot be called with ``positional`` positional arguments, as ``expected``
    (e.g. ``"streamer(row, tokens)"``) says decodekit will call it. A callable whose signature Python cannot tell
    (some builtins) is accepted.

    Raises:
        ConfigTypeError: the signature does not take that call (too many required arguments, or too few).
    """
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(positional))
    except TypeError as error:
        label = getattr(value, "__qualname__", None) or type(value).__qualname__
        raise ConfigTypeError(
            f"{name} must be callable as {expected} ({positional} positional argument{'s' * (positional != 1)}), but "
            f"{label}{signature} cannot be called that way ({error})"
        ) from None


def check_instance(name: str, value: Any, protocol: type, *, what: str = "", optional: bool = True) -> None:
    """Refuse a ``value`` that does not implement ``protocol``, and a class passed where an instance is expected.

    Args:
        name: the argument's name, for the message.
        protocol: a runtime-checkable Protocol or a class.
        what: what the protocol asks for, e.g. ``"a propose(state, budget) method"``.
        optional: None is accepted.
    """
    if value is None and optional:
        return
    if isinstance(value, type):
        raise ConfigTypeError(
            f"{name} must be an instance, got the class {value.__name__}; pass an instance: {value.__name__}()"
        )
    if not isinstance(value, protocol):
        needs = f" ({what})" if what else ""
        raise ConfigTypeError(f"{name} must implement the {protocol.__name__} protocol{needs}, got {describe(value)}")


def parse_device(name: str, device: Any) -> torch.device:
    """``device`` (a ``torch.device``, a string such as ``"cpu"`` / ``"cuda:0"``, or a CUDA index) as a
    ``torch.device`` that exists on this machine.

    Raises:
        ConfigTypeError: not a device, a string or an integer.
        ConfigError: an unknown device string, or a device this machine does not have.
    """
    if isinstance(device, torch.device):
        resolved = device
    elif isinstance(device, str) or is_int(device):
        try:
            resolved = torch.device(device if isinstance(device, str) else int(device))
        except (RuntimeError, ValueError, TypeError):
            raise ConfigError(
                f"{name} must be a device such as 'cpu', 'cuda', 'cuda:0' or 'mps', got {describe(device)}"
            ) from None
    else:
        raise ConfigTypeError(
            f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda:0', got {describe(device)}"
        )
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{name}={device!r} but CUDA is not available on this machine; use {name}='cpu'")
        if resolved.index is not None and resolved.index >= count:
            raise ConfigError(
                f"{name}={device!r} but this machine has {count} CUDA device(s): use cuda:0 .. cuda:{count - 1}"
            )
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{name}={device!r} but MPS is not available on this machine; use {name}='cpu'")
    return resolved


# ------------------------------------------------------------------------------------------------- models
def check_model_spec(name: str, spec: Any) -> None:
    """Refuse a model argument that :func:`~decodekit.load_model` cannot take: anything but a decodekit
    ``LanguageModel``, a transformers causal LM instance (an ``nn.Module`` with ``get_decoder()`` and
    ``get_output_embeddings()``; a plain ``nn.Module`` is refused), a zoo name or a local path."""
    from decodekit.models.base import LanguageModel

    if isinstance(spec, torch.nn.Module) and not isinstance(spec, LanguageModel):
        if not all(callable(getattr(spec, m, None)) for m in ("get_decoder", "get_output_embeddings")):
            raise ConfigTypeError(
                f"{name} must be a transformers causal LM (a PreTrainedModel with get_decoder() and an output head, "
                f"e.g. LlamaForCausalLM), a decodekit LanguageModel, a zoo name or a local path; got "
                f"{describe(spec)}, a torch.nn.Module that is not a causal LM"
            )
        return
    if isinstance(spec, (LanguageModel, str, os.PathLike)):
        return
    if isinstance(spec, type):
        raise ConfigTypeError(
            f"{name} must be a model instance, got the class {spec.__name__}; pass a loaded model (e.g. "
            f"{spec.__name__}.from_pretrained(path)), a zoo name or a local path"
        )
    raise ConfigTypeError(
        f"{name} must be a decodekit LanguageModel, a transformers causal LM, a zoo name or a local path, "
        f"got {describe(spec)}"
    )


# -------------------------------------------------------------------------------------- generate() arguments
def check_seed(seed: Any, num_prompts: int) -> Any:
    """Refuse a ``seed`` other than None, an integer, or one integer per prompt (a list / tuple or a 1-D integer
    tensor of length ``num_prompts``). Returns the seed unchanged, except an integer scalar (numpy's too) as an
    ``int``."""
    expected = f"None, an integer, or a list of {num_prompts} integers (one per prompt)"
    if seed is None:
        return None
    if isinstance(seed, torch.Tensor):
        if not int_array(seed) or seed.ndim > 1:
            raise ConfigTypeError(f"seed must be {expected}, got {describe(seed)}")
        if seed.ndim == 1 and seed.shape[0] != num_prompts:
            raise ConfigError(f"seed has {seed.shape[0]} values for {num_prompts} prompts; pass one per prompt")
        values = seed.reshape(-1).tolist()
    elif is_int(seed):
        values = [seed]
    elif isinstance(seed, Sequence) and not isinstance(seed, (str, bytes)):
        bad = next((s for s in seed if not is_int(s)), None)
        if bad is not None:
            raise ConfigTypeError(f"seed must be {expected}; it holds {describe(bad)}")
        if len(seed) != num_prompts:
            raise ConfigError(f"seed has {len(seed)} values for {num_prompts} prompts; pass one per prompt")
        values = list(seed)
    else:
        hint = "; use seed.tolist()" if is_numpy_array(seed) else ""
        raise ConfigTypeError(f"seed must be {expected}, got {describe(seed)}{hint}")
    low, high = SEED_RANGE
    bad = next((s for s in values if not low <= s < high), None)
    if bad is not None:
        raise ConfigError(f"seed must be in [-2**63, 2**64) (what torch.Generator takes), got {bad}")
    return int(seed) if is_int(seed) else seed


def eos_ids(eos_token_id: Any, vocab_size: int) -> list[int]:
    """``eos_token_id`` (an integer or a sequence of integers, each in ``[0, vocab_size)``) as a list."""
    expected = f"None, a token id in [0, {vocab_size}) or a sequence of them (() = never stop early)"
    if is_int(eos_token_id):
        ids = [eos_token_id]
    elif isinstance(eos_token_id, torch.Tensor) or is_numpy_array(eos_token_id):
        if not int_array(eos_token_id) or eos_token_id.ndim > 1:
            raise ConfigTypeError(f"eos_token_id must be {expected}, got {describe(eos_token_id)}")
        ids = eos_token_id.reshape(-1).tolist()
    elif isinstance(eos_token_id, Iterable) and not isinstance(eos_token_id, (str, bytes, Mapping)):
        ids = list(eos_token_id)
        bad = next((t for t in ids if not is_int(t)), None)
        if bad is not None:
            raise ConfigTypeError(f"eos_token_id must be {expected}; it holds {describe(bad)}")
    else:
        raise ConfigTypeError(f"eos_token_id must be {expected}, got {describe(eos_token_id)}")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ConfigError(f"eos_token_id must be {expected}, got {bad} (outside the model's vocabulary)")
    return [int(t) for t in ids]
