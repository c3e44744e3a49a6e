"""Lossy codecs for the deltas workers commit: fp16, bf16 and top-k, with error feedback.

Pure numpy: a codec turns a list of float arrays into the arrays that go on
the wire (``encode``) and back (``decode``, given the center they will be
added to). Every wire array has a dtype the transport already carries:

* ``Float16`` (``"fp16"``): IEEE half precision, half the bytes. Values past
  the fp16 range are clipped to +-65504 (error feedback carries the rest).
* ``BFloat16`` (``"bf16"``): the top 16 bits of each float32, rounded to the
  nearest even; half the bytes, float32's range, 8 bits of mantissa. The bits
  travel as ``int16`` (a reinterpretation, not a conversion) because the
  wire's dtype allow-list has no ``uint16``; ``uint16`` is accepted too.
* ``TopK(fraction)`` (``"topk:F"``): for each tensor only the ``ceil(F * size)``
  entries of largest magnitude, as ``int32`` flat indices then their
  ``float32`` values: ``8 * F`` of the dense bytes (``topk:0.01`` sends 8 %).

Error feedback (Seide et al., 2014; Karimireddy et al., 2019): what a lossy
codec dropped from one commit is added to the next one, so nothing is lost
for good, only delayed. `compress_with_feedback` is the pure step:
``(arrays, residual) -> (wire, new residual)``; the worker keeps the residual.
Without it top-k at small fractions stalls (small coordinates never move).

Replies (``Trainer(compress_replies=True)``): the server sends each worker
the change of the center since what that worker holds, encoded by the same
codec, and both ends move their copy of "what the worker holds" by the
decoded change (`Codec.encode_change`, `Codec.apply_change`: the same float32 additions
on both ends, so the copies stay bit-identical). What a reply drops is in the
next one: with bf16 the worker's center is never further from the server's
than one reply's rounding; with top-k it lags on the entries not sent yet.

`parse_compression` reads the option of ``Trainer(compression=...)`` and the
jobs' ``--compression none|fp16|bf16|topk:F``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from trainer.algorithms.base import AlgorithmConfigError, Layout, split_dense

Arrays = list[np.ndarray]

_FP16_MAX = float(np.finfo(np.float16).max)
_BF16_NAN = np.uint16(0x7FC0)
_BF16_CHUNK = 1 << 18  # float32s rounded at a time: a 1 MiB temporary, in the caches


@dataclass(frozen=True)
class Codec:
    """Base class: ``encode(arrays) -> wire``, ``decode(wire, like) -> arrays``, ``check(wire, shapes)``."""

    name: ClassVar[str] = "codec"

    def encode(self, arrays: Sequence[np.ndarray]) -> Arrays:
        raise NotImplementedError

    def decode(self, wire: Sequence[np.ndarray], like: Sequence[np.ndarray]) -> Arrays:
        """The dense arrays `wire` stands for, with the shapes and dtypes of `like` (the center)."""
        raise NotImplementedError

    def decode_into(self, wire: Sequence[np.ndarray], out: Sequence[np.ndarray]) -> None:
        """`decode` written into `out` (C-contiguous arrays shaped and typed like the center), the same bits."""
        for o, dense in zip(out, self.decode(wire, out), strict=True):
            np.copyto(o, dense)

    def split(self, wire: Sequence[np.ndarray], layout: Layout) -> list[Arrays]:
        """Each shard's part of `wire` for its pieces ``(tensor, start, stop)``, itself a wire of those pieces."""
        return split_dense(wire, layout)  # a dense wire: flat views

    def check(self, wire: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]) -> str | None:
        """What is wrong with a received `wire` for tensors of `shapes`, or None when it decodes."""
        if len(wire) != len(shapes):
            return (f"a {self.describe()} payload has {len(wire)} arrays, expected {len(shapes)} (one per model "
                    "weight); the worker's model or compression differs from the server's")
        for i, (a, shape) in enumerate(zip(wire, shapes)):
            if a.shape != tuple(shape) or a.dtype.name not in self.wire_dtypes:
                return (f"{self.describe()} payload array #{i} is {a.dtype.name}{list(a.shape)}, expected one of "
                        f"{sorted(self.wire_dtypes)} with shape {list(shape)}; the worker's model or compression "
                        "differs from the server's")
        return None

    wire_dtypes: ClassVar[frozenset[str]] = frozenset()
    #: Wire arrays per tensor.
    wire_arrays: ClassVar[int] = 1

    def encode_change(self, new: Sequence[np.ndarray], held: Sequence[np.ndarray], *,
                      overwrite: bool = False) -> Arrays:
        """The wire of ``new - held``; `held` (what the peer holds) is moved in place to what the peer will
        hold once it has applied that wire with `apply_change`. With `overwrite` the arrays of `new`
        (C-contiguous) are the scratch space and hold garbage afterwards: the change and its decoded form
        need no arrays of their own (the encoding may)."""
        if not overwrite:
            new = [np.array(n, copy=True) for n in new]
        change = [np.subtract(n, h, out=n) for n, h in zip(new, held, strict=True)]
        wire = self.encode(change)
        self.decode_into(wire, change)  # the same bits as apply_change's decode
        for h, c in zip(held, change):
            np.add(h, c, out=h)
        return wire

    def apply_change(self, wire: Sequence[np.ndarray], held: Sequence[np.ndarray],
                     scratch: Sequence[np.ndarray] | None = None) -> None:
        """Add the change that `wire` encodes to `held`, in place (float32 arithmetic, the same on both ends).
        `scratch` (arrays like `held`, kept by the caller) takes the decoded change instead of new arrays."""
        if scratch is None:
            decoded = self.decode(wire, held)
        else:
            self.decode_into(wire, scratch)
            decoded = scratch
        for h, change in zip(held, decoded, strict=True):
            np.add(h, change, out=h)

    def wire_fraction(self) -> float:
        """Bytes on the wire per float32 byte of the dense delta."""
        return 1.0

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class Float16(Codec):
    name: ClassVar[str] = "fp16"
    wire_dtypes: ClassVar[frozenset[str]] = frozenset({"float16"})

    def encode(self, arrays):
        return [np.clip(a, -_FP16_MAX, _FP16_MAX).astype(np.float16) for a in arrays]

    def decode(self, wire, like):
        return [w.astype(c.dtype) for w, c in zip(wire, like, strict=True)]

    def decode_into(self, wire, out):
        for o, w in zip(out, wire, strict=True):
            np.copyto(o, w, casting="unsafe")  # what astype does

    def wire_fraction(self) -> float:
        return 0.5


