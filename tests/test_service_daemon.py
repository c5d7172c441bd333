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
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import poll_until
from virtual_bench_support import VirtualBench

from calibration.calibration_file import save_calibration
from daemon.api.client import ControlClient
from daemon.config.settings import config_from_dict
from daemon.service.daemon import Daemon
from daemon.system.sd_notify import Notifier
from drivers.emulator import reference_calibration
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
def systemd_bench(virtual_bench: VirtualBench) -> Iterator[tuple[Path, FakeSystemd]]:
    """The virtual bench with both arms at POSE, and a fake systemd's notify socket beside it."""
    virtual_bench.leader.set_pose_units(POSE)
    virtual_bench.follower.set_pose_units(POSE)
    fake = FakeSystemd(virtual_bench.root / "notify.sock")
    yield virtual_bench.root, fake
    fake.close()


def _start_daemon(
    root: Path, fake: FakeSystemd, extra_toml: str = "", watchdog_usec: int = 1_000_000
) -> tuple[subprocess.Popen, Path, Path]:
    cal_root = root / "calibration"
    save_calibration(reference_calibration("leader"), "leader", "leader", cal_root)
    save_calibration(reference_calibration("follower"), "follower", "follower", cal_root)
    cfg = root / "so101d.toml"
    sock = root / "control.sock"
    cfg.write_text(
        f'[leader]\nport = "{root / "leader"}"\n[follower]\nport = "{root / "follower"}"\n'
        f'[calibration]\nroot = "{cal_root}"\n[socket]\npath = "{sock}"\n[control]\nrate_hz = 50.0\n' + extra_toml
    )
    env = dict(os.environ, NOTIFY_SOCKET=fake.path, WATCHDOG_USEC=str(watchdog_usec), HF_HUB_OFFLINE="1")
    # Output to a file, not a pipe: the dataset writer (a child) would hold a pipe open.
    log = open(root / "so101d.log", "w")
    proc = subprocess.Popen([SO101D, "run", "--config", str(cfg)], env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    proc.log_path = root / "so101d.log"  # type: ignore[attr-defined]
    return proc, cfg, sock


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.kill()
        proc.wait(20)
    return proc.log_path.read_text()  # type: ignore[attr-defined]


def test_so101d_run_notifies_ready_watchdog_status_stopping(systemd_bench) -> None:
    root, fake = systemd_bench
    proc, _cfg, sock = _start_daemon(root, fake)
    try:
        ready = fake.wait_for("READY=1", timeout_s=45)
        assert f"MAINPID={proc.pid}" in ready
        t_ready = time.monotonic()
        fake.wait_for("STATUS=", timeout_s=10)
        # three pings (a 1 s watchdog: one each 0.5 s at most), then their rate
        deadline = t_ready + 30.0
        while fake.pings(t_ready, time.monotonic()) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        window_s = time.monotonic() - t_ready
        n = fake.pings(t_ready, time.monotonic())
        assert n >= 3, f"{n} WATCHDOG=1 in {window_s:.1f} s with a 1 s watchdog"
        assert n <= window_s / 0.5 + 2, f"{n} pings in {window_s:.1f} s: the gate should rate-limit to period/2"
        statuses = [line for _, m in fake.messages for line in m if line.startswith("STATUS=")]
        assert any("Hz" in s for s in statuses), statuses
        # `so101d status` reaches the running service through its socket.
        st = subprocess.run([SO101D, "status", "--socket", str(sock)], capture_output=True, text=True, timeout=30)
        assert st.returncode == 0, st.stdout + st.stderr
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)  # well inside TimeoutStopSec
        assert rc == 0
        fake.wait_for("STOPPING=1", timeout_s=5)
    finally:
        _stop(proc)


def test_sighup_reloads_live_keys_with_reloading_then_ready(systemd_bench) -> None:
    root, fake = systemd_bench
    proc, cfg, sock = _start_daemon(root, fake)
    try:
        fake.wait_for("READY=1", timeout_s=45)
        cfg.write_text(cfg.read_text() + "[safety]\nmax_step_deg = 4.0\n")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        reloading = fake.wait_for("RELOADING=1", timeout_s=10, since=t0)
        assert any(line.startswith("MONOTONIC_USEC=") for line in reloading)
        t_rel = next(t for t, m in fake.messages if t >= t0 and "RELOADING=1" in m)
        fake.wait_for("READY=1", timeout_s=10, since=t_rel)
        with ControlClient(sock, timeout_s=5) as c:
            st = c.request("status")
        assert st.get("reloads") == 1, st
        assert proc.poll() is None  # SIGHUP must not kill it (the default action would)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0
        finally:
            _stop(proc)


