"""The calibration procedure against the STS3215 emulator, through our FeetechBus.

The emulated arm starts from the factory preset (Homing_Offset 0, limits 0..4095, Phase bit 4 set
on two servos, EEPROM locked). The test plays the operator: it puts the emulated arm in the middle
pose, closes and opens the gripper, and sweeps each joint while the session samples. Afterwards
LeRobot 0.6.1's own SOFollower / SOLeader must connect with the saved file without prompting.
"""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import connect_lerobot

from calibration.calibration_file import (
    ArmCalibration,
    MotorCalibration,
    calibration_path,
    load_calibration_file,
)
from calibration.conventions import GRIPPER_INDEX, JOINT_NAMES, ticks_to_units, unit_limits
from daemon.apps.calibration_procedure import CalibrationProcedureError, CalibrationSession
from drivers.arm_interface import BusTimeoutError
from drivers.calibration_io import CalibrationMismatchError, check_against_servos, verify_against_servos
from drivers.emulator import BusEmulator, EmulatedArm
from drivers.feetech_bus import FeetechBus
from drivers.sts3215_table import encode_sign_magnitude

MIDDLE = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 50.0])  # LeRobot units: every joint mid-range
REPO = Path(__file__).resolve().parents[1]
DEG_PER_TICK = 360.0 / 4095


class Bench:
    """An emulated factory-fresh arm on a pty, our bus on it, and operator moves."""

    def __init__(self, tmp_path: Path, role: str, reversed_gripper: bool = False) -> None:
        # reversed_gripper: a gripper servo mounted the other way round (the emulator's
        # gripper_reversed): closing the jaw turns the horn toward the high end of the range.
        self.arm = EmulatedArm(role, preset="factory", initial_pose_units=MIDDLE, gripper_reversed=reversed_gripper)  # type: ignore[arg-type]
        self.arm.set_pose_units(MIDDLE)
        self.link = tmp_path / f"{role}.tty"
        self.emulator = BusEmulator(self.link, self.arm).start()
        # Generous reply timeout: calibration is not time-critical, and on this shared machine the
        # whole test process is sometimes descheduled for most of a second.
        self.bus = FeetechBus(str(self.link), retries=3, reply_margin_s=3.0)
        self.bus.open()
        self.root = tmp_path / "calibration"

    def close(self) -> None:
        self.bus.close()
        self.emulator.stop()

    def pose(self, **joints: float) -> np.ndarray:
        p = MIDDLE.copy()
        for name, value in joints.items():
            p[JOINT_NAMES.index(name)] = value
        self.arm.set_pose_units(p)
        return p

    def sweep(self, session: CalibrationSession, joints: tuple[str, ...] = JOINT_NAMES, steps: int = 8) -> None:
        """Move each joint (but wrist_roll) mid -> lower limit -> upper limit -> mid, sampling all along."""
        lo, hi = unit_limits(self.arm.reference)
        for name in joints:
            if name == "wrist_roll":
                continue
            i = JOINT_NAMES.index(name)
            path = np.concatenate(
                [
                    np.linspace(MIDDLE[i], lo[i], steps),
                    np.linspace(lo[i], hi[i], 2 * steps),
                    np.linspace(hi[i], MIDDLE[i], steps),
                ]
            )
            for v in path:
                self.pose(**{name: float(v)})
                session.sample_ranges()

    def operator_run(self, session: CalibrationSession) -> ArmCalibration:
        session.begin()
        session.set_homing()
        self.pose(gripper=0.0)
        session.mark_gripper("closed")
        self.pose(gripper=100.0)
        session.mark_gripper("open")
        self.pose()
        self.sweep(session)
        return session.finish()


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[Bench]:
    b = Bench(tmp_path, "follower")
    yield b
    b.close()


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Bench]:
    b = Bench(tmp_path, "leader")
    yield b
    b.close()


def no_prompt(*args: object, **kwargs: object) -> str:
    raise AssertionError(f"input() was called: {args!r}")


def test_record_ranges_stops_when_asked(leader: Bench) -> None:
    session = CalibrationSession(leader.bus, role="leader")
    session.begin()
    session.set_homing()
    calls = iter(range(1000))
    taken = session.record_ranges(duration_s=30.0, period_s=0.001, should_stop=lambda: next(calls) >= 4)
    assert taken == 5


