"""The suite's own setup as a newcomer meets it: a test file added without a kind stops the run,
and the run must say why (the file's name and where to give it a kind), not end in a bare
"no tests ran" with exit status 4.

A copy of tests/conftest.py and the support module it imports, beside one new test file, in a
temporary folder; pytest runs there in a child process, as `make test-unit` runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def test_a_file_without_a_kind_is_named_when_the_run_stops(tmp_path: Path) -> None:
    suite = tmp_path / "tests"
    suite.mkdir()
    for name in ("conftest.py", "virtual_bench_support.py"):
        shutil.copy(TESTS / name, suite / name)
    (suite / "test_brand_new_thing.py").write_text("def test_it():\n    assert True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(suite)])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "unit", "-o", "addopts=", str(suite)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    said = run.stdout + run.stderr
    assert run.returncode == 4, said
    assert "test_brand_new_thing.py" in said and "FILE_KINDS" in said, said
