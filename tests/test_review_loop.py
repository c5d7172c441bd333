"""Review findings on the control loop, against the emulated bench (our driver on the STS3215
emulator, the loop itself; no daemon service around it).

1. A switch between tracking sources (policy -> teleop via ``teleop start``, teleop -> policy)
   must re-align at the alignment speed from where the arm is, not step at ``max_step`` per cycle
   (10 deg/cycle at 100 Hz = 1000 deg/s) toward a source that may be far away.
2. A policy source that raises must not kill the loop thread: the follower holds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import still_arm_on_pty, wait_for
from virtual_bench_support import VirtualBench

from daemon.config.settings import config_from_dict
from daemon.control.loop import ControlLoop
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

POSE_A = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])
POSE_B = np.array([40.0, -30.0, 30.0, 10.0, 30.0, 60.0])


class ConstantPolicy:
    """A target source that always has a fresh target (as a policy with a full action queue)."""

    def __init__(self, pose: np.ndarray) -> None:
        self.pose = np.asarray(pose, dtype=np.float64)

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        return self.pose.copy()


class BrokenPolicy:
    def __init__(self) -> None:
        self.calls = 0

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        self.calls += 1
        raise RuntimeError("policy worker died")


class Commands:
    def __init__(self, loop: ControlLoop) -> None:
        self.loop = loop
        self.rows: list[tuple[str, np.ndarray, np.ndarray]] = []

    def on_cycle(self, now, state, action, teleop_action):
        self.rows.append((self.loop.state.mode, state.copy(), action.copy()))


def biggest_step(rows: list, params) -> np.ndarray:
    """Largest per-joint move of the command in one cycle; where alignment (re)starts, measured
    from the follower's measured pose (where the design starts it), else from the previous command."""
    biggest = np.zeros(6)
    for i in range(1, len(rows)):
        if rows[i][0] == "aligning" and rows[i - 1][0] != "aligning":
            step = np.abs(rows[i][2] - np.clip(rows[i][1], params.lower, params.upper))
        else:
            step = np.abs(rows[i][2] - rows[i - 1][2])
        biggest = np.maximum(biggest, step)
    return biggest


@pytest.fixture
def loop_bench(virtual_bench: VirtualBench):
    root = virtual_bench.root
    parts: dict = {}
    la, fa = virtual_bench.leader, virtual_bench.follower
    la.set_pose_units(POSE_A)
    fa.set_pose_units(POSE_B)
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "safety": {"align_speed_deg_s": 90.0, "align_gripper_speed_pct_s": 120.0},
            "control": {
                "reconnect_backoff_min_s": 0.05,
                "reconnect_backoff_max_s": 0.2,
                "health_period_s": 0.1,
                "start_mode": "idle",
            },
        }
    )
    leader = FeetechLeader(str(root / "leader"), reference_calibration("leader"))
    follower = FeetechFollower(str(root / "follower"), reference_calibration("follower"))
    loop = ControlLoop(leader, follower, cfg)
    rec = Commands(loop)
    loop.add_hook(rec)
    parts.update(loop=loop, rec=rec, la=la, fa=fa)
    loop.start()
    try:
        wait_for(lambda: loop.state.mode == "idle" and loop.leader_link.connected, 20.0, "loop idle with both arms")
        yield parts
    finally:
        loop.stop()


def test_policy_to_teleop_switch_realigns_instead_of_jumping(loop_bench) -> None:
    loop, rec = loop_bench["loop"], loop_bench["rec"]
    loop.policy_source = ConstantPolicy(POSE_B)  # the follower already stands at POSE_B
    loop.call(lambda: loop.set_intent("policy"))
    wait_for(lambda: loop.state.mode == "policy", 20.0, "policy tracking")
    params = loop.params
    n0 = len(rec.rows)
    # the operator types `so101d teleop start` while the policy drives; the leader sits at POSE_A
    loop.call(lambda: loop.set_intent("teleop"))
    wait_for(lambda: len(rec.rows) > n0 + 20, 10.0, "cycles after the switch")
    rows = rec.rows[n0 - 1 :]
    biggest = biggest_step(rows, params)
    assert np.all(biggest <= params.max_align_step + 1e-6), (
        f"policy -> teleop moved {biggest} in one cycle (alignment allows {params.max_align_step})"
    )
    assert any(r[0] == "aligning" for r in rows), "the switch did not re-align"