# ---------------------------------------------------------------------------------------------
# gripper direction (LR#3942)
# ---------------------------------------------------------------------------------------------
def test_a_reversed_gripper_gets_drive_mode_1_and_still_reads_0_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = Bench(tmp_path, "follower", reversed_gripper=True)
    try:
        session = CalibrationSession(bench.bus, role="follower")
        cal = bench.operator_run(session)
        assert session.gripper_reversed is True
        assert cal["gripper"].drive_mode == 1
        assert any("drive_mode 1" in n for n in session.notes)
        assert all(cal[n].drive_mode == 0 for n in JOINT_NAMES if n != "gripper")
        path = session.write("reversed", root=bench.root)
        # Our conventions: closed reads 0, open reads 100.
        bench.pose(gripper=0.0)
        assert ticks_to_units(bench.arm.present_ticks(), cal)[GRIPPER_INDEX] == pytest.approx(0.0, abs=0.2)
        bench.pose(gripper=100.0)
        assert ticks_to_units(bench.arm.present_ticks(), cal)[GRIPPER_INDEX] == pytest.approx(100.0, abs=0.2)
        bench.bus.close()
        # LeRobot honours the drive mode the same way.
        from lerobot.robots.so_follower import SOFollower, SOFollowerRobotConfig

        monkeypatch.setattr(builtins, "input", no_prompt)
        robot = connect_lerobot(
            lambda: SOFollower(SOFollowerRobotConfig(port=str(bench.link), id="reversed", calibration_dir=path.parent))
        )
        try:
            robot.bus.disable_torque()  # the operator moves the gripper by hand
            bench.pose(gripper=0.0)
            assert robot.get_observation()["gripper.pos"] == pytest.approx(0.0, abs=0.2)
            bench.pose(gripper=90.0)
            assert robot.get_observation()["gripper.pos"] == pytest.approx(90.0, abs=0.2)
        finally:
            robot.disconnect()
    finally:
        bench.close()


def test_a_reversed_gripper_can_be_refused(tmp_path: Path) -> None:
    bench = Bench(tmp_path, "follower", reversed_gripper=True)
    try:
        session = CalibrationSession(bench.bus, role="follower", reversed_gripper="fail")
        with pytest.raises(CalibrationProcedureError, match="gripper mounted reversed"):
            bench.operator_run(session)
        with pytest.raises(CalibrationProcedureError, match="write"):
            session.write("refused", root=bench.root)
        assert not calibration_path("follower", "refused", bench.root).exists()
    finally:
        bench.close()


def test_a_normal_gripper_keeps_drive_mode_0(leader: Bench) -> None:
    session = CalibrationSession(leader.bus, role="leader")
    cal = leader.operator_run(session)
    assert session.gripper_reversed is False
    assert cal["gripper"].drive_mode == 0
    # closed is the low end of the range.
    assert session.gripper_marks["closed"] == cal["gripper"].range_min


def test_gripper_direction_is_required(follower: Bench) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    session.begin()
    session.set_homing()
    follower.sweep(session)
    with pytest.raises(CalibrationProcedureError, match="gripper direction unknown"):
        session.finish()


def test_gripper_half_closed_is_rejected(follower: Bench) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    session.begin()
    session.set_homing()
    follower.pose(gripper=40.0)
    session.mark_gripper("closed")
    follower.pose(gripper=60.0)
    session.mark_gripper("open")
    follower.sweep(session)
    with pytest.raises(CalibrationProcedureError, match="less than half its range"):
        session.finish()


# ---------------------------------------------------------------------------------------------
# what the operator can get wrong
# ---------------------------------------------------------------------------------------------
def test_a_joint_that_did_not_move_is_named(follower: Bench) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    session.begin()
    session.set_homing()
    follower.pose(gripper=0.0)
    session.mark_gripper("closed")
    follower.pose(gripper=100.0)
    session.mark_gripper("open")
    follower.sweep(session, joints=("shoulder_pan", "shoulder_lift", "wrist_flex", "gripper"))
    with pytest.raises(CalibrationProcedureError) as exc:
        session.finish()
    msg = str(exc.value)
    assert "'elbow_flex' moved only 0 ticks" in msg
    assert "shoulder_pan" not in msg
    # Nothing reached the servos' limits or the disk.
    assert follower.arm.servo("elbow_flex").reg("Max_Position_Limit") == 4095
    assert not follower.root.exists()


