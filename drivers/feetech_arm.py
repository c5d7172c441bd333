"""Our SO-101 arm driver: six STS3215 servos on one Feetech bus, in LeRobot 0.6.1 units.

``FeetechLeader`` (the arm moved by hand, torque off) and ``FeetechFollower`` (the arm that follows)
implement ``drivers.arm_interface.LeaderArm`` / ``FollowerArm`` on ``drivers.feetech_bus``
(see its docstring for why we do not go through scservo_sdk / FeetechMotorsBus).

How this differs from LeRobot 0.6.1's SOFollower / SOLeader, and why:

* ``connect()`` never calls ``input()``. It opens the port, checks every servo (id answers, model
  777, one firmware version for all) and raises ``HandshakeError`` naming the joint, its id and the
  port; then configures the servos with LeRobot's values (Return_Delay_Time 0,
  Maximum_Acceleration 254, Acceleration 254, Phase bit 4 cleared, Operating_Mode 0, follower
  P 16 / I 0 / D 32, gripper Max_Torque_Limit 500, Protection_Current 250, Overload_Torque 25).
  A calibration stored in the servos that differs from the file is *reported*
  (``calibration_mismatches``) and logged, never silently overwritten: the caller decides
  (``write_calibration``), because writing EEPROM is the calibration procedure's job.
* Configuration distinguishes registers that matter for safety (limits, offsets, torque caps,
  Phase, Operating_Mode, the gains) from those that only tune timing (Return_Delay_Time,
  Maximum_Acceleration, Acceleration). Real servos do not all keep the latter: third-party STS
  tables list 85 as factory (read-only) and clamp Return_Delay_Time below 50; LeRobot writes them
  and never checks. A refused timing register is a warning (logged, ``configure_warnings``, in the
  daemon's status); a refused safety register fails ``connect`` naming joint and register.
* The gripper's torque cap goes to Torque_Limit (48) as well as Max_Torque_Limit (16): the real
  servo caps at 48 and only seeds it from 16 at power-on, so writing 16 alone (as LeRobot does)
  leaves the gripper at 100 % torque until the next power cycle (LR#3942).
* A servo whose overload protection latched refuses torque until its power is cycled (real
  STS3215s keep the bit through Torque_Enable writes, and may stop answering): ``set_torque(True)``
  checks Torque_Enable afterwards and raises ``OverloadLatchedError`` saying exactly that.
* Configuration reads first and writes only registers that differ. EEPROM has a limited number of
  writes, and an EEPROM write needs Lock 0, which LeRobot ties to torque off: rewriting unchanged
  registers on every reconnect would drop a holding follower for nothing.
* The follower ends ``connect()`` with torque as it found it (LeRobot switches it on inside
  ``configure``). ``set_torque(True)`` first sets every Goal_Position to the present position, so
  enabling torque never jumps to a stale goal (the gear-stripping jump at t=0, IsaacTeleop#730).
* One sync read per control cycle; health registers (40..70) in one more sync read at the
  caller's lower rate; goals in one sync write, clamped to the calibrated range, NaN/inf refused
  with ValueError before anything reaches the bus.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from calibration.calibration_file import ArmCalibration
from calibration.conventions import (
    GRIPPER_INDEX,
    JOINT_IDS,
    JOINT_NAMES,
    MAX_TICK,
    NUM_JOINTS,
    BodyMode,
    ticks_to_units,
    unit_limits,
    units_to_ticks,
)
from drivers.arm_interface import (
    ArmError,
    ArmHealth,
    BusCounters,
    BusDiagnostics,
    BusTimeoutError,
    HandshakeError,
    OverloadLatchedError,
    PortGoneError,
    ServoHealth,
)
from drivers.calibration_io import (
    CalibrationMismatchError,
    read_servo_calibration,
    reset_servo_calibration,
    verify_against_servos,
    write_servo_calibration,
)
from drivers.feetech_bus import (
    DEFAULT_REPLY_MARGIN_S,
    DEFAULT_RETRIES,
    FeetechBus,
    ServoNoReplyError,
    decode_value,
    is_pseudo_terminal,
)
from drivers.servo_setup import diagnose_lone_id_one
from drivers.sts3215_table import CONTROL_TABLE, ERR_OVERCURRENT, ERR_OVERLOAD, MODEL_NUMBER_STS3215

log = logging.getLogger("drivers.feetech_arm")

JOINT_ID_LIST: tuple[int, ...] = tuple(JOINT_IDS[n] for n in JOINT_NAMES)
NAME_BY_ID: dict[int, str] = {JOINT_IDS[n]: n for n in JOINT_NAMES}

# Health block: Torque_Enable (40) .. Present_Current (69, 2 bytes) in one sync read.
HEALTH_START = CONTROL_TABLE["Torque_Enable"][0]
HEALTH_END = CONTROL_TABLE["Present_Current"][0] + CONTROL_TABLE["Present_Current"][1]
HEALTH_LEN = HEALTH_END - HEALTH_START
CURRENT_MA_PER_UNIT = 6.5  # STS3215 Present_Current unit (Feetech: 6.5 mA)
PHASE_ANGLE_FEEDBACK_BIT = 0x10  # LeRobot clears it so positions stay in 0..4095 (LR#3373)
# Registers that only tune timing: a servo that does not keep our value still works safely, so a
# refusal is a warning, not a failed connect (see the module docstring).
TIMING_REGISTERS = frozenset({"Return_Delay_Time", "Maximum_Acceleration", "Acceleration"})
# Third-party STS tables: Return_Delay_Time below 50 (100 us) reads 50. A servo already at or
# under that floor is left alone: rewriting it (EEPROM: torque off) on every daemon start would
# drop a holding follower for nothing.
RETURN_DELAY_FLOOR = 50


def _settled(reg: str, held: int, want: int) -> bool:
    """A timing register that is as close to ``want`` as real servos allow."""
    return reg == "Return_Delay_Time" and want < RETURN_DELAY_FLOOR and held <= RETURN_DELAY_FLOOR


LATCHING_ERRORS = ERR_OVERLOAD | ERR_OVERCURRENT


def power_cycle_message(joints: list[str], silent: list[str] | None = None) -> str:
    """What the operator reads: which joint, and that the arm's power must be cycled."""
    names = ", ".join(joints)
    quiet = f" ({', '.join(silent)} no longer answering)" if silent else ""
    return f"{names} overload latched{quiet}: power-cycle the arm"


