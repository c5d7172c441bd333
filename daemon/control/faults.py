"""Fault classification for the control loop, as pure functions of plain data.

The loop sees failures in three places: a follower read that raised, a follower write that raised,
and a health reading. What each one *means* (a lost link, a servo off the bus, a latched overload
that needs the arm's power cycled, a transient hiccup the retries covered) is decided here, free
of I/O, clocks and logging, so it can be tested with plain values. The loop does the I/O and the
logging with the answers (``daemon/control/loop.py``); ``daemon/control/safety.py`` decides what the
follower is told once a fault is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from calibration.conventions import JOINT_NAMES
from drivers.arm_interface import ArmError, ArmHealth, HandshakeError, OverloadLatchedError, PortGoneError
from drivers.feetech_bus import ServoNoReplyError
from drivers.sts3215_table import describe_error_bits

# consecutive reads with the same servo(s) silent before that is a fault, not a hiccup the bus's
# retries already covered
MISSING_FAULT_CYCLES = 3
# overload and over-current: real STS3215s keep these bits (and refuse torque) until a power cycle
LATCHING_BITS = 0x20 | 0x08
_JOINT_BY_ID = {i + 1: name for i, name in enumerate(JOINT_NAMES)}

WriteFailure = Literal["latched", "gone", "transient"]


def describe_faults(health: ArmHealth, fault_bits: int, max_temperature_c: float) -> str:
    """A one-line fault description from a health reading, or "" when healthy."""
    parts: list[str] = []
    if health.missing:
        parts.append(f"servo(s) not answering: {', '.join(health.missing)}")
    for name, h in health.servos.items():
        bits = h.status_bits & fault_bits
        if bits:
            parts.append(f"{name}: {', '.join(describe_error_bits(bits))} (status 0x{h.status_bits:02x})")
        if h.temperature_c > max_temperature_c:
            parts.append(f"{name}: {h.temperature_c:.0f} C > {max_temperature_c:.0f} C")
    return "; ".join(parts)


@dataclass(frozen=True)
class ReadFailure:
    """What a failed follower read means."""

    gone: bool  # the port (or endpoint) is gone, or the failure is not an arm's: reconnect now
    silent_joints: tuple[str, ...] = ()  # some servos silent while the others answered: a servo off the bus

    def missing_fault(self) -> str:
        """The fault text for the silent servos ("" when none)."""
        return f"servo(s) not answering: {', '.join(self.silent_joints)}" if self.silent_joints else ""


def classify_read_failure(exc: BaseException) -> ReadFailure:
    """Some servos silent while others answer: a servo is off the bus. All of them silent is the
    bus or the port (or a stalled host), handled as a lost link once it lasts; a corrupt reply says
    nothing about which servo is there."""
    gone = isinstance(exc, PortGoneError) or not isinstance(exc, ArmError)
    silent: tuple[str, ...] = ()
    if isinstance(exc, ServoNoReplyError) and not exc.corrupt and 0 < len(exc.missing_ids) < len(JOINT_NAMES):
        silent = tuple(_JOINT_BY_ID.get(int(i), f"id {i}") for i in exc.missing_ids)
    return ReadFailure(gone=gone, silent_joints=silent)


def read_failure_lost(failure: ReadFailure, failing_s: float, stale_s: float) -> bool:
    """The follower link is lost: the port went, or no valid reply for long enough that the arm
    is not just noisy (five leader-stale periods, at least half a second)."""
    return failure.gone or failing_s > max(0.5, stale_s * 5)


def classify_write_failure(exc: BaseException) -> WriteFailure:
    """latched: only a power cycle helps (do not hammer the bus); gone: reconnect; transient: retry
    next cycle."""
    if isinstance(exc, OverloadLatchedError):
        return "latched"
    if isinstance(exc, PortGoneError) or not isinstance(exc, ArmError):
        return "gone"
    return "transient"


def handshake_fault(exc: BaseException) -> str:
    """A connect that failed because some servos answer but not all (or a wrong model) is a fault
    of that arm, not just a missing cable; nothing answering at all is a port/power matter ("")."""
    if isinstance(exc, HandshakeError) and "ids answering: none" not in str(exc):
        return str(exc)
    return ""


@dataclass(frozen=True)
class HealthVerdict:
    """What one health reading says."""

    fault: str  # the fault to report now ("" when healthy)
    power_cycle_required: str  # still needed ("" once the latch is gone)
    power_cycled: bool  # the latch went away: the servos lost their SRAM settings, configure again


def judge_health(
    health: ArmHealth, fault_bits: int, max_temperature_c: float, power_cycle_required: str
) -> HealthVerdict:
    """The fault a health reading shows, and whether a needed power cycle has happened (the
    latching bits are gone and every servo answers)."""
    fault = describe_faults(health, fault_bits, max_temperature_c)
    if not power_cycle_required:
        return HealthVerdict(fault, "", False)
    latched = bool(health.missing) or any(h.status_bits & LATCHING_BITS for h in health.servos.values())
    if latched:
        return HealthVerdict(
            f"{power_cycle_required} ({fault})" if fault else power_cycle_required, power_cycle_required, False
        )
    return HealthVerdict(fault, "", True)


def fault_text(fault: str, power_cycle_required: str) -> str:
    """The fault as the operator must read it: a needed power cycle first."""
    need = power_cycle_required
    if need and need not in fault:
        return f"{need} ({fault})" if fault else need
    return fault
