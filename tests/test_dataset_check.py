"""`so101d dataset check`: each planted defect is flagged with its reason (a stalled joint, a
dropped camera, a hold in the middle, NaN in an imported file), a clean episode passes, and
`--episodes-for-training` prints the clean list as lerobot-train takes it. It also runs on a
dataset LeRobot wrote itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from dataset_support import FPS, Ep, make_dataset, smooth_motion, so101d, so101d_here

from daemon.data.check import Thresholds, check_dataset


def _stalled_shoulder_pan(state: np.ndarray, action: np.ndarray):
    state[20:60, 0] = state[20, 0]  # the command moves, the joint stays (stuck or unpowered)
    return state, action


def _hold_in_the_middle(state: np.ndarray, action: np.ndarray):
    state[25:65], action[25:65] = state[25], action[25]  # 1.3 s frozen, then it goes on
    return state, action


def _nan_in_import(state: np.ndarray, action: np.ndarray):
    state[40, 2] = np.nan
    return state, action


def test_check_flags_each_planted_defect_and_passes_the_clean_episode(tmp_path: Path, capsys):
    root = make_dataset(
        tmp_path / "ds",
        [
            Ep(frames=90),
            Ep(frames=90, rows=_stalled_shoulder_pan),
            Ep(frames=90, camera_gap=(30, 55)),
            Ep(frames=90, rows=_hold_in_the_middle),
            Ep(frames=90, rows=_nan_in_import, origin="import", follower_kind="sim-leisaac"),
            Ep(frames=88),
        ],
        cameras=[("front", 48, 64)],
    )
    r = so101d("dataset", "check", str(root), "--json")
    assert r.returncode == 0, r.stderr
    eps = {e["episode_index"]: e for e in json.loads(r.stdout)["episodes"]}
    assert [i for i, e in eps.items() if e["clean"]] == [0, 5]
    assert eps[1]["metrics"]["stalled_joints"] == ["shoulder_pan.pos"]
    assert any(x.startswith("stall: command moves shoulder_pan.pos") for x in eps[1]["reasons"]), eps[1]
    assert any(x.startswith("camera front dropped for 0.83 s from frame 30") for x in eps[2]["reasons"]), eps[2]
    assert any(x.startswith("hold for 1.3 s in the middle") for x in eps[3]["reasons"]), eps[3]
    assert eps[4]["reasons"] == ["NaN/inf in observation.state (1 frames)"]

    rc, out, err = so101d_here(capsys, "dataset", "check", str(root), "--episodes-for-training")
    assert rc == 0, err
    assert out.strip() == "--dataset.episodes=[0,5]"
    # thresholds are flags: a longer hold allowed, the hold episode is no longer flagged for its
    # hold, but still for the resume at frame 65 (the command jumps where the motion went on:
    # faster than the servo can move, the feasibility check)
    rc, out, _ = so101d_here(capsys, "dataset", "check", str(root), "--max-hold-s", "2", "--json")
    reasons = {e["episode_index"]: e["reasons"] for e in json.loads(out)["episodes"]}
    assert not any(x.startswith("hold for") for x in reasons[3]), reasons[3]
    assert any(x.startswith("speed: ") and x.endswith("frames 65") for x in reasons[3]), reasons[3]
    _, table, _ = so101d_here(capsys, "dataset", "check", str(root))
    assert "      1      90      3.0  FLAGGED" in table and "2 clean, 4 flagged" in table


def test_check_runs_on_a_dataset_lerobot_wrote(tmp_path: Path):
    """A plain LeRobot v3.0 dataset (LeRobot's own writer, no tags, no timing files)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from calibration.conventions import FEATURE_NAMES

    joints = {"dtype": "float32", "shape": (6,), "names": list(FEATURE_NAMES)}
    ds = LeRobotDataset.create(
        "local/plain",
        fps=FPS,
        features={"observation.state": joints, "action": joints},
        root=tmp_path / "plain",
        use_videos=False,
    )
    for e in range(2):
        s = smooth_motion(60, phase=e)
        if e == 1:
            s[:, 5] = 30.0  # a gripper that never opens or closes
        for k in range(60):
            ds.add_frame({"observation.state": s[k], "action": s[k] + 0.2, "task": "pick"})
        ds.save_episode()
    ds.finalize()
    reports = check_dataset(tmp_path / "plain", Thresholds())
    assert [r.clean for r in reports] == [True, False]
    assert reports[1].reasons == ["gripper never opened or closed (range 0.0)"]
