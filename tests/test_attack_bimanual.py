"""Attacks on the bimanual loop: what a running two-arm daemon must honour."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config.settings import config_from_dict
from daemon.control.loop import ControlLoop
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

pytestmark = pytest.mark.unit


def test_sighup_reload_of_fault_holds_reaches_the_loop(tmp_path: Path) -> None:
    """safety.fault_holds is a reloadable safety setting: after a reload to "faulted" a fault on
    the right arm must no longer hold the left one (and back to "all" must hold both again)."""

    def cfg(holds: str):
        return config_from_dict({"socket": {"path": str(tmp_path / "c.sock")}, "safety": {"fault_holds": holds}})

    loop = ControlLoop(
        FeetechLeader(str(tmp_path / "l"), reference_calibration("leader")),
        FeetechFollower(str(tmp_path / "f"), reference_calibration("follower")),
        cfg("all"),
        primary_name="left",
        leader_name="left_leader",
    )
    assert loop.hold_together
    loop.apply_config(cfg("faulted"))
    assert not loop.hold_together, "fault_holds reloaded to 'faulted' but the loop still holds every arm together"
    loop.apply_config(cfg("all"))
    assert loop.hold_together


def test_bus_worker_stop_says_when_its_call_is_still_on_the_bus() -> None:
    """Shutdown stops an arm's bus worker, then makes its own bus calls (torque off or hold, close)
    from the shutdown thread. If the worker's call is still in flight (a bus stuck past its
    timeouts), those calls would share the port with it: stop must say so, so the shutdown can
    leave that bus alone instead of writing over the stuck transaction."""
    import threading

    from daemon.control.bus_worker import BusWorker

    release = threading.Event()
    entered = threading.Event()

    def stuck_call() -> None:
        entered.set()
        release.wait(30.0)

    worker = BusWorker("right")
    try:
        assert worker.run(stuck_call)
        assert entered.wait(5.0)
        assert worker.stop() is False, "stop returned as if the bus were free while a call is still on it"
    finally:
        release.set()
    assert worker.wait(5.0)


def test_a_stuck_right_bus_holds_the_left_arm(tmp_path: Path) -> None:
    """The right follower's bus call hangs (its bus worker never returns): the right pose ages and
    nothing is written to it. With safety.fault_holds = "all" the left arm must hold too, as the
    loop's own comment promises, not keep tracking its leader while its partner is frozen."""
    import threading

    import numpy as np
    from support import still_arm_on_pty, wait_for

    pose_a = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])
    release = threading.Event()

    class HangingFollower(FeetechFollower):
        hang = False

        def read_joints(self) -> np.ndarray:
            if self.hang:
                release.wait(60.0)
            return super().read_joints()

    emus = [still_arm_on_pty(tmp_path / n, r, pose_a) for n, r in (("ll", "leader"), ("lf", "follower"))]
    emus += [still_arm_on_pty(tmp_path / n, r, pose_a) for n, r in (("rl", "leader"), ("rf", "follower"))]
    cfg = config_from_dict(
        {"socket": {"path": str(tmp_path / "c.sock")}, "control": {"start_mode": "teleop", "overlap_io": True}}
    )
    right = HangingFollower(str(tmp_path / "rf"), reference_calibration("follower"))
    loop = ControlLoop(
        FeetechLeader(str(tmp_path / "ll"), reference_calibration("leader")),
        FeetechFollower(str(tmp_path / "lf"), reference_calibration("follower")),
        cfg,
        primary_name="left",
        leader_name="left_leader",
    )
    loop.add_leader("right_leader", FeetechLeader(str(tmp_path / "rl"), reference_calibration("leader")))
    loop.add_arm("right", right, source="right_leader")
    try:
        loop.start_links()
        wait_for(lambda: all(link.connected for link in loop.links()), 20.0, "four arms connected")
        loop.step(60)
        assert loop.arms[0].state.mode == "teleop", loop.arms[0].state
        right.hang = True
        loop.step(5)  # each cycle waits up to a second for the stuck worker
        modes = [(a.name, a.state.mode, a.state.reason) for a in loop.arms]
        assert loop.arms[0].state.mode != "teleop", f"left kept tracking while right's bus is stuck: {modes}"
    finally:
        release.set()
        loop.supervisor.shutdown()
        for _arm, emu in emus:
            emu.stop()
