"""SIGHUP reload planning (daemon/config/reload.py) and memory locking (daemon/system/realtime.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.config.reload import apply_live, flatten, plan_reload, reload_config
from daemon.config.settings import CameraConfig, Config, ConfigError, dump_toml

REPO = Path(__file__).resolve().parents[1]


def test_flatten_includes_camera_tables() -> None:
    cfg = Config()
    cfg.cameras["front"] = CameraConfig(width=320)
    flat = flatten(cfg)
    assert flat["safety.max_step_deg"] == 10.0
    assert flat["cameras.front.width"] == 320
    assert "cameras" not in flat
    assert flatten(Config())["cameras"] == {}


def test_plan_splits_live_and_restart_keys_and_applies_only_live() -> None:
    old = Config()
    new = Config()
    new.safety.max_step_deg = 5.0
    new.recording.task = "pick the cube"
    new.leader.port = "/dev/so101-leader"
    new.control.rate_hz = 50.0
    new.cameras["wrist"] = CameraConfig()
    plan = plan_reload(old, new)
    assert plan.live == ["recording.task", "safety.max_step_deg"]
    assert set(plan.restart_required) == {
        "leader.port",
        "control.rate_hz",
        "cameras",
        *(f"cameras.wrist.{f.name}" for f in dataclasses.fields(CameraConfig)),  # a new camera: all its keys
    }
    applied = apply_live(old, new, plan)
    assert applied.safety.max_step_deg == 5.0 and applied.recording.task == "pick the cube"
    assert applied.leader.port == old.leader.port and applied.control.rate_hz == old.control.rate_hz
    assert applied.cameras == {}
    assert old.safety.max_step_deg == 10.0  # inputs untouched
    s = plan.summary()
    assert "safety.max_step_deg 10.0 -> 5.0" in s and "restart needed for" in s and "leader.port" in s
    assert plan_reload(old, Config()).nothing_changed


def test_reload_from_file_and_bad_file_keeps_old(tmp_path: Path) -> None:
    cur = Config()
    edited = Config()
    edited.safety.leader_stale_s = 0.25
    edited.follower.port = "/dev/ttyACM9"
    f = tmp_path / "so101d.toml"
    f.write_text(dump_toml(edited))
    applied, plan = reload_config(f, cur)
    assert applied.safety.leader_stale_s == 0.25
    assert applied.follower.port == cur.follower.port
    assert plan.restart_required == ["follower.port"]
    f.write_text("[safety]\nmax_step_deg = -3\n")
    with pytest.raises(ConfigError, match="safety.max_step_deg"):
        reload_config(f, cur)


_LOCK_SCRIPT = """
import logging, resource, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))
from daemon.system.realtime import lock_memory
r = lock_memory()
print("LOCKED" if r.locked else "UNLOCKED")
"""


def test_lock_memory_failure_is_a_warning_not_a_crash() -> None:
    # No CAP_IPC_LOCK (bounding set dropped) and a 64 KiB limit: mlockall must fail, cleanly.
    import shutil

    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) not installed: cannot drop CAP_IPC_LOCK for the test")
    r = subprocess.run(
        [
            "setpriv",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--",
            sys.executable,
            "-c",
            _LOCK_SCRIPT,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    if r.returncode != 0 and "setpriv" in r.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert "UNLOCKED" in r.stdout
    assert "LimitMEMLOCK=infinity" in r.stdout and "running with unlocked memory" in r.stdout


def _has_cap_ipc_lock() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 14))
    return False


def test_lock_memory_succeeds_when_allowed() -> None:
    if not _has_cap_ipc_lock():
        pytest.skip("no CAP_IPC_LOCK here and the memlock limit cannot be raised")
    script = _LOCK_SCRIPT.replace("resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))", "")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "LOCKED"
