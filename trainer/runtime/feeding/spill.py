"""A worker's shard on local disk: an Arrow IPC file written once, read back one block at a time.

`Spill` receives the shard's Arrow record batches as Spark sends them (the
two-column layout of ``trainer.data.checks``), re-cuts them into blocks of
about `BLOCK_BYTES` and appends them to ``shard.arrow`` in a directory of its
own under the executor's local directory (`spill_directory`). Each block holds

* ``x``: fixed_size_list<float32>[prod(input shape)], one row per sample;
* ``y``: float32, or fixed_size_list<float32>[label size] for vector labels.

The file is a standard Arrow IPC file (``pyarrow.ipc.open_file`` reads it).
The writer also keeps the byte range of every block, so that `read_block`
memory-maps ONE block (``mmap`` with an offset), copies its rows out and
unmaps it: the process's resident memory and address space hold a block at a
time, never the file. Mapping the whole file instead would leave every page
read during a pass resident in the worker (and counted in its RSS) until the
kernel needs it back.

`remove` deletes the directory. Spark also deletes the executor's local
directories when the application ends, which covers a killed worker.
"""

from __future__ import annotations

import math
import mmap
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from trainer.data.columns import FEATURES, LABEL

BLOCK_BYTES = 1 << 20  # rows per block: about 1 MB of samples
SPILL_PREFIX = "trainer-spill-"


def spill_directory() -> str:
    """The executor's local directory (the first of ``SPARK_LOCAL_DIRS``, which Spark sets for its
    Python workers), else the system's temporary directory."""
    for candidate in os.environ.get("SPARK_LOCAL_DIRS", "").split(","):
        if candidate and os.path.isdir(candidate):
            return candidate
    return tempfile.gettempdir()


@dataclass(frozen=True)
class Block:
    """Where one block's IPC message lies in the file, and which rows it holds."""

    offset: int
    length: int
    first_row: int
    rows: int


def _flat_float32(column: pa.Array, rows: int, width: int, name: str) -> np.ndarray:
    """A list (or fixed-size list) column of `rows` x `width` numbers as a (rows, width) float32 array."""
    values = column.flatten().to_numpy(zero_copy_only=False)
    if values.size != rows * width:
        raise ValueError(f"The column {name!r} holds {values.size} numbers for {rows} rows; expected "
                         f"{width} per row. The data changed after it was checked: re-run the fit.")
    return values.astype(np.float32, copy=False).reshape(rows, width)


