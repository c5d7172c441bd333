"""The operator's story on a bimanual rig: two SO-101 pairs (left and right), one daemon.

The virtual bimanual bench (`so101d emulate --bimanual`, a subprocess: four emulated arms on four
pseudo-terminals, the leaders running the handover motion) and the daemon in-process on a
configuration written as the user writes it ([arms.left] / [arms.right], LeRobot's bimanual
calibration ids ``<id>_left`` / ``<id>_right`` from the bench's --calibration-out folder).

- Both followers track their own leader, through one loop (each arm its own safety state).
- A left-follower servo drops off the bus: both arms hold (``safety.fault_holds = "all"``, the
  default: a bimanual task is one task), the right arm keeps its pose while its leader moves on,
  and status names the left servo and port. Once it is back, ``teleop start`` resumes both arms
  by alignment: no command step larger than the safety limit on either arm, at any point.
- With ``fault_holds = "faulted"`` the right arm keeps tracking while the left holds.
- What is not built for two arms (replay, the LeIsaac remote leader) is refused with the reason
  (recording two arms, and a policy trained on them: tests/test_bimanual_recording.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bimanual_support import write_bimanual_config
from support import wait_for

from calibration.conventions import GRIPPER_INDEX
from daemon.api.client import CommandFailed, ControlClient
from daemon.config.settings import load_config
from daemon.control.seams import CycleRecord
from daemon.service.daemon import Daemon, StartupError
from drivers.emulator.process import EmulatorProcess

pytestmark = pytest.mark.e2e  # the bimanual emulator as a user runs it, the daemon on its four ports

SIDES = ("left", "right")
MAX_STEP_DEG = 10.0  # the configuration's safety limits (the defaults)
MAX_STEP_GRIPPER_PCT = 20.0


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    d = tmp_path_factory.mktemp("bimanual")
    with EmulatorProcess(d, bimanual=True, calibration_out=d / "calibration") as ep:
        yield ep


def write_config(bench: EmulatorProcess, directory: Path, extra: str = "") -> Path:
    """The rig's so101d.toml, as docs/configuration.md shows it."""
    return write_bimanual_config(bench, directory, f'\n[socket]\npath = "{directory / "control.sock"}"\n{extra}')


class Frames:
    """A record hook: every cycle's arms (what the recorder gets), kept for the checks."""

    def __init__(self) -> None:
        self.records: list[CycleRecord] = []
        self._lock = threading.Lock()

    def on_record(self, record: CycleRecord) -> None:
        with self._lock:
            self.records.append(record)

    def snapshot(self) -> list[CycleRecord]:
        with self._lock:
            return list(self.records)


@pytest.fixture
def rig(bench: EmulatorProcess, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Daemon, Frames]]:
    extra = getattr(request, "param", "")
    bench.control({"cmd": "set_motion", "arm": "left_leader", "motion": "handover-left"})
    bench.control({"cmd": "set_motion", "arm": "right_leader", "motion": "handover-right"})
    cfg = load_config(write_config(bench, tmp_path, extra))
    daemon = Daemon(cfg)
    frames = Frames()
    daemon.loop.add_hook(frames)
    daemon.start()
    try:
        yield daemon, frames
    finally:
        daemon.stop()
        for side in SIDES:  # the next test starts from servos that all answer
            bench.control({"cmd": "set_online", "arm": f"{side}_follower", "joint": "wrist_flex", "online": True})


def _status(daemon: Daemon) -> dict:
    with ControlClient(daemon.socket_path) as c:
        return c.request("status")


def _both(daemon: Daemon, mode: str) -> bool:
    arms = _status(daemon)["arms"]
    return all(arms[side]["mode"] == mode for side in SIDES)


def _pose(bench: EmulatorProcess, arm: str) -> np.ndarray:
    return np.array(bench.control({"cmd": "snapshot", "arm": arm})["pose_units"])


