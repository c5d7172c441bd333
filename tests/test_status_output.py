"""`so101d status` read by something other than a screen: a pipe, a file, `timeout`, `head`.

- `status --watch` into a pipe prints one line per refresh as it comes (flushed), `--json` one
  JSON object per refresh; `| head -n 3` gets three and the watcher exits quietly.
- Output that is not a terminal is never cut to 80 columns: a long error is given whole.

A real daemon in-process on emulated arms; the leader's USB link is then pulled, so the daemon's
own error text (which names the port's long path) is what must come through uncut.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import still_arm_on_pty, wait_for
from virtual_bench_support import open_virtual_bench

from daemon.config.settings import config_from_dict
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

REPO = Path(__file__).resolve().parents[1]
SO101D = f"{shlex.quote(sys.executable)} -m daemon.apps.cli"


@pytest.fixture
def status_bench(tmp_path: Path):
    # the virtual bench in a directory with a long name: long ports in the status table
    with open_virtual_bench(tmp_path / ("a-bench-directory-with-a-rather-long-name-" * 2)) as vb:
        cfg = config_from_dict(
            {
                "socket": {"path": str(tmp_path / "c.sock")},
                "control": {"reconnect_backoff_min_s": 0.05, "reconnect_backoff_max_s": 0.2},
            }
        )
        daemon = Daemon(
            cfg,
            FeetechLeader(str(vb.leader_port), reference_calibration("leader")),
            FeetechFollower(str(vb.follower_port), reference_calibration("follower")),
        )
        daemon.start()
        wait_for(lambda: daemon.loop.status()["mode"] == "teleop", 30, "teleop")
        yield daemon, tmp_path / "c.sock", vb.leader_bus
        daemon.stop()


def _sh(cmd: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True, timeout=timeout_s, cwd=REPO
    )


def test_watch_json_into_head_gives_three_json_objects_and_exits_cleanly(status_bench) -> None:
    _, sock, _ = status_bench
    r = _sh(f"{SO101D} status --watch --json --interval 0.1 --socket {sock} | head -n 3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    objs = [json.loads(line) for line in lines]
    assert all(o["mode"] == "teleop" and "timing_ms" in o for o in objs)
    assert [o["cycles"] for o in objs] == sorted(o["cycles"] for o in objs) and objs[0]["cycles"] < objs[2]["cycles"]
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


def test_watch_under_timeout_into_a_file_has_a_line_per_refresh(status_bench, tmp_path: Path) -> None:
    _, sock, _ = status_bench
    out = tmp_path / "watch.log"
    r = _sh(f"timeout 4 {SO101D} status --watch --interval 0.2 --socket {sock} > {out}")
    assert r.returncode == 124  # killed by timeout, as the operator's command was
    lines = out.read_text().splitlines()
    assert len(lines) >= 3, out.read_text()  # written as they came, not lost at the kill
    assert all(" mode teleop" in line and " Hz" in line for line in lines), lines


def test_a_long_error_is_not_cut_when_status_goes_to_a_pipe(status_bench) -> None:
    daemon, sock, leader_bus = status_bench
    leader_bus.stop()  # the leader's USB cable pulled: its link disappears
    # The first error names the read that failed; it is replaced by the reconnect attempts', which
    # all fail the same way while the cable stays out. Wait for that steady one, so the text read
    # here is still the daemon's when `status` is asked a moment later.
    wait_for(
        lambda: "cannot open serial port" in str(daemon.loop.status()["leader"].get("last_error") or ""),
        30,
        "the leader's reconnect attempts failing",
    )
    error = daemon.loop.status()["leader"]["last_error"]
    assert len(error) > 120, error

    table = _sh(f"{SO101D} status --socket {sock} | cat")
    assert table.returncode == 0, table.stderr
    assert error.splitlines()[0] in table.stdout, f"cut:\n{table.stdout}\nfull error:\n{error}"

    watched = _sh(f"{SO101D} status --watch --interval 0.1 --socket {sock} | head -n 2")
    assert watched.returncode == 0, watched.stderr
    assert all("leader NOT connected" in line for line in watched.stdout.splitlines()), watched.stdout
    assert error.splitlines()[0] in watched.stdout.splitlines()[-1], watched.stdout


def test_a_leader_port_that_does_not_exist_is_named_in_status(tmp_path: Path) -> None:
    pose = np.array([0.0, -40.0, 45.0, 30.0, 0.0, 50.0])
    _fa, fb = still_arm_on_pty(tmp_path / "follower", "follower", pose)
    missing = tmp_path / "so101-leader"  # never made: a wrong leader.port
    cfg = config_from_dict({"socket": {"path": str(tmp_path / "c.sock")}})
    daemon = Daemon(
        cfg,
        FeetechLeader(str(missing), reference_calibration("leader")),
        FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower")),
    )
    daemon.start()
    try:
        wait_for(lambda: daemon.loop.status()["reason"] == "leader stale", 30, "the hold for the missing leader")
        out = _sh(f"{SO101D} status --socket {tmp_path / 'c.sock'} | cat")
        assert out.returncode == 0, out.stderr
        head = out.stdout.splitlines()[0]
        assert f"leader port {missing} does not exist" in head, out.stdout
        line = _sh(f"{SO101D} status --watch --interval 0.1 --socket {tmp_path / 'c.sock'} | head -n 1")
        assert f"leader port {missing} does not exist" in line.stdout, line.stdout
    finally:
        daemon.stop()
        fb.stop()
