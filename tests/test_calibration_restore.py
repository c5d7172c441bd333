"""A calibration attempt that does not end in a saved calibration leaves the servos as it found them.

The operator's story: a follower calibrated last week (file on disk, servos holding it) is
recalibrated. The attempt changes the servos (factory offsets, limits 0..4095, torque off, EEPROM
unlocked); it is then rejected (a joint forgotten, a range across the encoder seam), aborted
('q', end of input, Ctrl-C) or broken by an exception. Every servo must then hold exactly what it
held before (the whole EEPROM, torque and Lock, read from the emulated servos themselves), and
`so101d calibrate follower --verify` must still pass against last week's file, since a follower
left with 0..4095 limits can be driven into itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from calibration.calibration_file import calibration_path, load_calibration_file, save_calibration_file
from calibration.conventions import JOINT_IDS, JOINT_NAMES, unit_limits
from daemon.apps.calibration_procedure import (
    CalibrationProcedureError,
    CalibrationRestoreError,
    CalibrationSession,
    Step,
)
from drivers.calibration_io import verify_against_servos
from drivers.emulator import BusEmulator, EmulatedArm
from drivers.feetech_bus import FeetechBus
from drivers.sts3215_table import CONTROL_TABLE, EEPROM_END

REPO = Path(__file__).resolve().parents[1]
MIDDLE = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 50.0])
ARM_ID = "lastweek"


def servo_state(arm: EmulatedArm) -> dict[str, bytes]:
    """What each servo holds that a calibration may touch: its whole EEPROM, torque and Lock."""
    out = {}
    for joint in JOINT_NAMES:
        s = arm.servo(joint)
        out[joint] = bytes(s.mem[:EEPROM_END]) + bytes([s.reg("Torque_Enable"), s.reg("Lock")])
    return out


def differences(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    names = {addr: name for name, (addr, _size) in CONTROL_TABLE.items()}
    diffs = []
    for joint in JOINT_NAMES:
        for i, (a, b) in enumerate(zip(before[joint], after[joint])):
            if a != b:
                what = names.get(i, f"byte {i}") if i < EEPROM_END else ("Torque_Enable", "Lock")[i - EEPROM_END]
                diffs.append(f"{joint} {what}: {a} -> {b}")
    return diffs


class CalibratedFollower:
    """An emulated follower calibrated earlier: its servos hold the calibration, its file exists."""

    def __init__(self, tmp_path: Path) -> None:
        self.arm = EmulatedArm("follower", preset="calibrated", initial_pose_units=MIDDLE)
        self.link = tmp_path / "follower.tty"
        self.emulator = BusEmulator(self.link, self.arm).start()
        self.root = tmp_path / "calibration"
        self.file = save_calibration_file(
            self.arm.eeprom_calibration(), calibration_path("follower", ARM_ID, self.root), keep_backup=False
        )
        self.bus = FeetechBus(str(self.link), retries=3, reply_margin_s=3.0)
        self.bus.open()
        self.before = servo_state(self.arm)

    def close(self) -> None:
        self.bus.close()
        self.emulator.stop()

    def pose(self, **joints: float) -> None:
        p = MIDDLE.copy()
        for name, value in joints.items():
            p[JOINT_NAMES.index(name)] = value
        self.arm.set_pose_units(p)

    def operator(self, session: CalibrationSession, skip: tuple[str, ...] = ()) -> None:
        """Middle pose, gripper closed then open, every joint but ``skip`` swept end to end."""
        session.begin()
        session.set_homing()
        self.pose(gripper=0.0)
        session.mark_gripper("closed")
        self.pose(gripper=100.0)
        session.mark_gripper("open")
        lo, hi = unit_limits(self.arm.reference)
        for name in JOINT_NAMES:
            if name == "wrist_roll" or name in skip:
                continue
            i = JOINT_NAMES.index(name)
            for v in np.concatenate([np.linspace(MIDDLE[i], lo[i], 6), np.linspace(lo[i], hi[i], 12)]):
                self.pose(**{name: float(v)})
                session.sample_ranges()
        self.pose()

    def assert_as_before(self) -> None:
        assert differences(self.before, servo_state(self.arm)) == []
        cal = load_calibration_file(self.file)
        assert verify_against_servos(self.bus, cal) == []


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[CalibratedFollower]:
    b = CalibratedFollower(tmp_path)
    yield b
    b.close()


# ---------------------------------------------------------------------------------------------
# the procedure (API)
# ---------------------------------------------------------------------------------------------
def test_the_attempt_changes_the_servos_and_a_forgotten_joint_puts_them_back(follower: CalibratedFollower) -> None:
    # One servo left unlocked, as LeRobot's disable_torque leaves it (Lock 0): the attempt locks
    # every EEPROM again after writing it, so putting things back must unlock that one again.
    follower.bus.write("Lock", JOINT_IDS["shoulder_pan"], 0)
    follower.before = servo_state(follower.arm)
    session = CalibrationSession(follower.bus, role="follower")
    session.begin()
    # The attempt really does change them (else this test would prove nothing).
    changed = differences(follower.before, servo_state(follower.arm))
    assert any("Max_Position_Limit" in d for d in changed) and any("Lock" in d for d in changed)
    assert all(s.reg("Lock") == 1 for s in follower.arm.servos)
    session.begin()
    session.set_homing()
    follower.pose(gripper=0.0)
    session.mark_gripper("closed")
    follower.pose(gripper=100.0)
    session.mark_gripper("open")
    for v in (-60.0, 60.0):  # every joint but wrist_flex goes end to end; wrist_flex barely moves
        follower.pose(shoulder_pan=v, shoulder_lift=v, elbow_flex=v, wrist_flex=v / 40, gripper=50 + v * 0.8)
        session.sample_ranges()
    with pytest.raises(CalibrationProcedureError) as exc:
        session.finish()
    assert "'wrist_flex' moved only" in str(exc.value)
    assert "previous offsets and limits" in str(exc.value)
    follower.assert_as_before()
    assert session.before is None  # nothing left to undo; begin() starts a new attempt


def test_a_range_across_the_seam_puts_the_servos_back(follower: CalibratedFollower) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    follower.operator(session)
    for ticks in (3000, 3600, 4090, 20, 300):  # wrist_flex's "middle" was half a turn off
        follower.arm.set_joint_ticks("wrist_flex", ticks)
        session.sample_ranges()
    with pytest.raises(CalibrationProcedureError, match="'wrist_flex' crossed the encoder's 4095/0 seam"):
        session.finish()
    follower.assert_as_before()


def test_an_exception_mid_attempt_puts_the_servos_back(follower: CalibratedFollower) -> None:
    with pytest.raises(RuntimeError, match="the operator's laptop"):
        with CalibrationSession(follower.bus, role="follower") as session:
            follower.operator(session)
            raise RuntimeError("the operator's laptop went to sleep")
    follower.assert_as_before()


def test_a_holding_follower_holds_again_where_it_now_is(follower: CalibratedFollower) -> None:
    for joint in JOINT_NAMES:
        follower.bus.write("Torque_Enable", JOINT_NAMES.index(joint) + 1, 1)
    follower.before = servo_state(follower.arm)
    with CalibrationSession(follower.bus, role="follower") as session:
        session.begin()
        session.set_homing()
        follower.pose(elbow_flex=30.0)  # moved by hand while limp
        session.sample_ranges()
    follower.assert_as_before()
    # Torque is back, holding the pose it was left in: no jump back to the old goal.
    time.sleep(0.2)
    assert follower.arm.pose_units()[JOINT_NAMES.index("elbow_flex")] == pytest.approx(30.0, abs=1.0)
    assert np.abs(follower.arm.goal_ticks() - follower.arm.present_ticks()).max() <= 2


def test_a_saved_calibration_is_not_undone(follower: CalibratedFollower) -> None:
    with CalibrationSession(follower.bus, role="follower", min_travel_ticks=100) as session:
        follower.operator(session)
        cal = session.finish()
        session.write(ARM_ID, root=follower.root)
    assert verify_against_servos(follower.bus, cal) == []
    assert load_calibration_file(follower.file) == cal
    assert session.restore() is False and session.step is Step.WRITTEN  # nothing left to undo
    assert verify_against_servos(follower.bus, cal) == []


def test_a_restore_that_cannot_finish_names_the_servo(follower: CalibratedFollower) -> None:
    session = CalibrationSession(follower.bus, role="follower")
    session.begin()
    follower.arm.set_online("wrist_roll", False)
    follower.bus.reply_margin_s = 0.05  # wrist_roll will not answer: fail fast
    with pytest.raises(CalibrationRestoreError) as exc:
        session.restore()
    msg = str(exc.value)
    assert "motor 'wrist_roll' (id 5)" in msg and "--verify" in msg
    assert "shoulder_pan" not in msg  # the others were put back
    after = servo_state(follower.arm)
    assert [d for d in differences(follower.before, after) if not d.startswith("wrist_roll")] == []


# ---------------------------------------------------------------------------------------------
# the CLI, as the operator runs it
# ---------------------------------------------------------------------------------------------
def _cli(follower: CalibratedFollower, *extra: str) -> subprocess.Popen:
    follower.bus.close()  # the CLI opens the port itself
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "calibrate",
            "follower",
            "--port",
            str(follower.link),
            "--id",
            ARM_ID,
            "--calibration-root",
            str(follower.root),
            *extra,
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def _wait_for(proc: subprocess.Popen, text: str, timeout_s: float = 30.0) -> None:
    seen = ""
    deadline = time.monotonic() + timeout_s
    while text not in seen:
        assert time.monotonic() < deadline, f"no {text!r}; got:\n{seen}"
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"CLI exited before {text!r}:\n{seen}\n{proc.stderr.read()}"  # type: ignore[union-attr]
        seen += line


def _type(proc: subprocess.Popen, text: str = "\n") -> None:
    proc.stdin.write(text)  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]


def _verify_cli(follower: CalibratedFollower) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "calibrate",
            "follower",
            "--verify",
            "--port",
            str(follower.link),
            "--id",
            ARM_ID,
            "--calibration-root",
            str(follower.root),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def _through_the_gripper(proc: subprocess.Popen, follower: CalibratedFollower) -> None:
    _wait_for(proc, "MIDDLE")
    _type(proc)
    _wait_for(proc, "CLOSE the gripper")
    follower.pose(gripper=0.0)
    _type(proc)
    _wait_for(proc, "OPEN the gripper")
    follower.pose(gripper=100.0)
    _type(proc)
    _wait_for(proc, "ENTIRE range")


def test_cli_a_forgotten_wrist_flex_is_rejected_and_verify_still_passes(follower: CalibratedFollower) -> None:
    proc = _cli(follower)
    _through_the_gripper(proc, follower)
    lo, hi = unit_limits(follower.arm.reference)
    for name in ("shoulder_pan", "shoulder_lift", "elbow_flex", "gripper"):  # wrist_flex forgotten
        i = JOINT_NAMES.index(name)
        for v in (lo[i], hi[i], MIDDLE[i]):
            follower.pose(**{name: float(v)})
            time.sleep(0.15)  # several 20 ms samples per pose, even on a loaded machine
    _type(proc)
    code, out, err = _finish(proc)
    assert code == 2, out + err
    assert "'wrist_flex' moved only" in err
    assert "previous offsets and limits" in err
    assert differences(follower.before, servo_state(follower.arm)) == []
    ok = _verify_cli(follower)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "the servos hold this calibration" in ok.stdout


def test_cli_ctrl_c_while_recording_ranges_puts_the_servos_back(follower: CalibratedFollower) -> None:
    proc = _cli(follower)
    _through_the_gripper(proc, follower)
    follower.pose(elbow_flex=-40.0)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    code, out, err = _finish(proc)
    assert code == 2, out + err
    assert "aborted (Ctrl-C)" in err and "put back as they were" in err
    assert "Traceback" not in err
    assert differences(follower.before, servo_state(follower.arm)) == []
    assert _verify_cli(follower).returncode == 0


def test_cli_q_at_a_prompt_puts_the_servos_back(follower: CalibratedFollower) -> None:
    proc = _cli(follower)
    _wait_for(proc, "MIDDLE")
    _type(proc)
    _wait_for(proc, "CLOSE the gripper")
    _type(proc, "q\n")
    code, out, err = _finish(proc)
    assert code == 2, out + err
    assert "aborted ('q' typed)" in err and "put back as they were" in err
    assert differences(follower.before, servo_state(follower.arm)) == []
    assert _verify_cli(follower).returncode == 0
