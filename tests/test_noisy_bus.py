"""Issue 12, noisy bus: damaged status packets on the follower's bus cost a quick retry, never a
failed read, a stale value, a fault or the loop's rate; a servo gone silent costs each cycle a
bounded time, not 3 x 50 ms.

The operator's story: the follower's USB cable picks up noise (the emulator damages a share of
its status packets, set through ``so101d emulate``'s control socket as an operator would), and the
daemon keeps teleoperating at its rate as if nothing happened.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from support import wait_for

from daemon.config.settings import config_from_dict
from daemon.control.loop import ControlLoop
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
from drivers.emulator.process import EmulatorProcess
from drivers.feetech_arm import FeetechFollower, FeetechLeader, FollowerBusConfig
from drivers.feetech_bus import ServoNoReplyError

MODES = ("checksum", "any", "len", "drop", "insert")


@pytest.fixture
def follower_on_pty(tmp_path):
    """A connected FeetechFollower (LeRobot's default 2 retries) on an emulated follower, torque off
    so the test moves it "by hand" and knows every true position."""
    arm = EmulatedArm("follower")
    emu = BusEmulator(tmp_path / "follower", arm).start()
    follower = FeetechFollower(
        str(tmp_path / "follower"), reference_calibration("follower"), FollowerBusConfig(disable_torque_on_close=False)
    )
    follower.connect()
    try:
        yield arm, emu, follower
    finally:
        follower.close()
        emu.stop()


@pytest.mark.parametrize("mode", MODES)
def test_every_read_through_heavy_noise_is_fresh_and_none_fails(follower_on_pty, mode):
    """10 % damaged packets (five times the issue's 2 %): with only the 2 retries a silent servo
    gets, about one six-servo read in ten gives up. Noise must cost retries only: every read
    returns the pose the arm holds right now, never the previous one."""
    arm, emu, follower = follower_on_pty
    rng = np.random.default_rng(7)
    emu.corrupt(0.10, mode)
    for _ in range(150):
        pose = np.concatenate([rng.uniform(-60, 60, 5), rng.uniform(5, 95, 1)])
        arm.set_pose_units(pose)  # a new pose before every read: a stale value cannot match
        truth = arm.present_ticks().tolist()
        assert follower.read_joints_ticks().tolist() == truth
    assert emu.stats.corrupted_replies >= 40, emu.stats
    assert follower.counters.retries >= 40
    assert follower.counters.failures == 0


def test_a_silent_servo_costs_a_bounded_time_per_read_and_is_read_again_when_back(follower_on_pty):
    arm, _emu, follower = follower_on_pty
    arm.set_online(3, False)  # elbow_flex stops answering (cable pulled out of the servo)
    with pytest.raises(ServoNoReplyError) as ei:
        follower.read_joints_ticks()
    assert ei.value.missing_ids == (3,) and not ei.value.corrupt
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        with pytest.raises(ServoNoReplyError):
            follower.read_joints_ticks()
        times.append(time.perf_counter() - t0)
    # before issue 12: 3 tries x (wire time + 50 ms) = 150 ms per read, every control cycle
    assert sorted(times)[5] < 0.02, f"median silent-servo read {sorted(times)[5] * 1e3:.1f} ms"
    arm.set_online(3, True)
    arm.set_pose_units([10.0, -20.0, 30.0, 15.0, 5.0, 40.0])
    assert follower.read_joints_ticks().tolist() == arm.present_ticks().tolist()
    assert follower.silent_ids == ()


# --- the daemon's 100 Hz loop on the virtual bench ------------------------------------------------
@contextmanager
def teleop_at_100hz(ep: EmulatorProcess, tmp_path: Path) -> Iterator[ControlLoop]:
    """Our loop at 100 Hz on the emulated bench, tracking the leader (stopped on exit)."""
    cfg = config_from_dict({"control": {"rate_hz": 100.0}, "socket": {"path": str(tmp_path / "unused.sock")}})
    leader = FeetechLeader(str(ep.leader_path), reference_calibration("leader"))
    follower = FeetechFollower(str(ep.follower_path), reference_calibration("follower"))
    loop = ControlLoop(leader, follower, cfg)
    loop.start()
    try:
        wait_for(lambda: loop.state.mode == "teleop", 30, "teleop")
        yield loop
    finally:
        loop.stop()


def _rate(ep: EmulatorProcess, loop: ControlLoop, rate: float, mode: str, seconds: float) -> tuple[float, int]:
    """Cycles per second over a measured wall interval, and samples seen in fault/disconnected."""
    ep.control({"cmd": "corrupt", "arm": "follower", "rate": rate, "mode": mode})
    try:
        c0 = loop.cycles
        t0 = time.monotonic()
        bad = 0
        while time.monotonic() - t0 < seconds:
            # the follower's faults; a hold for a stale *leader* (this loaded machine stalling the
            # clean leader's read) is not the follower's noise
            bad += loop.state.mode in ("fault", "disconnected")
            time.sleep(0.01)
        return (loop.cycles - c0) / (time.monotonic() - t0), bad
    finally:
        ep.control({"cmd": "corrupt", "arm": "follower", "rate": 0.0})


@pytest.mark.parametrize("mode", ["checksum"])
def test_a_100hz_loop_keeps_its_rate_with_2_percent_of_follower_packets_damaged(tmp_path: Path, mode: str):
    """The issue's measurement: 2 % of the follower's status packets damaged, the loop at 100 Hz
    (it fell to 63 Hz). Judged against a clean-bus run of the same loop, interleaved, so the load
    of this shared machine hits both; bench/bench_noisy_bus.py reports the absolute figures."""
    with EmulatorProcess(tmp_path, leader_motion="demo") as ep, teleop_at_100hz(ep, tmp_path) as loop:
        clean_hz, noisy_hz, off_teleop = [], [], 0
        for _ in range(6):  # short slices: this machine's load comes and goes over seconds
            clean_hz.append(_rate(ep, loop, 0.0, mode, 0.5)[0])
            hz, bad = _rate(ep, loop, 0.02, mode, 0.5)
            noisy_hz.append(hz)
            off_teleop += bad
        damaged = ep.control({"cmd": "stats", "arm": "follower"})["stats"]["corrupted_replies"]
        failures, errors = loop.follower_link.arm.counters.failures, loop.follower_errors
    # medians of the slices: a stall of this shared machine (overruns of ~100 ms happen under
    # the other engineers' tests) lands in one slice, clean or noisy, and must not decide
    clean, noisy = float(np.median(clean_hz)), float(np.median(noisy_hz))
    assert damaged >= 10, f"only {damaged} packets damaged: the test did not test noise"
    assert failures == 0 and errors == 0, f"{failures} failed reads, {errors} follower errors"
    assert off_teleop == 0, "the follower faulted or dropped during the noise"
    assert noisy >= 0.95 * clean, f"{noisy:.1f} Hz with noise vs {clean:.1f} Hz clean"


def test_a_servo_falling_silent_costs_the_100hz_loop_a_fault_not_its_cycles(tmp_path: Path):
    """elbow_flex stops answering mid-teleop: the loop names it as a fault and keeps cycling at
    close to its rate while it still holds the follower (before issue 12 each cycle spent 3 tries
    x 50 ms on the silent servo: ~4 cycles in the half second before the link was dropped)."""
    with EmulatorProcess(tmp_path, leader_motion="demo") as ep, teleop_at_100hz(ep, tmp_path) as loop:
        losses = loop.follower_link.losses
        ep.control({"cmd": "set_online", "arm": "follower", "joint": "elbow_flex", "online": False})
        c0, t0 = loop.cycles, time.monotonic()
        wait_for(lambda: "elbow_flex" in loop.fault_now, 10, "the silent servo named as a fault")
        wait_for(lambda: loop.follower_link.losses > losses, 10, "the follower link dropped")
        cycles, elapsed = loop.cycles - c0, time.monotonic() - t0
    assert cycles / elapsed >= 50, f"{cycles} cycles in {elapsed:.2f} s while a servo was silent"