def test_a_joint_that_crossed_the_encoder_seam_is_rejected(follower: Bench) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    session.begin()
    session.set_homing()
    follower.pose(gripper=0.0)
    session.mark_gripper("closed")
    follower.pose(gripper=100.0)
    session.mark_gripper("open")
    follower.pose()
    follower.sweep(session)
    # The operator's "middle" for wrist_flex was half a turn off: its range wraps 4095 -> 0.
    for ticks in (3000, 3600, 4090, 20, 300):
        follower.arm.set_joint_ticks("wrist_flex", ticks)
        session.sample_ranges()
    with pytest.raises(CalibrationProcedureError, match="'wrist_flex' crossed the encoder's 4095/0 seam"):
        session.finish()


def test_middle_pose_at_raw_4095_fits_the_sign_magnitude_offset(follower: Bench) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    session.begin()
    follower.arm.set_joint_ticks("elbow_flex", 4095)  # raw, offsets are 0 after begin()
    follower.arm.set_joint_ticks("wrist_flex", 0)
    offsets = session.set_homing()
    assert offsets["elbow_flex"] == 2047  # 4095 - 2047 = 2048 does not fit 11 bits
    assert offsets["wrist_flex"] == -2047
    assert follower.arm.present_ticks()[JOINT_NAMES.index("elbow_flex")] == 2048
    assert follower.arm.present_ticks()[JOINT_NAMES.index("wrist_flex")] == 2047
    assert any("elbow_flex" in n and "2048" in n for n in session.notes)


def test_steps_must_come_in_order(follower: Bench) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    with pytest.raises(CalibrationProcedureError, match="call begin\\(\\) first"):
        session.set_homing()
    with pytest.raises(CalibrationProcedureError, match="call set_homing\\(\\) first"):
        session.sample_ranges()
    session.begin()
    with pytest.raises(CalibrationProcedureError, match="call set_homing\\(\\) first"):
        session.mark_gripper("closed")
    with pytest.raises(CalibrationProcedureError, match="call finish\\(\\) first"):
        session.write("x", root=follower.root)
    session.set_homing()
    with pytest.raises(CalibrationProcedureError, match="set_homing"):
        session.set_homing()
    with pytest.raises(ValueError, match="'closed' or 'open'"):
        session.mark_gripper("half")  # type: ignore[arg-type]


def test_a_foreign_servo_model_is_refused(follower: Bench) -> None:
    follower.arm.servo("wrist_flex").set_register("Model_Number", 1030)
    session = CalibrationSession(follower.bus, role="follower")
    with pytest.raises(CalibrationProcedureError, match="motor 'wrist_flex' \\(id 4\\) reports model 1030"):
        session.begin()


def test_the_session_accepts_an_object_holding_the_bus(follower: Bench) -> None:
    class Holder:
        bus = follower.bus

    session = CalibrationSession(Holder(), role="follower")
    assert session.bus is follower.bus
    follower.operator_run(session)


def test_a_servo_lost_while_writing_leaves_no_file(follower: Bench) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    follower.operator_run(session)
    follower.arm.set_online("gripper", False)
    follower.bus.reply_margin_s = 0.05  # the gripper will not answer: fail fast
    with pytest.raises(BusTimeoutError):
        session.write("lost", root=follower.root)
    assert not calibration_path("follower", "lost", follower.root).exists()


def test_recalibrating_keeps_a_backup(follower: Bench) -> None:
    first = CalibrationSession(follower.bus, role="follower")
    cal1 = follower.operator_run(first)
    path = first.write("twice", root=follower.root)
    follower.pose()
    second = CalibrationSession(follower.bus, role="follower", min_travel_ticks=100)
    cal2 = follower.operator_run(second)
    second.write("twice", root=follower.root)
    assert load_calibration_file(path) == cal2
    assert load_calibration_file(path.with_name("twice.json.bak")) == cal1


