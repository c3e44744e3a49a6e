"""The single-threaded input pipeline the workers give to ``model.fit`` (real TensorFlow)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from trainer.runtime.feeding.feed import ShardFeed


def _rows(x: np.ndarray, y: np.ndarray, batch_size: int, **kwargs) -> list[list[int]]:
    """Each pass's batches as the row ids carried in column 0 of x, checking that y follows x."""
    feed = ShardFeed(x, y, **kwargs)
    dataset = feed.fit_kwargs(batch_size)["x"]
    passes = []
    for _ in range(2):
        batches = [(bx.numpy(), by.numpy()) for bx, by in dataset]
        for bx, by in batches:
            np.testing.assert_array_equal(bx[:, 0] * 10, by)
        passes.append([[int(v) for v in bx[:, 0]] for bx, _ in batches])
    return passes


@pytest.fixture
def shard():
    x = np.stack([np.arange(10, dtype=np.float32), np.ones(10, np.float32)], axis=1)
    return x, x[:, 0] * 10


def test_each_pass_is_a_new_shuffle_of_every_row(shard):
    first, second = _rows(*shard, batch_size=4, seed=3)
    assert [len(b) for b in first] == [len(b) for b in second] == [4, 4, 2]
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(10))
    assert first != second


def test_the_same_seed_gives_the_same_batches(shard):
    assert _rows(*shard, batch_size=4, seed=7) == _rows(*shard, batch_size=4, seed=7)


def test_an_order_is_kept_exactly(shard):
    x, y = shard
    order = np.array([9, 0, 8, 1, 7, 2, 6, 3, 5, 4])
    batches = [bx.numpy()[:, 0].astype(int).tolist() for bx, _ in ShardFeed(x, y).fit_kwargs(3, order)["x"]]
    assert batches == [[9, 0, 8], [1, 7, 2], [6, 3, 5], [4]]


def test_the_pipeline_stays_on_one_thread(shard):
    options = ShardFeed(*shard).fit_kwargs(4)["x"].options()
    assert options.threading.private_threadpool_size == 1
    assert options.threading.max_intra_op_parallelism == 1
    assert options.autotune.enabled is False


def test_mismatched_lengths_are_refused(shard):
    x, y = shard
    with pytest.raises(ValueError, match="x has 10 rows and y has 9"):
        ShardFeed(x, y[:9])


def test_keras_fit_learns_from_the_feed():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    feed = ShardFeed(x, y, seed=0)
    history = model.fit(**feed.fit_kwargs(32), epochs=20, verbose=0)
    assert history.history["loss"][-1] < 0.05 * history.history["loss"][0]
