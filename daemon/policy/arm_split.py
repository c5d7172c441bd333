"""One policy driving several arms: a bimanual policy's joint vector split into each arm's target.

A policy trained on a bimanual dataset (LeRobot 0.6.1's ``BiSOFollower`` layout,
lerobot/robots/bi_so_follower/bi_so_follower.py: ``left_shoulder_pan.pos`` .. ``left_gripper.pos``,
then ``right_...``) takes every arm's pose in one ``observation.state`` and answers one action of
the same width. The control loop asks each arm's source in turn, with that arm's pose only. The
first arm asked in a cycle asks the policy once, with every arm's measured pose joined in the
vector's order (the loop's read step measured them all before any source is asked); each arm
takes its own slice of that answer. So the policy sees one observation and gives one action per
cycle, as LeRobot's own bimanual rollout does, and each arm keeps its own safety layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from calibration.conventions import NUM_JOINTS
from daemon.control.seams import TargetSource


class MeasuredArm(Protocol):
    """What the split reads of each arm (the loop's DrivenArm): its name and newest pose."""

    @property
    def name(self) -> str: ...

    @property
    def measured(self) -> np.ndarray | None: ...


class ArmSplit:
    """A ``PerArmSource`` (daemon/control/seams.py) over ``policy``: ``views[arm]`` is that arm's
    source. ``arms`` in the policy vector's order (LeRobot's: left, then right)."""

    def __init__(self, policy: TargetSource, arms: Sequence[MeasuredArm], joints_per_arm: int = NUM_JOINTS):
        if len(arms) < 2:
            raise ValueError("a split needs two arms or more; one arm takes the policy's source itself")
        self.policy = policy
        self.arms = tuple(arms)
        self.joints_per_arm = joints_per_arm
        self.width = joints_per_arm * len(self.arms)
        self.views: Mapping[str, TargetSource] = {
            a.name: _ArmView(self, slice(i * joints_per_arm, (i + 1) * joints_per_arm)) for i, a in enumerate(self.arms)
        }
        self._asked_at: float | None = None  # the cycle (its ``now``) the policy was last asked in
        self._answer: np.ndarray | None = None
        self._state = np.zeros(self.width, dtype=np.float64)
        self.unposed_cycles = 0  # cycles with an arm's pose unknown: the policy was not asked, all held

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        """An arm with no view of its own (not one the policy was trained for) holds."""
        return None

    def answer(self, now_monotonic_s: float) -> np.ndarray | None:
        """The policy's whole action for this cycle (asked once per cycle; None: every arm holds)."""
        if now_monotonic_s == self._asked_at:
            return self._answer
        self._asked_at = now_monotonic_s
        state, n = self._state, self.joints_per_arm
        for i, arm in enumerate(self.arms):
            pose = arm.measured
            if pose is None:  # an arm not read yet (connecting): no observation of the whole rig
                self.unposed_cycles += 1
                self._answer = None
                return None
            state[i * n : (i + 1) * n] = pose
        # a fresh array each cycle: the policy's source may keep what it is given
        answer = self.policy.target(now_monotonic_s, state.copy())
        if answer is not None and np.shape(answer) != (self.width,):
            raise ValueError(f"the policy answered {np.shape(answer)} for {len(self.arms)} arms; needs ({self.width},)")
        self._answer = answer
        return answer


class _ArmView:
    """One arm's source: its slice of the policy's action this cycle."""

    def __init__(self, split: ArmSplit, part: slice):
        self.split = split
        self.part = part

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        answer = self.split.answer(now_monotonic_s)
        return None if answer is None else answer[self.part]