def describe_joint(servo_id: int) -> str:
    name = NAME_BY_ID.get(servo_id)
    return f"'{name}' (id {servo_id})" if name else f"id {servo_id}"


@dataclass
class BusConfig:
    """Settings shared by leader and follower buses (LeRobot 0.6.1 defaults)."""

    baudrate: int = 1_000_000
    retries: int = DEFAULT_RETRIES  # extra tries per transaction before BusTimeoutError
    reply_margin_s: float = DEFAULT_REPLY_MARGIN_S  # reply time allowed beyond wire time
    return_delay_time: int = 0  # 2 us units; factory 250 (500 us), LeRobot writes 0
    maximum_acceleration: int = 254
    acceleration: int = 254
    expected_model: int = MODEL_NUMBER_STS3215
    expected_firmware: tuple[int, int] | None = None  # (major, minor) to require; None: all servos equal
    body_mode: BodyMode = "degrees"
    reconnect_timeout_s: float = 5.0


@dataclass
class FollowerBusConfig(BusConfig):
    """Follower settings; defaults are LeRobot 0.6.1's SOFollower configure()."""

    p_coefficient: int = 16
    i_coefficient: int = 0
    d_coefficient: int = 32
    gripper_max_torque_limit: int = 500  # 50 % of max torque: the gripper overloads otherwise (LR#3942)
    gripper_protection_current: int = 250
    gripper_overload_torque: int = 25
    disable_torque_on_close: bool = True  # as LeRobot's disconnect(); best effort


@dataclass
class LeaderBusConfig(BusConfig):
    """Leader settings (torque always off: the operator moves it by hand)."""


@dataclass
class _Desired:
    """Register values ``configure`` wants on one servo, EEPROM ones kept apart."""

    eeprom: dict[str, int] = field(default_factory=dict)
    sram: dict[str, int] = field(default_factory=dict)