# ---------------------------------------------------------------------------------------------
# file vs servos
# ---------------------------------------------------------------------------------------------
def test_verify_reports_each_mismatch_per_motor(follower: Bench) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    cal = follower.operator_run(session)
    path = session.write("verify", root=follower.root)
    assert verify_against_servos(follower.bus, cal) == []
    check_against_servos(follower.bus, cal, str(path))  # no error

    follower.arm.servo("elbow_flex").set_register("Max_Position_Limit", 3000)
    follower.arm.servo("shoulder_pan").set_register("Homing_Offset", encode_sign_magnitude(-5, 11))
    follower.arm.set_online("gripper", False)
    follower.bus.reply_margin_s = 0.05  # the gripper will not answer: fail fast
    mismatches = verify_against_servos(follower.bus, cal)
    by_motor = {m.motor: m for m in mismatches}
    assert set(by_motor) == {"elbow_flex", "shoulder_pan", "gripper"}
    assert by_motor["elbow_flex"].register == "Max_Position_Limit"
    assert (by_motor["elbow_flex"].servo_value, by_motor["elbow_flex"].file_value) == (
        3000,
        cal["elbow_flex"].range_max,
    )
    assert by_motor["shoulder_pan"].register == "Homing_Offset" and by_motor["shoulder_pan"].servo_value == -5
    assert "no answer" in by_motor["gripper"].describe()
    with pytest.raises(CalibrationMismatchError) as exc:
        check_against_servos(follower.bus, cal, str(path))
    msg = str(exc.value)
    assert str(path) in msg and "elbow_flex" in msg and "shoulder_pan" in msg and "gripper" in msg
    assert len(exc.value.mismatches) == 3


def test_verify_against_a_file_from_another_arm(follower: Bench) -> None:
    # The emulated follower's servos vs. a calibration made for some other arm.
    other = ArmCalibration({n: MotorCalibration(i + 1, 0, 0, 1000, 3000) for i, n in enumerate(JOINT_NAMES)})
    mismatches = verify_against_servos(follower.bus, other)
    assert {m.motor for m in mismatches} == set(JOINT_NAMES)


# ---------------------------------------------------------------------------------------------
# the CLI, as an operator runs it
# ---------------------------------------------------------------------------------------------
def _send(proc: subprocess.Popen, expect: str, reply: str = "\n", timeout_s: float = 20.0) -> str:
    """Wait for a prompt containing ``expect`` on the child's stdout, then type ``reply``."""
    seen = ""
    deadline = time.monotonic() + timeout_s
    while expect not in seen:
        assert time.monotonic() < deadline, f"no prompt {expect!r}; got:\n{seen}"
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"CLI exited before {expect!r}:\n{seen}\n{proc.stderr.read()}"  # type: ignore[union-attr]
        seen += line
    proc.stdin.write(reply)  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    return seen


