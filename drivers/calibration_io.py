"""The calibration as the servos hold it: read it, write it, compare it with a file.

This is the one place that reads and writes the calibration registers; the arm driver
(``FeetechArm.read_calibration`` / ``write_calibration`` / ``reset_calibration``), the calibration
procedure (its factory reset, homing offsets, final write and restore), ``so101d calibrate`` and
``so101d doctor`` all call it. LeRobot keeps the same job on its motors bus.

An STS3215 keeps its part of the calibration in EEPROM: Homing_Offset (the servo reports
``Present_Position = actual - Homing_Offset``) and Min/Max_Position_Limit (it clamps goals to
them). drive_mode is LeRobot software only and lives in the JSON file alone.

Every EEPROM write goes through ``write_eeprom``: torque off and Lock 0 (LeRobot's
``disable_torque``; with Lock 1 a real STS3215 applies an EEPROM write but does not save it, so it
would be gone at the next power-off, and torque must be off anyway while an offset changes or the
servo would jump to a goal now expressed in other ticks), the writes, Lock again, then a read-back
of every value written and of the Lock: a servo acknowledges writes it does not keep.

LeRobot's ``connect()`` compares these registers with the file and, on a mismatch, stops at
``input()``. We never do that: ``verify_against_servos`` reports every difference, per motor,
and the caller decides (the CLI prints it, the daemon refuses to start teleoperation).

The bus is anything with the agreed ``FeetechBus`` methods (``read``/``write`` by register name
and servo id, sign-magnitude decoded by the bus); see ``ServoBus``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from calibration.calibration_file import ArmCalibration, CalibrationError, MotorCalibration
from calibration.conventions import JOINT_IDS, JOINT_NAMES, MAX_TICK
from drivers.arm_interface import ArmError

# Registers that hold the calibration, with the MotorCalibration field each one stores.
CALIBRATION_REGISTERS: tuple[tuple[str, str], ...] = (
    ("Homing_Offset", "homing_offset"),
    ("Min_Position_Limit", "range_min"),
    ("Max_Position_Limit", "range_max"),
)
# As a new servo leaves the factory, and as LeRobot sets it before calibrating: the servo then
# reports its raw encoder angle over the whole turn.
FACTORY_CALIBRATION: dict[str, int] = {"Homing_Offset": 0, "Min_Position_Limit": 0, "Max_Position_Limit": MAX_TICK}
EEPROM_UNLOCKED = 0
EEPROM_LOCKED = 1  # the power-on state: a stray write later cannot change what was saved


class ServoBus(Protocol):
    """The subset of drivers.feetech_bus.FeetechBus that calibration needs."""

    def read(self, register_name: str, servo_id: int) -> int: ...

    def write(self, register_name: str, servo_id: int, value: int) -> None: ...

    def sync_read(self, register_name: str, ids: list[int]) -> dict[int, int]: ...


@dataclass(frozen=True)
class NotKept:
    """A register a servo acknowledged but does not hold (read back after ``write_eeprom``)."""

    register: str
    written: int
    held: int

    def describe(self) -> str:
        return f"{self.register} is {self.held}, was written {self.written}"


def write_eeprom(
    bus: ServoBus, servo_id: int, values: Mapping[str, int], *, lock_after: int = EEPROM_LOCKED
) -> list[NotKept]:
    """Write EEPROM registers of one servo: torque off, unlock, write, lock, read back.

    ``lock_after`` is the Lock left behind (locked unless a caller restores a servo that was
    found unlocked). Returns every value (the Lock included) the servo does not hold afterwards,
    empty when all were kept; a servo that does not answer raises the bus's ArmError.
    """
    bus.write("Torque_Enable", servo_id, 0)
    bus.write("Lock", servo_id, EEPROM_UNLOCKED)
    for reg, value in values.items():
        bus.write(reg, servo_id, value)
    bus.write("Lock", servo_id, lock_after)
    wanted = {**values, "Lock": lock_after}
    held = {reg: int(bus.read(reg, servo_id)) for reg in wanted}
    return [NotKept(reg, wanted[reg], held[reg]) for reg in wanted if held[reg] != wanted[reg]]


class CalibrationMismatchError(CalibrationError):
    """The servos do not hold the calibration a file describes (message names file and motors)."""

    def __init__(self, message: str, mismatches: list[ServoMismatch]) -> None:
        super().__init__(message)
        self.mismatches = mismatches


@dataclass(frozen=True)
class ServoMismatch:
    """One difference between a calibration file and a servo."""

    motor: str
    servo_id: int
    register: str  # control-table register name, or "" when the servo did not answer
    file_value: int | None
    servo_value: int | None
    detail: str = ""

    def describe(self) -> str:
        if not self.register:
            return f"motor '{self.motor}' (id {self.servo_id}): {self.detail}"
        return (
            f"motor '{self.motor}' (id {self.servo_id}): {self.register} is {self.servo_value} on the servo, "
            f"{self.file_value} in the file"
        )


def read_servo_calibration(bus: ServoBus, drive_modes: Mapping[str, int] | None = None) -> ArmCalibration:
    """The calibration the servos hold. drive_mode lives only in the file: taken from
    ``drive_modes`` (motor -> mode) or 0. Raises the bus's ArmError if a servo does not answer."""
    motors: dict[str, MotorCalibration] = {}
    for motor in JOINT_NAMES:
        sid = JOINT_IDS[motor]
        held = {field: int(bus.read(reg, sid)) for reg, field in CALIBRATION_REGISTERS}
        motors[motor] = MotorCalibration(id=sid, drive_mode=(drive_modes or {}).get(motor, 0), **held)
    return ArmCalibration(motors)


