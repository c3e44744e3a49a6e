"""How a sharded parameter server cuts the model, and how its parts are joined again (numpy only).

The tensors are laid end to end and cut at every S-th of their bytes, so
the parts weigh the same even when one tensor holds nearly all of the model
(the dense kernel of a CNN). A part is a list of *pieces* ``(tensor, start,
stop)``: flat element ranges of the tensors, each a 1-D array on its shard.
A payload is cut the same way on the worker (the algorithm's ``split_payload``)
and a reply joined back with `join_parts`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

Piece = tuple[int, int, int]


def check_shards(shards: Any, algorithm: Any = None) -> int:
    """`shards` as a positive int; ValueError for another value or an algorithm that cannot be sharded."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"`ps_shards` must be a positive integer (parameter-server endpoints). Received: "
                         f"ps_shards={shards!r}")
    if shards > 1 and getattr(algorithm, "exchanges_optimizer_state", False):
        describe = getattr(algorithm, "describe", lambda: type(algorithm).__name__)()
        raise ValueError(f"{describe} keeps optimizer state on the parameter server, which cannot be sharded. "
                         f"Fix: ps_shards=1, or average the weights only (average_optimizer_state=False).")
    return shards


def shard_layout(arrays: Sequence[Any], shards: int) -> list[list[Piece]]:
    """Each shard's pieces ``(tensor, start, stop)`` of `arrays` (anything with ``size`` and ``itemsize``),
    cut into `shards` parts of equal bytes; raises ValueError when a part would be empty."""
    shards = check_shards(shards)
    total = sum(a.size * a.itemsize for a in arrays)
    layout: list[list[Piece]] = [[] for _ in range(shards)]
    offset = 0  # bytes of the tensors before this one
    for t, a in enumerate(arrays):
        n, width = int(a.size), int(a.itemsize)
        if n == 0:  # keeps its place (and its shape in the joined center), holds nothing
            layout[min(shards - 1, offset * shards // max(total, 1))].append((t, 0, 0))
            continue

        def first(s: int) -> int:  # the first element of tensor t that starts in shard s's bytes
            return min(n, max(0, math.ceil((s * total - shards * offset) / (shards * width))))

        for s in range(shards):
            start, stop = first(s), first(s + 1) if s + 1 < shards else n
            if stop > start:
                layout[s].append((t, start, stop))
        offset += n * width
    empty = [s for s, pieces in enumerate(layout) if not any(stop > start for _, start, stop in pieces)]
    if empty:
        raise ValueError(f"a model of {sum(a.size for a in arrays)} values cannot be cut into {shards} parameter-"
                         f"server shards (shard {empty[0]} would hold none). Fix: fewer ps_shards.")
    return layout


def cut(arrays: Sequence[np.ndarray], layout: Sequence[Sequence[Piece]]) -> list[list[np.ndarray]]:
    """Each shard's pieces of whole tensors: flat views ``ravel(arrays[t])[start:stop]`` (the center on the
    server; a dense payload on a worker, which the algorithm's ``split_payload`` cuts the same way)."""
    return [[np.ravel(arrays[t])[start:stop] for t, start, stop in pieces] for pieces in layout]


def cut_tensors(layout: Sequence[Sequence[Piece]]) -> list[int]:
    """The tensors that `layout` cuts between shards, in order."""
    shards_of: dict[int, int] = {}
    for pieces in layout:
        for t, _, _ in pieces:
            shards_of[t] = shards_of.get(t, 0) + 1
    return sorted(t for t, n in shards_of.items() if n > 1)


def join_parts(parts: Sequence[Sequence[np.ndarray]], layout: Sequence[Sequence[Piece]],
               shapes: Sequence[tuple[int, ...]], buffer: Callable[[int, int], Any] | None = None,
               ) -> list[np.ndarray]:  # fmt: skip
    """The tensors of `shapes` from each shard's arrays (`parts`, in `layout`'s order).

    A tensor in one piece is a view of it; tensor `t` cut into several is
    copied into a new array, or into ``buffer(t, nbytes)`` (a writable
    buffer such as a `~trainer.transport.wire.RecvPool` view, so that a
    client allocates nothing per reply).
    """
    pieces: list[list[tuple[int, np.ndarray]]] = [[] for _ in shapes]
    for part, part_layout in zip(parts, layout, strict=True):
        for array, (t, start, _) in zip(part, part_layout, strict=True):
            pieces[t].append((start, array))
    joined = []
    for t, (found, shape) in enumerate(zip(pieces, shapes)):
        if len(found) == 1:
            joined.append(found[0][1].reshape(shape))
            continue
        dtype = found[0][1].dtype
        size = math.prod(shape)
        flat = (np.empty(size, dtype) if buffer is None
                else np.frombuffer(buffer(t, size * dtype.itemsize), dtype=dtype, count=size))
        for start, array in found:
            flat[start:start + array.size] = array
        joined.append(flat.reshape(shape))
    return joined
