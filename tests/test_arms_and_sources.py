"""The operator's story: a second arm and a scripted source join the daemon through its public
seams, the follower is handed to the script and back inside one episode, and the recorded frames
say who drove each arm.

Real parts only: two followers (our Feetech driver on two emulated buses), the emulated leader, the
daemon in-process with recording on (the real recorder, its writer process, a LeRobot dataset read
back with LeRobot's own loader). The cycle is not touched: ``loop.add_arm``, ``loop.add_source``
and ``loop.assign`` are all the test uses.
"""

from __future__ import annotations

from itertools import groupby
from pathlib import Path

import numpy as np
import pytest
from recording_support import load_dataset, record_frames, wait_until
from support import still_arm_on_pty, wait_for

from daemon.api.client import ControlClient
from daemon.config.settings import config_from_dict
from daemon.data.schema import SOURCE_KEY
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

POSE_A = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])
POSE_B = np.array([25.0, -45.0, 50.0, 30.0, 15.0, 45.0])
TOL_DEG = 2.0
REPO = "local/arms"


class ScriptedSource:
    """A target source of our own: a fixed pose, as a replayed episode or an outside client would
    give one (``TargetSource``: target(now, state) -> joint target or None)."""

    def __init__(self, pose: np.ndarray) -> None:
        self.pose = pose
        self.calls = 0

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        self.calls += 1
        return self.pose


@pytest.fixture
def bench(tmp_path: Path):
    parts = [still_arm_on_pty(tmp_path / name, role, POSE_A) for name, role in (
        ("leader", "leader"), ("follower", "follower"), ("second", "follower"),
    )]  # fmt: skip
    cfg = config_from_dict(
        {
            "socket": {"path": str(tmp_path / "c.sock")},
            "safety": {"align_speed_deg_s": 90.0, "align_gripper_speed_pct_s": 90.0},
            "recording": {"enabled": True, "dataset_root": str(tmp_path / "data"), "repo_id": REPO, "fps": 30},
        }
    )
    daemon = Daemon(
        cfg,
        FeetechLeader(str(tmp_path / "leader"), reference_calibration("leader")),
        FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower")),
    )
    second = FeetechFollower(str(tmp_path / "second"), reference_calibration("follower"))
    daemon.loop.add_arm("second", second, source="leader")  # before start: connected with the others
    daemon.start()
    try:
        yield daemon, [arm for arm, _bus in parts], tmp_path / "data" / REPO
    finally:
        daemon.stop()
        for _arm, bus in parts:
            bus.stop()


def test_a_second_arm_and_a_scripted_source_join_and_the_frames_say_who_drove(bench) -> None:
    daemon, (leader, follower, second), root = bench
    loop, rec = daemon.loop, daemon.recorder
    assert rec is not None
    wait_for(lambda: loop.state.mode == "teleop" and rec.phase == "idle", 60, "teleop, recorder ready")
    assert loop.assignments() == {"follower": "leader", "second": "leader"}
    script = ScriptedSource(POSE_B)
    loop.add_source("script", script)
    with ControlClient(daemon.socket_path) as c:
        c.request("episode.start", task="hand over and back")
        record_frames(rec, 20)
        loop.assign("follower", "script").result(timeout=2.0)  # applied at a cycle boundary
        assert loop.assignments() == {"follower": "script", "second": "leader"}
        # the follower goes to the script's pose; the second arm still follows the leader
        wait_for(lambda: np.all(np.abs(follower.pose_units() - POSE_B) <= TOL_DEG), 20, "follower at the script's pose")
        assert np.all(np.abs(second.pose_units() - leader.pose_units()) <= TOL_DEG)
        assert script.calls > 0
        record_frames(rec, rec.frames_recorded + 15)
        at_script = rec.frames_recorded
        loop.assign("follower", "leader").result(timeout=2.0)  # and back to the operator
        wait_for(
            lambda: np.all(np.abs(follower.pose_units() - leader.pose_units()) <= TOL_DEG), 20, "following the leader"
        )
        record_frames(rec, at_script + 20)
        status = c.request("status")
        assert status["arms"]["second"]["source"] == "leader" and status["arms"]["follower"]["source"] == "leader"
        c.request("episode.save", success=True)
    assert rec.wait_saved(120), rec.status()
    assert wait_until(lambda: rec.status()["episodes_in_dataset"] == 1, 30), rec.status()

    ds = load_dataset(root, REPO)  # LeRobot's loader takes the extra string column
    assert SOURCE_KEY in ds.meta.features
    sources = [ds[i][SOURCE_KEY] for i in range(ds.num_frames)]
    runs = [(text, len(list(group))) for text, group in groupby(sources)]
    assert [text for text, _n in runs] == [
        "follower=leader,second=leader",
        "follower=script,second=leader",
        "follower=leader,second=leader",
    ], runs
    assert all(n >= 10 for _text, n in runs), runs
    # the frames driven by the script carry its target as the raw action
    first_script = runs[0][1]
    teleop = np.asarray(ds[first_script]["teleop.action"], dtype=np.float64)
    assert np.allclose(teleop, POSE_B, atol=1e-3), teleop
