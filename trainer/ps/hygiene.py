"""Update hygiene: what a COMMIT payload must be before the server folds it into the center (numpy only).

A payload must have one array per model weight (then, for algorithms that keep it
on the server, the optimizer state), each with the weight's shape and the
model's dtype, and every float value finite. The center that an algorithm
returns must be finite too. The checks name the array by the model's weight
name (e.g. ``dense_1/kernel``) so that a refusal says where a worker went
wrong. A finite check costs one ``sum`` per array; only when that sum is not
finite are the NaN and inf values counted. `freeze` makes the server's private
read-only copies of a center; `refusal` and `stale_attempt` word the ERROR
replies.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from trainer.transport.wire import ALLOWED_DTYPES

DIVERGED_HINT = ("Training diverged on that worker. Fix: lower the learning rate, clip the gradients (e.g. "
                 "keras.optimizers.Adam(clipnorm=1.0)), or look for extreme values in its rows")


def freeze(arrays: Sequence[Any], what: str = "center") -> list[np.ndarray]:
    """Private read-only copies; raises ValueError for a dtype the wire cannot carry."""
    out = []
    for i, a in enumerate(arrays):
        c = np.array(a, copy=True)
        if c.dtype.name not in ALLOWED_DTYPES:
            raise ValueError(
                f"{what} array #{i} has dtype {c.dtype}, which the wire format cannot carry; "
                f"expected one of {sorted(ALLOWED_DTYPES)}"
            )
        c.setflags(write=False)
        out.append(c)
    return out


def array_name(index: int, names: Sequence[str] | None) -> str:
    """``"#3 'dense_1/kernel'"``, or ``"#5 (optimizer state)"`` past the model's weights."""
    if names and index < len(names):
        return f"#{index} {names[index]!r}"
    if names:
        return f"#{index} (optimizer state)"
    return f"#{index}"


def non_finite(a: np.ndarray) -> tuple[int, int] | None:
    """(NaN count, inf count) of a float array that has any, else None."""
    if a.dtype.kind != "f" or a.size == 0:
        return None
    with np.errstate(all="ignore"):
        # The fast check: a sum of squares is finite unless a value is NaN or inf (or the squares
        # overflow); float32/64 take BLAS's dot, several times faster than a sum on a server's
        # per-commit path. The exact count only when it fails.
        if a.dtype in (np.float32, np.float64) and a.flags.c_contiguous:
            flat = a.reshape(-1)
            fast = np.dot(flat, flat)
        else:
            fast = a.sum()
        if np.isfinite(fast):
            return None
    nan, inf = int(np.count_nonzero(np.isnan(a))), int(np.count_nonzero(np.isinf(a)))
    return (nan, inf) if nan or inf else None


def check_commit(arrays: Sequence[np.ndarray], center: Sequence[np.ndarray], num_weights: int,
                 names: Sequence[str] | None, with_optimizer: bool,
                 layout: Callable[[Sequence[np.ndarray], list[tuple[int, ...]]], str | None] | None = None,
                 finite: bool = True) -> tuple[str, bool] | None:  # fmt: skip
    """Why `arrays` may not be committed against `center`, or None.

    Returns ``(problem, diverged)``: `diverged` is True for non-finite values
    (the worker's training blew up), False for a payload of another model.
    `layout` replaces the count, shape and dtype checks for an algorithm whose
    payload is not the model's arrays (a compressed algorithm's ``check_payload``);
    its float values must still be finite. ``finite=False`` leaves the values
    out (a server that checks every result before publishing it finds a
    non-finite payload there, and asks again with ``finite=True`` to word it).
    """
    if layout is not None:
        problem = layout(arrays, [c.shape for c in center[:num_weights]])
        if problem is not None:
            return problem, False
        for i, a in enumerate(arrays if finite else ()):
            bad = non_finite(a)
            if bad is not None:
                return f"compressed array #{i} holds {bad[0]} NaN and {bad[1]} inf values", True
        return None
    if with_optimizer:
        if len(arrays) < num_weights:
            return (f"it has {len(arrays)} arrays, expected at least {num_weights} (the model weights, then "
                    "optimizer state); the worker's model differs from the one the server was started with"), False
    elif len(arrays) != num_weights:
        return (f"it has {len(arrays)} arrays, expected {num_weights} (one per model weight); the worker's model "
                "differs from the one the server was started with"), False
    for i, a in enumerate(arrays):
        if i < len(center):
            expected = center[i]
            if a.shape != expected.shape:
                return (f"array {array_name(i, names)} has shape {a.shape}, expected {expected.shape}; the worker's "
                        "model differs from the one the server was started with"), False
            if a.dtype != expected.dtype:
                return (f"array {array_name(i, names)} has dtype {a.dtype}, expected the model's {expected.dtype}. "
                        "Fix: send the model's own dtype (no casting to float64 or to integers on the worker)"), False
        bad = non_finite(a) if finite else None
        if bad is not None:
            return f"array {array_name(i, names)} holds {bad[0]} NaN and {bad[1]} inf values", True
    return None


def check_center(center: Sequence[np.ndarray], names: Sequence[str] | None) -> str | None:
    """Why a center an algorithm returned may not replace the current one (non-finite values), or None."""
    for i, a in enumerate(center):
        problem = center_problem(i, a, names)
        if problem is not None:
            return problem
    return None


def center_problem(index: int, array: np.ndarray, names: Sequence[str] | None) -> str | None:
    """Why `array` may not become center array `index` (non-finite values), or None."""
    bad = non_finite(array)
    if bad is None:
        return None
    return f"applying it would put {bad[0]} NaN and {bad[1]} inf values into center array {array_name(index, names)}"


def refusal(worker: int | None, step: object, epoch: object, problem: str, diverged: bool) -> str:
    """The ERROR a worker gets for a refused COMMIT (and the trainer's TrainingFailedError)."""
    return (f"refused the COMMIT of worker {worker} at step {step!r:.20} (epoch {epoch!r:.20}): {problem}. "
            f"The center is unchanged.{' ' + DIVERGED_HINT + '.' if diverged else ''}")


def stale_attempt(attempt: int, current: int) -> str:
    """The refusal of a request (or a connection) from an older attempt than the current one."""
    return (f"stale attempt: this task belongs to attempt {attempt} but the driver runs attempt {current} now "
            "(a leftover task of a failed attempt); its requests are refused")
