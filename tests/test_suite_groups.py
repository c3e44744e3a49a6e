"""make test's main run shares its two session clusters through pytest-xdist's groups (``--dist loadgroup``,
conftest's `xdist_group`): the installed pytest and pytest-xdist must honour a group that a conftest gives in
``pytest_collection_modifyitems``. Under pytest 9.2 with pytest-xdist 3.8 they did not, silently
(pytest-dev/pytest-xdist#1386): each xdist worker started both session clusters and ran every doc example, and
the main run took minutes more. No Spark: a throwaway project of two files, one group, two workers."""

from __future__ import annotations

import re
import subprocess
import sys

CONFTEST = '''
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group("shared"))
'''
TESTS = "import pytest\n\n@pytest.mark.parametrize('i', range(4))\ndef test_one(i):\n    pass\n"


def test_a_conftest_group_keeps_its_tests_on_one_xdist_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(TESTS)
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                           "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+)", done.stdout)
    assert len(ran) == 8, done.stdout[-3000:]
    assert all(nodeid.endswith("@shared") for _, nodeid in ran), (
        f"pytest-xdist did not group the tests (no @group in their ids): {ran}; see this module's docstring")
    assert len({worker for worker, _ in ran}) == 1, f"one group runs on one worker: {ran}"
