#!/usr/bin/env python3
"""Install the project's pinned dependencies from pyproject.toml, without the project.

The image installs dependencies before it copies the `trainer` source, so that
editing the source does not re-download 2 GB of wheels. pyproject.toml stays
the one place where versions are pinned; this script only reads it.

The GPU variant swaps `tensorflow-cpu` for the `gpu` extra
(`tensorflow[and-cuda]`): both wheels ship the same `tensorflow` package and
must never be installed together.

Example:
    python install-deps.py --pyproject pyproject.toml --extras lab,data --variant cpu
"""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys
import tomllib
from pathlib import Path

log = logging.getLogger("install-deps")

VARIANTS = ("cpu", "gpu")
# Requirements the GPU variant drops in favour of the `gpu` extra.
CPU_ONLY = {"tensorflow-cpu"}


def requirement_name(requirement: str) -> str:
    """Return the normalized distribution name of a PEP 508 requirement."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"Cannot parse requirement {requirement!r} in pyproject.toml.")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def resolve(pyproject: Path, extras: list[str], variant: str) -> list[str]:
    """List the requirements to install for `extras` and `variant`."""
    if variant not in VARIANTS:
        raise ValueError(f"Expected variant to be one of {', '.join(VARIANTS)}. Received: variant={variant!r}.")
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    wanted = list(extras) + (["gpu"] if variant == "gpu" else [])
    unknown = [e for e in wanted if e not in optional]
    if unknown:
        raise ValueError(
            f"Unknown extra(s) {unknown} in {pyproject}. Expected some of: {', '.join(sorted(optional))}."
        )
    requirements = list(project.get("dependencies", []))
    if variant == "gpu":
        requirements = [r for r in requirements if requirement_name(r) not in CPU_ONLY]
    for extra in wanted:
        requirements.extend(optional[extra])
    # Keep the first occurrence of each requirement string, in order.
    return list(dict.fromkeys(requirements))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, required=True, help="path to the project's pyproject.toml")
    parser.add_argument("--extras", default="", help="comma-separated extras to add, e.g. lab,data")
    parser.add_argument("--variant", choices=VARIANTS, default="cpu", help="cpu: tensorflow-cpu; gpu: the gpu extra")
    parser.add_argument("--dry-run", action="store_true", help="print the requirements, install nothing")
    args = parser.parse_args(argv)

    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    requirements = resolve(args.pyproject, extras, args.variant)
    log.info("variant=%s extras=%s: %d requirements", args.variant, extras, len(requirements))
    if args.dry_run:
        print("\n".join(requirements))
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "--no-cache-dir", *requirements]
    log.info("running: %s", " ".join(cmd))
    return subprocess.call(cmd)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sys.exit(main())