def _max_step(frames: list[CycleRecord], side: str) -> tuple[float, float]:
    """The largest command change between consecutive recorded cycles of one arm: body, gripper."""
    actions = np.array([a.action_units for r in frames for a in r.arms if a.arm == side])
    steps = np.abs(np.diff(actions, axis=0))
    body = np.delete(steps, GRIPPER_INDEX, axis=1)
    return float(body.max(initial=0.0)), float(steps[:, GRIPPER_INDEX].max(initial=0.0))


def test_both_followers_track_their_own_leader(rig, bench: EmulatorProcess) -> None:
    daemon, frames = rig
    wait_for(lambda: _both(daemon, "teleop"), 30, "both arms tracking")
    st = _status(daemon)
    for side in SIDES:
        arm = st["arms"][side]
        assert arm["teleop_source"] == f"{side}_leader" and arm["source"] == f"{side}_leader", arm
        assert arm["follower"]["port"] == str(bench.links[f"{side}_follower"]), arm["follower"]
        assert arm["leader"]["port"] == str(bench.links[f"{side}_leader"]), arm["leader"]
    daemon.loop.wait_cycles(50)
    # each follower is where its own leader was a moment ago (the leaders move: a loose bound)
    for side in SIDES:
        leader, follower = _pose(bench, f"{side}_leader"), _pose(bench, f"{side}_follower")
        assert np.max(np.abs(leader - follower)) < 15.0, (side, leader, follower)
    left, right = _pose(bench, "left_follower"), _pose(bench, "right_follower")
    assert np.max(np.abs(left - right)) > 5.0, "the two arms move differently (not one arm shown twice)"
    recs = frames.snapshot()[-20:]
    assert {r.sources_text() for r in recs} == {"left=left_leader,right=right_leader"}
    # both arms' bus work happened in every one of those cycles, none of them skipped
    assert all(len(r.arms) == 2 for r in recs)


def _left_missing_both_hold(st: dict, port: str) -> bool:
    left, right = st["arms"]["left"], st["arms"]["right"]
    return (
        "wrist_flex" in left["missing_servos"]
        and left["follower"]["port"] == port
        and left["mode"] in ("fault", "disconnected")
        and right["mode"] == "hold"
        and "left" in right["reason"]
    )


def test_a_left_servo_off_the_bus_holds_both_arms_then_teleop_resumes_without_a_jump(
    rig, bench: EmulatorProcess
) -> None:
    daemon, frames = rig
    wait_for(lambda: _both(daemon, "teleop"), 30, "both arms tracking")
    port = str(bench.links["left_follower"])
    bench.control({"cmd": "set_online", "arm": "left_follower", "joint": "wrist_flex", "online": False})
    wait_for(lambda: _left_missing_both_hold(_status(daemon), port), 15, "left servo named, both arms holding")
    st = _status(daemon)
    assert "wrist_flex" in st["arms"]["left"]["fault"] or "wrist_flex" in st["arms"]["left"]["follower"]["waiting"]
    # the right arm holds its pose while its leader moves on
    held = _pose(bench, "right_follower")
    leader_before = _pose(bench, "right_leader")
    wait_for(lambda: np.max(np.abs(_pose(bench, "right_leader") - leader_before)) > 5.0, 20, "right leader moving")
    assert np.max(np.abs(_pose(bench, "right_follower") - held)) < 1.0, "the right arm held still"
    assert _status(daemon)["arms"]["right"]["mode"] == "hold"

    bench.control({"cmd": "set_online", "arm": "left_follower", "joint": "wrist_flex", "online": True})
    back_at = time.monotonic()

    def resumed() -> bool:
        try:
            with ControlClient(daemon.socket_path) as c:
                c.request("teleop.start")
        except CommandFailed:
            return False  # refused while the servo is being picked up again: the reason says so
        return _both(daemon, "teleop")

    wait_for(resumed, 30, "teleop start accepted and both arms tracking again")
    assert time.monotonic() - back_at < 30
    daemon.loop.wait_cycles(25)
    for side in SIDES:
        body, gripper = _max_step(frames.snapshot(), side)
        assert body <= MAX_STEP_DEG + 1e-6 and gripper <= MAX_STEP_GRIPPER_PCT + 1e-6, (side, body, gripper)


