"""The calibration as the servos hold it: read it back, write it, compare it with a file.

An STS3215 keeps its part of the calibration in EEPROM: Homing_Offset (the servo reports
``Present_Position = actual - Homing_Offset``) and Min/Max_Position_Limit (it clamps goals to
them). drive_mode is LeRobot software only and lives in the JSON file alone.

LeRobot's ``connect()`` compares these registers with the file and, on a mismatch, stops at
``input()``. We never do that: ``verify_against_servos`` reports every difference, per motor,
and the caller decides (the CLI prints it, the daemon refuses to start teleoperation).

The bus is anything with the agreed ``FeetechBus`` methods (``read``/``write`` by register name
and servo id, sign-magnitude decoded by the bus); see ``ServoBus``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from calibration.calibration_file import ArmCalibration, CalibrationError, MotorCalibration
from calibration.conventions import JOINT_NAMES
from drivers.arm_interface import ArmError

# Registers that hold the calibration, with the MotorCalibration field each one stores.
CALIBRATION_REGISTERS: tuple[tuple[str, str], ...] = (
    ("Homing_Offset", "homing_offset"),
    ("Min_Position_Limit", "range_min"),
    ("Max_Position_Limit", "range_max"),
)


class ServoBus(Protocol):
    """The subset of drivers.feetech_bus.FeetechBus that calibration needs."""

    def read(self, register_name: str, servo_id: int) -> int: ...

    def write(self, register_name: str, servo_id: int, value: int) -> None: ...

    def sync_read(self, register_name: str, ids: list[int]) -> dict[int, int]: ...


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


def read_servo_calibration(bus: ServoBus, ids: dict[str, int] | None = None) -> dict[str, dict[str, int]]:
    """Homing_Offset and position limits of every servo, keyed by motor name then field name.

    Raises the bus's ArmError if a servo does not answer.
    """
    ids = ids or {name: i + 1 for i, name in enumerate(JOINT_NAMES)}
    out: dict[str, dict[str, int]] = {}
    for motor, servo_id in ids.items():
        out[motor] = {field: int(bus.read(reg, servo_id)) for reg, field in CALIBRATION_REGISTERS}
    return out


def write_servo_calibration(bus: ServoBus, cal: ArmCalibration, relock: bool = True) -> None:
    """Write offsets and limits to every servo's EEPROM, then read them back.

    EEPROM writes are saved only with Lock 0 (LeRobot's disable_torque writes Torque_Enable 0
    then Lock 0, and we do the same: with Lock 1 a real STS3215 applies the write but does not
    save it, so the calibration would be gone at the next power-off). Torque must be off anyway
    while the offset changes, or the servo would jump to a goal now expressed in other ticks.
    With ``relock`` the EEPROM is locked again afterwards (the power-on state), so a stray write
    later cannot change the calibration. Raises CalibrationMismatchError if a value did not stick.
    """
    for motor in JOINT_NAMES:
        m = cal[motor]
        bus.write("Torque_Enable", m.id, 0)
        bus.write("Lock", m.id, 0)
        bus.write("Homing_Offset", m.id, m.homing_offset)
        bus.write("Min_Position_Limit", m.id, m.range_min)
        bus.write("Max_Position_Limit", m.id, m.range_max)
    mismatches = verify_against_servos(bus, cal)
    if relock:
        for motor in JOINT_NAMES:
            bus.write("Lock", cal[motor].id, 1)
    if mismatches:
        lines = "\n  ".join(m.describe() for m in mismatches)
        raise CalibrationMismatchError(f"the servos did not keep the calibration just written:\n  {lines}", mismatches)


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