class _FeetechArm:
    role = "arm"

    def __init__(self, port: str, calibration: ArmCalibration | None, config: BusConfig) -> None:
        self.port = port
        self.calibration = calibration
        self.config = config
        self.bus = FeetechBus(port, config.baudrate, retries=config.retries, reply_margin_s=config.reply_margin_s)
        self.firmware: tuple[int, int] | None = None
        self.calibration_mismatches: list[str] = []
        # Timing registers a servo did not keep (joint, register, wanted, reads): reported, not fatal.
        self.configure_warnings: list[str] = []
        self._refused: dict[tuple[int, str], int] = {}  # (id, register) -> value it holds instead
        self.torque_enabled: bool | None = None  # as last read or commanded; None: unknown
        self.last_goal_ticks: np.ndarray | None = None  # the last Goal_Position sync-written
        self.silent_ids: tuple[int, ...] = ()  # servos silent at the last position read (others answered)
        self._missing_ids: tuple[int, ...] = ()  # silent at the last handshake or read (status, probe_missing)
        self._connected = False

    # ------------------------------------------------------------------------------------------
    @property
    def counters(self) -> BusCounters:
        return self.bus.counters

    @property
    def is_connected(self) -> bool:
        return self._connected and self.bus.is_open

    def diagnostics(self) -> BusDiagnostics:
        return BusDiagnostics(
            latency_timer_ms=self.bus.latency_timer_ms,
            configure_warnings=tuple(self.configure_warnings),
            counters=self.bus.counters,
        )

    def missing_servos(self) -> tuple[str, ...]:
        """Joints silent at the last handshake or position read (no bus traffic)."""
        return tuple(NAME_BY_ID[s] for s in self._missing_ids)

    def probe_missing(self) -> tuple[str, ...]:
        """Ping only the servos that were missing, once each and without retries (a few hundred
        microseconds per servo at 1 Mbaud), opening the port for it if a failed connect closed
        it; the joints still silent. The reconnect thread calls this between its full attempts,
        so a servo that comes back is seen within one probe period, not after the backoff."""
        if not self._missing_ids:
            return ()
        opened = not self.bus.is_open
        if opened:
            self.bus.open()
        try:
            still: list[int] = []
            for sid in self._missing_ids:
                try:
                    self.bus.ping(sid, retries=0)
                except BusTimeoutError:
                    still.append(sid)
            self._missing_ids = tuple(still)
        finally:
            if opened:
                self.bus.close()
        return self.missing_servos()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.port!r})"

    # ------------------------------------------------------------------------------------------
    # connect / handshake / configure
    # ------------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Open, handshake, configure. Never blocks on input; raises ArmError subclasses."""
        self.bus.open()
        try:
            self.handshake()
            self.configure()
            self.calibration_mismatches = self._compare_calibration()
            if self.calibration_mismatches:
                log.warning(
                    "%s on %s: calibration in the servos differs from the file (%s); "
                    "run the calibration or write it with write_calibration()",
                    self.role,
                    self.port,
                    "; ".join(self.calibration_mismatches),
                )
        except BaseException:
            self.bus.close()
            raise
        self._connected = True

    def _lone_id_one_hint(self) -> str:
        """Only id 1 answers: a new kit (the same next step `so101d doctor` names, in the fault the
        status and the console show) or a daisy chain cut after servo 1 (check the cable)."""
        try:
            lone = diagnose_lone_id_one(self.bus)
        except ArmError as exc:
            return f"; only id 1 answers (could not tell a new kit from a loose cable after servo 1: {exc})"
        if lone.new_kit:
            return (
                f"; only id 1 answers, as on a new kit ({lone.why}): stop so101d, then run "
                f"so101d setup-motors {self.role} --port {self.port}"
            )
        return f"; only id 1 answers: {lone.why}"

    def handshake(self) -> None:
        """Every joint's id answers with the STS3215 model number, all on one firmware version."""
        missing: list[int] = []
        found: dict[int, int] = {}
        for sid in JOINT_ID_LIST:
            try:
                found[sid] = self.bus.ping(sid, retries=1)
            except BusTimeoutError:
                missing.append(sid)
        self._missing_ids = tuple(missing)
        problems: list[str] = []
        if missing:
            problems.append(
                "no reply from servo "
                + ", ".join(describe_joint(s) for s in missing)
                + " (unpowered, unplugged, or a different id/baud rate?)"
            )
        wrong = {sid: m for sid, m in found.items() if m != self.config.expected_model}
        if wrong:
            problems.append(
                "wrong model: "
                + ", ".join(f"{describe_joint(s)} reports model {m}" for s, m in wrong.items())
                + f", expected {self.config.expected_model} (STS3215)"
            )
        if problems:
            seen = ", ".join(str(s) for s in sorted(found)) or "none"
            hint = self._lone_id_one_hint() if missing and set(found) == {1} else ""
            raise HandshakeError(
                f"{self.role} arm on {self.port}: " + "; ".join(problems) + f" (ids answering: {seen}){hint}"
            )
        versions: dict[int, tuple[int, int]] = {}
        for sid in JOINT_ID_LIST:
            major = self.bus.read("Firmware_Major_Version", sid)
            minor = self.bus.read("Firmware_Minor_Version", sid)
            versions[sid] = (major, minor)
        distinct = set(versions.values())
        if len(distinct) != 1:
            listing = ", ".join(f"{describe_joint(s)} {v[0]}.{v[1]}" for s, v in versions.items())
            raise HandshakeError(
                f"{self.role} arm on {self.port}: servos run different firmware versions ({listing}); "
                "update them with Feetech's software first"
            )
        (fw,) = distinct
        expected = self.config.expected_firmware
        if expected is not None and fw != tuple(expected):
            raise HandshakeError(
                f"{self.role} arm on {self.port}: firmware {fw[0]}.{fw[1]} on every servo, expected {expected[0]}.{expected[1]}"
            )
        self.firmware = fw

    def _desired(self, sid: int) -> _Desired:
        c = self.config
        d = _Desired()
        d.eeprom["Return_Delay_Time"] = c.return_delay_time
        d.eeprom["Operating_Mode"] = 0
        d.sram["Maximum_Acceleration"] = c.maximum_acceleration
        d.sram["Acceleration"] = c.acceleration
        return d

    def plan_configuration(self) -> dict[int, dict[str, tuple[int, int]]]:
        """What ``configure`` would write: id -> register -> (reads now, would write). Reads only
        (``so101d doctor``'s dry run uses it)."""
        plan: dict[int, dict[str, tuple[int, int]]] = {}
        for sid in JOINT_ID_LIST:
            want = self._desired(sid)
            writes: dict[str, tuple[int, int]] = {}
            for reg, value in {**want.eeprom, **want.sram}.items():
                held = self.bus.read(reg, sid)
                if held != value and self._refused.get((sid, reg)) != held and not _settled(reg, held, value):
                    writes[reg] = (held, value)
            phase = self.bus.read("Phase", sid)
            if phase & PHASE_ANGLE_FEEDBACK_BIT:
                writes["Phase"] = (phase, phase & ~PHASE_ANGLE_FEEDBACK_BIT)
            if writes:
                plan[sid] = writes
        return plan

    def configure(self) -> None:
        """Bring every servo to the desired registers, writing only those that differ.

        A timing register (``TIMING_REGISTERS``) the servo does not keep is a warning
        (``configure_warnings``, logged) and is not written again while it holds the same value;
        any other register not kept raises ArmError naming joint and register.
        """
        plan: dict[int, dict[str, int]] = {}
        eeprom_needed = False
        for sid in JOINT_ID_LIST:
            want = self._desired(sid)
            writes: dict[str, int] = {}
            for reg, value in {**want.eeprom, **want.sram}.items():
                held = self.bus.read(reg, sid)
                if held == value:
                    self._refused.pop((sid, reg), None)
                elif reg in TIMING_REGISTERS and (self._refused.get((sid, reg)) == held or _settled(reg, held, value)):
                    self._refused[(sid, reg)] = held  # not written again: reported below
                else:
                    writes[reg] = value
                    eeprom_needed |= reg in want.eeprom
            phase = self.bus.read("Phase", sid)
            if phase & PHASE_ANGLE_FEEDBACK_BIT:
                writes["Phase"] = phase & ~PHASE_ANGLE_FEEDBACK_BIT
                eeprom_needed = True
            if writes:
                plan[sid] = writes
        if eeprom_needed:
            # EEPROM is writable only with Lock 0, which LeRobot couples with torque off.
            log.info("%s on %s: configuring servos (torque off while EEPROM is written)", self.role, self.port)
            self._torque_off_all()
        for sid, writes in plan.items():
            for reg, value in writes.items():
                self.bus.write(reg, sid, value)
            log.debug("%s on %s: %s configured: %s", self.role, self.port, describe_joint(sid), writes)
        # Read every change back: a servo acknowledges writes it does not keep (a read-only or
        # clamped register; and with Lock = 1 an EEPROM write takes effect but is not saved, so
        # it would be gone after the next power cycle: that is why EEPROM is written with Lock 0).
        kept_not: list[str] = []
        for sid, writes in plan.items():
            for reg, value in writes.items():
                held = self.bus.read(reg, sid)
                if held == value:
                    self._refused.pop((sid, reg), None)
                elif reg in TIMING_REGISTERS:
                    self._refused[(sid, reg)] = held
                else:
                    kept_not.append(f"{describe_joint(sid)} {reg}={value} (reads {held})")
        if kept_not:
            raise ArmError(
                f"{self.role} arm on {self.port}: servos did not keep their configuration: " + "; ".join(kept_not)
            )
        self.configure_warnings = []
        for (sid, reg), held in sorted(self._refused.items()):
            want = self._desired(sid)
            asked = {**want.eeprom, **want.sram}[reg]
            self.configure_warnings.append(
                f"{describe_joint(sid)} keeps {reg}={held} (asked {asked}; timing only, carrying on)"
            )
        for w in self.configure_warnings:
            log.warning("%s on %s: %s", self.role, self.port, w)
        self._after_configure()

    def _after_configure(self) -> None:
        self.torque_enabled = self._read_torque_all()

    def _read_torque_all(self) -> bool:
        states = self.bus.sync_read("Torque_Enable", JOINT_ID_LIST)
        return all(states.values())

    def _torque_off_all(self) -> None:
        for sid in JOINT_ID_LIST:
            self.bus.write("Torque_Enable", sid, 0)
            self.bus.write("Lock", sid, 0)
        self.torque_enabled = False

    # ------------------------------------------------------------------------------------------
    # calibration in the servos
    # ------------------------------------------------------------------------------------------
    def read_calibration(self) -> ArmCalibration:
        """The calibration the servos hold (drive_mode lives only in the file: taken from it or 0)."""
        cal = self.calibration
        return read_servo_calibration(self.bus, {n: cal[n].drive_mode for n in JOINT_NAMES} if cal else None)

    def _compare_calibration(self) -> list[str]:
        """File vs servos, through the one implementation the calibration CLI uses too; a servo
        that does not answer raises (as any other read during connect would)."""
        if self.calibration is None:
            return []
        return [m.describe() for m in verify_against_servos(self.bus, self.calibration, raise_on_no_answer=True)]

    def write_calibration(self, cal: ArmCalibration) -> None:
        """Write Homing_Offset and Min/Max_Position_Limit of every joint, like LeRobot, through
        ``drivers.calibration_io`` (torque off, unlocked, written, locked again, read back): a
        value the servo did not keep raises ArmError naming the joint. Torque stays off
        afterwards. The arm then converts units with ``cal``.
        """
        self.torque_enabled = False
        self.calibration = cal  # as before: the file's calibration, whatever the servos kept
        try:
            write_servo_calibration(self.bus, cal)
        except CalibrationMismatchError as exc:
            self.calibration_mismatches = [m.describe() for m in exc.mismatches]
            raise ArmError(
                f"{self.role} arm on {self.port}: servos did not keep the calibration written: "
                + "; ".join(self.calibration_mismatches)
            ) from exc
        self.calibration_mismatches = []

    def reset_calibration(self) -> None:
        """Factory calibration (Homing_Offset 0, limits 0..4095), as LeRobot before calibrating;
        torque off and the EEPROM locked again afterwards, every value read back."""
        self.torque_enabled = False
        problems = reset_servo_calibration(self.bus)
        if problems:
            raise ArmError(
                f"{self.role} arm on {self.port}: servos did not keep the factory calibration: " + "; ".join(problems)
            )

    # ------------------------------------------------------------------------------------------
    # per-cycle I/O
    # ------------------------------------------------------------------------------------------
    def _require_calibration(self) -> ArmCalibration:
        if self.calibration is None:
            raise ArmError(f"{self.role} arm on {self.port}: no calibration loaded (run `so101d calibrate`)")
        return self.calibration

    def read_joints_ticks(self) -> np.ndarray:
        """Present_Position of the six joints (int64 ticks), one sync read; fresh or an exception.

        A servo that stayed silent while the others answered is a fault for the caller; until it
        answers again the reads go without the silence retries (noise still gets its own), so a
        dead servo costs each cycle one read plus the bus's quiet time (~6 ms), not 3 x 50 ms.
        """
        retries = 0 if self.silent_ids else None
        try:
            values = self.bus.sync_read("Present_Position", JOINT_ID_LIST, retries=retries)
        except ServoNoReplyError as exc:
            if not exc.corrupt and len(exc.missing_ids) < NUM_JOINTS:
                self.silent_ids = self._missing_ids = tuple(exc.missing_ids)
            raise
        self.silent_ids = self._missing_ids = ()
        return np.fromiter((values[sid] for sid in JOINT_ID_LIST), dtype=np.int64, count=NUM_JOINTS)

    def read_joints(self) -> np.ndarray:
        """Joint positions in LeRobot units (body degrees, gripper 0..100), float64 (6,)."""
        cal = self._require_calibration()
        return ticks_to_units(self.read_joints_ticks(), cal, self.config.body_mode)

    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        return unit_limits(self._require_calibration(), self.config.body_mode)

    def read_health(self) -> ArmHealth:
        """Temperature, voltage, load, current, status bits and torque of every servo.

        One sync read of registers 40..70. A servo that does not answer is listed in ``missing``
        (the others are still reported); if none answers, the BusTimeoutError propagates.
        """
        now = time.monotonic()
        try:
            blocks = self.bus.sync_read_bytes(HEALTH_START, HEALTH_LEN, JOINT_ID_LIST, what="SYNC_READ health")
            missing: list[int] = []
        except ServoNoReplyError as exc:
            missing = list(exc.missing_ids)
            answered = [s for s in JOINT_ID_LIST if s not in missing]
            blocks = {}
            if answered:
                blocks = self.bus.sync_read_bytes(HEALTH_START, HEALTH_LEN, answered, what="SYNC_READ health")
            # On a real bus one silent servo can silence the ones listed after it in a sync read:
            # ask each missing one alone (no retry) so only the truly silent are reported.
            for sid in list(missing):
                try:
                    blocks[sid] = self.bus.read_bytes(HEALTH_START, HEALTH_LEN, sid, retries=0)
                except ServoNoReplyError:
                    continue
                missing.remove(sid)
            if not blocks:
                raise
            blocks = {s: blocks[s] for s in JOINT_ID_LIST if s in blocks}
        servos: dict[str, ServoHealth] = {}
        for sid, blk in blocks.items():
            servos[NAME_BY_ID[sid]] = ServoHealth(
                temperature_c=float(self._field(blk, "Present_Temperature")),
                voltage_v=self._field(blk, "Present_Voltage") / 10.0,
                load_pct=self._field(blk, "Present_Load") / 10.0,
                current_ma=self._field(blk, "Present_Current") * CURRENT_MA_PER_UNIT,
                status_bits=self._field(blk, "Status") | self.bus.last_error_bits.get(sid, 0),
                torque_enabled=bool(self._field(blk, "Torque_Enable")),
            )
        if not missing:
            self.torque_enabled = all(h.torque_enabled for h in servos.values())
        return ArmHealth(servos=servos, read_at_s=now, missing=tuple(NAME_BY_ID[s] for s in missing))

    @staticmethod
    def _field(block: bytes, name: str) -> int:
        addr, size = CONTROL_TABLE[name]
        off = addr - HEALTH_START
        return decode_value(name, block[off : off + size])

    # ------------------------------------------------------------------------------------------
    # goals and torque (follower; leader only for a take-over)
    # ------------------------------------------------------------------------------------------
    def goals_to_ticks(self, goals: np.ndarray) -> np.ndarray:
        """LeRobot units -> Goal_Position ticks, clamped to the calibrated range (ValueError on NaN/inf)."""
        cal = self._require_calibration()
        g = np.asarray(goals, dtype=np.float64)
        if g.shape != (NUM_JOINTS,):
            raise ValueError(f"{self.role} arm on {self.port}: expected {NUM_JOINTS} goals, got shape {g.shape}")
        if not np.all(np.isfinite(g)):
            bad = [JOINT_NAMES[i] for i in np.flatnonzero(~np.isfinite(g))]
            raise ValueError(f"{self.role} arm on {self.port}: non-finite goal for {', '.join(bad)}: {g.tolist()}")
        ticks = units_to_ticks(g, cal, self.config.body_mode)
        lo = np.array([cal[n].range_min for n in JOINT_NAMES], dtype=np.int64)
        hi = np.array([cal[n].range_max for n in JOINT_NAMES], dtype=np.int64)
        return np.clip(ticks, lo, hi)

    def write_goals(self, goals: np.ndarray) -> None:
        """One sync write of the six Goal_Position values (LeRobot units in)."""
        self.write_goals_ticks(self.goals_to_ticks(goals))

    def write_goals_ticks(self, ticks: np.ndarray) -> None:
        t = np.asarray(ticks)
        if t.shape != (NUM_JOINTS,):
            raise ValueError(f"{self.role} arm on {self.port}: expected {NUM_JOINTS} goal ticks, got shape {t.shape}")
        if not np.issubdtype(t.dtype, np.integer):
            if not np.all(np.isfinite(t)):
                raise ValueError(f"{self.role} arm on {self.port}: non-finite goal ticks {t.tolist()}")
            t = np.rint(t)
        values = {sid: int(v) for sid, v in zip(JOINT_ID_LIST, t.tolist())}
        bad = {NAME_BY_ID[s]: v for s, v in values.items() if not 0 <= v <= MAX_TICK}
        if bad:
            raise ValueError(f"{self.role} arm on {self.port}: goal ticks outside 0..{MAX_TICK}: {bad}")
        self.bus.sync_write("Goal_Position", values)
        self.last_goal_ticks = np.array(list(values.values()), dtype=np.int64)

    def set_torque(self, enabled: bool) -> None:
        """Torque on: goals := present positions first (no jump), then Torque_Enable 1, Lock 1 per
        servo (LeRobot's order). Torque off: Torque_Enable 0, Lock 0.

        On a leader this is for a policy take-over (the leader driven to the follower's pose);
        teleoperation keeps it off."""
        if enabled:
            try:
                present = self.read_joints_ticks()
                self.bus.sync_write("Goal_Position", {sid: int(v) for sid, v in zip(JOINT_ID_LIST, present.tolist())})
                self.last_goal_ticks = present
                for sid in JOINT_ID_LIST:
                    self.bus.write("Torque_Enable", sid, 1)
                    self.bus.write("Lock", sid, 1)
            except ServoNoReplyError as exc:
                # A servo that showed an overload and then fell silent is not a bus hiccup.
                latched = self.latched_joints(list(exc.missing_ids))
                if latched:
                    raise OverloadLatchedError(power_cycle_message(latched, latched), latched) from exc
                raise
            self._check_torque_taken()
            self.torque_enabled = True
        else:
            self._torque_off_all()

    def latched_joints(self, ids: list[int] | tuple[int, ...] | None = None) -> list[str]:
        """Joints whose latest status packet carried a latching protection bit (overload or
        over-current), among ``ids`` (all by default)."""
        bits = self.bus.last_error_bits
        return [NAME_BY_ID[s] for s in (ids if ids is not None else JOINT_ID_LIST) if bits.get(s, 0) & LATCHING_ERRORS]

    def _check_torque_taken(self) -> None:
        """After Torque_Enable 1: every servo must report torque on. One that refuses with its
        overload/over-current bit set (or went silent after showing it) needs a power cycle."""
        try:
            states = self.bus.sync_read("Torque_Enable", JOINT_ID_LIST)
        except ServoNoReplyError as exc:
            latched = self.latched_joints(list(exc.missing_ids))
            if latched:
                raise OverloadLatchedError(power_cycle_message(latched, latched), latched) from exc
            raise
        refused = [s for s in JOINT_ID_LIST if not states[s]]
        if not refused:
            return
        self.torque_enabled = False
        latched = self.latched_joints(refused)
        if latched:
            raise OverloadLatchedError(power_cycle_message(latched), latched)
        raise ArmError(
            f"{self.role} arm on {self.port}: torque did not come on for "
            + ", ".join(describe_joint(s) for s in refused)
        )

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
    def reconnect(self, timeout_s: float | None = None) -> None:
        """Reopen the port after it vanished (replugged adapter, restarted emulator) and handshake.

        Retries until ``timeout_s`` (config.reconnect_timeout_s by default); the last error
        propagates if the arm is still not back. Counted in ``counters.reconnects``.
        """
        deadline = time.monotonic() + (self.config.reconnect_timeout_s if timeout_s is None else timeout_s)
        self._connected = False
        self.bus.close()
        while True:
            try:
                self.connect()
            except (PortGoneError, BusTimeoutError, HandshakeError) as exc:
                if time.monotonic() >= deadline:
                    raise
                log.debug("%s on %s: reconnect attempt failed: %s", self.role, self.port, exc)
                time.sleep(0.05)
                continue
            self.bus.counters.reconnects += 1
            log.info("%s on %s: reconnected", self.role, self.port)
            return

    def close(self, torque_off: bool = True) -> None:
        self._connected = False
        self.bus.close()