def write_servo_calibration(bus: ServoBus, cal: ArmCalibration) -> None:
    """Write offsets and limits to every servo's EEPROM (``write_eeprom``: unlocked, written,
    locked again, read back). Torque stays off. Raises CalibrationMismatchError naming every
    motor and register that did not stick; every servo is written even after one fails."""
    mismatches: list[ServoMismatch] = []
    for motor in JOINT_NAMES:
        m = cal[motor]
        values = {reg: int(getattr(m, field)) for reg, field in CALIBRATION_REGISTERS}
        for nk in write_eeprom(bus, m.id, values):
            mismatches.append(ServoMismatch(motor, m.id, nk.register, nk.written, nk.held))
    if mismatches:
        lines = "\n  ".join(m.describe() for m in mismatches)
        raise CalibrationMismatchError(f"the servos did not keep the calibration just written:\n  {lines}", mismatches)


def reset_servo_calibration(bus: ServoBus, extra: Mapping[int, Mapping[str, int]] | None = None) -> list[str]:
    """Factory calibration on every servo (Homing_Offset 0, limits 0..4095), as LeRobot does
    before calibrating, with ``extra`` EEPROM registers per servo id written alongside (the
    procedure's position mode and Phase). Returns "motor (id): what was not kept" lines."""
    problems: list[str] = []
    for motor in JOINT_NAMES:
        sid = JOINT_IDS[motor]
        values = {**(extra or {}).get(sid, {}), **FACTORY_CALIBRATION}
        not_kept = write_eeprom(bus, sid, values)
        if not_kept:
            problems.append(f"motor '{motor}' (id {sid}): " + ", ".join(nk.describe() for nk in not_kept))
    return problems


def verify_against_servos(bus: ServoBus, cal: ArmCalibration, raise_on_no_answer: bool = False) -> list[ServoMismatch]:
    """Every difference between ``cal`` and what the servos hold, per motor; empty when they agree.

    Never prompts and never writes. A servo that does not answer is reported as a mismatch of
    its own (the other servos are still checked), unless ``raise_on_no_answer``: then the bus's
    ArmError propagates (a driver's connect() must fail, and a vanished port stay a PortGoneError).
    """
    mismatches: list[ServoMismatch] = []
    for motor in JOINT_NAMES:
        m: MotorCalibration = cal[motor]
        for reg, field in CALIBRATION_REGISTERS:
            expected = int(getattr(m, field))
            try:
                held = int(bus.read(reg, m.id))
            except ArmError as exc:
                if raise_on_no_answer:
                    raise
                mismatches.append(ServoMismatch(motor, m.id, "", expected, None, f"no answer reading {reg}: {exc}"))
                break
            if held != expected:
                mismatches.append(ServoMismatch(motor, m.id, reg, expected, held))
    return mismatches


def check_against_servos(bus: ServoBus, cal: ArmCalibration, source: str) -> None:
    """Raise CalibrationMismatchError naming ``source`` and each motor if the servos disagree."""
    mismatches = verify_against_servos(bus, cal)
    if mismatches:
        lines = "\n  ".join(m.describe() for m in mismatches)
        raise CalibrationMismatchError(
            f"{source}: the servos hold a different calibration than this file "
            f"(recalibrate with `so101d calibrate`, or write this file to the servos):\n  {lines}",
            mismatches,
        )
