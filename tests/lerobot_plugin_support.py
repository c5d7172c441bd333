"""What the tests of LeRobot's own tools driving the daemon share: the environment LeRobot's
console scripts run in, the check that the so101d plugin is installed, and `so101d run` on a
virtual bench in its own process group (so a test can kill it whole, as a power cut does).
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import wait_status
from virtual_bench_support import VirtualBench

BIN = Path(sys.executable).parent  # where LeRobot's console scripts (lerobot-record, ...) are installed
CAM_W, CAM_H = 64, 48
PLUGIN_DIST = "lerobot_robot_so101d"


def lerobot_env() -> dict[str, str]:
    """This interpreter's import path for the child, and no Hub access (the tests are offline)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "HF_HUB_OFFLINE": "1"}


def require_plugin() -> None:
    """LeRobot finds the plugin by its distribution name; without it every tool would fail later
    with a less useful error."""
    try:
        importlib.metadata.distribution(PLUGIN_DIST)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("the so101d LeRobot plugin is not installed: run `make setup` (it installs lerobot_plugin/)")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole process group, SIGKILL if it does not end within a minute."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def start_daemon(
    bench: VirtualBench, safety_toml: str = "", *, align_deg_s: float = 180.0, rate_hz: float = 100.0
) -> subprocess.Popen[bytes]:
    """`so101d run` on the bench with one small virtual camera, in teleop when this returns.
    ``safety_toml``: more [safety] keys; ``align_deg_s``: the alignment speed (joints and gripper)."""
    cfg = bench.write_config(
        f"[safety]\nalign_speed_deg_s = {align_deg_s}\nalign_gripper_speed_pct_s = {align_deg_s}\n"
        f"{safety_toml}"
        f'[cameras.front]\nkind = "virtual"\nwidth = {CAM_W}\nheight = {CAM_H}\nfps = 30\n',
        rate_hz=rate_hz,
    )
    with open(bench.root / "daemon.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", "run", "--config", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=lerobot_env(),
            start_new_session=True,  # its own process group: killed whole, as by a power cut
        )
    try:
        wait_status(bench.socket_path, lambda st: st["mode"] == "teleop", timeout_s=60, proc=proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc
