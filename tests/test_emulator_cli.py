"""`so101d emulate` as a user runs it: links, control socket, trajectory files, clean exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scservo_sdk as scs
from test_emulator_sdk import ok

from calibration.conventions import JOINT_NAMES
from drivers.emulator.process import ControlClient, EmulatorControlError, EmulatorProcess


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_emulate_serves_both_arms_and_sigterm_removes_links(tmp_path: Path) -> None:
    traj = tmp_path / "wave.csv"
    traj.write_text("t_s," + ",".join(JOINT_NAMES) + "\n0,0,-50,50,0,0,10\n1,30,-50,50,0,0,90\n")
    ep = EmulatorProcess(tmp_path / "bench", leader_motion=str(traj)).start()
    try:
        assert ep.leader_path and ep.follower_path
        for path in (ep.leader_path, ep.follower_path):
            assert path.is_symlink() and os.readlink(path).startswith("/dev/pts/")
        arms = ep.control({"cmd": "arms"})["arms"]
        assert set(arms) == {"leader", "follower"}
        # The leader follows the file (looping, linear): pan goes 0 -> 30 degrees within a second.
        pans = []
        for _ in range(8):
            pans.append(ep.control({"cmd": "snapshot", "arm": "leader"})["pose_units"][0])
            time.sleep(0.1)
        assert min(pans) < max(pans) and min(pans) >= -0.5 and max(pans) <= 30.5

        # A client talks to the follower through the link.
        port = scs.PortHandler(str(ep.follower_path))
        assert port.openPort()
        ph = scs.PacketHandler(0)
        assert ok(port, ph.ping, port, 1)[:2] == (777, scs.COMM_SUCCESS)
        ep.control({"cmd": "set_online", "arm": "follower", "joint": "gripper", "online": False})
        assert ph.ping(port, 6)[1] == scs.COMM_RX_TIMEOUT
        ep.control({"cmd": "set_online", "arm": "follower", "joint": 6, "online": True})
        ep.control({"cmd": "drop_replies", "arm": "follower", "n": 1})
        assert ph.ping(port, 2)[1] == scs.COMM_RX_TIMEOUT
        assert ep.control({"cmd": "stats", "arm": "follower"})["stats"]["dropped_replies"] == 1
        port.closePort()

        # Unplug / replug over the control socket.
        ep.control({"cmd": "unplug", "arm": "follower"})
        assert not os.path.lexists(ep.follower_path)
        ep.control({"cmd": "replug", "arm": "follower"})
        assert ep.follower_path.is_symlink()

        # Bad requests are refused with a reason, and the connection stays usable.
        with pytest.raises(EmulatorControlError, match="unknown command"):
            ep.control({"cmd": "explode"})
        with pytest.raises(EmulatorControlError, match="say which arm"):
            ep.control({"cmd": "snapshot"})
        with pytest.raises(EmulatorControlError, match="unknown joint"):
            ep.control({"cmd": "block", "arm": "follower", "joint": "elbow", "at_ticks": 100})
        with pytest.raises(EmulatorControlError, match="needs 'pose_units'"):
            ep.control({"cmd": "set_pose", "arm": "leader"})
        with pytest.raises(EmulatorControlError, match="finite"):
            ep.control({"cmd": "set_pose", "arm": "leader", "pose_units": [0, 0, 0, 0, 0, float("nan")]})
        ep.control({"cmd": "set_pose", "arm": "follower", "pose_units": [1, -2, 3, -4, 5, 60]})
        pose = ep.control({"cmd": "snapshot", "arm": "follower"})["pose_units"]
        np.testing.assert_allclose(pose, [1, -2, 3, -4, 5, 60], atol=0.1)

        # Idle: no busy loop (a second of wall time costs well under 0.1 s of CPU).
        cpu0 = _cpu_s(ep.pid)  # type: ignore[arg-type]
        time.sleep(1.5)
        assert _cpu_s(ep.pid) - cpu0 < 0.15  # type: ignore[arg-type]
    finally:
        code = ep.stop()
    assert code == 0
    assert not os.path.lexists(ep.leader_path) and not os.path.lexists(ep.follower_path)
    assert not ep.control_path.exists()


def test_raw_socket_client_gets_json_errors_for_garbage(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path, leader=False) as ep:
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.connect(str(ep.control_path))
        f = s.makefile("rwb")
        f.write(b"this is not json\n[1, 2]\n")
        f.flush()
        first, second = json.loads(f.readline()), json.loads(f.readline())
        assert first["ok"] is False and "not JSON" in first["error"]
        assert second == {"ok": False, "error": "a request must be a JSON object"}
        s.close()
        # Still serving: another client works (a bad client harms nobody).
        assert ControlClient(ep.control_path).request({"cmd": "ping"})["ok"]


def test_sigint_is_clean_too(tmp_path: Path) -> None:
    link = tmp_path / "leader"
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.apps.cli", "emulate", "--leader", str(link), "--no-wire-time"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not link.is_symlink() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert link.is_symlink()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "leader:" in out
    assert not os.path.lexists(link)


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give --leader PATH and/or --follower PATH"),
        (["--leader", "X", "--leader-motion", "/nonexistent/traj.csv"], "cannot read trajectory"),
        (["--follower", "X", "--baud", "12345"], "unsupported --baud"),
        (["--follower", "X", "--realism", "strict,pl2303"], "--realism: unknown realism preset 'pl2303'"),
    ],
)
def test_bad_arguments_exit_2_with_a_reason(tmp_path: Path, args: list[str], message: str) -> None:
    args = [a.replace("X", str(tmp_path / "x")) for a in args]
    res = subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", "emulate", *args], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2
    assert message in res.stderr
    assert not os.path.lexists(tmp_path / "x")