def to_bfloat16_bits(a: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (uint16) of `a`, rounded to nearest even; NaN stays NaN.

    Rounded a chunk at a time through one small temporary: a model-sized uint32
    temporary would be allocated (and page-faulted) for every 40 MB reply."""
    bits = np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)
    out = np.empty(bits.size, np.uint16)
    scratch = np.empty(min(bits.size, _BF16_CHUNK), np.uint32)
    for start in range(0, bits.size, _BF16_CHUNK):
        part = bits[start:start + _BF16_CHUNK]
        rounded = scratch[:part.size]
        np.right_shift(part, np.uint32(16), out=rounded)
        rounded &= np.uint32(1)
        rounded += np.uint32(0x7FFF)
        rounded += part
        rounded >>= np.uint32(16)
        wire = out[start:start + part.size]
        np.copyto(wire, rounded, casting="unsafe")
        # rounding can turn a NaN's payload into inf or a number: every NaN becomes the quiet NaN
        nan = np.isnan(part.view(np.float32))
        if nan.any():
            wire[nan] = _BF16_NAN
    return out.reshape(np.shape(a))


def from_bfloat16_bits(bits: np.ndarray, dtype=np.float32) -> np.ndarray:
    """float arrays from bfloat16 bits (uint16 or int16 views)."""
    wide = np.ascontiguousarray(bits).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32).astype(dtype, copy=False)


@dataclass(frozen=True)
class BFloat16(Codec):
    name: ClassVar[str] = "bf16"
    wire_dtypes: ClassVar[frozenset[str]] = frozenset({"int16", "uint16"})

    def encode(self, arrays):
        return [to_bfloat16_bits(a).view(np.int16) for a in arrays]

    def decode(self, wire, like):
        return [from_bfloat16_bits(w, c.dtype) for w, c in zip(wire, like, strict=True)]

    def decode_into(self, wire, out):
        for o, w in zip(out, wire, strict=True):
            if o.dtype != np.float32 or not o.flags.c_contiguous:
                np.copyto(o, from_bfloat16_bits(w, o.dtype))
                continue
            bits = o.view(np.uint32)  # the float32's high half is the bfloat16, the low half zeros
            np.copyto(bits, np.ascontiguousarray(w).view(np.uint16))
            np.left_shift(bits, 16, out=bits)

    def wire_fraction(self) -> float:
        return 0.5


@dataclass(frozen=True)
class TopK(Codec):
    """The largest-magnitude `fraction` of every tensor (at least one entry each)."""

    fraction: float = 0.01

    name: ClassVar[str] = "topk"
    wire_arrays: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) \
                or not 0.0 < self.fraction <= 1.0:
            raise AlgorithmConfigError(
                f"top-k needs a fraction in (0, 1] of each tensor to send. Received: fraction={self.fraction!r}. "
                "Fix: e.g. compression='topk:0.01' (1 % of the entries)."
            )

    def k(self, size: int) -> int:
        return min(size, max(1, math.ceil(self.fraction * size)))

    def encode(self, arrays):
        wire: Arrays = []
        for a in arrays:
            flat = np.ravel(a)
            idx = self._largest(flat, self.k(flat.size)).astype(np.int32)
            wire += [idx, flat[idx].astype(np.float32)]
        return wire

    @staticmethod
    def _largest(flat: np.ndarray, k: int) -> np.ndarray:
        """Indices of `k` entries of largest magnitude. Zeros are left out of the selection: a partition
        over many equal values is several times slower (a reply's change of the center is mostly
        zeros), and with at most k non-zeros they are the answer, padded with zeros' indices to k."""
        if k >= flat.size:
            return np.arange(flat.size)
        nonzero = np.count_nonzero(flat)
        if nonzero == flat.size:
            return np.argpartition(np.abs(flat), flat.size - k)[flat.size - k:]
        where = np.flatnonzero(flat)
        if nonzero <= k:
            return np.concatenate([where, np.flatnonzero(flat == 0)[: k - nonzero]])
        return where[np.argpartition(np.abs(flat[where]), nonzero - k)[nonzero - k:]]

    def decode(self, wire, like):
        out = []
        for i, c in enumerate(like):
            dense = np.zeros(c.size, dtype=c.dtype)
            dense[wire[2 * i]] = wire[2 * i + 1]
            out.append(dense.reshape(c.shape))
        return out

    def decode_into(self, wire, out):
        for i, o in enumerate(out):
            if not o.flags.c_contiguous:
                np.copyto(o, self.decode(wire[2 * i: 2 * i + 2], [o])[0])
                continue
            flat = o.reshape(-1)  # a view of a contiguous array
            flat.fill(0)
            flat[wire[2 * i]] = wire[2 * i + 1]

    def split(self, wire, layout):
        parts = []
        for pieces in layout:
            part: Arrays = []
            for t, start, stop in pieces:
                idx, values = wire[2 * t], wire[2 * t + 1]
                keep = (idx >= start) & (idx < stop)
                part += [(idx[keep] - start).astype(np.int32), values[keep]]
            parts.append(part)
        return parts

    def check(self, wire, shapes):
        if len(wire) != 2 * len(shapes):
            return (f"a {self.describe()} payload has {len(wire)} arrays, expected {2 * len(shapes)} (indices and "
                    "values for each model weight); the worker's model or compression differs from the server's")
        for i, shape in enumerate(shapes):
            idx, values = wire[2 * i], wire[2 * i + 1]
            size = math.prod(shape)
            if idx.ndim != 1 or idx.dtype.name != "int32" or values.shape != idx.shape \
                    or values.dtype.name != "float32" or len(idx) > size:
                return (f"{self.describe()} payload for weight #{i} is {idx.dtype.name}{list(idx.shape)} indices and "
                        f"{values.dtype.name}{list(values.shape)} values; expected int32 and float32 vectors of the "
                        f"same length, at most {size}")
            if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= size):
                return (f"{self.describe()} payload for weight #{i} has indices in [{int(idx.min())}, "
                        f"{int(idx.max())}], expected [0, {size - 1}]")
        return None

    def wire_fraction(self) -> float:
        return min(1.0, 2.0 * self.fraction)

    def describe(self) -> str:
        return f"topk:{self.fraction:g}"


