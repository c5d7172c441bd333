"""Hostile and damaged inputs to replay, at rest (no daemon, no arm): each is refused with a reason
or handled, never a crash, a hang or an unbounded allocation.

- a dataset whose files are damaged (bad JSON, a truncated parquet, rows of another width, fps 0)
  or whose meta/info.json is a FIFO (reading it would block the daemon's worker for ever): a
  ``ReplayRefused`` naming why;
- a speed so small the replay would last for ever: refused, and a long episode's log stays
  bounded in memory;
- a sim episode with NaN in its recorded state: the sim-to-real gap is told over the frames that
  have a state, not NaN;
- ``dataset check``'s feasibility on a one-frame episode: its pose is still checked against the
  calibrated range and the gripper's 0..100.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dataset_support import Ep, make_dataset

from calibration.conventions import FEATURE_NAMES
from daemon.api.messages import ReplayStartRequest
from daemon.control.replay_source import MIN_SPEED, ReplayLog, ReplaySource
from daemon.control.safety import ControllerState
from daemon.control.tracking_report import tracking_report
from daemon.data.feasibility import ArmLimits, check_feasibility
from daemon.data.replay_episode import ReplayRefused, load_replay_episode


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("good") / "good", [Ep(frames=20)])


@pytest.fixture
def copy(good: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ds"
    shutil.copytree(good, dst)
    return dst


def _data_file(root: Path) -> Path:
    return sorted((root / "data").glob("chunk-*/file-*.parquet"))[0]


def test_the_good_dataset_loads(good: Path):
    ep = load_replay_episode(good, 0)
    assert ep.actions_units.shape == (20, 6) and ep.fps > 0


def test_a_truncated_parquet_is_refused_naming_the_dataset(copy: Path):
    f = _data_file(copy)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ReplayRefused, match="cannot be read"):
        load_replay_episode(copy, 0)


def test_info_json_that_is_not_json_is_refused(copy: Path):
    (copy / "meta" / "info.json").write_text('{"codebase_version": "v3.0", ')
    with pytest.raises(ReplayRefused, match="cannot be read"):
        load_replay_episode(copy, 0)


@pytest.mark.parametrize("fps", [0, -30, None])
def test_an_info_json_with_no_positive_fps_is_refused(copy: Path, fps):
    info = json.loads((copy / "meta" / "info.json").read_text())
    info["fps"] = fps
    (copy / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(ReplayRefused, match="fps"):
        load_replay_episode(copy, 0)


def test_action_rows_of_another_width_than_the_features_declare_are_refused(copy: Path):
    f = _data_file(copy)
    t = pq.read_table(f)
    i = t.schema.get_field_index("action")
    short = pa.array([row[:5] for row in t.column("action").to_pylist()], pa.list_(pa.float32()))
    pq.write_table(t.set_column(i, "action", short), f)
    with pytest.raises(ReplayRefused, match="rows are"):
        load_replay_episode(copy, 0)


def test_an_info_json_that_is_a_fifo_is_refused_at_once_not_read_for_ever(copy: Path):
    info = copy / "meta" / "info.json"
    info.unlink()
    os.mkfifo(info)
    out: list[BaseException | None] = []

    def load() -> None:
        try:
            load_replay_episode(copy, 0)
            out.append(None)
        except BaseException as exc:
            out.append(exc)

    th = threading.Thread(target=load, daemon=True)
    th.start()
    th.join(timeout=30)
    if th.is_alive():  # unblock the reader so the test process can end
        fd = os.open(info, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("load_replay_episode blocked on a FIFO")
    assert isinstance(out[0], ReplayRefused) and "not a regular file" in str(out[0]), out


class _Arm:
    state = ControllerState(mode="teleop", torque_on=True)
    params = None


def test_a_speed_below_the_minimum_is_refused_by_the_source_and_the_request():
    actions = np.zeros((300, 6))
    with pytest.raises(ValueError, match="speed"):
        ReplaySource(actions, fps=30.0, speed=1e-9, arm=_Arm(), period_s=1 / 60)
    import msgspec

    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"cmd": "replay.start", "speed": MIN_SPEED / 10}, ReplayStartRequest)
    msgspec.convert({"cmd": "replay.start", "speed": MIN_SPEED}, ReplayStartRequest)


def test_a_long_slow_replay_keeps_its_log_bounded_in_memory():
    actions = np.zeros((30 * 3600 * 4, 6))  # four hours at 30 fps
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        src = ReplaySource(actions, fps=30.0, speed=MIN_SPEED, arm=_Arm(), period_s=1 / 100)
        grown = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert src.frames == len(actions)
    assert grown < 200e6, f"{grown / 1e6:.0f} MB for the replay's log"


def test_a_sim_state_with_nan_frames_gives_a_finite_sim_gap():
    k = 50
    frame = np.arange(k)
    target = np.zeros((k, 6))
    measured = np.full((k, 6), 1.0)
    log = ReplayLog(
        t_s=frame / 30.0,
        frame=frame,
        target=target,
        measured=measured,
        command=target.copy(),
        shaped_step=np.zeros(k, bool),
        shaped_limit=np.zeros(k, bool),
        dropped_cycles=0,
    )
    sim = np.full((k, 6), 3.0)
    sim[10:20] = np.nan  # frames with no recorded state
    rep = tracking_report(log, list(FEATURE_NAMES), k, "done", 1 / 60, sim)
    assert rep.sim_gap and all(np.isfinite([e.p50, e.p99, e.max]).all() for e in rep.sim_gap), rep.sim_gap
    assert rep.sim_gap[0].max == pytest.approx(2.0)
    assert "nan" not in rep.summary()


def test_feasibility_of_a_one_frame_episode_still_checks_its_pose():
    lim = ArmLimits(
        rated_speed_deg_s=316.0,
        model="sts3215",
        supply_voltage_v=7.4,
        max_step_per_frame=np.full(6, 20.0),
        step_text="10 deg per cycle",
        lower=np.array([-110.0, -100, -100, -95, -160, 0]),
        upper=np.array([110.0, 100, 100, 95, 160, 100]),
    )
    one = np.array([[150.0, 0, 0, 0, 0, 120.0]])  # shoulder_pan past its range, gripper past 100
    reasons = check_feasibility(one, None, 30.0, lim).reasons
    assert any(r.startswith("range: shoulder_pan.pos") and "frames 0" in r for r in reasons), reasons
    assert any(r.startswith("gripper: command outside 0..100") for r in reasons), reasons
    assert check_feasibility(np.array([[0.0, 0, 0, 0, 0, 50]]), None, 30.0, lim).reasons == []
