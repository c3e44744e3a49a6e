"""The out-of-core path without Spark: the spill file, the streamed feed, the choice of path, bounded RSS.

The feed tests run real TensorFlow; the RSS test runs in a fresh Python
process so that nothing else of the test session counts in its peak.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
import pytest

from trainer.runtime.memory import peak_rss_bytes, reset_peak_rss
from trainer.runtime.feeding.shard import MemoryShard, SpilledShard, receive_shard, shard_budget
from trainer.runtime.feeding.spill import Spill, spill_directory
from trainer.runtime.feeding.stream import StreamFeed

REPO = Path(__file__).resolve().parents[1]


def spark_batches(rows: int, width: int, per_batch: int, label_size: int | None = None) -> list[pa.RecordBatch]:
    """Record batches as Spark sends them: ``features`` list<float>, ``label`` float or list<float>.
    Row i has features[0] = i and label i (or [i, -i])."""
    out = []
    for start in range(0, rows, per_batch):
        ids = np.arange(start, min(rows, start + per_batch), dtype=np.float32)
        x = np.repeat(ids[:, None], width, axis=1)
        x[:, 1:] = 0.5
        features = pa.ListArray.from_arrays(pa.array(np.arange(0, x.size + 1, width, dtype=np.int32)),
                                            pa.array(x.reshape(-1)))
        if label_size is None:
            label = pa.array(ids)
        else:
            y = np.stack([ids, -ids], axis=1)
            label = pa.ListArray.from_arrays(pa.array(np.arange(0, y.size + 1, 2, dtype=np.int32)),
                                             pa.array(y.reshape(-1)))
        out.append(pa.record_batch([features, label], names=["features", "label"]))
    return out


def spilled(rows: int, width: int = 6, block_bytes: int = 200, tmp: Path | None = None, **kwargs) -> Spill:
    spill = Spill((width,), None, str(tmp) if tmp else None, block_bytes=block_bytes)
    for batch in spark_batches(rows, width, per_batch=37, **kwargs):
        spill.append(batch)
    spill.flush()
    return spill


def pass_ids(feed: StreamFeed, batch_size: int, pass_index: int | None = None) -> list[list[int]]:
    batches = []
    for bx, by in feed.batches(batch_size, pass_index):
        np.testing.assert_array_equal(bx[:, 0], by)  # y follows x
        batches.append([int(v) for v in by])
    return batches


def test_spill_round_trips_rows_in_blocks_of_a_standard_arrow_file(tmp_path):
    spill = spilled(100, tmp=tmp_path)
    assert spill.rows == 100 and len(spill.blocks) > 3  # 200-byte blocks of 7 rows
    assert os.path.dirname(spill.directory) == str(tmp_path)
    rows = np.concatenate([spill.read_block(i)[1] for i in range(len(spill.blocks))])
    np.testing.assert_array_equal(rows, np.arange(100))
    x, _ = spill.read_block(2)
    assert x.shape[1:] == (6,) and np.all(x[:, 1:] == 0.5)
    spill.close_writer()
    table = pa.ipc.open_file(spill.path).read_all()  # any Arrow reader reads it
    assert table.num_rows == 100 and table.schema.field("x").type == pa.list_(pa.float32(), 6)
    spill.remove()
    assert not os.path.exists(spill.directory)


def test_spill_keeps_vector_labels_and_takes_rows_in_order(tmp_path):
    spill = Spill((2, 3), 2, str(tmp_path), block_bytes=128)
    for batch in spark_batches(50, 6, per_batch=9, label_size=2):
        spill.append(batch)
    spill.flush()
    x, y = spill.take(np.array([49, 0, 17, 17, 3]))
    assert x.shape == (5, 2, 3) and y.shape == (5, 2)
    np.testing.assert_array_equal(y[:, 0], [49, 0, 17, 17, 3])
    np.testing.assert_array_equal(y[:, 1], [-49, 0, -17, -17, -3])
    with pytest.raises(IndexError, match=r"\[0, 50\)"):
        spill.take(np.array([50]))
    spill.remove()


def test_spill_refuses_rows_that_do_not_match_the_shape(tmp_path):
    spill = Spill((5,), None, str(tmp_path))
    with pytest.raises(ValueError, match="expected 5 per row"):
        spill.append(spark_batches(3, 6, per_batch=3)[0])
    spill.remove()


def test_spill_directory_is_the_executor_s_local_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path / 'missing'},{tmp_path}")
    assert spill_directory() == str(tmp_path)
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    assert os.path.isdir(spill_directory())


def test_out_of_core_stream_gives_every_row_once_per_pass_with_a_seeded_shuffle(tmp_path):
    spill = spilled(1000, tmp=tmp_path)
    feed = StreamFeed(spill, seed=5, buffer_bytes=2000)  # a buffer of 71 rows, far less than the shard
    first, second = pass_ids(feed, 32), pass_ids(feed, 32)
    for ids in (first, second):
        assert [len(b) for b in ids] == [32] * 31 + [8]
        assert sorted(sum(ids, [])) == list(range(1000))
    assert first != second  # each pass is a new order
    assert pass_ids(StreamFeed(spill, seed=5, buffer_bytes=2000), 32) == first  # the same seed, the same passes
    assert pass_ids(StreamFeed(spill, seed=6, buffer_bytes=2000), 32) != first
    # Rows far apart in the file share minibatches: the order is not the file's.
    spread = np.mean([np.ptp(b) for b in first[:-1]])
    assert spread > 500, spread
    spill.remove()


def test_out_of_core_padding_appends_repeats_of_the_shard_s_rows(tmp_path):
    shard = receive_shard(iter(spark_batches(100, 6, per_batch=30)), (6,), None, feed="stream",
                          directory=str(tmp_path))
    assert isinstance(shard, SpilledShard) and shard.rows == 100
    shard.pad_to(103, seed=1)
    assert (shard.rows, shard.padded_rows) == (100, 103)
    ids = sum(pass_ids(shard.feed(seed=0), 10), [])
    assert len(ids) == 103 and set(ids) == set(range(100))  # three repeats
    memory = receive_shard(iter(spark_batches(100, 6, per_batch=30)), (6,), None, feed="memory")
    memory.pad_to(103, seed=1)
    assert memory.padded_rows == 103
    np.testing.assert_array_equal(sorted(ids), sorted(memory.y.astype(int)))  # the same repeats on both paths
    directory = shard.spill.directory
    shard.close()
    assert not os.path.exists(directory)


def test_auto_streams_only_shards_over_the_budget(tmp_path):
    batches = spark_batches(100, 6, per_batch=30)
    size = sum(b.nbytes for b in batches)
    small = receive_shard(iter(batches), (6,), None, budget=size, directory=str(tmp_path))
    assert isinstance(small, MemoryShard) and small.rows == 100 and not os.listdir(tmp_path)
    large = receive_shard(iter(batches), (6,), None, budget=size - 1, directory=str(tmp_path))
    assert isinstance(large, SpilledShard) and large.rows == 100
    assert large.info() == {"feed": "stream", "shard_bytes": size, "spill_bytes": large.spill.nbytes}
    assert isinstance(receive_shard(iter(batches), (6,), None, feed="memory", budget=1), MemoryShard)
    with pytest.raises(ValueError, match="feed must be one of auto, memory, stream. Received: feed='disk'"):
        receive_shard(iter(batches), (6,), None, feed="disk")
    large.close()


def test_shard_budget_follows_the_executor_s_memory(monkeypatch):
    monkeypatch.delenv("PYSPARK_EXECUTOR_MEMORY_MB", raising=False)
    assert shard_budget(explicit=123) == 123
    assert shard_budget(task_memory=4 << 30) == 1 << 30
    monkeypatch.setenv("PYSPARK_EXECUTOR_MEMORY_MB", "2048")  # spark.executor.pyspark.memory, per task
    assert shard_budget(task_memory=4 << 30) == 512 << 20


def test_out_of_core_tf_dataset_stays_on_one_thread_and_knows_its_length(tmp_path):
    spill = spilled(300, tmp=tmp_path)
    dataset = StreamFeed(spill, seed=1, buffer_bytes=1000).fit_kwargs(32)["x"]
    assert int(dataset.cardinality()) == 10
    options = dataset.options()
    assert options.threading.private_threadpool_size == 1 and options.autotune.enabled is False
    passes = [[int(v) for _, by in dataset for v in by.numpy()] for _ in range(2)]
    assert sorted(passes[0]) == sorted(passes[1]) == list(range(300)) and passes[0] != passes[1]
    spill.remove()


def test_out_of_core_keras_fit_learns_from_the_stream(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)).astype(np.float32)
    spill = Spill((4,), None, str(tmp_path), block_bytes=400)
    spill.append_arrays(x, y)
    spill.close_writer()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    history = model.fit(**StreamFeed(spill, seed=0, buffer_bytes=2000).fit_kwargs(32), epochs=20, verbose=0)
    assert history.history["loss"][-1] < 0.05 * history.history["loss"][0]
    spill.remove()


def test_peak_rss_can_be_reset():
    # Reset first: earlier tests in this process may have left a high-water mark far above today's RSS.
    if not reset_peak_rss():
        pytest.skip("this kernel does not let a process reset its peak RSS")
    before = peak_rss_bytes()
    # 64 MB of fresh pages, touched: mapped here, since malloc may hand back freed memory that is still resident.
    block = mmap.mmap(-1, 64 << 20)
    np.frombuffer(block, np.uint8)[:] = 1
    assert peak_rss_bytes() >= before + (60 << 20)
    block.close()
    assert reset_peak_rss()
    assert peak_rss_bytes() < before + (30 << 20)


RSS_PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from trainer.runtime.feeding.arrow import arrow_to_numpy
    from trainer.runtime.memory import peak_rss_bytes, reset_peak_rss, rss_bytes
    from trainer.runtime.feeding.spill import Spill
    from trainer.runtime.feeding.stream import StreamFeed

    mode, directory = sys.argv[1], sys.argv[2]
    width, rows, per_batch = 784, 100_000, 2_000  # 314 MB of float32 samples

    def batches():
        import pyarrow as pa
        rng = np.random.default_rng(0)
        for start in range(0, rows, per_batch):
            x = rng.random((per_batch, width), dtype=np.float32)
            offsets = pa.array(np.arange(0, x.size + 1, width, dtype=np.int32))
            yield pa.record_batch([pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1))),
                                   pa.array(np.arange(start, start + per_batch, dtype=np.float32))],
                                  names=["features", "label"])

    reset_peak_rss()
    base = rss_bytes()
    seen = 0
    if mode == "stream":
        spill = Spill((width,), None, directory)
        for batch in batches():
            spill.append(batch)
        spill.close_writer()
        for _ in range(2):
            for x, y in StreamFeed(spill, seed=0).batches(32):
                seen += len(y)
        spill.remove()
    else:
        x, y = arrow_to_numpy(batches(), (width,), None)
        seen = 2 * len(y)
    print(json.dumps({"growth": peak_rss_bytes() - base, "seen": seen, "bytes": rows * width * 4}))
""")


@pytest.mark.parametrize("mode", ["stream", "memory"])
def test_out_of_core_rss_stays_bounded_while_in_memory_grows_with_the_shard(tmp_path, mode):
    """Two passes over a 314 MB shard: streamed, the process's peak RSS grows by a few buffers; in
    memory (the control that shows the measure works) by at least the shard."""
    done = subprocess.run([sys.executable, "-c", RSS_PROBE, mode, str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert result["seen"] == 200_000
    if mode == "stream":
        assert result["growth"] < 160 << 20, result  # buffers of 32 MB: ~3 held at once, plus a block
        assert not os.listdir(tmp_path)
    else:
        assert result["growth"] > result["bytes"], result