@pytest.mark.parametrize("rig", ['[safety]\nfault_holds = "faulted"\n'], indirect=True)
def test_with_fault_holds_faulted_the_other_arm_keeps_tracking(rig, bench: EmulatorProcess) -> None:
    daemon, _frames = rig
    wait_for(lambda: _both(daemon, "teleop"), 30, "both arms tracking")
    bench.control({"cmd": "set_online", "arm": "left_follower", "joint": "wrist_flex", "online": False})
    wait_for(
        lambda: _status(daemon)["arms"]["left"]["mode"] in ("fault", "disconnected"), 15, "the left arm out of the task"
    )
    start = _pose(bench, "right_follower")
    wait_for(lambda: np.max(np.abs(_pose(bench, "right_follower") - start)) > 5.0, 20, "the right arm still tracking")
    assert _status(daemon)["arms"]["right"]["mode"] == "teleop"


def test_what_two_arms_cannot_do_yet_is_refused_with_the_reason(bench: EmulatorProcess, tmp_path: Path) -> None:
    cfg = load_config(write_config(bench, tmp_path, "[leisaac_remote_leader]\nenabled = true\n"))
    with pytest.raises(StartupError, match=r"\[leisaac_remote_leader\] enabled with \[arms.left\]"):
        Daemon(cfg)
    cfg = load_config(write_config(bench, tmp_path))
    daemon = Daemon(cfg)
    daemon.start()
    try:
        with ControlClient(daemon.socket_path) as c:
            for verb, why in (
                ("replay.start", "not built for two arms yet"),
                ("episode.start", "recording is disabled"),
                # the policy verbs are there (tests/test_bimanual_recording.py drives both arms);
                # corrections take one arm
                ("policy.load", "no checkpoint given"),
            ):
                with pytest.raises(CommandFailed) as refused:
                    c.request(verb)
                assert why in str(refused.value), (verb, str(refused.value))
    finally:
        daemon.stop()


def test_the_right_arm_can_be_lent_to_a_client_and_goes_back_to_its_leader(rig) -> None:
    """arm.acquire with arm "right" on a bimanual daemon: the right follower is driven by its own
    leader ("right_leader"), which is teleop as "leader" is on a single-arm rig, so it may be lent;
    on release it goes back to that leader, not to a leader the rig does not have."""
    daemon, _frames = rig
    wait_for(lambda: all(a["mode"] == "teleop" for a in _status(daemon)["arms"].values()), 20.0, "both arms tracking")
    with ControlClient(daemon.socket_path) as c:
        lease = c.request("arm.acquire", arm="right", client="attack")["lease"]
        c.request("arm.release", lease=lease)
    assert daemon.loop.assignments()["right"] == "right_leader"


def test_arm_observe_of_each_arm_shows_that_arms_own_leader(rig, bench: EmulatorProcess) -> None:
    """arm.observe "right" answers the right leader's pose, not the primary (left) leader's."""
    daemon, _frames = rig
    wait_for(lambda: _both(daemon, "teleop"), 30, "both arms tracking")
    bench.control({"cmd": "set_motion", "arm": "left_leader", "motion": "still"})
    bench.control({"cmd": "set_motion", "arm": "right_leader", "motion": "still"})
    bench.control({"cmd": "set_pose", "arm": "left_leader", "pose_units": [-30.0, -40.0, 40.0, 30.0, 0.0, 20.0]})
    bench.control({"cmd": "set_pose", "arm": "right_leader", "pose_units": [30.0, -60.0, 60.0, 50.0, 10.0, 60.0]})

    def observed(side: str) -> np.ndarray:
        with ControlClient(daemon.socket_path) as c:
            return np.array(list(c.request("arm.observe", arm=side)["leader"].values()))

    for side in SIDES:
        wait_for(
            lambda side=side: np.max(np.abs(observed(side) - _pose(bench, f"{side}_leader"))) < 1.0,
            10,
            f"arm.observe {side} showing the {side} leader",
        )
