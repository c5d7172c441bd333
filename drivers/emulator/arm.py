"""An emulated SO-101 arm: six STS3215 servos (ids 1..6), presets, pose API, motion sources.

Presets (what is in the servos' EEPROM at power-on):

- ``"calibrated"`` (default): the arm was calibrated with LeRobot and configured by it: Homing_Offset
  and Min/Max_Position_Limit as in ``reference_calibration()``, Return_Delay_Time 0, Phase bit 4
  clear. Leader and follower have different offsets and ranges, so a test that maps one onto the
  other proves each arm's own calibration is honoured.
- ``"factory"``: as shipped: offset 0, limits 0..4095, Return_Delay_Time 250 (500 us), Phase bit 4
  set on some servos like the units LeRobot has to fix (LR#3373). For calibration tests.
- ``"new-kit"``: the factory EEPROM, and every servo still at the factory id 1 (at the arm's
  ``baudrate``: some batches ship at another rate). Six servos on one chain then answer as one id
  and collide; ``connect_servos([joint])`` is the operator plugging only that servo's 3-pin cable
  into the controller board (the others lose power), as ``so101d setup-motors`` and LeRobot's
  ``setup_motors`` ask. A servo whose cable goes back in powers up afresh (saved EEPROM, Lock 1).

The *physical* arm is the same under both presets: a pose in LeRobot units is turned into raw
encoder positions through the role's reference calibration, whatever the EEPROM now says, so a
correct calibration procedure run against a factory arm finds (about) the reference values.

Thread-safety: every method takes ``self.lock``; the bus server holds it while it handles one
request, so API calls from tests and the control socket interleave safely with bus traffic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

import numpy as np

from calibration.calibration_file import ArmCalibration, MotorCalibration
from calibration.conventions import GRIPPER_INDEX, JOINT_IDS, JOINT_NAMES, MAX_TICK, NUM_JOINTS, ticks_to_units
from drivers.emulator.motion import REST_POSE_UNITS, DemoMotion, MotionSource, StillMotion
from drivers.emulator.realism import ServoRealism
from drivers.emulator.servo import ADDR_ID, EmulatedServo, ServoPhysics, factory_registers
from drivers.sts3215_table import (
    BAUD_RATE_BY_CODE,
    ERROR_BIT_NAMES,
    TICKS_PER_TURN,
    decode_sign_magnitude,
    encode_sign_magnitude,
)

Role = Literal["leader", "follower"]
Preset = Literal["calibrated", "factory", "new-kit"]
PRESETS: tuple[Preset, ...] = ("calibrated", "factory", "new-kit")
FACTORY_ID = 1  # every STS3215 leaves the factory answering as id 1

# joint -> (homing_offset, range_min, range_max), as LeRobot's calibration would have written.
_REFERENCE: dict[str, dict[str, tuple[int, int, int]]] = {
    "follower": {
        "shoulder_pan": (-1470, 758, 3292),
        "shoulder_lift": (1021, 812, 3187),
        "elbow_flex": (-877, 874, 3076),
        "wrist_flex": (356, 889, 3203),
        "wrist_roll": (-1935, 0, 4095),
        "gripper": (1287, 2003, 3481),
    },
    "leader": {
        "shoulder_pan": (312, 721, 3340),
        "shoulder_lift": (-1103, 845, 3151),
        "elbow_flex": (944, 902, 3044),
        "wrist_flex": (-601, 862, 3228),
        "wrist_roll": (1754, 0, 4095),
        "gripper": (-212, 1986, 3360),
    },
}

# The right arm of a bimanual pair (``side="right"``) is another physical arm: its horns sit a few
# encoder ticks away from the left's, so its homing offsets differ by this much (ranges, in the
# offset frame, stay the same). A left calibration on the right arm is then a mismatch LeRobot
# would ask to recalibrate, as with real arms, and a swapped pair of files is caught.
_RIGHT_ARM_OFFSET_SHIFT_TICKS = 37


def _reference(role: Role, joint: str, side: str | None) -> tuple[int, int, int]:
    """(homing_offset, range_min, range_max) of ``joint`` of the ``role`` arm on ``side``."""
    off, lo, hi = _REFERENCE[role][joint]
    if side == "right":
        off += _RIGHT_ARM_OFFSET_SHIFT_TICKS
    elif side not in (None, "left"):
        raise ValueError(f"side must be 'left', 'right' or None, got {side!r}")
    return off, lo, hi


# Physical constants by role: the follower's 1/345 gear at 7.4 V; the leader runs at 5 V and
# its lower-ratio servos are back-driven by hand (speed only matters if someone enables torque).
_PHYSICS: dict[str, ServoPhysics] = {
    "follower": ServoPhysics(max_speed_tps=3000.0, supply_v=7.4),
    "leader": ServoPhysics(max_speed_tps=4500.0, supply_v=5.0),
}
# Gravity pulls the lift and elbow one way: the hold load's sign per joint (cosmetic realism).
_GRAVITY_SIGN = {
    "shoulder_pan": 1.0,
    "shoulder_lift": -1.0,
    "elbow_flex": 1.0,
    "wrist_flex": -1.0,
    "wrist_roll": 1.0,
    "gripper": 1.0,
}


def reference_calibration(role: Role, gripper_reversed: bool = False, side: str | None = None) -> ArmCalibration:
    """The LeRobot calibration of the emulated ``role`` arm (what the 'calibrated' preset holds).

    ``side``: the arm of a bimanual pair ("left" is the single arm's; "right" another arm's,
    see _RIGHT_ARM_OFFSET_SHIFT_TICKS). With ``gripper_reversed`` the gripper's drive_mode is 1: its servo is mounted the other way
    round, so closing turns the horn toward high ticks and LeRobot reads ``100 - x``.
    """
    if role not in _REFERENCE:
        raise ValueError(f"role must be 'leader' or 'follower', got {role!r}")
    return ArmCalibration(
        {
            name: MotorCalibration(
                id=JOINT_IDS[name],
                drive_mode=1 if gripper_reversed and name == "gripper" else 0,
                homing_offset=off,
                range_min=lo,
                range_max=hi,
            )
            for name, (off, lo, hi) in ((n, _reference(role, n, side)) for n in _REFERENCE[role])
        }
    )


def _preset_registers(role: Role, preset: Preset, joint: str, baud_code: int, side: str | None) -> bytearray:
    servo_id = FACTORY_ID if preset == "new-kit" else JOINT_IDS[joint]
    mem = factory_registers(servo_id)

    def put(addr: int, size: int, value: int) -> None:
        mem[addr : addr + size] = int(value).to_bytes(size, "little")

    put(6, 1, baud_code)
    if preset == "calibrated":
        off, lo, hi = _reference(role, joint, side)
        put(31, 2, encode_sign_magnitude(off, 11))  # Homing_Offset
        put(9, 2, lo)  # Min_Position_Limit
        put(11, 2, hi)  # Max_Position_Limit
        put(7, 1, 0)  # Return_Delay_Time: LeRobot's configure_motors writes 0
        put(85, 1, 254)  # Maximum_Acceleration
        put(41, 1, 254)  # Acceleration (SRAM, but configure_motors ran: keep it realistic)
        if role == "follower":
            put(21, 1, 16)  # P
            put(22, 1, 32)  # D
            if joint == "gripper":
                put(16, 2, 500)  # Max_Torque_Limit
                put(28, 2, 250)  # Protection_Current
                put(36, 1, 25)  # Overload_Torque
                put(48, 2, 500)  # Torque_Limit follows Max_Torque_Limit at power-on
    elif preset in ("factory", "new-kit"):
        if joint in ("shoulder_lift", "wrist_roll"):
            put(18, 1, 0x1C)  # Phase with bit 4 set (LR#3373)
    else:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    return mem


class EmulatedArm:
    """Six emulated STS3215 servos forming one SO-101 leader or follower."""

    def __init__(
        self,
        role: Role = "follower",
        preset: Preset = "calibrated",
        motion: MotionSource | None = None,
        initial_pose_units: np.ndarray | list[float] | None = None,
        baudrate: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
        gripper_reversed: bool = False,
        realism: ServoRealism | None = None,
        side: str | None = None,
    ) -> None:
        if role not in ("leader", "follower"):
            raise ValueError(f"role must be 'leader' or 'follower', got {role!r}")
        codes = {b: c for c, b in BAUD_RATE_BY_CODE.items()}
        if baudrate not in codes:
            raise ValueError(f"unsupported baud rate {baudrate}; the STS3215 knows {sorted(codes)}")
        self.role: Role = role
        self.preset: Preset = preset
        self.clock = clock
        self.lock = threading.RLock()
        self.gripper_reversed = bool(gripper_reversed)
        self.side = side  # of a bimanual pair: "left", "right"; None: a single arm
        self.reference = reference_calibration(role, self.gripper_reversed, side)
        self._lo = np.array([self.reference[n].range_min for n in JOINT_NAMES], dtype=np.float64)
        self._hi = np.array([self.reference[n].range_max for n in JOINT_NAMES], dtype=np.float64)
        self._mid = (self._lo + self._hi) / 2
        self._offsets = np.array([self.reference[n].homing_offset for n in JOINT_NAMES], dtype=np.float64)
        pose = np.asarray(REST_POSE_UNITS if initial_pose_units is None else initial_pose_units, dtype=np.float64)
        phys = self._units_to_phys(pose)
        base = _PHYSICS[role]
        self.servos: list[EmulatedServo] = []
        for i, joint in enumerate(JOINT_NAMES):
            physics = ServoPhysics(
                max_speed_tps=base.max_speed_tps,
                supply_v=base.supply_v,
                hold_load_pct=base.hold_load_pct,
                gravity_sign=_GRAVITY_SIGN[joint],
            )
            regs = _preset_registers(role, preset, joint, codes[baudrate], side)
            servo = EmulatedServo(regs[ADDR_ID], phys[i], clock, physics, regs, realism)
            servo.on_release = self._on_torque_release
            self.servos.append(servo)
        self._motion: MotionSource | None = None
        self.motion_paused = False  # a torque release froze the motion source (see _on_torque_release)
        self._motion_t0 = clock()
        self._phys_cache: dict[float, np.ndarray] = {}
        if motion is None and role == "leader":
            motion = DemoMotion()
        if motion is not None:
            self.set_motion(motion)

    def reference_calibration(self) -> ArmCalibration:
        """The LeRobot calibration of this physical arm (what the 'calibrated' preset holds)."""
        return self.reference

    # --- frames -----------------------------------------------------------------------------
    def _units_to_phys(self, units: np.ndarray) -> np.ndarray:
        """LeRobot units -> raw encoder ticks of this physical arm (reference calibration).

        Float, not rounded like ``units_to_ticks``: a hand-moved joint moves continuously and
        its encoder (and velocity) quantise only when read.
        """
        u = np.asarray(units, dtype=np.float64)
        if u.shape != (NUM_JOINTS,):
            raise ValueError(f"a pose needs {NUM_JOINTS} values, got shape {u.shape}")
        out = u * MAX_TICK / 360.0 + self._mid
        g = GRIPPER_INDEX
        opening = min(100.0, max(0.0, u[g])) / 100.0
        if self.gripper_reversed:
            opening = 1.0 - opening  # mounted the other way round: closed sits at the high end
        out[g] = opening * (self._hi[g] - self._lo[g]) + self._lo[g]
        return out + self._offsets

    def _phys_to_units(self, phys: np.ndarray) -> np.ndarray:
        ticks = np.mod(np.asarray(phys) - self._offsets, TICKS_PER_TURN)
        return ticks_to_units(ticks, self.reference)

    # --- lookup -----------------------------------------------------------------------------
    def servo(self, joint: str | int) -> EmulatedServo:
        """A servo by joint name, or by its *original* id 1..6 (index into the arm)."""
        if isinstance(joint, str):
            try:
                return self.servos[JOINT_NAMES.index(joint)]
            except ValueError:
                raise KeyError(f"unknown joint {joint!r}; joints are {', '.join(JOINT_NAMES)}") from None
        if not 1 <= int(joint) <= NUM_JOINTS:
            raise KeyError(f"unknown servo {joint!r}; the arm has servos 1..{NUM_JOINTS}")
        return self.servos[int(joint) - 1]

    def servos_by_id(self, servo_id: int) -> list[EmulatedServo]:
        """Online servos answering to ``servo_id`` now (an ID change can make two collide)."""
        return [s for s in self.servos if s.on_bus and s.servo_id == servo_id]

    # --- motion -----------------------------------------------------------------------------
    def set_motion(self, motion: MotionSource | None) -> None:
        """Drive the torque-off joints from ``motion`` (restarting its clock), or stop driving."""
        with self.lock:
            for s in self.servos:
                s.update()
            self._motion = motion
            self.motion_paused = False
            self._motion_t0 = self.clock()
            self._phys_cache = {}
            for i, s in enumerate(self.servos):
                s.external = None if motion is None else self._external_for(i)
                s.update()

    def _on_torque_release(self, released: EmulatedServo) -> None:
        """A servo's torque went off (a take-over handing the leader back, an overload trip).

        The motors had moved the arm away from where the motion source (the hand) would put it;
        a real hand does not yank the arm back to its old script, it holds the arm where the
        motors left it. So the motion source is paused: every joint stops following it and stays
        where it is (torque-on joints keep holding their goals). ``set_motion`` resumes driving.
        Runs under ``self.lock`` (the bus server holds it while a write is handled).
        """
        if self._motion is None:
            return
        now = released._t
        for s in self.servos:
            if s is not released:
                s.update(now)
            s.external = None
        self._motion = None
        self._phys_cache = {}
        self.motion_paused = True

    def _external_for(self, index: int) -> Callable[[float], float]:
        return lambda now: float(self._phys_at(now)[index])

    def _phys_at(self, now: float) -> np.ndarray:
        """Physical pose from the motion source at ``now``; a two-entry cache serves the six
        servos of one request (and the velocity estimate's second sample) with one conversion."""
        cache = self._phys_cache
        hit = cache.get(now)
        if hit is not None:
            return hit
        assert self._motion is not None
        phys = self._units_to_phys(self._motion.pose_at(now - self._motion_t0))
        if len(cache) >= 2:
            cache.pop(next(iter(cache)))
        cache[now] = phys
        return phys

    def set_pose_units(self, pose_units: np.ndarray | list[float]) -> None:
        """Put the arm (by hand) in a pose given in LeRobot units; stops any motion source.

        Torque-off joints go there; torque-on joints are pushed there and then hold their goal.
        """
        pose = np.asarray(pose_units, dtype=np.float64)
        if pose.shape != (NUM_JOINTS,) or not np.all(np.isfinite(pose)):
            raise ValueError(f"a pose needs {NUM_JOINTS} finite values, got {pose_units!r}")
        with self.lock:
            self.set_motion(StillMotion(pose) if self.role == "leader" else None)
            phys = self._units_to_phys(pose)
            for s, p in zip(self.servos, phys):
                s.update()
                s.phys = float(p)
                s._apply_block()

    def set_joint_ticks(self, joint: str | int, present_ticks: float) -> None:
        """Move one joint by hand to a Present_Position value (in its current EEPROM frame)."""
        with self.lock:
            if self._motion is not None:
                # Freeze the motion source at the current pose so the hand move sticks.
                self.set_pose_units(self.pose_units())
            self.servo(joint).move_to_present(present_ticks)
            if self.role == "leader":
                self.set_motion(StillMotion(self.pose_units()))

    def pose_units(self) -> np.ndarray:
        """The arm's physical pose in LeRobot units, through the reference calibration."""
        with self.lock:
            for s in self.servos:
                s.update()
            return self._phys_to_units(np.array([s.phys for s in self.servos]))

    def present_ticks(self) -> np.ndarray:
        """Present_Position of every servo as the bus would report it now."""
        with self.lock:
            out = []
            for s in self.servos:
                s.update()
                out.append(s.present_ticks())
            return np.array(out, dtype=np.int64)

    def goal_ticks(self) -> np.ndarray:
        with self.lock:
            return np.array([s.goal_ticks() for s in self.servos], dtype=np.int64)

    # --- faults and environment --------------------------------------------------------------
    def block_joint(self, joint: str | int, at_ticks: float | None) -> None:
        """Put an obstacle in a joint's way at a Present_Position value (None removes it)."""
        with self.lock:
            self.servo(joint).block_at(at_ticks)

    def set_error_bits(self, joint: str | int, bits: int) -> None:
        """Force status error bits on a servo (0 clears what was forced)."""
        if not 0 <= bits <= 0x7F:
            raise ValueError(f"error bits {bits} outside 0..127")
        with self.lock:
            self.servo(joint).forced_errors = bits

    def set_supply_voltage(self, volts: float, joint: str | int | None = None) -> None:
        """Change the supply voltage (all servos, or one): outside the limits sets the voltage bit."""
        with self.lock:
            for s in self.servos if joint is None else [self.servo(joint)]:
                s.update()
                s.physics.supply_v = float(volts)
                s.voltage_v = float(volts)

    def set_temperature(self, joint: str | int, celsius: float) -> None:
        """Heat a servo (it then cools toward ambient): above Max_Temperature_Limit sets overheat."""
        with self.lock:
            s = self.servo(joint)
            s.update()
            s.temperature_c = float(celsius)

    def refuse_writes(self, joint: str | int, register: str, refuse: bool = True) -> None:
        """Make one servo acknowledge writes to ``register`` without keeping them (a unit whose
        firmware treats it as read-only), or stop doing so."""
        from drivers.sts3215_table import CONTROL_TABLE

        if register not in CONTROL_TABLE:
            raise KeyError(f"unknown register {register!r}")
        addr, size = CONTROL_TABLE[register]
        with self.lock:
            s = self.servo(joint)
            for a in range(addr, addr + size):
                (s.refused_addresses.add if refuse else s.refused_addresses.discard)(a)

    def set_online(self, joint: str | int, online: bool) -> None:
        """Take a servo off the bus (no replies at all, absent from sync reads) or put it back."""
        with self.lock:
            self.servo(joint).online = bool(online)

    def connect_servos(self, joints: list[str | int] | None = None) -> None:
        """The operator plugs only these servos' 3-pin cables into the chain (None: all of them,
        the assembled arm). An unplugged servo loses power and hears nothing; one plugged back in
        powers up afresh (``EmulatedServo.power_cycle``: saved EEPROM, Lock 1)."""
        with self.lock:
            chosen = set(range(NUM_JOINTS)) if joints is None else {self.servos.index(self.servo(j)) for j in joints}
            for i, s in enumerate(self.servos):
                cabled = i in chosen
                if cabled and not s.cabled:
                    s.power_cycle()
                s.update()
                s.cabled = cabled

    def connected_joints(self) -> list[str]:
        """The joints whose servo is plugged into the chain now."""
        with self.lock:
            return [j for j, s in zip(JOINT_NAMES, self.servos) if s.cabled]

    def set_realism(self, realism: ServoRealism) -> None:
        """Make every servo as strict as ``realism`` says (``drivers.emulator.realism``)."""
        with self.lock:
            for s in self.servos:
                s.update()
                s.realism = realism

    @property
    def realism(self) -> ServoRealism:
        return self.servos[0].realism

    def power_cycle(self) -> None:
        """The operator unplugs the arm's power and plugs it back: every servo reloads its saved
        EEPROM and starts with SRAM reset (torque off, Lock 1, latches cleared)."""
        with self.lock:
            for s in self.servos:
                s.power_cycle()

    # --- introspection ------------------------------------------------------------------------
    def eeprom_calibration(self) -> ArmCalibration:
        """The calibration the servos' EEPROM holds now (as LeRobot's read_calibration sees it)."""
        with self.lock:
            motors = {}
            for joint, s in zip(JOINT_NAMES, self.servos):
                motors[joint] = MotorCalibration(
                    id=s.servo_id,
                    drive_mode=0,
                    homing_offset=decode_sign_magnitude(s.reg("Homing_Offset"), 11),
                    range_min=s.reg("Min_Position_Limit"),
                    range_max=s.reg("Max_Position_Limit"),
                )
            return ArmCalibration(motors)

    def snapshot(self) -> dict:
        """A JSON-friendly view of every servo (for the control socket and debugging)."""
        with self.lock:
            servos = {}
            for joint, s in zip(JOINT_NAMES, self.servos):
                s.update()
                bits = s.error_bits()
                servos[joint] = {
                    "id": s.servo_id,
                    "online": s.online,
                    "cabled": s.cabled,
                    "baud_rate": BAUD_RATE_BY_CODE.get(s.reg("Baud_Rate"), 0),
                    "present_ticks": s.present_ticks(),
                    "goal_ticks": s.goal_ticks(),
                    "torque_enabled": s.torque_enabled,
                    "velocity_tps": round(s.vel_tps, 1),
                    "load_pct": round(s.load_pct, 1),
                    "temperature_c": round(s.temperature_c, 2),
                    "voltage_v": round(s.voltage_v, 2),
                    "error_bits": bits,
                    "errors": [name for bit, name in ERROR_BIT_NAMES.items() if bits & bit],
                    "lock": s.reg("Lock"),
                    "torque_limit": s.reg("Torque_Limit"),
                    "power_cycles": s.power_cycles,
                }
            return {
                "role": self.role,
                "preset": self.preset,
                "pose_units": self.pose_units().round(3).tolist(),
                "servos": servos,
            }