def test_sigterm_mid_episode_leaves_a_loadable_dataset(systemd_bench) -> None:
    root, fake = systemd_bench
    data = root / "datasets"
    proc, _cfg, sock = _start_daemon(
        root,
        fake,
        f'[recording]\nenabled = true\ndataset_root = "{data}"\nrepo_id = "local/svc"\nfps = 30\n'
        'on_shutdown = "discard"\n',  # this test checks the discard path; "save" is tested in test_recording_service.py
    )
    out = ""
    try:
        fake.wait_for("READY=1", timeout_s=60)
        with ControlClient(sock, timeout_s=10) as c:
            # READY=1 means arms connected; the recorder's writer process may still be loading.
            # On a loaded 2-core machine that took 30 s once: generous bounds, checked by state.
            end = time.monotonic() + 120
            while c.call("episode.start", task="saved before SIGTERM").get("ok") is not True:
                assert time.monotonic() < end, "recorder never became ready"
                time.sleep(0.2)
            end = time.monotonic() + 60
            while c.request("episode.status")["frames"] < 15:
                assert time.monotonic() < end, "no frames recorded"
                time.sleep(0.1)
            saved = c.request("episode.save", success=True)
            c.request("episode.start", task="in progress at SIGTERM")
            end = time.monotonic() + 60
            while c.request("episode.status")["frames"] < 5:
                assert time.monotonic() < end, "no frames recorded in the second episode"
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        out = _stop(proc)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/svc", root=data / "local" / "svc")
    assert ds.meta.total_episodes == 1, out[-3000:]  # the in-progress episode is discarded (on_shutdown)
    assert ds.num_frames == saved["frames"] > 10
    assert ds[0]["observation.state"].shape == (6,)
    assert list(ds.meta.episodes[0]["tasks"]) == ["saved before SIGTERM"]


class StallHook:
    """A loop hook that blocks the control thread while ``stall`` is set (the injected hang)."""

    def __init__(self) -> None:
        self.stall = threading.Event()
        self.stalled = threading.Event()  # the control thread is blocked in on_cycle
        self.release = threading.Event()

    def on_cycle(self, now, state, action, teleop_action) -> None:
        if self.stall.is_set():
            self.stalled.set()
            self.release.wait(30)


def test_stalled_loop_stops_the_watchdog_pings(systemd_bench) -> None:
    root, fake = systemd_bench
    cfg = config_from_dict({"socket": {"path": str(root / "c.sock")}, "control": {"rate_hz": 50.0}})
    leader = FeetechLeader(str(root / "leader"), reference_calibration("leader"))
    follower = FeetechFollower(str(root / "follower"), reference_calibration("follower"))
    notifier = Notifier.from_env({"NOTIFY_SOCKET": fake.path, "WATCHDOG_USEC": "400000"})  # pet every 0.2 s
    daemon = Daemon(cfg, leader, follower, notifier=notifier)
    hook = StallHook()
    daemon.loop.add_hook(hook)
    stop_ticks = threading.Event()
    ticks = [0]  # each tick is a chance to pet the watchdog

    def ticker() -> None:  # the main thread's housekeeping keeps running during the stall
        while not stop_ticks.is_set():
            daemon.tick()
            ticks[0] += 1
            time.sleep(0.1)

    def after_ticks(n: int) -> None:
        until = ticks[0] + n
        assert poll_until(lambda: ticks[0] >= until, 30.0), f"the main thread ticked {ticks[0]}, not {until}"

    daemon.start()
    t = threading.Thread(target=ticker, daemon=True)
    t.start()
    try:
        fake.wait_for("READY=1", timeout_s=30)
        t0 = time.monotonic()
        deadline = t0 + 10.0  # a running loop pets every 0.2 s; a loaded machine may be slower
        while fake.pings(t0, time.monotonic()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.pings(t0, time.monotonic()) >= 3
        hook.stall.set()
        assert hook.stalled.wait(10), "the loop never reached the stalling hook"
        after_ticks(2)  # a ping already in flight may land
        s0 = time.monotonic()
        after_ticks(12)  # three watchdog periods of ticks, each one a chance to pet
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
