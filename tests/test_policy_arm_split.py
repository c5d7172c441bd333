"""One policy, two arms: the 12-wide action split per arm, the checkpoint check that names the
joints, and the take-over of both leaders (plain data, fake arms; the daemon's story is in
tests/test_bimanual_recording.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from daemon.control.driven_arm import SourceEntry
from daemon.control.seams import PerArmSource, TargetSource
from daemon.policy.arm_split import ArmSplit
from daemon.policy.checkpoint import CheckpointInfo, ExpectedIO, check_inputs
from daemon.policy.takeover import Takeover, TakeoverConfig, TakeoverSet


@dataclass
class Arm:
    name: str
    measured: np.ndarray | None


class Policy:
    """Answers the state it was given plus 100 (so each arm's slice shows where it came from)."""

    def __init__(self) -> None:
        self.asked: list[tuple[float, np.ndarray]] = []

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        self.asked.append((now_monotonic_s, state_units))
        return state_units + 100.0


LEFT = np.arange(6, dtype=np.float64)
RIGHT = np.arange(6, dtype=np.float64) + 10.0


def test_each_arm_gets_its_own_half_of_one_answer_per_cycle() -> None:
    policy = Policy()
    split = ArmSplit(policy, [Arm("left", LEFT), Arm("right", RIGHT)])
    assert isinstance(split, PerArmSource) and set(split.views) == {"left", "right"}
    left = split.views["left"].target(1.0, LEFT)
    right = split.views["right"].target(1.0, RIGHT)
    assert left is not None and right is not None
    np.testing.assert_array_equal(left, LEFT + 100.0)
    np.testing.assert_array_equal(right, RIGHT + 100.0)
    # one observation of both arms, in LeRobot's order (left_... then right_...), once per cycle
    assert len(policy.asked) == 1
    np.testing.assert_array_equal(policy.asked[0][1], np.concatenate([LEFT, RIGHT]))
    split.views["right"].target(2.0, RIGHT)  # the next cycle: asked again, whichever arm asks first
    assert [t for t, _ in policy.asked] == [1.0, 2.0]


def test_an_arm_with_no_pose_yet_holds_both_and_the_policy_is_not_asked() -> None:
    policy = Policy()
    split = ArmSplit(policy, [Arm("left", LEFT), Arm("right", None)])
    assert split.views["left"].target(1.0, LEFT) is None
    assert split.views["right"].target(1.0, RIGHT) is None
    assert policy.asked == [] and split.unposed_cycles == 1


def test_a_policy_answering_the_wrong_width_raises_naming_both() -> None:
    class Narrow:
        def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
            return np.zeros(6)

    split = ArmSplit(Narrow(), [Arm("left", LEFT), Arm("right", RIGHT)])
    with pytest.raises(ValueError, match=r"answered \(6,\) for 2 arms; needs \(12,\)"):
        split.views["left"].target(1.0, LEFT)


def test_the_loops_source_entry_hands_each_arm_its_view() -> None:
    split = ArmSplit(Policy(), [Arm("left", LEFT), Arm("right", RIGHT)])
    entry = SourceEntry("policy", split, per_arm=split.views)
    assert entry.source_for("left") is split.views["left"]
    assert entry.source_for("third") is split  # no view: the split's own target, a hold
    assert split.target(1.0, LEFT) is None
    plain: TargetSource = Policy()
    assert SourceEntry("leader", plain).source_for("left") is plain


def _info(state: int, action: int) -> CheckpointInfo:
    return CheckpointInfo(
        path=Path("/ckpt"),
        policy_type="act",
        state_shape=(state,),
        cameras={},
        other_inputs={},
        action_shape=(action,),
        chunk_size=5,
        n_action_steps=5,
        n_obs_steps=1,
        device="cpu",
    )


def test_a_single_arm_policy_on_two_arms_is_refused_naming_the_joints() -> None:
    problems = check_inputs(_info(6, 6), ExpectedIO.for_arms({}, ("left", "right")))
    assert problems == [
        "observation.state: policy expects shape (6,) (one arm's joints), the daemon provides (12,): "
        "left_shoulder_pan.pos .. left_gripper.pos, right_shoulder_pan.pos .. right_gripper.pos, 2 arms (left, right)",
        "action: policy outputs shape (6,) (one arm's joints), the followers take (12,)",
    ]
    assert check_inputs(_info(12, 12), ExpectedIO.for_arms({}, ("left", "right"))) == []
    assert ExpectedIO.for_arms({}, ()).state_dim == 6


class Leader:
    """A leader whose motors follow their goal at once (its reading is the goal written)."""

    def __init__(self, pose: np.ndarray, fail: bool = False) -> None:
        self.pose = pose.copy()
        self.torque = False
        self.fail = fail

    def set_torque(self, enabled: bool) -> None:
        self.torque = enabled

    def write_goals(self, goals_units: np.ndarray) -> None:
        if self.fail:
            raise OSError("the leader's bus is gone")
        self.pose = np.asarray(goals_units, dtype=np.float64).copy()

    def read_joints(self) -> np.ndarray:
        return self.pose


def _run(both: TakeoverSet, poses: dict[str, np.ndarray], steps: int = 400) -> None:
    now = 0.0
    while not both.finished and steps:
        both.step(now, poses)
        now += 0.02
        steps -= 1


def test_both_leaders_come_to_their_own_followers_then_both_are_released() -> None:
    cfg = TakeoverConfig(speed_deg_s=200.0, gripper_speed_pct_s=200.0, settle_s=0.04)
    leaders = {"left": Leader(np.zeros(6)), "right": Leader(np.zeros(6))}
    both = TakeoverSet({n: Takeover(leader, cfg) for n, leader in leaders.items()})
    poses = {"left": LEFT * 3.0, "right": RIGHT * 2.0}
    assert both.phase == "torque_on"
    _run(both, poses)
    assert both.phase == "done" and both.error is None, both.error
    for name, leader in leaders.items():
        np.testing.assert_allclose(leader.pose, poses[name], atol=cfg.tolerance_deg)
        assert not leader.torque
    assert both.max_error is not None and both.max_error <= cfg.tolerance_deg


def test_one_leader_failing_stops_the_other_and_lets_it_go() -> None:
    cfg = TakeoverConfig(speed_deg_s=10.0)
    leaders = {"left": Leader(np.zeros(6), fail=True), "right": Leader(np.zeros(6))}
    both = TakeoverSet({n: Takeover(leader, cfg) for n, leader in leaders.items()})
    _run(both, {"left": LEFT * 3.0, "right": RIGHT * 2.0})
    assert both.phase == "failed" and both.finished
    assert both.error is not None and "left: OSError: the leader's bus is gone" in both.error
    assert "right: stopped: the left take-over failed" in both.error
    assert not leaders["right"].torque and not leaders["left"].torque
