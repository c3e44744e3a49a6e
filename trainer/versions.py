"""The oldest versions of the libraries this package runs with, checked when ``trainer`` is imported.

pip enforces ``pyproject.toml``'s ranges when it installs the package, but not
when a pyspark comes from ``SPARK_HOME`` rather than pip, nor after an install
with ``--no-deps``, nor for the Spark a session actually runs (``SPARK_HOME``'s
jars, a Spark Connect server). Below a floor, fail at once with the version
needed and why, instead of deep inside a Spark job. The floors are those of
``pyproject.toml`` (a unit test keeps them equal) and of the lowest cell of the
tested matrix (docs/install.md).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from typing import Any

from trainer import backends
from trainer.errors import UnsupportedVersionError

#: distribution -> (oldest version, what needs it). A backend's floor is its room's (``trainer.backends``): the
#: backends are optional, each checked when installed.
FLOORS: dict[str, tuple[str, str]] = {
    "pyspark": ("3.5.0", "every fit and model selection runs one mapInArrow(..., barrier=True) stage, "
                         "which Spark 3.5.0 introduced"),
    "keras": ("3.0.5", "the oldest Keras 3 the tested matrix runs"),
    "numpy": ("1.26.0", "the oldest NumPy the tested matrix runs"),
    **{name: backend.floor for name, backend in backends.BACKENDS.items() if backend.floor},
}


def parse(version: str) -> tuple[int, ...]:
    """'3.5.0' -> (3, 5, 0); '2.16.1rc0' or '4.0.0.dev1' -> the numeric release part."""
    match = re.match(r"(\d+(?:\.\d+)*)", version.strip())
    if not match:
        raise ValueError(f"Expected a version such as 3.5.0. Received: {version!r}.")
    return tuple(int(part) for part in match.group(1).split("."))


def _installed(name: str) -> str | None:
    dists = backends.BACKENDS[name].distributions if name in backends.BACKENDS else (name,)
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    if name == "pyspark":  # a pyspark on sys.path from SPARK_HOME/python has no distribution metadata
        try:
            return importlib.import_module("pyspark.version").__version__
        except ImportError:
            return None
    return None


def too_old(versions: dict[str, str | None]) -> list[str]:
    """One line per library in `versions` (name -> version, None when absent) below its floor."""
    lines = []
    for name, version in versions.items():
        if version is None or name not in FLOORS:
            continue
        floor, why = FLOORS[name]
        if parse(version) < parse(floor):
            lines.append(f"{name} {version} is installed, {name}>={floor} is needed: {why}.")
    return lines


def check_installed() -> None:
    """Raise UnsupportedVersionError when an installed library is older than its floor."""
    problems = too_old({name: _installed(name) for name in FLOORS})
    if problems:
        raise UnsupportedVersionError(
            "spark-keras-trainer cannot run with these versions:\n  " + "\n  ".join(problems)
            + "\nUpgrade them, e.g. pip install 'pyspark>=3.5,<5' 'keras>=3' (docs/install.md lists the tested sets)."
        )


def check_spark(spark: Any) -> None:
    """Raise UnsupportedVersionError when the Spark that `spark` runs on (its JVM, or a Spark Connect
    server) is older than the pyspark floor, e.g. SPARK_HOME pointing at an older Spark installation."""
    version = str(spark.version)
    floor, why = FLOORS["pyspark"]
    if parse(version) < parse(floor):
        raise UnsupportedVersionError(
            f"The Spark session runs Spark {version}; Spark >= {floor} is needed: {why}. Point SPARK_HOME at a "
            f"Spark {floor} or newer installation (or unset it to use the pyspark package's own), or connect to "
            "a newer cluster."
        )
