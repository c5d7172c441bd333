"""The code's shape, checked by the test command: imports point one way, ruff's lint and format, mypy.

Run one by hand: ``python .ci/check_imports.py --graph``, ``ruff check .``, ``ruff format --check .``,
``mypy`` (the configuration is in pyproject.toml).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), cwd=REPO, capture_output=True, text=True)


def test_imports_point_one_way_and_form_no_circle() -> None:
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "check_imports.py")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker is not vacuous: an upward import in a copy of the tree is reported by file and line."""
    tree = tmp_path / "tree"
    for layer in ("calibration", "drivers", "daemon", "sim_bridge", ".ci"):
        shutil.copytree(REPO / layer, tree / layer, ignore=shutil.ignore_patterns("__pycache__"))
    bad = tree / "calibration" / "conventions.py"
    bad.write_text(
        bad.read_text() + "\n\ndef _late() -> None:\n    from daemon.config.settings import load_config  # noqa: F401\n"
    )
    out = subprocess.run([sys.executable, str(tree / ".ci" / "check_imports.py")], capture_output=True, text=True)
    assert out.returncode == 1
    assert "calibration/conventions.py" in out.stdout and "imports daemon.config.settings (upward" in out.stdout


def test_ruff_finds_nothing_to_say() -> None:
    out = _run(str(BIN / "ruff"), "check", "--output-format", "concise", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_code_is_ruff_formatted() -> None:
    out = _run(str(BIN / "ruff"), "format", "--check", ".")
    assert out.returncode == 0, "run `ruff format .`:\n" + out.stdout + out.stderr


def test_mypy_is_clean_on_the_packages() -> None:
    out = _run(str(BIN / "mypy"))
    assert out.returncode == 0, out.stdout + out.stderr