def _cli(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "daemon.apps.cli", "calibrate", *args],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_cli_calibrates_then_verifies(leader: Bench) -> None:
    leader.bus.close()
    root = leader.root
    proc = _cli("leader", "--port", str(leader.link), "--id", "cli_leader", "--calibration-root", str(root))
    try:
        _send(proc, "MIDDLE")
        _send(proc, "CLOSE the gripper", reply="")
        leader.pose(gripper=0.0)
        proc.stdin.write("\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        _send(proc, "OPEN the gripper", reply="")
        leader.pose(gripper=100.0)
        proc.stdin.write("\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        _send(proc, "ENTIRE range", reply="")
        lo, hi = unit_limits(leader.arm.reference)
        for name in ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "gripper"):
            i = JOINT_NAMES.index(name)
            for v in (lo[i], hi[i], MIDDLE[i]):
                leader.pose(**{name: float(v)})
                time.sleep(0.15)  # several 20 ms samples per pose, even on a loaded machine
        proc.stdin.write("\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    path = root / "teleoperators/so_leader/cli_leader.json"
    assert f"saved to {path}" in out
    cal = load_calibration_file(path)
    assert cal["gripper"].drive_mode == 0
    assert leader.arm.eeprom_calibration().motors["elbow_flex"].range_max == cal["elbow_flex"].range_max

    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "calibrate",
            "leader",
            "--verify",
            "--port",
            str(leader.link),
            "--id",
            "cli_leader",
            "--calibration-root",
            str(root),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "the servos hold this calibration" in ok.stdout

    leader.arm.servo("wrist_flex").set_register("Min_Position_Limit", 5)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "calibrate",
            "leader",
            "--verify",
            "--port",
            str(leader.link),
            "--id",
            "cli_leader",
            "--calibration-root",
            str(root),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 1
    assert "motor 'wrist_flex' (id 4): Min_Position_Limit is 5 on the servo" in bad.stdout


def test_cli_aborts_cleanly_when_stdin_closes(follower: Bench) -> None:
    follower.bus.close()
    proc = _cli("follower", "--port", str(follower.link), "--id", "eof", "--calibration-root", str(follower.root))
    _send(proc, "MIDDLE", reply="")
    proc.stdin.close()  # type: ignore[union-attr]
    proc.wait(timeout=30)
    err = proc.stderr.read()  # type: ignore[union-attr]
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    assert proc.returncode == 2
    assert "aborted" in err and "nothing was written" in err
    assert not (follower.root / "robots/so_follower/eof.json").exists()


def test_cli_reports_a_missing_port(tmp_path: Path) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "calibrate",
            "follower",
            "--port",
            str(tmp_path / "nope"),
            "--calibration-root",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 3
    assert str(tmp_path / "nope") in res.stderr


def test_cli_rejects_a_bad_id(tmp_path: Path) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "calibrate",
            "follower",
            "--port",
            "/dev/null",
            "--id",
            "../x",
            "--calibration-root",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert "invalid arm id" in res.stderr


def test_json_written_is_lerobots_format(follower: Bench) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    follower.operator_run(session)
    path = session.write("fmt", root=follower.root)
    data = json.loads(path.read_text())
    assert list(data) == list(JOINT_NAMES)
    assert all(set(v) == {"id", "drive_mode", "homing_offset", "range_min", "range_max"} for v in data.values())


def test_port_guess_prefers_the_udev_name_then_a_single_adapter(tmp_path: Path) -> None:
    from calibration.calibration_file import CalibrationError
    from daemon.apps.commands.calibrate import _guess_port

    dev = tmp_path / "dev"
    dev.mkdir()
    with pytest.raises(CalibrationError, match="no serial adapter found for the leader"):
        _guess_port("leader", dev)
    (dev / "ttyACM0").touch()
    assert _guess_port("leader", dev) == str(dev / "ttyACM0")
    (dev / "ttyUSB3").touch()
    with pytest.raises(CalibrationError, match="several serial ports found .*ttyACM0.*ttyUSB3"):
        _guess_port("leader", dev)
    (dev / "so101-leader").touch()
    assert _guess_port("leader", dev) == str(dev / "so101-leader")


def test_live_table_redraws_in_place_on_a_terminal(follower: Bench) -> None:
    import io

    from daemon.apps.commands.calibrate import _LiveTable

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    session = CalibrationSession(follower.bus, role="follower")
    session.begin()
    session.set_homing()
    out = Tty()
    table = _LiveTable(out)
    for _ in range(10):
        table.show(session, session.sample_ranges())
    text = out.getvalue()
    assert text.count("shoulder_pan") == 2  # drawn every 5th sample
    assert "\x1b[7F" in text  # the second drawing moves up over the first (header + 6 joints)
    assert "(full turn)" in text
    silent = io.StringIO()
    quiet = _LiveTable(silent)
    quiet.show(session, session.sample_ranges())
    assert silent.getvalue() == ""


def test_our_leader_driver_reads_the_new_calibration_without_mismatch(leader: Bench) -> None:
    from drivers.feetech_arm import FeetechLeader

    session = CalibrationSession(leader.bus, role="leader")
    leader.operator_run(session)
    path = session.write("driver_check", root=leader.root)
    leader.bus.close()
    arm = FeetechLeader(str(leader.link), load_calibration_file(path))
    arm.connect()
    try:
        assert arm.calibration_mismatches == []
        pose = leader.pose(shoulder_pan=-50.0, elbow_flex=35.0, gripper=10.0)
        np.testing.assert_allclose(arm.read_joints()[:GRIPPER_INDEX], pose[:GRIPPER_INDEX], atol=2 * DEG_PER_TICK)
        assert abs(arm.read_joints()[GRIPPER_INDEX] - 10.0) < 0.2
    finally:
        arm.close()
