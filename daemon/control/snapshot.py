"""The control loop's status: a snapshot (plain values, taken from any thread without locks)
and its rendering into the ``status`` verb's JSON shape.

The shape is a contract: ``so101d status`` (daemon/apps/commands/status.py), the README and the
browser console read these keys. ``render_status`` keeps it exactly; add keys, never rename.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration.conventions import JOINT_NAMES
from drivers.arm_interface import ArmHealth

SAFETY_CONFIG_KEYS: tuple[str, ...] = ("align_speed_deg_s", "max_step_deg", "leader_stale_s", "on_fault")
BUS_COUNTER_KEYS: tuple[str, ...] = ("transactions", "retries", "failures", "reconnects")


@dataclass(frozen=True)
class LinkSnapshot:
    """One arm's connection as the loop sees it."""

    connected: bool
    port: str | None
    connected_for_s: float  # since the last connect or loss
    connects: int
    losses: int
    last_error: str
    configure_warnings: tuple[str, ...]
    bus_counters: dict[str, int] | None  # None: the arm keeps no bus counters (a simulator)
    missing_servos: tuple[str, ...] = ()  # joints silent at the last (re)connect attempt or probe
    next_try_in_s: float | None = None  # while reconnecting: seconds to the next full attempt
    waiting: str = ""  # while not connected: what is missing, on which port, when the next try is


@dataclass(frozen=True)
class ArmSnapshot:
    """One driven arm: which source drives it, what it does, its follower's link and pose."""

    name: str
    source: str
    mode: str
    reason: str
    kind: str
    connected: bool
    teleop_source: str = ""  # the leader that drives it in teleop
    fault: str = ""  # latched or seen now (a needed power cycle first)
    follower: LinkSnapshot | None = None
    leader: LinkSnapshot | None = None  # its teleop leader's link (None: no such leader)
    follower_units: np.ndarray | None = None
    command_units: np.ndarray | None = None
    leader_units: np.ndarray | None = None
    errors: int = 0
    limited_cycles: int = 0
    health: ArmHealth | None = None


@dataclass(frozen=True)
class LoopSnapshot:
    """Everything ``status`` shows about the loop, copied at one moment."""

    mode: str
    intent: str
    reason: str
    fault: str  # for the operator: a needed power cycle first
    fault_latched: str
    fault_now: str
    torque_wanted: bool
    follower_kind: str
    uptime_s: float
    rate_hz_target: float
    rate_hz: float
    cycles: int
    overruns: int
    missed_cycles: int
    limited_cycles: int
    limit_hits: tuple[int, ...]
    leader_errors: int
    follower_errors: int
    hook_errors: int
    overlap_io: bool
    rate_warning: str
    scheduling: str  # the loop thread's: "other", "fifo:50", "other (fifo:50 refused)"
    power_cycle_required: str
    safety_config: dict[str, Any]
    timing_ms: dict[str, dict[str, float | int]]
    leader: LinkSnapshot | None
    follower: LinkSnapshot
    leader_age_s: float  # inf: never read
    leader_units: np.ndarray | None
    follower_units: np.ndarray | None
    command_units: np.ndarray | None
    health: ArmHealth | None
    health_age_s: float | None
    arms: tuple[ArmSnapshot, ...] = ()
    worst_calls_ms: dict[str, float] | None = None  # per source and hook: its longest single call


def _joints(v: np.ndarray | None) -> dict[str, float] | None:
    return None if v is None else {n: round(float(x), 3) for n, x in zip(JOINT_NAMES, v)}


def _link(link: LinkSnapshot | None) -> dict[str, Any] | None:
    if link is None:
        return None
    return {
        "connected": link.connected,
        "port": link.port,
        "since_s": round(link.connected_for_s, 3),
        "connects": link.connects,
        "losses": link.losses,
        "last_error": link.last_error,
        "configure_warnings": list(link.configure_warnings),
        "bus": None if link.bus_counters is None else dict(link.bus_counters),
        "missing_servos": list(link.missing_servos),
        "next_try_in_s": None if link.next_try_in_s is None else round(link.next_try_in_s, 3),
        "waiting": link.waiting,
    }


