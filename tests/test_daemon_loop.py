"""The operator's story against the emulated bench, daemon in-process.

Real parts only: our driver (drivers/feetech_arm) talks to the STS3215 emulator on pseudo-terminals
(wire time modelled); the leader and follower have different calibrations, so following "within a
tolerance" proves the mapping goes through both. Timing asserts are generous (a shared 2-core box);
behaviour asserts are strict (per-cycle command steps, modes, holds).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from support import still_arm_on_pty, wait_for

from calibration.conventions import GRIPPER_INDEX
from daemon.api.client import ControlClient
from daemon.config.settings import config_from_dict
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

POSE_A = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])
POSE_B = np.array([30.0, -40.0, 45.0, 30.0, 20.0, 50.0])
TOL_DEG = 2.0  # follower vs leader once tracking (emulated servo dead band + one cycle of motion)


class CycleRecorder:
    """A real loop hook: keeps what the loop hands every cycle (as the recorder does)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []
        self.modes: list[tuple[str, int]] = []  # (mode, follower connects) of each row, for diagnosis
        self.loop = None

    def on_cycle(self, now, state, action, teleop_action):
        self.rows.append((now, state.copy(), action.copy(), teleop_action.copy()))
        self.modes.append((self.loop.state.mode, self.loop.follower_link.connects))

    def actions(self) -> np.ndarray:
        return np.array([r[2] for r in self.rows])

    def check_no_jump(self, params) -> int:
        """Every command is one bounded step from the previous one while tracking continuously, and
        one bounded step from the *measured* pose whenever tracking (re)starts. Returns the number
        of checked continuous steps."""
        tracking = ("aligning", "teleop", "policy")
        bound = np.maximum(params.max_align_step, params.align_tolerance) + 1e-6
        checked = 0
        for i in range(1, min(len(self.rows), len(self.modes))):
            (m0, c0), (m1, c1) = self.modes[i - 1], self.modes[i]
            if m1 not in tracking:
                continue
            if m0 in tracking and c0 == c1:
                step = np.abs(self.rows[i][2] - self.rows[i - 1][2])
                assert np.all(step <= bound), f"cycle {i}: step {step} > {bound} ({m0} -> {m1})"
                checked += 1
            else:
                start = np.abs(self.rows[i][2] - np.clip(self.rows[i][1], params.lower, params.upper))
                assert np.all(start <= params.max_align_step + 1e-6), (
                    f"cycle {i}: restart {start} not from the measured pose"
                )
        return checked


class Bench:
    def __init__(self, root: Path, leader_pose, follower_pose, **cfg_overrides) -> None:
        self.root = root
        # still, moved only by the test ("by hand")
        self.la, self.lb = still_arm_on_pty(root / "leader", "leader", leader_pose)
        self.fa, self.fb = still_arm_on_pty(root / "follower", "follower", follower_pose)
        data = {
            "socket": {"path": str(root / "c.sock")},
            "safety": {"align_speed_deg_s": 60.0, "align_gripper_speed_pct_s": 80.0},
            "control": {"reconnect_backoff_min_s": 0.05, "reconnect_backoff_max_s": 0.2, "health_period_s": 0.1},
        }
        for section, values in cfg_overrides.items():
            data.setdefault(section, {}).update(values)
        self.cfg = config_from_dict(data)
        self.leader = FeetechLeader(str(root / "leader"), reference_calibration("leader"))
        self.follower = FeetechFollower(str(root / "follower"), reference_calibration("follower"))
        self.daemon = Daemon(self.cfg, self.leader, self.follower)
        self.rec = CycleRecorder()
        self.rec.loop = self.daemon.loop
        self.daemon.loop.add_hook(self.rec)

    @property
    def mode(self) -> str:
        return self.daemon.loop.state.mode

    def wait_mode(self, *modes: str, timeout_s: float = 20.0) -> None:
        wait_for(
            lambda: self.mode in modes, timeout_s, f"mode in {modes} (now {self.mode}: {self.daemon.loop.state.reason})"
        )

    def error(self) -> np.ndarray:
        return np.abs(self.fa.pose_units() - self.la.pose_units())

    def close(self) -> None:
        self.daemon.stop()
        self.lb.stop()
        self.fb.stop()