class FeetechLeader(_FeetechArm):
    """The SO-101 leader arm (LeaderArm): torque off, read once per cycle."""

    role = "leader"

    def __init__(self, port: str, calibration: ArmCalibration | None, config: LeaderBusConfig | None = None) -> None:
        super().__init__(port, calibration, config or LeaderBusConfig())

    def _after_configure(self) -> None:
        # LeRobot's SOLeader.configure(): torque off on every motor (the operator moves it).
        self._torque_off_all()

    def close(self, torque_off: bool = True) -> None:
        # A leader left holding after a take-over would fight the operator's hand next time.
        if torque_off and self.torque_enabled is not False and self.bus.is_open:
            try:
                self._torque_off_all()
            except ArmError as exc:
                log.warning("%s on %s: could not switch torque off at close: %s", self.role, self.port, exc)
        super().close()


class FeetechFollower(_FeetechArm):
    """The SO-101 follower arm (FollowerArm, kind "feetech")."""

    role = "follower"
    kind = "feetech"
    sim_mapping: str | None = None  # a real arm is driven in the leader's own units

    def __init__(self, port: str, calibration: ArmCalibration | None, config: FollowerBusConfig | None = None) -> None:
        self.config: FollowerBusConfig
        super().__init__(port, calibration, config or FollowerBusConfig())

    def _desired(self, sid: int) -> _Desired:
        c = self.config
        d = super()._desired(sid)
        d.eeprom["P_Coefficient"] = c.p_coefficient
        d.eeprom["I_Coefficient"] = c.i_coefficient
        d.eeprom["D_Coefficient"] = c.d_coefficient
        if sid == JOINT_ID_LIST[GRIPPER_INDEX]:
            d.eeprom["Max_Torque_Limit"] = c.gripper_max_torque_limit
            d.eeprom["Protection_Current"] = c.gripper_protection_current
            d.eeprom["Overload_Torque"] = c.gripper_overload_torque
            # The cap in force now: 16 only seeds 48 at the servo's next power-on.
            d.sram["Torque_Limit"] = c.gripper_max_torque_limit
        return d

    @property
    def dataset_kind(self) -> str:
        """ "emulated" on a pseudo-terminal (our bus emulator; a USB adapter never is one), else "feetech"."""
        return "emulated" if is_pseudo_terminal(self.port) else "feetech"

    def scene_resets(self) -> int:
        return 0  # nothing but our own goals moves a real arm with torque on

    def close(self, torque_off: bool | None = None) -> None:
        """``torque_off`` None: ``config.disable_torque_on_close`` decides (LeRobot's disconnect())."""
        off = self.config.disable_torque_on_close if torque_off is None else torque_off
        if off and self.bus.is_open:
            try:
                self._torque_off_all()
            except ArmError as exc:  # the port may already be gone; closing must still succeed
                log.warning("%s on %s: could not switch torque off at close: %s", self.role, self.port, exc)
        super().close()


__all__ = [
    "TIMING_REGISTERS",
    "BusConfig",
    "FeetechFollower",
    "FeetechLeader",
    "FollowerBusConfig",
    "LeaderBusConfig",
    "OverloadLatchedError",
    "power_cycle_message",
]