def _arms(arms: Sequence[ArmSnapshot]) -> dict[str, dict[str, Any]]:
    return {
        a.name: {
            "source": a.source,
            "mode": a.mode,
            "reason": a.reason,
            "kind": a.kind,
            "connected": a.connected,
            "teleop_source": a.teleop_source,
            "fault": a.fault,
            "follower": _link(a.follower),
            "leader": _link(a.leader),
            "joints": {
                "leader": _joints(a.leader_units),
                "follower": _joints(a.follower_units),
                "command": _joints(a.command_units),
            },
            "errors": a.errors,
            "limited_cycles": a.limited_cycles,
            "servos": _servos(a.health),
            "missing_servos": _missing(a.health, a.follower),
        }
        for a in arms
    }


def _missing(health: ArmHealth | None, follower: LinkSnapshot | None) -> list[str]:
    """The health read's silent servos, else (while reconnecting) those the link found missing."""
    if health is not None and health.missing:
        return list(health.missing)
    return list(follower.missing_servos) if follower is not None else []


def _servos(health: ArmHealth | None) -> dict[str, dict[str, Any]] | None:
    if health is None:
        return None
    return {
        name: {
            "temperature_c": h.temperature_c,
            "voltage_v": h.voltage_v,
            "load_pct": h.load_pct,
            "current_ma": h.current_ma,
            "status": h.status_bits,
            "torque": h.torque_enabled,
        }
        for name, h in health.servos.items()
    }


def _limit_hits(hits: Sequence[int]) -> dict[str, int]:
    return {n: int(c) for n, c in zip(JOINT_NAMES, hits)}


def render_status(s: LoopSnapshot) -> dict[str, Any]:
    """The ``status`` verb's loop part (the daemon adds socket, config, verbs and the extras)."""
    return {
        "mode": s.mode,
        "intent": s.intent,
        "reason": s.reason,
        "fault": s.fault,
        "torque_wanted": s.torque_wanted,
        "follower_kind": s.follower_kind,
        "uptime_s": round(s.uptime_s, 3),
        "rate_hz_target": s.rate_hz_target,
        "rate_hz": round(s.rate_hz, 2),
        "cycles": s.cycles,
        "overruns": s.overruns,
        "missed_cycles": s.missed_cycles,
        "limited_cycles": s.limited_cycles,
        "leader_errors": s.leader_errors,
        "follower_errors": s.follower_errors,
        "hook_errors": s.hook_errors,
        "overlap_io": s.overlap_io,
        "rate_warning": s.rate_warning,
        "scheduling": s.scheduling,
        "power_cycle_required": s.power_cycle_required,
        "safety": {
            **s.safety_config,
            "fault_latched": s.fault_latched,  # stays until the operator clears it
            "fault_now": s.fault_now,  # what the servos report right now
            "limited_cycles": s.limited_cycles,
            "limit_hits": _limit_hits(s.limit_hits),
        },
        "timing_ms": s.timing_ms,
        "leader": _link(s.leader),
        "follower": _link(s.follower),
        "leader_age_s": None if math.isinf(s.leader_age_s) else round(s.leader_age_s, 4),
        "joints": {
            "leader": _joints(s.leader_units),
            "follower": _joints(s.follower_units),
            "command": _joints(s.command_units),
        },
        "servos": _servos(s.health),
        # the health read's silent servos, else (while reconnecting) those the link found missing
        "missing_servos": _missing(s.health, s.follower),
        "health_age_s": None if s.health_age_s is None else round(s.health_age_s, 3),
        "arms": _arms(s.arms),
        "worst_calls_ms": dict(s.worst_calls_ms or {}),
    }