@pytest.fixture
def make_bench():
    benches: list[Bench] = []
    dirs: list[tempfile.TemporaryDirectory] = []

    def make(leader_pose=POSE_A, follower_pose=POSE_A, before_start=None, **overrides) -> Bench:
        d = tempfile.TemporaryDirectory(prefix="so101d-")
        dirs.append(d)
        b = Bench(Path(d.name), np.asarray(leader_pose, float), np.asarray(follower_pose, float), **overrides)
        benches.append(b)
        if before_start is not None:  # the bench as the operator finds it when the daemon starts
            before_start(b)
        b.daemon.start()
        return b

    yield make
    for b in benches:
        b.close()
    for d in dirs:
        d.cleanup()


def test_start_aligns_slowly_then_follows(make_bench):
    bench = make_bench(leader_pose=POSE_B, follower_pose=POSE_A)
    t0 = time.monotonic()
    bench.wait_mode("aligning", timeout_s=10)
    bench.wait_mode("teleop", timeout_s=15)
    took = time.monotonic() - t0
    # 30 degrees at 60 deg/s is >= 0.5 s: the follower never jumped to the leader
    assert took >= 0.4
    loop = bench.daemon.loop
    acts = bench.rec.actions()
    assert len(acts) > 20
    assert bench.rec.check_no_jump(loop.params) > 20
    # the first command started at the follower's measured pose, not at the leader
    assert np.allclose(acts[0], POSE_A, atol=float(loop.params.max_align_step.max()) + 0.5)
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "follower on the leader")
    # follow a new pose
    bench.la.set_pose_units(POSE_A)
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "follower on the moved leader")
    assert bench.mode == "teleop"
    st = bench.daemon.status()
    assert st["follower"]["connected"] and st["servos"]["gripper"]["torque"] is True
    wait_for(lambda: bench.daemon.status()["cycles"] > st["cycles"], 10, "the loop to keep cycling")


def test_leader_jump_larger_than_step_limit_is_spread(make_bench):
    bench = make_bench(safety={"max_step_deg": 2.0, "max_step_gripper_pct": 3.0})
    bench.wait_mode("teleop")
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "tracking")
    bench.rec.rows.clear()
    bench.rec.modes.clear()
    jump = POSE_A + np.array([25.0, 0, 0, 0, 0, 0])
    bench.la.set_pose_units(jump)
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "follower after the jump")
    acts = bench.rec.actions()
    pan_steps = np.abs(np.diff(acts[:, 0]))
    assert pan_steps.max() <= 2.0 + 1e-6
    assert np.count_nonzero(pan_steps > 0.5) >= 10  # spread over >= 10 cycles
    assert bench.mode == "teleop"


def test_unplug_leader_holds_then_replug_realigns(make_bench):
    bench = make_bench()
    bench.wait_mode("teleop")
    bench.lb.unplug()
    bench.wait_mode("hold", timeout_s=15)
    assert "stale" in bench.daemon.loop.state.reason
    held = bench.fa.pose_units()
    bench.la.set_pose_units(POSE_B)  # moved while unplugged
    bench.daemon.loop.wait_cycles(40)
    assert np.all(np.abs(bench.fa.pose_units() - held) <= 1.0), "follower moved while the leader was gone"
    assert bench.daemon.loop.is_running()
    st = bench.daemon.status()
    assert st["leader"]["connected"] is False and st["leader"]["last_error"]
    n0 = len(bench.rec.modes)
    bench.lb.replug()

    def modes_since_replug() -> list[str]:  # every cycle's mode, as the hook saw it, changes only
        seen = [m for m, _ in bench.rec.modes[n0:]]
        return [m for i, m in enumerate(seen) if i == 0 or seen[i - 1] != m]

    wait_for(lambda: modes_since_replug()[-1:] == ["teleop"] and "aligning" in modes_since_replug(), 15, "re-aligned")
    assert modes_since_replug()[0] == "hold", modes_since_replug()
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "following after replug")
    assert bench.daemon.status()["leader"]["connects"] == 2
    assert bench.rec.check_no_jump(bench.daemon.loop.params) > 20


def test_unplug_follower_reports_and_resumes(make_bench):
    bench = make_bench()
    bench.wait_mode("teleop")
    bench.fb.unplug()
    bench.wait_mode("disconnected", timeout_s=15)
    bench.daemon.loop.wait_cycles(30)  # the loop runs on without its follower
    bench.la.set_pose_units(POSE_B)
    bench.fb.replug()
    bench.wait_mode("aligning", "teleop", timeout_s=15)
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "following after follower replug")
    assert bench.daemon.status()["follower"]["losses"] == 1
    assert bench.rec.check_no_jump(bench.daemon.loop.params) > 10  # tracking steps checked after the replug


