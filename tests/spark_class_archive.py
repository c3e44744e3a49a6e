"""The workload behind the tests' class-data-sharing archive of a Spark driver JVM (`make test`'s TEST_JVM_ARCHIVE).

`make test` runs this once per venv in a driver JVM started with `-XX:ArchiveClassesAtExit`: Java 17 then writes
every class the JVM loaded (Spark's, Scala's, Arrow's, Py4J's) into an archive that each later JVM of the tests
(drivers, the embedded clusters' daemons and executors: the same class path) maps instead of loading and verifying
those classes again (a driver's start-up here: about 3 CPU seconds instead of 6-7). The workload does what a fit
does on the JVM side, in local mode so that the task-side classes (barrier tasks, the Arrow Python runner) load in
the same JVM: a pandas DataFrame in, a repartition, a barrier mapInArrow, a Parquet round trip, an aggregate, a
random split and collects. A class it misses is loaded as usual.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession, functions as F


def _double(batches):
    for batch in batches:
        frame = batch.to_pandas()
        frame["y"] = frame["x"] * 2
        yield pa.RecordBatch.from_pandas(frame, preserve_index=False)


def main() -> int:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]").appName("class-archive")
        .config("spark.ui.enabled", "false").config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    try:
        frame = spark.createDataFrame(pd.DataFrame({"x": range(1000), "label": [i % 3 for i in range(1000)]}))
        frame = frame.withColumn("x", F.col("x").cast("double")).repartition(2)
        doubled = frame.mapInArrow(_double, "x double, label long, y double", barrier=True)
        with tempfile.TemporaryDirectory() as tmp:
            doubled.write.parquet(str(Path(tmp) / "frame"))
            back = spark.read.parquet(str(Path(tmp) / "frame")).cache()
            back.groupBy("label").agg(F.sum("y"), F.count("*")).collect()
            train, _ = back.randomSplit([0.8, 0.2], seed=1)
            train.coalesce(1).toArrow()
            back.rdd.barrier().mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()
    finally:
        jvm = spark.sparkContext._gateway.proc
        spark.stop()
    # The JVM writes the archive as it exits, which it does once its stdin closes: wait for it, so that make's
    # next step finds the whole file.
    jvm.stdin.close()
    return 0 if jvm.wait(timeout=300) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