CODECS = {"fp16": Float16, "bf16": BFloat16}


def parse_compression(spec: str | Codec | None) -> Codec | None:
    """A codec from ``None``/``"none"``, ``"fp16"``, ``"bf16"``, ``"topk:F"`` or a Codec; None means no compression."""
    if spec is None or isinstance(spec, Codec):
        return spec
    text = str(spec).strip().lower()
    if text in ("", "none"):
        return None
    if text in CODECS:
        return CODECS[text]()
    if text.startswith("topk:"):
        try:
            fraction = float(text[5:])
        except ValueError:
            fraction = float("nan")
        if fraction == fraction:
            return TopK(fraction)
    raise AlgorithmConfigError(
        f"Unknown compression {spec!r}. Expected none, fp16, bf16 or topk:F with F in (0, 1] "
        "(e.g. topk:0.01 sends the largest 1 % of each tensor)."
    )


def compress_with_feedback(codec: Codec, arrays: Sequence[np.ndarray],
                           residual: Sequence[np.ndarray] | None) -> tuple[Arrays, Arrays]:
    """Error feedback: encode ``arrays + residual``; the new residual is what the encoding lost.

    Pure: returns ``(wire, new_residual)``; `residual` None means zeros (the first commit).
    """
    corrected = list(arrays) if residual is None else [np.add(a, r) for a, r in zip(arrays, residual, strict=True)]
    wire = codec.encode(corrected)
    sent = codec.decode(wire, corrected)
    return wire, [np.subtract(c, s) for c, s in zip(corrected, sent)]
