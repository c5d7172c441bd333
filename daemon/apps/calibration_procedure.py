"""The SO-101 calibration procedure as a step-driven API (the CLI in ``daemon.apps.commands.calibrate`` sits on top).

Same result as LeRobot 0.6.1's ``SOFollower.calibrate()`` / ``SOLeader.calibrate()`` (so LeRobot
connects to an arm we calibrated without asking anything), without its ``input()`` calls:

1. ``begin()``: torque off, position mode, Phase bit 4 cleared (positions stay in 0..4095,
   LR#3373), factory calibration (Homing_Offset 0, limits 0..4095), so Present_Position is the
   raw encoder angle. Every EEPROM write here and below goes through
   ``drivers.calibration_io.write_eeprom``: unlocked, written, locked again, read back.
2. The operator puts every joint in the middle of its range; ``set_homing()`` writes
   ``Homing_Offset = present - 2047`` (the servo reports ``actual - offset``), so that pose reads
   2047 and no joint range crosses the 4095/0 seam. The register is 11-bit sign-magnitude: the
   one raw position that would need 2048 (4095) gets 2047 and reads 2048 (LeRobot raises
   "Magnitude exceeds 2047" there, LR#1296).
3. The operator closes the gripper fully (``mark_gripper("closed")``), then opens it
   (``mark_gripper("open")``): this is how a gripper mounted reversed is caught here instead of
   at the first teleop (LR#3942). LeRobot's convention is 0 = closed = range_min; if "closed"
   reads at the high end, we set the gripper's drive_mode to 1, which LeRobot's RANGE_0_100 turns
   into ``100 - x`` so 0 still means closed (policy ``reversed_gripper="fail"`` refuses instead).
4. ``sample_ranges()`` (or ``record_ranges(duration_s)``) while the operator moves every joint
   except wrist_roll through its whole range; wrist_roll gets 0..4095 like LeRobot.
5. ``finish()`` validates (each joint moved enough, min < max, no joint crossed the encoder
   seam, gripper direction known) and returns the ArmCalibration; ``write()`` writes offsets and
   limits to the servos, reads them back, and saves the JSON atomically where LeRobot reads it.

Steps 1-4 change the servos (factory offsets, limits 0..4095, torque off). A
follower left with limits 0..4095 can be driven into itself, so an attempt that does not end in a
saved calibration puts every servo back exactly as ``begin()`` found it (``RESTORED_REGISTERS``,
read back and checked): ``finish()`` does so itself when it rejects the recording, ``write()`` when
the servos or the file cannot be written, and ``restore()`` (or leaving ``with session:``) does
so for an abort or any other exception.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Literal

from calibration.calibration_file import (
    ArmCalibration,
    CalibrationError,
    MotorCalibration,
    Role,
    calibration_path,
    save_calibration_file,
)
from calibration.conventions import GRIPPER_INDEX, JOINT_IDS, JOINT_NAMES, MAX_TICK
from drivers.calibration_io import ServoBus, reset_servo_calibration, write_eeprom, write_servo_calibration
from drivers.sts3215_table import MODEL_NUMBER_STS3215

log = logging.getLogger("calibration")

GRIPPER = JOINT_NAMES[GRIPPER_INDEX]
FULL_TURN_JOINTS: tuple[str, ...] = ("wrist_roll",)  # LeRobot hard-codes wrist_roll to 0..4095
HALF_TURN_TICKS = MAX_TICK // 2  # 2047, LeRobot's int(max_res / 2)
MAX_HOMING_OFFSET = 2047  # 11-bit magnitude of the sign-magnitude Homing_Offset register
# Crossing the encoder's 4095 -> 0 seam shows as a range reaching both ends of the turn: the
# samples on either side of the seam lie within one sample's motion of it. No SO-101 joint but
# wrist_roll (excluded) spans more than 360 deg - 2 x 22.5 deg, so a range within this margin of
# both ends has wrapped. This does not depend on how often (or how evenly) samples are taken.
SEAM_MARGIN_TICKS = 256

ReversedGripperPolicy = Literal["flip", "fail"]


class CalibrationProcedureError(CalibrationError):
    """The procedure cannot produce a usable calibration; the message says what to redo."""


class CalibrationRestoreError(CalibrationProcedureError):
    """The servos could not be put back as they were before the attempt (message names each one)."""


# What begin() changes, saved before its first write and put back by restore(). Order matters on
# the way back: EEPROM registers through calibration_io.write_eeprom (torque off, Lock 0, the
# registers, the Lock as found, read back), then torque.
EEPROM_RESTORED: tuple[str, ...] = (
    "Operating_Mode",
    "Phase",
    "Homing_Offset",
    "Min_Position_Limit",
    "Max_Position_Limit",
)
RESTORED_REGISTERS: tuple[str, ...] = ("Torque_Enable", "Lock", *EEPROM_RESTORED)


class Step(Enum):
    NEW = "new"
    BEGUN = "begun"
    HOMED = "homed"
    FINISHED = "finished"
    WRITTEN = "written"


@dataclass
class JointRange:
    """Extremes seen so far for one joint, in post-homing ticks."""

    min_ticks: int
    max_ticks: int
    last_ticks: int

    def update(self, ticks: int) -> None:
        self.last_ticks = ticks
        self.min_ticks = min(self.min_ticks, ticks)
        self.max_ticks = max(self.max_ticks, ticks)

    @property
    def crossed_seam(self) -> bool:
        return self.min_ticks < SEAM_MARGIN_TICKS and self.max_ticks > MAX_TICK - SEAM_MARGIN_TICKS

    @property
    def travel_ticks(self) -> int:
        return self.max_ticks - self.min_ticks


@dataclass
class CalibrationSession:
    """One calibration of one arm, driven step by step (no prompts, no printing).

    ``bus_or_arm`` is a FeetechBus (or anything with its read/write/sync_read/ping), or an
    object exposing one as ``.bus`` (an arm driver). ``min_travel_ticks`` is how far each ranged
    joint must have moved for ``finish()`` to accept it (default 200 ticks, about 18 degrees: a
    joint that moved less was forgotten, and its range would make teleop useless).
    """

    bus_or_arm: object
    role: Role = "follower"
    min_travel_ticks: int = 200
    reversed_gripper: ReversedGripperPolicy = "flip"
    check_model: bool = True
    step: Step = field(default=Step.NEW, init=False)
    homing_offsets: dict[str, int] = field(default_factory=dict, init=False)
    ranges: dict[str, JointRange] = field(default_factory=dict, init=False)
    gripper_marks: dict[str, int] = field(default_factory=dict, init=False)
    notes: list[str] = field(default_factory=list, init=False)
    samples: int = field(default=0, init=False)
    calibration: ArmCalibration | None = field(default=None, init=False)
    # Registers of every servo as begin() found them (motor -> register -> value); None once the
    # servos hold a saved calibration or have been restored (nothing left to undo).
    before: dict[str, dict[str, int]] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.role not in ("follower", "leader"):
            raise ValueError(f"role must be 'follower' or 'leader', got {self.role!r}")
        if self.reversed_gripper not in ("flip", "fail"):
            raise ValueError(f"reversed_gripper must be 'flip' or 'fail', got {self.reversed_gripper!r}")
        inner = getattr(self.bus_or_arm, "bus", None)
        self.bus: ServoBus = inner if inner is not None and hasattr(inner, "sync_read") else self.bus_or_arm  # type: ignore[assignment]
        self._ids = [JOINT_IDS[n] for n in JOINT_NAMES]

    # ------------------------------------------------------------------------------------------
    # steps
    # ------------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Torque off, position mode, angle feedback in 0..4095, factory offsets (EEPROM locked again)."""
        if self.check_model and hasattr(self.bus, "ping"):
            for name in JOINT_NAMES:
                model = self.bus.ping(JOINT_IDS[name])
                if model != MODEL_NUMBER_STS3215:
                    raise CalibrationProcedureError(
                        f"motor '{name}' (id {JOINT_IDS[name]}) reports model {model}, expected an STS3215 "
                        f"({MODEL_NUMBER_STS3215}); is this an SO-101 {self.role} bus?"
                    )
        if self.before is None:
            # Read everything before the first write: a servo that does not answer here fails
            # the attempt with nothing changed. (A begin() that starts over keeps the first
            # snapshot: that is still the state before the attempt.)
            self.before = self._read_registers()
        extra: dict[int, dict[str, int]] = {}
        for name in JOINT_NAMES:
            sid = JOINT_IDS[name]
            extra[sid] = {"Operating_Mode": 0}
            phase = int(self.bus.read("Phase", sid))
            if phase & 0x10:
                # Bit 4 switches the angle feedback to a mode that leaves 0..4095 (LR#3373).
                extra[sid]["Phase"] = phase & ~0x10
                self.notes.append(f"{name}: cleared Phase bit 4 (angle feedback mode)")
        problems = reset_servo_calibration(self.bus, extra)
        if problems:
            raise CalibrationProcedureError(
                "the servos did not keep the factory calibration (Homing_Offset 0, limits 0..4095):\n  "
                + "\n  ".join(problems)
            )
        self.homing_offsets.clear()
        self.ranges.clear()
        self.gripper_marks.clear()
        self.samples = 0
        self.calibration = None
        self.step = Step.BEGUN

    def set_homing(self) -> dict[str, int]:
        """Call with every joint in the middle of its range: make that pose read 2047 everywhere.

        Returns the offsets written (also in ``homing_offsets``).
        """
        self._require((Step.BEGUN,), "set_homing", "call begin() first")
        raw = self._read_positions()
        offsets: dict[str, int] = {}
        for name in JOINT_NAMES:
            ticks = raw[name]
            if not 0 <= ticks <= MAX_TICK:
                raise CalibrationProcedureError(
                    f"motor '{name}' (id {JOINT_IDS[name]}) reports position {ticks}, outside 0..{MAX_TICK}: "
                    "its angle feedback mode is not the standard one"
                )
            offset = ticks - HALF_TURN_TICKS
            if abs(offset) > MAX_HOMING_OFFSET:
                # Only raw 4095 gets here (offset 2048): one tick off centre is harmless.
                clamped = max(-MAX_HOMING_OFFSET, min(MAX_HOMING_OFFSET, offset))
                self.notes.append(
                    f"{name}: raw position {ticks} needs homing offset {offset}, beyond the register's "
                    f"+-{MAX_HOMING_OFFSET}; wrote {clamped} (the middle pose reads {ticks - clamped})"
                )
                offset = clamped
            offsets[name] = offset
        for name, offset in offsets.items():
            not_kept = write_eeprom(self.bus, JOINT_IDS[name], {"Homing_Offset": offset})
            if not_kept:
                raise CalibrationProcedureError(
                    f"motor '{name}' (id {JOINT_IDS[name]}) did not keep its homing offset: "
                    + ", ".join(nk.describe() for nk in not_kept)
                )
        self.homing_offsets = offsets
        self.step = Step.HOMED
        # The middle pose is the first sample of every range.
        self.sample_ranges()
        return dict(offsets)

    def mark_gripper(self, state: Literal["closed", "open"]) -> int:
        """Record the gripper's position now, with the operator holding it fully closed or open."""
        self._require((Step.HOMED,), "mark_gripper", "call set_homing() first")
        if state not in ("closed", "open"):
            raise ValueError(f"gripper state must be 'closed' or 'open', got {state!r}")
        positions = self.sample_ranges()
        self.gripper_marks[state] = positions[GRIPPER]
        return positions[GRIPPER]

    def sample_ranges(self) -> dict[str, int]:
        """Read every joint once and widen the recorded ranges; returns the positions (ticks)."""
        self._require((Step.HOMED,), "sample_ranges", "call set_homing() first")
        positions = self._read_positions()
        for name, ticks in positions.items():
            rng = self.ranges.get(name)
            if rng is None:
                self.ranges[name] = JointRange(ticks, ticks, ticks)
            else:
                rng.update(ticks)
        self.samples += 1
        return positions

    def record_ranges(
        self,
        duration_s: float,
        period_s: float = 0.02,
        should_stop: Callable[[], bool] | None = None,
        on_sample: Callable[[dict[str, int]], None] | None = None,
    ) -> int:
        """Sample every ``period_s`` for ``duration_s`` (or until ``should_stop()``); returns samples taken."""
        deadline = time.monotonic() + duration_s
        taken = 0
        next_at = time.monotonic()
        while time.monotonic() < deadline:
            positions = self.sample_ranges()
            taken += 1
            if on_sample is not None:
                on_sample(positions)
            if should_stop is not None and should_stop():
                break
            # Fixed schedule (a late wake-up is made up by the next sleep); after falling more
            # than a whole period behind, restart the schedule instead of bursting.
            next_at += period_s
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -period_s:
                next_at = time.monotonic()
        return taken

    def finish(self) -> ArmCalibration:
        """Validate what was recorded and build the calibration (nothing is written yet)."""
        self._require((Step.HOMED, Step.FINISHED), "finish", "call set_homing() and sample_ranges() first")
        problems: list[str] = []
        for name in JOINT_NAMES:
            if name in FULL_TURN_JOINTS:
                continue
            rng = self.ranges[name]
            if rng.crossed_seam:
                problems.append(
                    f"'{name}' crossed the encoder's 4095/0 seam (range {rng.min_ticks}..{rng.max_ticks}): "
                    "its middle pose was not the middle of its range; start again from a pose nearer the middle"
                )
            elif rng.travel_ticks < self.min_travel_ticks:
                problems.append(
                    f"'{name}' moved only {rng.travel_ticks} ticks ({rng.min_ticks}..{rng.max_ticks}, "
                    f"{rng.travel_ticks * 360 / 4096:.1f} deg); move it through its whole range "
                    f"(at least {self.min_travel_ticks} ticks)"
                )
        gripper_drive_mode = 0
        if not problems:
            gripper_drive_mode = self._gripper_drive_mode(problems)
        if problems:
            message = f"{self.role} calibration rejected:\n  " + "\n  ".join(problems)
            self._restore_after(message)
            raise CalibrationProcedureError(
                message + "\nThe servos hold their previous offsets and limits again (nothing was written)."
            )
        motors: dict[str, MotorCalibration] = {}
        for name in JOINT_NAMES:
            if name in FULL_TURN_JOINTS:
                lo, hi = 0, MAX_TICK
            else:
                lo, hi = self.ranges[name].min_ticks, self.ranges[name].max_ticks
            motors[name] = MotorCalibration(
                id=JOINT_IDS[name],
                drive_mode=gripper_drive_mode if name == GRIPPER else 0,
                homing_offset=self.homing_offsets[name],
                range_min=lo,
                range_max=hi,
            )
        cal = ArmCalibration.from_json_dict(
            ArmCalibration(motors).to_json_dict(), source=f"<new {self.role} calibration>"
        )
        self.calibration = cal
        self.step = Step.FINISHED
        return cal

    def write(
        self,
        arm_id: str,
        root: Path | None = None,
        path: Path | None = None,
        keep_backup: bool = True,
    ) -> Path:
        """Write offsets and limits to the servos (read back), then save the JSON atomically.

        The file goes to ``path`` if given, else LeRobot's location for this role and id under
        ``root`` (default: LeRobot's calibration root). The servos are written first: if that
        fails, no file claims a calibration the servos do not hold.
        """
        self._require((Step.FINISHED,), "write", "call finish() first")
        assert self.calibration is not None
        target = Path(path) if path is not None else calibration_path(self.role, arm_id, root)
        try:
            write_servo_calibration(self.bus, self.calibration)
            saved = save_calibration_file(self.calibration, target, keep_backup=keep_backup)
        except BaseException as exc:
            # No file claims this calibration: the servos must not hold it (nor the 0..4095
            # limits) either. The write's own error stays the one raised (a lost servo is still
            # a bus error); a failed restore is added to it as a note.
            try:
                self.restore()
            except CalibrationRestoreError as restore_exc:
                exc.add_note(str(restore_exc))
            raise
        self.before = None  # the servos and the file agree on the new calibration
        self.step = Step.WRITTEN
        log.info("%s calibration '%s' written to the servos and saved to %s", self.role, arm_id, saved)
        return saved

    def restore(self) -> bool:
        """Put every servo back as begin() found it, read back and checked; the session starts over.

        Returns False when there was nothing to undo (begin() never wrote, or the calibration was
        saved). Raises CalibrationRestoreError naming each servo that does not hold its previous
        values (every servo is tried, even after one fails).
        """
        before = self.before
        if before is None:
            return False
        self.step = Step.NEW
        self.calibration = None
        problems: list[str] = []
        for name in JOINT_NAMES:
            sid = JOINT_IDS[name]
            want = before[name]
            try:
                # EEPROM first (torque off, unlocked, written, its Lock as found, read back)...
                wrong = [
                    f"{nk.register} is {nk.held}, was {nk.written}"
                    for nk in write_eeprom(
                        self.bus, sid, {reg: want[reg] for reg in EEPROM_RESTORED}, lock_after=want["Lock"]
                    )
                ]
                if want["Torque_Enable"]:
                    # ...then torque, if it held a pose before: hold where the joint is now (the
                    # arm was moved by hand), not the stale goal, so torque coming back does not jump.
                    present = int(self.bus.read("Present_Position", sid))
                    self.bus.write("Goal_Position", sid, present)
                    self.bus.write("Torque_Enable", sid, want["Torque_Enable"])
                torque = int(self.bus.read("Torque_Enable", sid))
            except Exception as exc:
                problems.append(f"motor '{name}' (id {sid}): {type(exc).__name__}: {exc}")
                continue
            if torque != want["Torque_Enable"]:
                wrong.append(f"Torque_Enable is {torque}, was {want['Torque_Enable']}")
            if wrong:
                problems.append(f"motor '{name}' (id {sid}): " + ", ".join(wrong))
        if problems:
            raise CalibrationRestoreError(
                "could not put the servos back as they were before the calibration attempt "
                "(a follower may now allow 0..4095: do not teleoperate it; calibrate again, "
                "then check with `so101d calibrate ROLE --verify`):\n  " + "\n  ".join(problems)
            )
        self.before = None
        log.info("%s calibration attempt undone: the servos hold their previous registers", self.role)
        return True

    def __enter__(self) -> CalibrationSession:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # Leaving the block without a saved calibration (abort, Ctrl-C, any exception, or simply
        # not writing) undoes the attempt.
        if self.before is not None:
            self.restore()

    # ------------------------------------------------------------------------------------------
    # helpers
    # ------------------------------------------------------------------------------------------
    def _restore_after(self, why: str) -> None:
        """restore(), chaining a restore failure to the reason the attempt failed."""
        try:
            self.restore()
        except CalibrationRestoreError as exc:
            raise CalibrationRestoreError(f"{why}\n{exc}") from None

    def _read_registers(self) -> dict[str, dict[str, int]]:
        return {
            name: {reg: int(self.bus.read(reg, JOINT_IDS[name])) for reg in RESTORED_REGISTERS} for name in JOINT_NAMES
        }

    @property
    def gripper_reversed(self) -> bool | None:
        """True when the gripper closes towards high ticks; None until both marks are recorded."""
        if "closed" not in self.gripper_marks or "open" not in self.gripper_marks:
            return None
        return self.gripper_marks["closed"] > self.gripper_marks["open"]

    def _gripper_drive_mode(self, problems: list[str]) -> int:
        missing = [s for s in ("closed", "open") if s not in self.gripper_marks]
        if missing:
            problems.append(
                f"gripper direction unknown: no '{' and '.join(missing)}' position recorded "
                "(mark_gripper('closed') with the gripper fully closed, mark_gripper('open') fully open)"
            )
            return 0
        rng = self.ranges[GRIPPER]
        closed, opened = self.gripper_marks["closed"], self.gripper_marks["open"]
        # Both marks must sit near opposite ends of the recorded range, or the operator did not
        # close/open it fully and the direction (and range) cannot be trusted.
        if abs(opened - closed) < 0.5 * rng.travel_ticks:
            problems.append(
                f"gripper 'closed' ({closed}) and 'open' ({opened}) positions are less than half its range "
                f"({rng.min_ticks}..{rng.max_ticks}) apart: close it fully, then open it fully"
            )
            return 0
        if closed <= opened:
            return 0
        if self.reversed_gripper == "fail":
            problems.append(
                f"gripper mounted reversed: fully closed reads {closed} ticks, the high end of its range "
                f"{rng.min_ticks}..{rng.max_ticks} (LeRobot expects closed at the low end). Remount the gripper "
                "servo horn, or recalibrate allowing drive_mode 1"
            )
            return 0
        self.notes.append(
            f"gripper closes towards high ticks ({closed} closed, {opened} open): drive_mode 1 set so that "
            "0 still means closed"
        )
        return 1

    def _read_positions(self) -> dict[str, int]:
        raw = self.bus.sync_read("Present_Position", self._ids)
        missing = [n for n in JOINT_NAMES if JOINT_IDS[n] not in raw]
        if missing:
            raise CalibrationProcedureError(f"no position from motor(s) {', '.join(missing)}")
        return {n: int(raw[JOINT_IDS[n]]) for n in JOINT_NAMES}

    def _require(self, allowed: tuple[Step, ...], action: str, first: str) -> None:
        if self.step not in allowed:
            raise CalibrationProcedureError(
                f"{action}: not allowed at step '{self.step.value}'; {first} (begin() starts over)"
            )
