"""Arrow record batches (the two-column layout of ``trainer.data.checks``) to numpy arrays.

`split_shard` also takes apart a shard whose rows carry the validation flag of
``trainer.data.validation`` (model-selection tasks); `ValidationRows` does the same
batch by batch for the training task, whose training rows may stream to a spill file.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trainer.data.columns import FEATURES, LABEL, VALIDATION_FLAG

Arrays = tuple[np.ndarray, np.ndarray | None]


def arrow_to_numpy(
    batches: Iterator[pa.RecordBatch], input_shape: tuple[int, ...], label_size: int | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Concatenate Arrow batches into (x, y) numpy arrays without per-row Python objects.

    `y` is None when the batches have no label column.
    """
    batches = list(batches)
    if not batches or sum(b.num_rows for b in batches) == 0:
        return np.zeros((0, *input_shape), np.float32), np.zeros((0,), np.float32)
    table = pa.Table.from_batches(batches)
    x = _flat_values(table.column(FEATURES)).reshape((table.num_rows, *input_shape))
    y = None
    if LABEL in table.column_names:
        labels = table.column(LABEL)
        if label_size is None:
            y = labels.combine_chunks().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        else:
            y = _flat_values(labels).reshape((table.num_rows, label_size))
    return x, y


def split_shard(batches: Iterator[pa.RecordBatch], input_shape: tuple[int, ...],
                label_size: int | None) -> tuple[Arrays, Arrays]:
    """((x, y) training rows, (x, y) validation rows) of a shard; without the flag column every
    row is a training row."""
    batches = [b for b in batches if b.num_rows]
    if not batches or VALIDATION_FLAG not in batches[0].schema.names:
        empty = arrow_to_numpy(iter(()), input_shape, label_size)
        return arrow_to_numpy(iter(batches), input_shape, label_size), empty
    table = pa.Table.from_batches(batches)
    flag = table.column(VALIDATION_FLAG)
    train = table.filter(pc.invert(flag)).drop_columns([VALIDATION_FLAG])
    val = table.filter(flag).drop_columns([VALIDATION_FLAG])
    return (arrow_to_numpy(iter(train.to_batches()), input_shape, label_size),
            arrow_to_numpy(iter(val.to_batches()), input_shape, label_size))


class ValidationRows:
    """Passes the training rows of a stream of record batches on, batch by batch, and keeps the
    validation rows (the flag column set) aside: the validation set is held in memory (it is the
    small part), the training rows can go to a spill file (``trainer.runtime.feeding.shard``)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._kept: list[pa.RecordBatch] = []

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self._batches:
            if VALIDATION_FLAG not in batch.schema.names:
                yield batch
                continue
            flag = batch.column(VALIDATION_FLAG)
            keep = [i for i, name in enumerate(batch.schema.names) if name != VALIDATION_FLAG]
            names = [batch.schema.names[i] for i in keep]
            for mask, into_validation in ((pc.invert(flag), False), (flag, True)):
                part = batch.filter(mask)
                if part.num_rows:
                    part = pa.RecordBatch.from_arrays([part.column(i) for i in keep], names=names)
                    if into_validation:
                        self._kept.append(part)
                    else:
                        yield part

    def arrays(self, input_shape: tuple[int, ...], label_size: int | None) -> Arrays:
        """(x, y) of the validation rows seen so far (empty arrays when there were none)."""
        return arrow_to_numpy(iter(self._kept), input_shape, label_size)


def _flat_values(column: pa.ChunkedArray) -> np.ndarray:
    return column.combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)


def pad_shard(x: np.ndarray, y: np.ndarray, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Repeat random rows so that every worker has the same number of batches per epoch.

    Synchronous algorithms need every worker to reach each exchange; Spark's
    round-robin repartition leaves shards that differ by a few rows.
    """
    missing = size - len(x)
    if missing <= 0:
        return x, y
    idx = np.random.default_rng(seed).integers(0, len(x), size=missing)
    return np.concatenate([x, x[idx]]), np.concatenate([y, y[idx]])