def test_teleop_to_policy_switch_realigns_instead_of_jumping(loop_bench) -> None:
    loop, rec = loop_bench["loop"], loop_bench["rec"]
    loop.call(lambda: loop.set_intent("teleop"))
    wait_for(lambda: loop.state.mode == "teleop", 30.0, "teleop tracking")
    params = loop.params
    loop.policy_source = ConstantPolicy(POSE_B)  # far from where teleop left the arm (POSE_A)
    n0 = len(rec.rows)
    loop.call(lambda: loop.set_intent("policy"))
    wait_for(lambda: len(rec.rows) > n0 + 20, 10.0, "cycles after the switch")
    rows = rec.rows[n0 - 1 :]
    biggest = biggest_step(rows, params)
    assert np.all(biggest <= params.max_align_step + 1e-6), (
        f"teleop -> policy moved {biggest} in one cycle (alignment allows {params.max_align_step})"
    )


def test_policy_source_that_raises_does_not_kill_the_loop(loop_bench) -> None:
    loop, fa = loop_bench["loop"], loop_bench["fa"]
    src = BrokenPolicy()
    loop.policy_source = src
    pose_before = fa.pose_units()
    loop.call(lambda: loop.set_intent("policy"))
    wait_for(lambda: src.calls >= 20, 10.0, "policy asked for targets")
    loop.wait_cycles(10)
    assert loop.is_running(), "a raising policy source killed the control loop"
    assert loop.state.mode == "hold", loop.state
    assert np.allclose(fa.pose_units(), pose_before, atol=2.0)
    # and the operator can still get out of it
    loop.call(lambda: loop.set_intent("hold"))


def test_torque_off_is_obeyed_while_a_fault_holds_the_arm(loop_bench) -> None:
    """on_fault = hold latches a hold; the operator's `torque off` (e.g. to free a trapped hand)
    must still switch the follower limp, not be ignored until the fault is cleared."""
    from drivers.sts3215_table import ERR_OVERHEAT

    loop, fa = loop_bench["loop"], loop_bench["fa"]
    loop.call(lambda: loop.set_intent("hold"))
    wait_for(lambda: loop.state.mode == "hold" and all(s.torque_enabled for s in fa.servos), 20.0, "holding, torque on")
    fa.set_error_bits("elbow_flex", ERR_OVERHEAT)
    wait_for(lambda: loop.state.mode == "fault", 20.0, "fault latched")
    assert all(s.torque_enabled for s in fa.servos)  # on_fault = hold: still holding
    loop.call(lambda: loop.set_torque_wanted(False))
    wait_for(
        lambda: not any(s.torque_enabled for s in fa.servos),
        5.0,
        f"torque off during a fault (mode {loop.state.mode}: {loop.state.reason})",
    )
    loop.wait_cycles(20)
    assert not any(s.torque_enabled for s in fa.servos), "torque came back on by itself"
    assert loop.state.fault  # still latched: clearing it stays the operator's explicit act


POSE_LOW = np.array([40.0, -10.0, 5.0, -20.0, 30.0, 60.0])


