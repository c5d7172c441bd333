"""The small interface between the control loop and an arm.

The loop works in LeRobot 0.6.1 units only (degrees for the five body joints, gripper 0..100 with
0 closed and 100 open, see ``calibration.conventions``). Serial bytes, ticks and simulator radians
stay behind these classes, so a real STS3215 follower, the emulated one and a simulated follower
over ZeroMQ are interchangeable (GELLO's process split, LeRobot's robot/teleoperator split).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from calibration.calibration_file import ArmCalibration


class ArmError(RuntimeError):
    """Base of every arm failure the loop must handle (it never sees a bare serial exception)."""


class PortGoneError(ArmError):
    """The serial port (or simulator endpoint) disappeared: unplugged, or the process died."""


class BusTimeoutError(ArmError):
    """A transaction got no (or no valid) reply within its retries."""


class OverloadLatchedError(ArmError):
    """A servo's overload / over-current protection latched: only a power cycle of the arm clears
    it (real STS3215s keep the bit, and refuse torque, through Torque_Enable writes)."""

    def __init__(self, message: str, joints: list[str] | None = None) -> None:
        super().__init__(message)
        self.joints = list(joints or [])


class HandshakeError(ArmError):
    """Connected, but the servos found do not match what was expected (names the servo and port)."""


@dataclass(frozen=True)
class ServoHealth:
    """Slow-changing health registers of one servo, read at a lower rate than positions."""

    temperature_c: float
    voltage_v: float
    load_pct: float  # Present_Load in percent of max torque, signed
    current_ma: float
    status_bits: int  # STS3215 error bits (voltage 1, angle 2, overheat 4, overcurrent 8, overload 32)
    torque_enabled: bool


@dataclass(frozen=True)
class ArmHealth:
    """Health of every servo of an arm, keyed by joint name, plus when it was read."""

    servos: dict[str, ServoHealth] = field(default_factory=dict)
    read_at_s: float = 0.0  # time.monotonic() of the read
    missing: tuple[str, ...] = ()  # joints that did not answer

    @property
    def faults(self) -> dict[str, int]:
        return {name: h.status_bits for name, h in self.servos.items() if h.status_bits}


@dataclass
class BusCounters:
    """Transaction counters every arm keeps and the daemon reports."""

    transactions: int = 0
    retries: int = 0
    failures: int = 0  # transactions that failed after all retries
    reconnects: int = 0


@dataclass(frozen=True)
class BusDiagnostics:
    """What an arm can tell about its link, for status and the rate diagnosis (copied when asked)."""

    latency_timer_ms: int | None = None  # an FTDI adapter's latency timer (None: not an FTDI, or a simulator)
    configure_warnings: tuple[str, ...] = ()  # timing registers a servo did not keep at configure
    counters: BusCounters | None = None  # None: the arm keeps no bus counters


@runtime_checkable
class Arm(Protocol):
    """What every arm offers, leader or follower: where it is, how to reach it, what is missing."""

    @property
    def port(self) -> str:
        """The serial port, or the simulator's endpoint."""
        ...

    def connect(self) -> None: ...

    def read_joints(self) -> np.ndarray:
        """Joint positions, float64 shape (6,), LeRobot units, in ``JOINT_NAMES`` order.

        Raises ArmError (never returns a stale value silently)."""
        ...

    def missing_servos(self) -> tuple[str, ...]:
        """Joints whose servos did not answer the last read or connect attempt (``()`` when all
        did, or when the arm has no servos of its own, a simulator): cheap, no bus traffic."""
        ...

    def probe_missing(self) -> tuple[str, ...]:
        """Ping the servos that were missing (a few bytes each, no full handshake) and return the
        ones still silent; called off the loop thread while the arm is being reconnected."""
        ...

    def diagnostics(self) -> BusDiagnostics: ...

    def close(self, torque_off: bool = True) -> None:
        """Release the port; ``torque_off`` switches the servos' torque off first (best effort;
        False: a follower keeps holding its last goal, ``follower.torque_off_on_shutdown = false``)."""
        ...


@runtime_checkable
class LeaderArm(Arm, Protocol):
    """The arm the operator moves by hand (torque off)."""

    @property
    def calibration(self) -> ArmCalibration | None:
        """The calibration it converts with (None: not loaded)."""
        ...


@runtime_checkable
class FollowerArm(Arm, Protocol):
    """The arm that follows: real STS3215 bus, emulated bus, or simulator."""

    kind: str  # "feetech" or "sim"

    @property
    def sim_mapping(self) -> str | None:
        """The ``[follower] sim_mapping`` a simulated follower is driven through; None: a real arm."""
        ...

    @property
    def dataset_kind(self) -> str:
        """What its episodes are tagged: "feetech", "emulated" (our bus emulator behind a
        pseudo-terminal), "sim-mujoco", "sim-leisaac"."""
        ...

    def write_goals(self, goals: np.ndarray) -> None:
        """Absolute joint targets, shape (6,), LeRobot units. Values must already be safe."""
        ...

    def set_torque(self, enabled: bool) -> None: ...

    def read_health(self) -> ArmHealth: ...

    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) joint limits in LeRobot units, from the follower's calibration."""
        ...

    def scene_resets(self) -> int:
        """How many times the follower's world was reset under it (a simulator's scene reset
        moves the arm without a command from us); always 0 for a real arm. The count goes up
        only once a pose measured after the reset is what ``read_joints`` returns, so a loop that
        reads this before ``read_joints`` never pairs a new count with a pre-reset pose."""
        ...
