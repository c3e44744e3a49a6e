#!/usr/bin/env python3
"""Install the project's dependencies, pinned by constraints.txt, without the project itself.

The image installs dependencies before it copies the `trainer` source, so that
editing the source does not re-download 2 GB of wheels. pyproject.toml declares
the ranges and extras; constraints.txt holds the exact pins (`make lock`), the
same file the Makefile and CI install with. This script only reads them.

TensorFlow is an extra: the cpu variant adds `tf` (tensorflow-cpu), the gpu
variant `tf-gpu` (tensorflow[and-cuda]); never both, since the two wheels ship
the same `tensorflow` package.

Example:
    python install-deps.py --pyproject pyproject.toml --constraints constraints.txt --extras lab,data --variant cpu
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tomllib
from pathlib import Path

log = logging.getLogger("install-deps")

#: variant -> the extra that brings TensorFlow.
VARIANTS = {"cpu": "tf", "gpu": "tf-gpu"}


def resolve(pyproject: Path, extras: list[str], variant: str) -> list[str]:
    """List the requirements (ranges) to install for `extras` and `variant`."""
    if variant not in VARIANTS:
        raise ValueError(f"Expected variant to be one of {', '.join(VARIANTS)}. Received: variant={variant!r}.")
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    wanted = [VARIANTS[variant], *(e for e in extras if e not in VARIANTS.values())]
    unknown = [e for e in wanted if e not in optional]
    if unknown:
        raise ValueError(
            f"Unknown extra(s) {unknown} in {pyproject}. Expected some of: {', '.join(sorted(optional))}."
        )
    requirements = list(project.get("dependencies", []))
    for extra in wanted:
        requirements.extend(optional[extra])
    # Keep the first occurrence of each requirement string, in order.
    return list(dict.fromkeys(requirements))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, required=True, help="path to the project's pyproject.toml")
    parser.add_argument("--constraints", type=Path, required=True, help="path to the project's constraints.txt")
    parser.add_argument("--extras", default="", help="comma-separated extras to add, e.g. lab,data")
    parser.add_argument("--variant", choices=list(VARIANTS), default="cpu",
                        help="cpu: the tf extra (tensorflow-cpu); gpu: the tf-gpu extra (tensorflow[and-cuda])")
    parser.add_argument("--dry-run", action="store_true", help="print the requirements, install nothing")
    args = parser.parse_args(argv)

    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    requirements = resolve(args.pyproject, extras, args.variant)
    log.info("variant=%s extras=%s: %d requirements", args.variant, extras, len(requirements))
    if args.dry_run:
        print("\n".join(requirements))
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "-c", str(args.constraints), *requirements]
    log.info("running: %s", " ".join(cmd))
    return subprocess.call(cmd)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sys.exit(main())