def test_reconnect_does_not_hold_the_pose_measured_before_the_loss(tmp_path: Path) -> None:
    """A USB glitch that also rebooted the servos: torque off, the arm dropped while the port was
    away. The cycle in which the reconnect lands (the connect thread sets ``connected`` while the
    cycle waits for the leader) must not take the pre-loss pose as this cycle's measurement:
    torque on + that goal would snap the arm back up at full speed."""
    from drivers.emulator.servo import ADDR_TORQUE_ENABLE

    _la, lb = still_arm_on_pty(tmp_path / "leader", "leader", POSE_A)
    fa, fb = still_arm_on_pty(tmp_path / "follower", "follower", POSE_B)
    cfg = config_from_dict(
        {
            "socket": {"path": str(tmp_path / "c.sock")},
            "safety": {"leader_stale_s": 0.5},
            "control": {"reconnect_backoff_min_s": 0.05, "reconnect_backoff_max_s": 0.1, "start_mode": "idle"},
        }
    )
    leader = FeetechLeader(str(tmp_path / "leader"), reference_calibration("leader"))
    follower = FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower"))
    loop = ControlLoop(leader, follower, cfg)  # stepped by hand: step() on this thread
    link = loop.follower_link

    class ReplugDuringLeaderRead:
        armed = False

        def on_leader(self, now, units):
            if self.armed:  # the reconnect lands between the follower read and the update
                self.armed = False
                fb.replug()
                wait_for(lambda: link.connected, 10.0, "follower reconnected")

    hook = ReplugDuringLeaderRead()
    loop.add_hook(hook)

    try:
        loop.leader_link.start()
        link.start()
        wait_for(lambda: link.connected and loop.leader_link.connected, 20.0, "both arms connected")
        loop.intent = "hold"
        loop.step(30)
        assert loop.state.mode == "hold" and all(s.torque_enabled for s in fa.servos)
        fb.unplug()
        for _ in range(50):
            loop.step(1)
            if not link.connected:
                break
        assert not link.connected
        for s in fa.servos:  # the servos rebooted: torque off, and the arm fell
            s.write(ADDR_TORQUE_ENABLE, b"\x00")
        fa.set_pose_units(POSE_LOW)
        hook.armed = True
        loop.step(60)
        assert link.connected
        err = np.abs(fa.pose_units() - POSE_LOW)
        assert np.all(err < 3.0), f"the follower moved {err} after the reconnect (back to the pre-loss pose?)"
    finally:
        loop.leader_link.stop()
        link.stop()
        leader.close()
        follower.close()
        lb.stop()
        fb.stop()


def test_failed_fault_clear_does_not_snap_back_to_the_old_hold_pose(loop_bench) -> None:
    """A fault holds; one servo's own protection had cut its torque and the joint was moved by
    hand. `teleop start` while another fault persists re-enables torque at the present pose and
    fails; the hold that follows must hold that present pose, not drive the joint back."""
    from drivers.emulator.servo import ADDR_TORQUE_ENABLE
    from drivers.sts3215_table import ERR_OVERHEAT

    loop, fa = loop_bench["loop"], loop_bench["fa"]
    loop.call(lambda: loop.set_intent("hold"))
    wait_for(lambda: loop.state.mode == "hold" and all(s.torque_enabled for s in fa.servos), 20.0, "holding, torque on")
    fa.set_error_bits("shoulder_pan", ERR_OVERHEAT)
    wait_for(lambda: loop.state.mode == "fault", 20.0, "fault latched")
    fa.servo("elbow_flex").write(ADDR_TORQUE_ENABLE, b"\x00")  # its protection cut the torque...
    moved = fa.pose_units()
    moved[2] -= 30.0
    fa.set_pose_units(moved)  # ...and the elbow was pushed 30 deg
    loop.wait_cycles(10)
    with pytest.raises(RuntimeError, match="fault still present"):
        loop.call(lambda: loop.set_intent("teleop"))
    loop.wait_cycles(50)
    assert fa.servo("elbow_flex").torque_enabled
    err = abs(fa.pose_units()[2] - moved[2])
    assert err < 3.0, f"the elbow moved {err:.1f} deg after the failed fault clear (back to the old hold pose)"


def test_stop_with_hold_on_shutdown_leaves_the_follower_holding(loop_bench) -> None:
    """follower.torque_off_on_shutdown = false (the default) promises a held pose when the daemon
    stops; closing the driver must not then switch the torque off (the arm would drop)."""
    loop, fa = loop_bench["loop"], loop_bench["fa"]
    assert loop.cfg.follower.torque_off_on_shutdown is False
    loop.call(lambda: loop.set_intent("hold"))
    wait_for(lambda: loop.state.mode == "hold" and all(s.torque_enabled for s in fa.servos), 20.0, "holding, torque on")
    pose = fa.pose_units()
    loop.stop()
    assert all(s.torque_enabled for s in fa.servos), "the follower went limp on a hold-on-shutdown stop"
    assert np.allclose(fa.pose_units(), pose, atol=2.0)
