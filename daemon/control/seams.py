"""The seams of the control loop, declared: what a target source, a cycle hook, a leader hook and
a watchdog must offer. Recording, the policy, the sim and the LeIsaac remote-leader publisher
implement these; the loop calls nothing else on them.

Every method here runs on the loop thread, once per cycle (or per fresh leader reading): it must
cost microseconds and never block.
"""

from __future__ import annotations

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
class CycleHook(Protocol):
    """Called every cycle with the follower's measured state, the command sent and the raw target
    (the source's reading before safety). It may keep the arrays (they are not reused)."""

    def on_cycle(
        self, now_monotonic_s: float, state_units: np.ndarray, action_units: np.ndarray, teleop_action_units: np.ndarray
    ) -> None: ...


@runtime_checkable
class LeaderHook(Protocol):
    """Called after each fresh leader reading (LeRobot units)."""

    def on_leader(self, now_monotonic_s: float, leader_units: np.ndarray) -> None: ...


class Watchdog(Protocol):
    """The service manager's watchdog gate (``daemon.system.sd_notify.WatchdogGate``): told after every cycle."""

    def progress(self, now_s: float | None = None, healthy: bool = True) -> bool: ...