def test_follower_overload_holds_until_operator_resumes(make_bench):
    bench = make_bench()
    bench.wait_mode("teleop")
    bench.fa.set_error_bits("elbow_flex", 0x20)
    bench.wait_mode("fault", timeout_s=15)
    st = bench.daemon.status()
    assert "elbow_flex" in st["fault"] and "overload" in st["fault"]
    bench.daemon.loop.wait_cycles(5)  # a few cycles into the fault
    held = bench.daemon.loop.command.copy()
    bench.la.set_pose_units(POSE_B)
    bench.daemon.loop.wait_cycles(30)
    assert np.allclose(bench.daemon.loop.command, held), "fault must hold, not track"
    with ControlClient(bench.cfg.socket.path) as c:
        r = c.call("teleop.start")
        assert r["ok"] is False and "fault still present" in r["error"]
        bench.fa.set_error_bits("elbow_flex", 0)
        c.request("teleop.start")
    bench.wait_mode("aligning", "teleop", timeout_s=15)
    bench.wait_mode("teleop", timeout_s=10)
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "following after the fault")


def test_real_overload_with_torque_off_reaction(make_bench):
    """An obstacle in the elbow's way: the emulated servo overloads and cuts torque; the daemon
    sees the status bit and switches the whole follower off (safety.on_fault = torque_off)."""
    bench = make_bench(safety={"on_fault": "torque_off"})
    bench.wait_mode("teleop")
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "tracking")
    elbow = bench.fa.servo("elbow_flex")
    bench.fa.block_joint("elbow_flex", elbow.present_ticks())
    bench.la.set_pose_units(POSE_A + np.array([0, 0, 25.0, 0, 0, 0]))
    bench.wait_mode("fault", timeout_s=20)
    wait_for(lambda: all(s.reg("Torque_Enable") == 0 for s in bench.fa.servos), 10, "torque off on every servo")
    assert "overload" in bench.daemon.status()["fault"]


def test_socket_verbs_drive_modes_and_bad_requests_leave_the_loop_alone(make_bench):
    bench = make_bench()
    bench.wait_mode("teleop")
    path = bench.cfg.socket.path
    with ControlClient(path) as c:
        assert c.request("teleop.stop")["mode"] == "hold"
        held = bench.fa.pose_units()
        bench.la.set_pose_units(POSE_B)
        bench.daemon.loop.wait_cycles(30)
        assert np.all(np.abs(bench.fa.pose_units() - held) <= 1.0)
        cycles = bench.daemon.loop.cycles
        for raw in (b"garbage\n", b"[]\n", b'{"cmd": "nope"}\n', b'{"cmd": "status", "x": "' + b"z" * 70000 + b'"}\n'):
            assert c.send_raw(raw)["ok"] is False
            c.close()
            c.connect()
        assert bench.daemon.loop.wait_cycles(10) >= cycles + 10 and bench.daemon.loop.is_running()
        c.request("teleop.start")
        bench.wait_mode("aligning", "teleop")
        bench.wait_mode("teleop", timeout_s=10)
        assert c.request("torque.off")["mode"] == "idle"
        wait_for(lambda: all(s.reg("Torque_Enable") == 0 for s in bench.fa.servos), 10, "torque off")
        c.request("torque.on")
        wait_for(lambda: all(s.reg("Torque_Enable") == 1 for s in bench.fa.servos), 10, "torque on")
        assert bench.mode == "idle"
        st = c.request("status")
        for key in (
            "mode",
            "rate_hz",
            "timing_ms",
            "overruns",
            "leader",
            "follower",
            "servos",
            "uptime_s",
            "follower_kind",
        ):
            assert key in st
        assert st["follower"]["bus"]["transactions"] > 0
        assert set(st["timing_ms"]["jitter"]) >= {"p50", "p99", "max"}


def test_gripper_and_body_follow_through_both_calibrations(make_bench):
    """Leader and follower presets differ: equal LeRobot units need different ticks on each arm."""
    bench = make_bench(leader_pose=POSE_B, follower_pose=POSE_B)
    bench.wait_mode("teleop")
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "tracking")
    assert not np.array_equal(bench.la.present_ticks(), bench.fa.present_ticks())
    assert abs(bench.fa.pose_units()[GRIPPER_INDEX] - POSE_B[GRIPPER_INDEX]) <= TOL_DEG


