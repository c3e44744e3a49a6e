"""`Compressed`: a delta algorithm (DOWNPOUR, ADAG, DynSGD) whose commits travel through a lossy codec.

The worker encodes its delta (with error feedback by default, see
``trainer.algorithms.compression``) and the server algorithm decodes it against
the center before the wrapped algorithm folds it in. Replies (the center) stay
dense unless `replies` is set: then the server sends each worker the change
of the center since what that worker holds, through the same codec
(``Codec.encode_change``; ``trainer.ps.commits``).
On the server the delta is decoded straight into the buffer that
receives the new center (``server_apply``), so a compressed commit allocates
nothing there either. Only algorithms whose workers send *deltas* are wrapped: rounding full
weights (EASGD, AEASGD, synchronous averaging, the single worker) would lose
precision of the model itself, not of a step.

The server asks ``check_payload`` whether a received payload decodes, so a
top-k payload (indices and values, not one array per weight) is checked for
what it is. ``Trainer(compression="bf16")`` builds it; so does
``with_compression(algorithm, "topk:0.01")``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from trainer.algorithms.base import Algorithm, AlgorithmConfigError, ParameterServerAlgorithm
from trainer.algorithms.compression import Codec, compress_with_feedback, parse_compression
from trainer.algorithms.delta import DeltaAlgorithm


@dataclass(frozen=True)
class Compressed(ParameterServerAlgorithm):
    """`inner` with its commits (and, with `replies`, the server's replies) encoded by `codec`;
    `error_feedback` carries what the codec dropped from a commit."""

    inner: Any = None
    codec: Any = None
    error_feedback: bool = True
    replies: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.inner, DeltaAlgorithm):
            raise AlgorithmConfigError(
                f"Compression applies to algorithms whose workers commit deltas (downpour, adag, dynsgd). Received: "
                f"{getattr(self.inner, 'name', type(self.inner).__name__)}. Fix: use one of those algorithms or "
                "compression='none'."
            )
        if not isinstance(self.codec, Codec):
            raise AlgorithmConfigError(f"`codec` must be a Codec (see parse_compression). Received: {self.codec!r}")

    @property
    def window(self) -> int | None:  # type: ignore[override]
        return self.inner.window

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def payload_arrays(self) -> int:  # type: ignore[override]
        return self.codec.wire_arrays

    @property
    def reply_codec(self) -> Codec | None:
        """The codec of the server's replies (changes of the center), or None for dense replies."""
        return self.codec if self.replies else None

    def check_workers(self, num_workers: int) -> None:
        self.inner.check_workers(num_workers)

    # -- worker side -------------------------------------------------------
    def worker_payload(self, weights, anchor):
        return self.codec.encode(self.inner.worker_payload(weights, anchor))

    def worker_commit(self, weights, anchor, residual):
        delta = self.inner.worker_payload(weights, anchor)
        if not self.error_feedback:
            return self.codec.encode(delta), None
        return compress_with_feedback(self.codec, delta, residual)

    def worker_apply(self, weights, anchor, reply):
        return self.inner.worker_apply(weights, anchor, reply)

    # -- server side -------------------------------------------------------
    def check_payload(self, arrays: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]) -> str | None:
        """What is wrong with a received payload for a center of `shapes`, or None."""
        return self.codec.check(arrays, shapes)

    def server_commit(self, center, payload, staleness):
        return self.inner.server_commit(center, self.codec.decode(payload, center), staleness)

    def server_apply(self, center, payload, staleness, out):
        self.codec.decode_into(payload, out)  # the dense delta, where the new center will be
        self.inner.server_apply(center, out, staleness, out)

    def split_payload(self, payload, layout):
        return self.codec.split(payload, layout)

    def describe(self) -> str:
        feedback = "" if self.error_feedback else ", no error feedback"
        replies = ", replies too" if self.replies else ""
        return f"{self.inner.describe()} [{self.codec.describe()}{feedback}{replies}]"


def with_compression(algorithm: Algorithm, compression: str | Codec | None,
                     error_feedback: bool = True, replies: bool = False) -> Algorithm:
    """`algorithm` wrapped in `Compressed` (its replies too with `replies`), or unchanged for ``None``/``"none"``."""
    codec = parse_compression(compression)
    if codec is None:
        if replies:
            raise AlgorithmConfigError(
                "compress_replies=True needs a compression for them (compression='bf16', 'fp16' or 'topk:F'). "
                "Fix: set compression, or leave compress_replies off."
            )
        return algorithm
    if isinstance(algorithm, Compressed):
        raise AlgorithmConfigError(f"{algorithm.describe()} is compressed already; give compression once.")
    return Compressed(algorithm, codec, error_feedback, bool(replies))