class Spill:
    """The spill file of one shard: append rows, then read them back block by block.

    Args:
        input_shape: Tuple. The model's input shape (without the batch axis).
        label_size: Integer or None. Numbers per label; None for scalar labels.
        directory: String or None. Where to create the spill's own directory;
            default `spill_directory()`.
        block_bytes: Integer. About this many bytes of samples per block.
    """

    def __init__(self, input_shape: tuple[int, ...], label_size: int | None, directory: str | None = None,
                 block_bytes: int = BLOCK_BYTES) -> None:
        self.input_shape = tuple(int(d) for d in input_shape)
        self.label_size = label_size
        self.width = math.prod(self.input_shape)
        row_bytes = 4 * (self.width + (label_size or 1))
        self.block_rows = max(1, int(block_bytes) // row_bytes)
        x_type = pa.list_(pa.float32(), self.width)
        y_type = pa.float32() if label_size is None else pa.list_(pa.float32(), int(label_size))
        self.schema = pa.schema([("x", x_type), ("y", y_type)])
        self.directory = tempfile.mkdtemp(prefix=SPILL_PREFIX, dir=directory or spill_directory())
        self.path = os.path.join(self.directory, "shard.arrow")
        self.blocks: list[Block] = []
        self.received_bytes = 0  # Arrow bytes of the batches given to `append`
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_rows = 0
        self._written_rows = 0
        self._sink = pa.OSFile(self.path, "wb")
        self._writer = pa.ipc.new_file(self._sink, self.schema)
        # The file's magic and schema go out with the first batch: a leading empty batch puts
        # them before the first block, whose byte range then starts where `tell` says.
        self._writer.write_batch(self._record_batch(np.zeros((0, self.width), np.float32),
                                                    np.zeros((0, *self._y_shape), np.float32)))
        self._reader: object | None = None  # the file, opened for reading once rows are read back

    @property
    def _y_shape(self) -> tuple[int, ...]:
        return () if self.label_size is None else (int(self.label_size),)

    @property
    def rows(self) -> int:
        """Rows appended so far."""
        return self._written_rows + self._pending_rows

    @property
    def nbytes(self) -> int:
        """Bytes of the spill file on disk so far."""
        return os.path.getsize(self.path) if os.path.exists(self.path) else 0

    # -- writing ------------------------------------------------------------------
    def append(self, batch: pa.RecordBatch) -> None:
        """Append a record batch with the ``features`` and ``label`` columns."""
        if batch.num_rows == 0:
            return
        self.received_bytes += batch.nbytes
        x = _flat_float32(batch.column(FEATURES), batch.num_rows, self.width, FEATURES)
        labels = batch.column(LABEL)
        if self.label_size is None:
            y = labels.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        else:
            y = _flat_float32(labels, batch.num_rows, int(self.label_size), LABEL)
        self.append_arrays(x, y)

    def append_arrays(self, x: np.ndarray, y: np.ndarray) -> None:
        """Append rows given as numpy arrays (`x` of rows x input shape, `y` of rows [x label size])."""
        if self._writer is None:
            raise RuntimeError("This spill file is closed for writing; rows can only be read back.")
        x = np.asarray(x, np.float32).reshape(len(x), self.width)
        y = np.asarray(y, np.float32).reshape(len(y), *self._y_shape)
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows and y has {len(y)}; they must match.")
        if len(x):
            self._pending.append((x, y))
            self._pending_rows += len(x)
        while self._pending_rows >= self.block_rows:
            self._write_pending(self.block_rows)

    def flush(self) -> None:
        """Write the rows still held back (a last, smaller block) so that they can be read."""
        if self._pending_rows:
            self._write_pending(self._pending_rows)

    def close_writer(self) -> None:
        """Flush and write the file's footer; afterwards rows can only be read."""
        if self._writer is None:
            return
        self.flush()
        self._writer.close()
        self._sink.close()
        self._writer = None

    def _write_pending(self, rows: int) -> None:
        xs = np.concatenate([x for x, _ in self._pending]) if len(self._pending) > 1 else self._pending[0][0]
        ys = np.concatenate([y for _, y in self._pending]) if len(self._pending) > 1 else self._pending[0][1]
        rest = len(xs) - rows
        self._pending = [(xs[rows:], ys[rows:])] if rest else []
        self._pending_rows = rest
        start = self._sink.tell()
        self._writer.write_batch(self._record_batch(xs[:rows], ys[:rows]))
        self.blocks.append(Block(start, self._sink.tell() - start, self._written_rows, rows))
        self._written_rows += rows

    def _record_batch(self, x: np.ndarray, y: np.ndarray) -> pa.RecordBatch:
        xs = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(x).reshape(-1)), self.width)
        if self.label_size is None:
            ys = pa.array(np.ascontiguousarray(y))
        else:
            ys = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(y).reshape(-1)),
                                                   int(self.label_size))
        return pa.record_batch([xs, ys], schema=self.schema)

    # -- reading ------------------------------------------------------------------
    def read_block(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Block `index` as (x, y) numpy arrays of its own (the mapping is gone when this returns)."""
        block = self.blocks[index]
        if self._reader is None:
            self._reader = open(self.path, "rb")
        start = block.offset - block.offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(self._reader.fileno(), block.offset + block.length - start,  # type: ignore[attr-defined]
                           access=mmap.ACCESS_READ, offset=start)
        try:
            x, y = self._copy_rows(mapped, block.offset - start, block.length)
        finally:
            mapped.close()  # every view into the mapping died with _copy_rows
        return x, y

    def _copy_rows(self, mapped: mmap.mmap, at: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        message = pa.ipc.read_message(pa.py_buffer(mapped).slice(at, length))
        batch = pa.ipc.read_record_batch(message, self.schema)
        x = batch.column(0).values.to_numpy().reshape((batch.num_rows, *self.input_shape)).copy()
        y = batch.column(1)
        y = (y.to_numpy() if self.label_size is None else y.values.to_numpy()).reshape(
            (batch.num_rows, *self._y_shape)).copy()
        return x, y

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows at `indices` (in that order), reading each block they fall in once."""
        indices = np.asarray(indices, np.int64)
        x = np.empty((len(indices), *self.input_shape), np.float32)
        y = np.empty((len(indices), *self._y_shape), np.float32)
        if len(indices) == 0:
            return x, y
        if indices.min() < 0 or indices.max() >= self._written_rows:
            raise IndexError(f"Row indices must lie in [0, {self._written_rows}) (rows written); received "
                             f"[{indices.min()}, {indices.max()}]. Call flush() before reading back new rows.")
        starts = np.array([b.first_row for b in self.blocks])
        owner = np.searchsorted(starts, indices, side="right") - 1
        for block in np.unique(owner):
            bx, by = self.read_block(int(block))
            where = owner == block
            local = indices[where] - self.blocks[block].first_row
            x[where], y[where] = bx[local], by[local]
        return x, y

    def remove(self) -> None:
        """Close the file and delete the spill's directory (idempotent)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except (OSError, pa.ArrowException):
                pass
            self._sink.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()  # type: ignore[attr-defined]
            self._reader = None
        shutil.rmtree(self.directory, ignore_errors=True)