def test_missing_follower_servo_is_a_fault_then_operator_resumes(make_bench):
    bench = make_bench()
    bench.wait_mode("teleop")
    bench.fa.set_online("wrist_flex", False)
    wait_for(lambda: "wrist_flex" in (bench.daemon.status()["fault"] or ""), 15, "missing-servo fault naming the joint")
    bench.wait_mode("fault", "disconnected")
    assert bench.daemon.loop.is_running()
    bench.fa.set_online("wrist_flex", True)
    # back on the bus: the follower reconnects, the fault stays latched until the operator resumes
    wait_for(
        lambda: bench.daemon.status()["follower"]["connected"] and bench.mode == "fault",
        20,
        "reconnected, fault latched",
    )
    wait_for(lambda: bench.daemon.loop.fault_now == "", 10, "servo healthy again")
    with ControlClient(bench.cfg.socket.path) as c:
        c.request("teleop.start")
    bench.wait_mode("teleop")
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "following after the servo came back")


def test_a_servo_silent_when_the_daemon_starts_is_a_fault_that_clears_once_it_answers(make_bench):
    """Powering up: one servo does not answer the first handshake (not powered yet, or slow to
    boot). The operator sees which one; once every servo answers, the arm has never moved, so
    the daemon aligns and follows with no verb. Once running, a silent servo stays latched
    (the test above)."""
    bench = make_bench(before_start=lambda b: b.fa.set_online("shoulder_pan", False))
    wait_for(lambda: "shoulder_pan" in (bench.daemon.status()["fault"] or ""), 15, "the silent servo named at connect")
    assert not bench.daemon.status()["follower"]["connected"]
    bench.fa.set_online("shoulder_pan", True)
    bench.wait_mode("teleop")
    st = bench.daemon.status()
    assert st["fault"] in ("", None) and st["follower"]["connected"], st["fault"]
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "following")


def test_leisaac_remote_leader_published_from_the_loop(make_bench):
    import struct

    import zmq

    from calibration.conventions import ticks_to_units

    bench = make_bench(leisaac_remote_leader={"enabled": True, "bind": "tcp://127.0.0.1:*"})
    bench.wait_mode("teleop")
    pub = bench.daemon.remote_leader
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.CONFLATE, 1)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(pub.endpoint)
    try:
        bench.daemon.loop.wait_cycles(30)  # the subscription reaches the publisher (ZeroMQ's slow joiner)
        msg = sub.recv()
    finally:
        sub.close(linger=0)
    assert len(msg) == 24
    got = np.array(struct.unpack("<6f", msg))
    expected = ticks_to_units(bench.la.present_ticks(), reference_calibration("leader"), body_mode="range_m100_100")
    assert np.allclose(got, expected, atol=0.2)


def test_slow_leader_never_stalls_the_follower_loop(make_bench):
    """A leader behind a slow USB bridge (LR#1166: 28 ms) is read on its own thread: the loop keeps
    its rate and keeps tracking with readings younger than the stale limit."""
    bench = make_bench()
    bench.wait_mode("teleop")
    bench.lb.set_latency(0.03)
    loop = bench.daemon.loop
    loop.wait_cycles(50)
    # Not paced by the leader: the loop runs cycles the leader cannot have been read for (a 30 ms
    # reply caps it at ~33 reads/s). A ratio of two counts in one window, whatever the load.
    c0, r0 = loop.cycles, bench.leader.counters.transactions
    wait_for(lambda: bench.leader.counters.transactions - r0 >= 15, 30, "15 slow leader reads")
    cycles, reads = loop.cycles - c0, bench.leader.counters.transactions - r0
    assert cycles > 1.5 * reads, f"{cycles} loop cycles for {reads} leader reads: the loop waited for the leader"
    assert bench.mode == "teleop"
    bench.la.set_pose_units(POSE_B)
    wait_for(lambda: np.all(bench.error() <= TOL_DEG), 10, "tracking through the slow leader")
    # far beyond the stale limit: hold
    bench.lb.set_latency(0.5)
    bench.wait_mode("hold")
    bench.lb.set_latency(0.0)
    bench.wait_mode("teleop")
