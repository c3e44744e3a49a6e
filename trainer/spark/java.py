"""Finding the Spark installation and a Java runtime it can use.

The pyspark wheel is the Spark distribution (jars + ``bin/spark-class``);
Spark 4 needs Java 17 or newer. Every failure says what was expected, what was
found and how to fix it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from trainer.errors import ClusterError, JavaError

MIN_JAVA = 17
_JAVA_FIX = (
    "install Java 17 or newer (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) "
    "and put it on PATH, or set JAVA_HOME to its home directory"
)


def find_spark_home() -> str:
    """SPARK_HOME of the installed pyspark wheel (or $SPARK_HOME if it has bin/spark-class)."""
    from pyspark.find_spark_home import _find_spark_home

    home = _find_spark_home()
    if not os.path.isfile(os.path.join(home, "bin", "spark-class")):
        raise ClusterError(
            f"expected bin/spark-class under SPARK_HOME, but {home!r} has none; unset SPARK_HOME "
            f"or reinstall pyspark (pip install pyspark)"
        )
    return home


def parse_memory_mb(text: str) -> int:
    """Parse a Spark memory string ('512m', '2g', '1t', '2048mb') into MiB."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt])b?\s*", str(text), flags=re.IGNORECASE)
    if not m:
        raise ValueError(
            f"expected a memory size like '512m' or '2g' (a number with unit k/m/g/t), got {text!r}"
        )
    value, unit = int(m.group(1)), m.group(2).lower()
    factor = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[unit]
    return int(value * factor)


def _java_binary(env: dict[str, str]) -> str:
    java_home = env.get("JAVA_HOME")
    if java_home:
        java = os.path.join(java_home, "bin", "java")
        if not os.access(java, os.X_OK):
            raise JavaError(
                f"expected a Java runtime at $JAVA_HOME/bin/java, but JAVA_HOME={java_home!r} has "
                f"no executable bin/java; unset JAVA_HOME or {_JAVA_FIX}"
            )
        return java
    java = shutil.which("java", path=env.get("PATH", os.defpath))
    if not java:
        raise JavaError(f"expected a 'java' executable on PATH (Java {MIN_JAVA}+), found none; {_JAVA_FIX}")
    return java


def check_java(env: dict[str, str] | None = None) -> tuple[str, int]:
    """Return (java executable, major version); raise JavaError if missing or older than 17."""
    env = dict(os.environ) if env is None else env
    java = _java_binary(env)
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaError(f"expected '{java} -version' to run, it failed: {exc}; {_JAVA_FIX}") from exc
    text = (out.stderr or "") + (out.stdout or "")
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if out.returncode != 0 or not m:
        raise JavaError(
            f"expected '{java} -version' to print a Java version, got exit code {out.returncode} "
            f"and output {text.strip()[:500]!r}; {_JAVA_FIX}"
        )
    major = int(m.group(1))
    if major == 1 and m.group(2):  # "1.8.0_392" -> 8
        major = int(m.group(2))
    if major < MIN_JAVA:
        raise JavaError(
            f"expected Java {MIN_JAVA} or newer for Spark 4, but {java} is Java {major}; {_JAVA_FIX}"
        )
    return java, major

