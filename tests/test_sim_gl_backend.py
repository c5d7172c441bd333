"""`MUJOCO_GL=osmesa so101d sim-follower` on a machine without libOSMesa: one line that says what
is missing and how to get it, not a 33-line traceback ending in an AttributeError."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import free_port

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(ctypes.util.find_library("OSMesa") is not None, reason="this machine has libOSMesa")
def test_osmesa_backend_without_its_library_is_one_clear_error() -> None:
    env = dict(os.environ, MUJOCO_GL="osmesa", PYTHONPATH=str(REPO))
    env.pop("PYOPENGL_PLATFORM", None)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "sim-follower",
            "--backend",
            "mujoco",
            "--bind",
            f"tcp://127.0.0.1:{free_port()}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "MUJOCO_GL=osmesa" in lines[0] and "OSMesa" in lines[0] and "apt install libosmesa6" in lines[0]
    assert "MUJOCO_GL=egl" in lines[0]  # the way out that needs no install


def test_the_default_backend_still_serves(tmp_path: Path) -> None:
    """Without MUJOCO_GL the follower renders with EGL as before (the check must not get in the way)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MUJOCO_GL", None)
    code = (
        "from sim_bridge.mujoco_follower import MujocoFollower, MujocoFollowerConfig\n"
        f"sim = MujocoFollower(MujocoFollowerConfig(bind='tcp://127.0.0.1:{free_port()}', seed=0))\n"
        "sim.open()\nframes = sim.render()\nsim.close_renderer()\n"
        "print(sorted((k, v.shape) for k, v in frames.items()))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "('front', (240, 320, 3))" in r.stdout and "('wrist', (240, 320, 3))" in r.stdout
