"""One emulated Feetech STS3215: its control table and a lazily integrated motor model.

Registers follow ``drivers.sts3215_table``. Positions live in a *physical* frame (raw encoder
ticks, unwrapped float); the servo reports ``Present_Position = physical - Homing_Offset``
wrapped to 0..4095 (or unwrapped, sign-magnitude bit 15, when Phase bit 4 is set), so a
calibration write changes what is read without moving the joint, as on the real servo.

Dynamics are integrated only when someone looks (a register access or an API call), from the
injected monotonic clock: no background thread, no CPU use while the bus is idle.

Model (good enough to make timing, stalls and protections behave like the real servo):
- position mode: trapezoidal motion toward Goal_Position at up to ``max_speed_tps`` (about
  3000 ticks/s for the 1/345 follower at 7.4 V) or Goal_Velocity if lower, with the
  Acceleration register (units of 100 ticks/s^2; 0 = no ramp); a goal within the dead zone
  (CW/CCW_Dead_Zone + 1 ticks) of the present position does not move the horn;
- goals clamped to Min/Max_Position_Limit (unless both are 0);
- velocity mode (Operating_Mode 1): constant Goal_Velocity;
- an obstacle (``block_at``) stops the horn; the position error then loads the motor
  (P_Coefficient-scaled, capped by Torque_Limit / Max_Torque_Limit);
- overload protection: load above Overload_Torque % for Protection_Time x 10 ms cuts the torque
  and latches the overload bit (cleared by the next Torque_Enable write, or only by a power
  cycle under ``ServoRealism.overload_latch_until_power_cycle``); likewise current
  (15 mA + 15 mA per % of load) above Protection_Current (6.5 mA units) for
  Over_Current_Protection_Time x 10 ms latches the over-current bit;
- temperature: first-order heating with load squared; voltage sags with load; error bits for
  voltage outside the limits and temperature above Max_Temperature_Limit;
- torque off: the horn stays where it is, or follows an external source (a leader arm moved by
  hand or by a motion source); when torque is released the source is dropped, so a joint the
  motor drove stays where the motor left it.

EEPROM: ``saved_eeprom`` is what survives ``power_cycle()``. A write made with Lock = 0 is applied
and saved; with Lock = 1 it is ignored (default) or applied but not saved
(``ServoRealism.lock_applies_unsaved``, as on the real servo). See ``drivers.emulator.realism``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from drivers.emulator.realism import ServoRealism
from drivers.sts3215_table import (
    CONTROL_TABLE,
    EEPROM_END,
    ERR_ANGLE_SENSOR,
    ERR_OVERCURRENT,
    ERR_OVERHEAT,
    ERR_OVERLOAD,
    ERR_VOLTAGE,
    FIRMWARE_MAJOR,
    FIRMWARE_MINOR,
    MODEL_NUMBER_STS3215,
    TABLE_SIZE,
    TICKS_PER_TURN,
    decode_sign_magnitude,
    encode_sign_magnitude,
)

_A = {name: addr for name, (addr, _size) in CONTROL_TABLE.items()}
ADDR_TORQUE_ENABLE = _A["Torque_Enable"]
ADDR_GOAL_POSITION = _A["Goal_Position"]
ADDR_LOCK = _A["Lock"]
ADDR_ID = _A["ID"]
ADDR_PRESENT_POSITION = _A["Present_Position"]
ADDR_PRESENT_CURRENT = _A["Present_Current"]
ADDR_RETURN_DELAY = _A["Return_Delay_Time"]
ADDR_MAX_ACCELERATION = _A["Maximum_Acceleration"]

# Addresses the host cannot change (firmware, model, the feedback block).
_READ_ONLY = frozenset({0, 1, 2, 3, 4} | set(range(_A["Present_Position"], _A["Present_Current"] + 2)))
_FEEDBACK_FIRST = _A["Present_Position"]
_FEEDBACK_END = _A["Present_Current"] + 2

CURRENT_MA_PER_UNIT = 6.5  # Present_Current LSB
AMBIENT_C = 28.0
THERMAL_TAU_S = 300.0
HEAT_C_PER_S_AT_FULL_LOAD = 0.5
SUBSTEP_S = 0.002
MAX_SUBSTEPS = 2000
NO_RAMP_ACCEL_TPS2 = 1.0e6
VELOCITY_WINDOW_S = 0.005


def factory_registers(servo_id: int) -> bytearray:
    """The control table of a new STS3215 (7.4 V) as it leaves the factory (Lock set at power-on)."""
    mem = bytearray(TABLE_SIZE)

    def put(name: str, value: int) -> None:
        addr, size = CONTROL_TABLE[name]
        mem[addr : addr + size] = int(value).to_bytes(size, "little")

    put("Firmware_Major_Version", FIRMWARE_MAJOR)
    put("Firmware_Minor_Version", FIRMWARE_MINOR)
    put("Model_Number", MODEL_NUMBER_STS3215)
    put("ID", servo_id)
    put("Baud_Rate", 0)
    put("Return_Delay_Time", 250)
    put("Response_Status_Level", 1)
    put("Min_Position_Limit", 0)
    put("Max_Position_Limit", 4095)
    put("Max_Temperature_Limit", 70)
    put("Max_Voltage_Limit", 80)
    put("Min_Voltage_Limit", 40)
    put("Max_Torque_Limit", 1000)
    put("Phase", 0x0C)
    put("Unloading_Condition", 44)
    put("LED_Alarm_Condition", 47)
    put("P_Coefficient", 32)
    put("D_Coefficient", 32)
    put("I_Coefficient", 0)
    put("Minimum_Startup_Force", 16)
    put("CW_Dead_Zone", 1)
    put("CCW_Dead_Zone", 1)
    put("Protection_Current", 500)
    put("Angular_Resolution", 1)
    put("Homing_Offset", 0)
    put("Operating_Mode", 0)
    put("Protective_Torque", 20)
    put("Protection_Time", 200)
    put("Overload_Torque", 80)
    put("Velocity_closed_loop_P_proportional_coefficient", 10)
    put("Over_Current_Protection_Time", 200)
    put("Velocity_closed_loop_I_integral_coefficient", 200)
    put("Torque_Enable", 0)
    put("Acceleration", 0)
    put("Torque_Limit", 1000)
    put("Lock", 1)
    put("Maximum_Acceleration", 0)
    return mem


@dataclass
class ServoPhysics:
    """Per-servo physical constants (not registers)."""

    max_speed_tps: float = 3000.0  # no-load speed, ticks/s
    supply_v: float = 7.4
    hold_load_pct: float = 3.0  # gravity / friction when holding still, torque on
    gravity_sign: float = 1.0


class EmulatedServo:
    """Registers + motor model of one STS3215. Not thread-safe: the arm serialises access."""

    def __init__(
        self,
        servo_id: int,
        physical_ticks: float,
        clock: Callable[[], float],
        physics: ServoPhysics | None = None,
        registers: bytearray | None = None,
        realism: ServoRealism | None = None,
    ) -> None:
        self.mem = registers if registers is not None else factory_registers(servo_id)
        self.mem[ADDR_ID] = servo_id
        self.realism = realism or ServoRealism()
        self.saved_eeprom = bytes(self.mem[:EEPROM_END])  # what a power cycle brings back
        self.power_cycles = 0
        self.refused_addresses: set[int] = set()  # fault injection: writes here acknowledged, not kept
        self.clock = clock
        self.physics = physics or ServoPhysics()
        self.phys = float(physical_ticks)  # raw encoder, unwrapped
        self.vel_tps = 0.0  # signed, in the present frame (same sign as physical)
        self.load_pct = 0.0
        self.temperature_c = AMBIENT_C
        self.voltage_v = self.physics.supply_v
        self.overload_s = 0.0  # how long the load has stayed above Overload_Torque
        self.overcurrent_s = 0.0
        self.latched_errors = 0  # overload / overcurrent, cleared by a Torque_Enable write
        self.forced_errors = 0  # injected from the API
        self.block_lo: float | None = None  # physical bounds imposed by an obstacle
        self.block_hi: float | None = None
        self.external: Callable[[float], float] | None = None  # torque-off position source (physical)
        # Called when torque goes off; the arm pauses its motion source there (no snap back).
        self.on_release: Callable[[EmulatedServo], None] | None = None
        self.online = True
        # Its 3-pin cable is plugged into the chain (a new kit is set up one servo at a time).
        self.cabled = True
        self.pending_reg_write: tuple[int, bytes] | None = None
        self._t = clock()
        # Power-on: goal = present, so enabling torque holds the pose.
        self._set_reg("Goal_Position", self._present_now())

    # --- register helpers -------------------------------------------------------------------
    @property
    def servo_id(self) -> int:
        return self.mem[ADDR_ID]

    def _reg(self, name: str) -> int:
        """Register value as stored (no model update: for use inside the model)."""
        addr, size = CONTROL_TABLE[name]
        if size == 1:
            return self.mem[addr]
        return int.from_bytes(self.mem[addr : addr + size], "little")

    def reg(self, name: str) -> int:
        """Register value as the bus would read it now (model brought up to date first)."""
        self.update()
        addr, size = CONTROL_TABLE[name]
        if addr < _FEEDBACK_END and addr + size > _FEEDBACK_FIRST:
            self._refresh_feedback()
        return self._reg(name)

    def _set_reg(self, name: str, value: int) -> None:
        addr, size = CONTROL_TABLE[name]
        self.mem[addr : addr + size] = (int(value) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")

    def set_register(self, name: str, value: int) -> None:
        """Set a register directly (test/preset API: bypasses Lock and read-only rules; an EEPROM
        register is saved too, as if it had been so since the factory)."""
        self._set_reg(name, value)
        self.saved_eeprom = bytes(self.mem[:EEPROM_END])

    @property
    def on_bus(self) -> bool:
        """Hears the bus and may answer: powered and answering, and its cable plugged in."""
        return self.online and self.cabled

    @property
    def homing_offset(self) -> int:
        return decode_sign_magnitude(self._reg("Homing_Offset"), 11)

    @property
    def torque_enabled(self) -> bool:
        """Torque on now (after bringing the model up to date: a protection may have tripped)."""
        self.update()
        return self._torque_on()

    def _torque_on(self) -> bool:
        return self.mem[ADDR_TORQUE_ENABLE] == 1

    def _limits(self) -> tuple[int, int] | None:
        lo, hi = self._reg("Min_Position_Limit"), self._reg("Max_Position_Limit")
        if lo == 0 and hi == 0:
            return None
        return lo, hi

    def goal_ticks(self) -> int:
        return decode_sign_magnitude(self._reg("Goal_Position"), 15)

    # --- frames -----------------------------------------------------------------------------
    def _unwrapped_feedback(self) -> bool:
        return bool(self.mem[CONTROL_TABLE["Phase"][0]] & 0x10)

    def present_from_phys(self, phys: float) -> float:
        """Physical ticks -> present-frame ticks (float, before rounding)."""
        p = phys - self.homing_offset
        if self._unwrapped_feedback():
            return p
        return p % TICKS_PER_TURN

    def present_ticks(self) -> int:
        """Present_Position now (model brought up to date first), in its EEPROM frame."""
        self.update()
        return self._present_now()

    def _present_now(self) -> int:
        p = self.present_from_phys(self.phys)
        r = round(p)
        if not self._unwrapped_feedback() and r >= TICKS_PER_TURN:
            r -= TICKS_PER_TURN
        return r

    def phys_from_present(self, present: float) -> float:
        """The physical position nearest the current one that reads ``present``."""
        cur = self.present_from_phys(self.phys)
        return self.phys + (present - cur)

    # --- dynamics ---------------------------------------------------------------------------
    def update(self, now: float | None = None) -> None:
        """Integrate the model from the last update to ``now``."""
        now = self.clock() if now is None else now
        dt = now - self._t
        if dt <= 0.0:
            return
        self._t = now
        prev_phys = self.phys
        if self._torque_on():
            self._integrate_torque_on(dt)
        else:
            self.overload_s = 0.0
            self.overcurrent_s = 0.0
            if self.external is not None:
                self.phys = self._external_at(now)
                blocked = self._apply_block()
                # What the encoder sees now: the source's instantaneous speed, not the average
                # since the last (possibly long ago) access.
                earlier = self._external_at(now - VELOCITY_WINDOW_S)
                self.vel_tps = 0.0 if blocked else (self.phys - earlier) / VELOCITY_WINDOW_S
            else:
                self.vel_tps = (self.phys - prev_phys) / dt if dt < 0.05 else 0.0
            self.load_pct = 0.0
        self._thermal(dt)

    def _external_at(self, t: float) -> float:
        """The hand's position at ``t``."""
        assert self.external is not None
        return float(self.external(t))

    def _released(self) -> None:
        """Torque just went off: the horn stays where the motor left it. An external source is
        dropped (the hand holds the joint here rather than snapping it back to its script), and
        the owner is told so it can pause the other joints' source too."""
        if self.on_release is not None:
            self.on_release(self)
        self.external = None

    def _apply_block(self) -> bool:
        if self.block_hi is not None and self.phys > self.block_hi:
            self.phys = self.block_hi
            return True
        if self.block_lo is not None and self.phys < self.block_lo:
            self.phys = self.block_lo
            return True
        return False

    def _accel_tps2(self) -> float:
        acc = self.mem[CONTROL_TABLE["Acceleration"][0]]
        return acc * 100.0 if acc else NO_RAMP_ACCEL_TPS2

    def _torque_cap_pct(self) -> float:
        if self.realism.torque_limit_seeded_at_power_on:
            # The real servo caps at Torque_Limit; Max_Torque_Limit only seeds it at power-on.
            return min(self._reg("Torque_Limit"), 1000) / 10.0
        return min(self._reg("Torque_Limit"), self._reg("Max_Torque_Limit"), 1000) / 10.0

    def _integrate_torque_on(self, dt: float) -> None:
        mode = self.mem[CONTROL_TABLE["Operating_Mode"][0]]
        accel = self._accel_tps2()
        vmax = self.physics.max_speed_tps
        deadband = max(self.mem[CONTROL_TABLE["CW_Dead_Zone"][0]], self.mem[CONTROL_TABLE["CCW_Dead_Zone"][0]]) + 1
        goal = self.goal_ticks()
        if mode == 0:
            gv = decode_sign_magnitude(self._reg("Goal_Velocity"), 15)
            if gv:
                vmax = min(vmax, abs(gv))
        n = min(MAX_SUBSTEPS, max(1, math.ceil(dt / SUBSTEP_S)))
        h = dt / n
        cap_pct = self._torque_cap_pct()
        p_gain = self.mem[CONTROL_TABLE["P_Coefficient"][0]]
        overload_thr = self.mem[CONTROL_TABLE["Overload_Torque"][0]]
        overload_time_s = self.mem[CONTROL_TABLE["Protection_Time"][0]] * 0.01
        overcurrent_ma = self._reg("Protection_Current") * CURRENT_MA_PER_UNIT
        overcurrent_time_s = self.mem[CONTROL_TABLE["Over_Current_Protection_Time"][0]] * 0.01
        for _ in range(n):
            cur = self.present_from_phys(self.phys)
            blocked = False
            if mode == 0:
                err = goal - cur
                if abs(err) <= deadband and abs(self.vel_tps) < 1e-9:
                    v_des = 0.0
                    err = 0.0
                else:
                    v_des = math.copysign(min(vmax, math.sqrt(2.0 * accel * abs(err))), err)
            elif mode == 1:
                err = 0.0
                v_des = float(decode_sign_magnitude(self._reg("Goal_Velocity"), 15))
                v_des = max(-vmax, min(vmax, v_des))
            else:
                err = 0.0
                v_des = 0.0
            dv = v_des - self.vel_tps
            max_dv = accel * h
            if dv > max_dv:
                dv = max_dv
            elif dv < -max_dv:
                dv = -max_dv
            v_prev = self.vel_tps
            self.vel_tps += dv
            step = self.vel_tps * h
            if mode == 0 and err != 0.0 and abs(step) >= abs(err):
                step = err
                self.vel_tps = 0.0
            self.phys += step
            if self._apply_block():
                blocked = True
                self.vel_tps = 0.0
            # Load: the position error of a stalled horn, or motion / acceleration effort.
            if blocked and mode == 0:
                stall_err = abs(goal - self.present_from_phys(self.phys))
                demand = min(cap_pct, 2.0 * stall_err * max(p_gain, 1) / 32.0)
                self.load_pct = math.copysign(demand, goal - self.present_from_phys(self.phys))
            else:
                effort = (
                    4.0
                    + 10.0 * abs(self.vel_tps) / max(vmax, 1.0)
                    + 4.0 * abs(self.vel_tps - v_prev) / max(max_dv, 1e-9)
                )
                if abs(self.vel_tps) < 1e-9 and abs(v_prev) < 1e-9:
                    self.load_pct = min(cap_pct, self.physics.hold_load_pct) * self.physics.gravity_sign
                else:
                    self.load_pct = math.copysign(min(cap_pct, effort), self.vel_tps if self.vel_tps else v_prev)
            # Overload protection.
            if abs(self.load_pct) > overload_thr:
                self.overload_s += h
                if self.overload_s >= overload_time_s:
                    self._trip(ERR_OVERLOAD)
                    return
            else:
                self.overload_s = 0.0
            if self._current_ma() > overcurrent_ma:
                self.overcurrent_s += h
                if self.overcurrent_s >= overcurrent_time_s:
                    self._trip(ERR_OVERCURRENT)
                    return
            else:
                self.overcurrent_s = 0.0

    def _trip(self, bit: int) -> None:
        """Protection: cut the torque and latch the error bit, as the STS3215 does."""
        self.latched_errors |= bit
        if self.realism.overload_goes_silent:
            self.online = False  # answers nothing until power_cycle()
        self.mem[ADDR_TORQUE_ENABLE] = 0
        self.vel_tps = 0.0
        self.load_pct = 0.0
        self.overload_s = 0.0
        self.overcurrent_s = 0.0
        self._released()

    def _thermal(self, dt: float) -> None:
        heat = HEAT_C_PER_S_AT_FULL_LOAD * (self.load_pct / 100.0) ** 2
        t_eq = AMBIENT_C + heat * THERMAL_TAU_S
        self.temperature_c = t_eq + (self.temperature_c - t_eq) * math.exp(-dt / THERMAL_TAU_S)
        self.voltage_v = self.physics.supply_v - 0.4 * abs(self.load_pct) / 100.0

    # --- feedback ---------------------------------------------------------------------------
    def current_ma(self) -> float:
        self.update()
        return self._current_ma()

    def _current_ma(self) -> float:
        return 15.0 + abs(self.load_pct) * 15.0 if self._torque_on() else 8.0

    def error_bits(self) -> int:
        """Status error bits now (model brought up to date first)."""
        self.update()
        return self._error_bits()

    def _error_bits(self) -> int:
        bits = self.latched_errors | self.forced_errors
        v10 = round(self.voltage_v * 10)
        if (
            v10 > self.mem[CONTROL_TABLE["Max_Voltage_Limit"][0]]
            or v10 < self.mem[CONTROL_TABLE["Min_Voltage_Limit"][0]]
        ):
            bits |= ERR_VOLTAGE
        if self.temperature_c > self.mem[CONTROL_TABLE["Max_Temperature_Limit"][0]]:
            bits |= ERR_OVERHEAT
        return bits & (ERR_VOLTAGE | ERR_ANGLE_SENSOR | ERR_OVERHEAT | ERR_OVERCURRENT | ERR_OVERLOAD)

    def _refresh_feedback(self) -> None:
        present = self._present_now()
        if self._unwrapped_feedback():
            present = encode_sign_magnitude(max(-32767, min(32767, present)), 15)
        self._set_reg("Present_Position", present)
        vel = round(self.vel_tps)
        self._set_reg("Present_Velocity", encode_sign_magnitude(max(-32767, min(32767, vel)), 15))
        load = round(max(-100.0, min(100.0, self.load_pct)) * 10)
        self._set_reg("Present_Load", encode_sign_magnitude(load, 10))
        self._set_reg("Present_Voltage", max(0, min(255, round(self.voltage_v * 10))))
        self._set_reg("Present_Temperature", max(0, min(255, round(self.temperature_c))))
        self._set_reg("Status", self._error_bits())
        moving = abs(self.vel_tps) > 0.5
        self._set_reg("Moving", 1 if moving else 0)
        self._set_reg("Present_Current", min(0x7FFF, round(self._current_ma() / CURRENT_MA_PER_UNIT)))

    # --- bus access -------------------------------------------------------------------------
    def read(self, address: int, length: int, now: float | None = None) -> bytes:
        """Bytes of the control table (what a READ / SYNC_READ returns)."""
        if address < _FEEDBACK_END and address + length > _FEEDBACK_FIRST:
            self.update(now)
            self._refresh_feedback()
        end = min(TABLE_SIZE, address + length)
        data = bytes(self.mem[address:end])
        return data + bytes(length - len(data))

    def write(self, address: int, data: bytes, now: float | None = None) -> None:
        """Apply a WRITE. EEPROM bytes: applied and saved with Lock 0; with Lock 1 ignored, or
        applied but not saved (``realism.lock_applies_unsaved``). Read-only bytes: never."""
        self.update(now)
        locked = self.mem[ADDR_LOCK] == 1
        realism = self.realism
        touched: set[int] = set()
        saved = bytearray(self.saved_eeprom)
        for k, byte in enumerate(data):
            a = address + k
            if a >= TABLE_SIZE or a in _READ_ONLY:
                continue
            if a == ADDR_MAX_ACCELERATION and realism.max_acceleration_read_only:
                continue
            if a in self.refused_addresses:
                continue
            if a == ADDR_RETURN_DELAY and byte < realism.return_delay_min:
                byte = realism.return_delay_min
            if a < EEPROM_END:
                if locked and not realism.lock_applies_unsaved:
                    continue
                if not locked:
                    saved[a] = byte
            if a == ADDR_TORQUE_ENABLE:
                self._write_torque_enable(byte)
                continue
            self.mem[a] = byte
            touched.add(a)
        self.saved_eeprom = bytes(saved)
        if ADDR_GOAL_POSITION in touched or ADDR_GOAL_POSITION + 1 in touched:
            self._clamp_goal()
        if ADDR_LOCK in touched and self.mem[ADDR_LOCK] > 1:
            self.mem[ADDR_LOCK] = 1

    def _write_torque_enable(self, value: int) -> None:
        if self.latched_errors and self.realism.overload_latch_until_power_cycle:
            # The protection holds until power is removed: torque stays off, the bit stays set.
            if not value:
                self.mem[ADDR_TORQUE_ENABLE] = 0
            return
        self.latched_errors = 0
        self.overload_s = 0.0
        if value == 128:
            # STS "set middle": the present position becomes 2048 (written to Homing_Offset).
            offset = round(self.phys) % TICKS_PER_TURN - 2048
            self._set_reg("Homing_Offset", encode_sign_magnitude(offset, 11))
            return
        was_on = self._torque_on()
        self.mem[ADDR_TORQUE_ENABLE] = 1 if value else 0
        if was_on and not value:
            self.vel_tps = 0.0
            self.load_pct = 0.0
            self._released()

    def _clamp_goal(self) -> None:
        lim = self._limits()
        if lim is None:
            return
        goal = self.goal_ticks()
        clamped = max(lim[0], min(lim[1], goal))
        if clamped != goal:
            self._set_reg("Goal_Position", encode_sign_magnitude(clamped, 15))

    def power_cycle(self) -> None:
        """Power removed and restored: saved EEPROM reloaded, SRAM reset (torque off, Lock 1,
        Torque_Limit seeded from Max_Torque_Limit, goal = present), latches cleared, online."""
        self.update()
        self.mem[:EEPROM_END] = self.saved_eeprom
        fresh = factory_registers(self.mem[ADDR_ID])
        for name in ("Torque_Enable", "Acceleration", "Goal_Time", "Goal_Velocity", "Lock"):
            addr, size = CONTROL_TABLE[name]
            self.mem[addr : addr + size] = fresh[addr : addr + size]
        self._set_reg("Torque_Limit", self._reg("Max_Torque_Limit"))
        self.latched_errors = 0
        self.overload_s = self.overcurrent_s = 0.0
        self.vel_tps = self.load_pct = 0.0
        self.pending_reg_write = None
        self.online = True  # an external source (the hand on a leader) keeps moving the horn
        self._set_reg(
            "Goal_Position",
            encode_sign_magnitude(self._present_now(), 15) if self._unwrapped_feedback() else self._present_now(),
        )
        self.power_cycles += 1

    # --- API for tests / motion sources -----------------------------------------------------
    def move_to_present(self, present_ticks: float) -> None:
        """Move the horn by hand (or by a test) to a present-frame position; honours obstacles."""
        self.update()
        self.phys = self.phys_from_present(present_ticks)
        self._apply_block()
        # On a torqued joint this is a disturbance the position loop then corrects.

    def block_at(self, present_ticks: float | None) -> None:
        """Put an obstacle at a present-frame position (None removes it).

        The obstacle stops motion from the current side toward and past it.
        """
        self.update()
        if present_ticks is None:
            self.block_lo = self.block_hi = None
            return
        wall = self.phys_from_present(present_ticks)
        if wall >= self.phys:
            self.block_hi, self.block_lo = wall, None
        else:
            self.block_lo, self.block_hi = wall, None
