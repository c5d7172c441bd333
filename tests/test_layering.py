"""The code's shape: imports point one way (calibration < drivers < daemon < sim_bridge), no circle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_imports_point_one_way_and_form_no_circle() -> None:
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "check_imports.py")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker is not vacuous: an upward import in a copy of the tree is reported by file and line."""
    import shutil

    tree = tmp_path / "tree"
    for layer in ("calibration", "drivers", "daemon", "sim_bridge", ".ci"):
        shutil.copytree(REPO / layer, tree / layer, ignore=shutil.ignore_patterns("__pycache__"))
    bad = tree / "calibration" / "conventions.py"
    bad.write_text(
        bad.read_text() + "\n\ndef _late() -> None:\n    from daemon.config import load_config  # noqa: F401\n"
    )
    out = subprocess.run([sys.executable, str(tree / ".ci" / "check_imports.py")], capture_output=True, text=True)
    assert out.returncode == 1
    assert "calibration/conventions.py" in out.stdout and "imports daemon.config (upward" in out.stdout
