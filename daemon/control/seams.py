"""The seams of the control loop, declared: what a target source, a cycle hook, a leader hook and
a watchdog must offer. Recording, the policy, the sim and the LeIsaac remote-leader publisher
implement these; the loop calls nothing else on them.

Every method here runs on the loop thread, once per cycle (or per fresh leader reading): it must
cost microseconds and never block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class TargetSource(Protocol):
    """Where the loop's target comes from: the leader in ``teleop``, the policy in ``policy``.

    ``target`` returns the joint target (LeRobot units), or None for "nothing fresh": the loop
    then holds the measured pose.
    """

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None: ...


@runtime_checkable
class PerArmSource(Protocol):
    """One source that drives several arms at once (a bimanual policy: one 12-wide action for
    the left and right arms): each arm it drives asks its own view, by arm name. Its own
    ``target`` serves an arm it has no view for (None: that arm holds)."""

    @property
    def views(self) -> Mapping[str, TargetSource]: ...

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None: ...


@runtime_checkable
class CycleHook(Protocol):
    """Called every cycle with the follower's measured state, the command sent and the raw target
    (the source's reading before safety). It may keep the arrays (they are not reused)."""

    def on_cycle(
        self, now_monotonic_s: float, state_units: np.ndarray, action_units: np.ndarray, teleop_action_units: np.ndarray
    ) -> None: ...


@dataclass(frozen=True)
class ArmRecord:
    """One arm's part of a cycle: its measured state, the command sent, the raw target (the
    source's reading before safety) and the name of the source that drove it."""

    arm: str  # "follower"; "left", "right" on a bimanual bench
    source: str  # "leader", "policy", or any source the loop was given (``ControlLoop.add_source``)
    state_units: np.ndarray
    action_units: np.ndarray
    teleop_action_units: np.ndarray


@dataclass(frozen=True)
class CycleRecord:
    """What a ``RecordHook`` gets each cycle: every arm whose pose is current, in the loop's arm
    order (the first is the primary arm, the one a single-arm dataset records, when its pose is
    current: on a loop of several arms a record may lack it)."""

    now_monotonic_s: float
    arms: tuple[ArmRecord, ...]
    primary_current: bool = True  # False: the primary arm is not among ``arms`` this cycle

    def sources_text(self) -> str:
        """Who drove what, as one short string: ``follower=leader`` (``left=policy,right=leader``)."""
        return ",".join(f"{a.arm}={a.source}" for a in self.arms)


@runtime_checkable
class RecordHook(Protocol):
    """Called every cycle in which the primary arm's pose is current (on a loop of several arms:
    any arm's), with the whole record (the recorder). An object that is a RecordHook gets only this call, not ``on_cycle``."""

    def on_record(self, record: CycleRecord) -> None: ...


@runtime_checkable
class LeaderHook(Protocol):
    """Called after each fresh leader reading (LeRobot units)."""

    def on_leader(self, now_monotonic_s: float, leader_units: np.ndarray) -> None: ...


class Watchdog(Protocol):
    """The service manager's watchdog gate (``daemon.system.sd_notify.WatchdogGate``): told after every cycle."""

    def progress(self, now_s: float | None = None, healthy: bool = True) -> bool: ...
