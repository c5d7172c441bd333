"""The notify protocol as systemd would see it, from the real daemon on the virtual bench.

`so101d run` (a subprocess, exactly what ExecStart runs) drives emulated arms on pseudo-terminals
with NOTIFY_SOCKET and WATCHDOG_USEC set; this test plays systemd's side of the socket. A second
test stalls the control loop itself (a hook that blocks, in-process) and checks that the watchdog
pings stop while the rest of the daemon keeps running, then resume.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from calibration.calibration_file import save_calibration
from daemon.config import config_from_dict
from daemon.sd_notify import Notifier
from daemon.service import Daemon
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

SO101D = str(Path(sys.executable).with_name("so101d"))
POSE = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])


class FakeSystemd:
    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._rx, daemon=True)
        self.sock.settimeout(0.05)
        self._t.start()

    def _rx(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode().split("\n")))

    def wait_for(self, key: str, timeout_s: float, since: float = 0.0) -> list[str]:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for t, m in list(self.messages):
                if t >= since and any(line == key or line.startswith(key) for line in m):
                    return m
            time.sleep(0.02)
        raise AssertionError(f"no {key} within {timeout_s} s; got {[m for _, m in self.messages]}")

    def pings(self, start: float, end: float) -> int:
        return sum(1 for t, m in list(self.messages) if start <= t <= end and "WATCHDOG=1" in m)

    def close(self) -> None:
        self._stop.set()
        self._t.join(1)
        self.sock.close()


@pytest.fixture
def bench(tmp_path: Path):
    la, fa = EmulatedArm("leader", initial_pose_units=POSE), EmulatedArm("follower", initial_pose_units=POSE)
    la.set_pose_units(POSE)
    lb = BusEmulator(tmp_path / "leader", la).start()
    fb = BusEmulator(tmp_path / "follower", fa).start()
    fake = FakeSystemd(tmp_path / "notify.sock")
    yield tmp_path, fake
    fake.close()
    lb.stop()
    fb.stop()


def test_so101d_run_notifies_ready_watchdog_status_stopping(bench) -> None:
    root, fake = bench
    cal_root = root / "calibration"
    save_calibration(reference_calibration("leader"), "leader", "leader", cal_root)
    save_calibration(reference_calibration("follower"), "follower", "follower", cal_root)
    cfg = root / "so101d.toml"
    sock = root / "control.sock"
    cfg.write_text(
        f'[leader]\nport = "{root / "leader"}"\n[follower]\nport = "{root / "follower"}"\n'
        f'[calibration]\nroot = "{cal_root}"\n[socket]\npath = "{sock}"\n[control]\nrate_hz = 50.0\n'
    )
    env = dict(os.environ, NOTIFY_SOCKET=fake.path, WATCHDOG_USEC="1000000")
    proc = subprocess.Popen([SO101D, "run", "--config", str(cfg)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = fake.wait_for("READY=1", timeout_s=45)
        assert f"MAINPID={proc.pid}" in ready
        t_ready = time.monotonic()
        fake.wait_for("STATUS=", timeout_s=10)
        time.sleep(2.2)
        n = fake.pings(t_ready, time.monotonic())
        assert n >= 2, f"only {n} WATCHDOG=1 in 2.2 s with a 1 s watchdog"
        assert n <= 2.2 / 0.5 + 2, f"{n} pings: the gate should rate-limit to period/2"
        statuses = [line for _, m in fake.messages for line in m if line.startswith("STATUS=")]
        assert any("Hz" in s for s in statuses), statuses
        # `so101d status` reaches the running service through its socket.
        st = subprocess.run([SO101D, "status", "--socket", str(sock)], capture_output=True, text=True, timeout=30)
        assert st.returncode == 0, st.stdout + st.stderr
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)  # well inside TimeoutStopSec=60s
        assert rc == 0, proc.stdout.read() if proc.stdout else ""
        fake.wait_for("STOPPING=1", timeout_s=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


class StallHook:
    """A loop hook that blocks the control thread while ``stall`` is set (the injected hang)."""

    def __init__(self) -> None:
        self.stall = threading.Event()
        self.release = threading.Event()

    def on_cycle(self, now, state, action, teleop_action) -> None:
        if self.stall.is_set():
            self.release.wait(30)


def test_stalled_loop_stops_the_watchdog_pings(bench) -> None:
    root, fake = bench
    cfg = config_from_dict({"socket": {"path": str(root / "c.sock")}, "control": {"rate_hz": 50.0}})
    leader = FeetechLeader(str(root / "leader"), reference_calibration("leader"))
    follower = FeetechFollower(str(root / "follower"), reference_calibration("follower"))
    notifier = Notifier.from_env({"NOTIFY_SOCKET": fake.path, "WATCHDOG_USEC": "400000"})  # pet every 0.2 s
    daemon = Daemon(cfg, leader, follower, notifier=notifier)
    hook = StallHook()
    daemon.loop.add_hook(hook)
    stop_ticks = threading.Event()

    def ticker() -> None:  # the main thread's housekeeping keeps running during the stall
        while not stop_ticks.is_set():
            daemon.tick()
            time.sleep(0.1)

    daemon.start()
    t = threading.Thread(target=ticker, daemon=True)
    t.start()
    try:
        fake.wait_for("READY=1", timeout_s=30)
        t0 = time.monotonic()
        time.sleep(1.0)
        assert fake.pings(t0, time.monotonic()) >= 3
        hook.stall.set()
        time.sleep(0.3)  # a ping already in flight may land
        s0 = time.monotonic()
        time.sleep(1.2)  # three watchdog periods
        assert fake.pings(s0, time.monotonic()) == 0, "a stalled loop must not pet the watchdog"
        assert daemon.loop.is_running()  # stalled, not dead: only the watchdog can tell
        hook.stall.clear()
        hook.release.set()
        r0 = time.monotonic()
        fake.wait_for("WATCHDOG=1", timeout_s=5, since=r0)
    finally:
        hook.stall.clear()
        hook.release.set()
        stop_ticks.set()
        t.join(2)
        daemon.stop()
