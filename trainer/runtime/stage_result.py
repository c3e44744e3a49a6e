"""What every barrier stage of the driver returns, fits and searches alike: one row per task, its record as JSON.

A task of any kind (the parameter-server worker, the collective task, a
model-selection task) ends by yielding `result_batch(worker, record)`; the
driver's controller (``trainer.controller``) runs the stage with `RESULT_DDL`
and reads the records back with `read_records`.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import pyarrow as pa

RESULT_SCHEMA = pa.schema([("worker", pa.int32()), ("record", pa.string())])
RESULT_DDL = "worker int, record string"


def result_batch(worker: int, record: dict[str, Any]) -> pa.RecordBatch:
    """The one row a task yields: its index and its record (JSON)."""
    return pa.RecordBatch.from_pydict({"worker": [worker], "record": [json.dumps(record)]}, schema=RESULT_SCHEMA)


def read_records(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """The tasks' records from the stage's collected rows."""
    return [json.loads(row.record) for row in rows]
