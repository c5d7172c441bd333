"""The daemon's declared seams: what plugs into the loop and the daemon, and how it is told apart.

Real parts: our driver on the STS3215 emulator (a pty), the real Daemon and its context.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import still_arm_on_pty, wait_for

from daemon.config.settings import config_from_dict
from daemon.control.loop import ControlLoop
from daemon.service.attach_recording import follower_dataset_kind
from daemon.service.context import DaemonContext
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

POSE = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])


class LeaderTap:
    """A LeaderHook: every fresh leader reading."""

    def __init__(self) -> None:
        self.readings: list[np.ndarray] = []

    def on_leader(self, now_monotonic_s: float, leader_units: np.ndarray) -> None:
        self.readings.append(leader_units.copy())


class NotAHook:
    def on_frame(self, *args: object) -> None: ...


def bench_cfg(root: Path):
    return config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "control": {"reconnect_backoff_min_s": 0.05, "reconnect_backoff_max_s": 0.2, "start_mode": "idle"},
        }
    )


def test_an_object_that_is_no_hook_is_refused_by_name(tmp_path: Path) -> None:
    follower = FeetechFollower(str(tmp_path / "nowhere"), reference_calibration("follower"))
    loop = ControlLoop(None, follower, bench_cfg(tmp_path))
    with pytest.raises(TypeError, match="NotAHook.*neither a CycleHook"):
        loop.add_hook(NotAHook())  # type: ignore[arg-type]  # the mistake this test makes on purpose


def test_a_stepped_loop_runs_the_cycles_asked_and_hands_fresh_leader_readings_to_its_hooks(tmp_path: Path) -> None:
    _la, lb = still_arm_on_pty(tmp_path / "leader", "leader", POSE)
    _fa, fb = still_arm_on_pty(tmp_path / "follower", "follower", POSE)
    leader = FeetechLeader(str(tmp_path / "leader"), reference_calibration("leader"))
    follower = FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower"))
    loop = ControlLoop(leader, follower, bench_cfg(tmp_path))
    tap = LeaderTap()
    loop.add_hook(tap)
    try:
        loop.start_links()
        assert loop.leader_link is not None
        wait_for(lambda: loop.follower_link.connected and loop.leader_link.connected, 20, "both arms connected")
        reads_before = leader.counters.transactions
        loop.step(25)
        assert loop.cycles == 25 and loop.stats.update.count == 25  # each one ran all its steps
        # a leader reading reaches the hooks at most once, and only a good one (a failed read gives
        # none; a late read that the next one overtook within a cycle is superseded, not replayed)
        reads = leader.counters.transactions - reads_before
        good = reads - loop.leader_errors
        assert 1 <= len(tap.readings) <= min(good, 25), (reads, loop.leader_errors, len(tap.readings))
        assert np.allclose(tap.readings[-1], POSE, atol=1.0)
        with pytest.raises(TimeoutError, match="0 of 5 cycles"):
            loop.wait_cycles(5, timeout_s=0.2)  # nobody runs cycles: the wait says so, never hangs
    finally:
        loop.stop()
        lb.stop()
        fb.stop()


def test_a_started_loop_cannot_be_stepped_by_hand_too(tmp_path: Path) -> None:
    _fa, fb = still_arm_on_pty(tmp_path / "follower", "follower", POSE)
    loop = ControlLoop(
        None, FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower")), bench_cfg(tmp_path)
    )
    loop.start()
    try:
        assert loop.wait_cycles(10) >= 10
        with pytest.raises(RuntimeError, match="not started"):
            loop.step()
    finally:
        loop.stop()
        fb.stop()


def test_the_emulator_is_told_apart_by_its_device_not_its_path(tmp_path: Path) -> None:
    _fa, fb = still_arm_on_pty(tmp_path / "follower", "follower", POSE)
    try:
        emulated = FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower"))
        assert follower_dataset_kind(emulated) == "emulated"
        # a character device that is no pseudo-terminal, and a port that is not there: real hardware
        for port in ("/dev/null", str(tmp_path / "ttyACM9")):
            assert follower_dataset_kind(FeetechFollower(port, reference_calibration("follower"))) == "feetech"
    finally:
        fb.stop()


def test_the_daemon_shares_one_context_and_owns_the_cameras(tmp_path: Path) -> None:
    _la, lb = still_arm_on_pty(tmp_path / "leader", "leader", POSE)
    _fa, fb = still_arm_on_pty(tmp_path / "follower", "follower", POSE)
    cfg = config_from_dict(
        {
            "socket": {"path": str(tmp_path / "c.sock")},
            "cameras": {"front": {"kind": "virtual", "width": 64, "height": 48, "fps": 30}},
            "recording": {"enabled": True, "dataset_root": str(tmp_path / "datasets"), "repo_id": "local/seams"},
        }
    )
    daemon = Daemon(
        cfg,
        FeetechLeader(str(tmp_path / "leader"), reference_calibration("leader")),
        FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower")),
    )
    ctx = daemon.context
    assert isinstance(ctx, DaemonContext) and ctx.loop is daemon.loop and ctx.server is daemon.server
    daemon.start()
    try:
        # the recorder and the policy read the same camera objects: the daemon's
        assert daemon.recorder is ctx.recorder is not None
        front = ctx.cameras.all()
        assert [c.name for c in front] == ["front"] and daemon.recorder.cameras == front
        assert daemon.policy is ctx.policy is not None and daemon.policy.cameras == {"front": front[0]}
        wait_for(lambda: front[0].latest_frame() is not None, 20, "the daemon's camera delivering")
        assert ctx.dataset_dir == tmp_path / "datasets" / "local" / "seams"
    finally:
        daemon.stop()
        lb.stop()
        fb.stop()
