"""LeIsaac bi-arm HDF5 demos <-> a bimanual dataset, both ways, as a user runs it.

Bi-arm demo files are written as LeIsaac 0.4.0's bi-arm tasks record them
(``fixtures/isaaclab_bi_arm.py``: ``obs/left_joint_pos`` / ``obs/right_joint_pos``, 12-wide
``actions`` left then right, cameras left_wrist / right_wrist / top, both arms in initial_state),
through the streaming recorder of ``fixtures/isaaclab_recorder.py``. ``so101d import-hdf5`` gives
the dataset a bimanual recording gives (LeRobot's BiSOFollower features, built, not connected),
each arm converted as one arm is; export gives back demos LeIsaac's bi-arm replay takes, whose
numbers import to the same dataset. A file of the other layout, a mixed import and a demo lacking
one arm are refused, naming what is wrong, with nothing written.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from fixtures.isaaclab_bi_arm import CLEAN_TOY_TABLE_TASK, bi_arm_episode, replay_reads
from fixtures.isaaclab_recorder import leisaac_episode, record_session

from calibration.conventions import sim_rad_to_units, units_to_sim_rad
from daemon.apps.cli import main as so101d
from daemon.data.isaaclab_hdf5 import ExportRefused, HDF5FormatError, export_hdf5, import_hdf5, units_to_rad
from daemon.data.schema import ACTION_KEY, BIMANUAL_ROBOT_TYPE, STATE_KEY, read_episode_tags

os.environ.setdefault("HF_HUB_OFFLINE", "1")
H, W = 24, 32
STEPS = 31  # 60 Hz sim steps -> 16 frames at 30 fps
CAMERAS = ("left_wrist", "right_wrist", "top")
# one STS3215 tick in LeRobot degrees; the gripper's 0..100 over LeIsaac's 110 degree range is
# finer than a tick of a real gripper's calibrated range, so one bound serves all twelve
TICK_DEG = 360.0 / 4096


def arm_units(n: int, phase: float) -> np.ndarray:
    """A smooth joint trajectory of one arm in LeRobot units (body degrees, gripper 0..100)."""
    t = np.arange(n) / 60.0
    return np.stack(
        [
            30 * np.sin(t + phase),
            20 * np.cos(t) - phase,
            10 * t - 20,
            -5 * t,
            40 * np.sin(2 * t),
            50 + 40 * np.sin(3 * t),
        ],
        1,
    )


def write_bi_arm_file(path: Path, demos: int = 2) -> dict[str, np.ndarray]:
    """A teleop session on the bi-arm CleanToyTable task; returns each demo's (N, 12) radians."""
    truth, episodes = {}, []
    for i in range(demos):
        left = units_to_sim_rad(arm_units(STEPS, phase=i)).astype(np.float32)
        right = units_to_sim_rad(arm_units(STEPS, phase=i + 2.5)).astype(np.float32)
        truth[f"demo_{i}"] = np.concatenate([left, right], 1)
        images = {}
        for c, cam in enumerate(CAMERAS):
            img = np.zeros((STEPS, H, W, 3), np.uint8)
            img[..., c] = (np.arange(STEPS) * 5 % 200 + 20)[:, None, None]
            images[cam] = img
        episodes.append(bi_arm_episode(left, right, images, success=True, seed=None if i else 3))
    record_session(path, episodes, env_name=CLEAN_TOY_TABLE_TASK)
    return truth


def write_single_arm_file(path: Path) -> None:
    rad = units_to_sim_rad(arm_units(STEPS, phase=0)).astype(np.float32)
    images = {cam: np.full((STEPS, H, W, 3), 90, np.uint8) for cam in ("front", "wrist")}
    record_session(path, [leisaac_episode(rad, images, success=True)])


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    if not root.exists():
        return "absent"
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def load(root: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(f"local/{root.name}", root=root, video_backend="pyav")


def columns(root: Path) -> dict[str, np.ndarray]:
    ds = load(root)
    return {
        key: np.stack([np.asarray(ds.hf_dataset[i][key]) for i in range(len(ds))]) for key in (STATE_KEY, ACTION_KEY)
    }


def lerobot_bi_arm_features(tmp: Path) -> tuple[dict[str, dict], str]:
    """LeRobot 0.6.1's BiSOFollower with LeIsaac's bi-arm cameras (each arm's "wrist", a top-level
    "top"), built and never connected, as test_bimanual_recording.py builds it."""
    from lerobot.cameras.opencv import OpenCVCameraConfig
    from lerobot.robots.bi_so_follower import BiSOFollower, BiSOFollowerConfig
    from lerobot.robots.so_follower import SOFollowerConfig
    from lerobot.utils.feature_utils import hw_to_dataset_features

    def cams() -> dict[str, OpenCVCameraConfig]:
        return {"wrist": OpenCVCameraConfig(index_or_path="/dev/null", width=W, height=H, fps=30)}

    robot = BiSOFollower(
        BiSOFollowerConfig(
            id="sim_pair",
            calibration_dir=tmp,
            left_arm_config=SOFollowerConfig(port="/dev/null", cameras=cams()),
            right_arm_config=SOFollowerConfig(port="/dev/null", cameras=cams()),
            cameras={"top": OpenCVCameraConfig(index_or_path="/dev/null", width=W, height=H, fps=30)},
        )
    )
    features = {
        **hw_to_dataset_features(robot.observation_features, "observation"),
        **hw_to_dataset_features(robot.action_features, "action"),
    }
    return features, robot.name


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """A bi-arm file imported with the CLI (feasibility check included), every step kept."""
    d = tmp_path_factory.mktemp("bi")
    src, root = d / "clean_toy_table.hdf5", d / "pair"
    truth = write_bi_arm_file(src)
    rc = so101d(
        ["import-hdf5", str(src), "--dataset", str(root), "--task", "tidy up", "--skip-frames", "0", "--no-progress"]
    )
    assert rc == 0
    return src, root, truth


def test_a_bi_arm_file_imports_as_lerobots_bimanual_dataset(imported, tmp_path: Path) -> None:
    _, root, truth = imported
    ds = load(root)
    assert ds.meta.total_episodes == 2 and ds.meta.robot_type == BIMANUAL_ROBOT_TYPE
    theirs, robot_type = lerobot_bi_arm_features(tmp_path)
    assert robot_type == BIMANUAL_ROBOT_TYPE
    for key in (STATE_KEY, ACTION_KEY):
        assert ds.features[key]["names"] == theirs[key]["names"], key
        assert tuple(ds.features[key]["shape"]) == tuple(theirs[key]["shape"]) == (12,)
    ours_cams = sorted(k for k in ds.features if k.startswith("observation.images."))
    assert ours_cams == sorted(k for k in theirs if k.startswith("observation.images.")), ours_cams
    assert ours_cams == [f"observation.images.{c}" for c in ("left_wrist", "right_wrist", "top")]
    for key in ours_cams:
        assert tuple(ds.features[key]["shape"]) == tuple(theirs[key]["shape"]), key

    # values: each arm's six through the single-arm conversion, on the 30 fps grid (every 2nd step)
    cols = columns(root)
    want = np.concatenate([truth[f"demo_{i}"][::2] for i in range(2)])
    expected = np.concatenate([sim_rad_to_units(want[:, :6]), sim_rad_to_units(want[:, 6:])], 1)
    for key in (STATE_KEY, ACTION_KEY):
        assert cols[key].shape == (32, 12)
        np.testing.assert_allclose(cols[key], expected, atol=1e-3)
    assert np.abs(cols[STATE_KEY][:, :6] - cols[STATE_KEY][:, 6:]).max() > 5.0, "both arms got the same joints"
    tags = read_episode_tags(root)
    assert all(t.source["arms"] == ["left", "right"] and t.follower_kind == "sim-leisaac" for t in tags.values())
    assert [t.source["demo"] for t in tags.values()] == ["demo_0", "demo_1"]


def test_export_gives_demos_leisaacs_bi_arm_replay_takes_and_they_import_to_the_same_numbers(
    imported, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, root, _ = imported
    out = tmp_path / "pair.hdf5"
    assert so101d(["export-hdf5", "--dataset", str(root), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "wrote 2 bi-arm demo(s)" in said and "replay.py --task LeIsaac-SO101-...-BiArm-v0" in said, said
    cols = columns(root)
    with h5py.File(out, "r") as f:
        for i in range(2):
            g = f["data"][f"demo_{i}"]
            stepped = np.stack(replay_reads(g))
            assert stepped.shape == (STEPS, 12)
            assert np.stack(replay_reads(g, mode="state")).shape == (STEPS, 12)
            # the file's joint targets are the dataset's actions, in LeIsaac radians, within a tick
            frames = cols[ACTION_KEY][16 * i : 16 * (i + 1)]
            err_deg = np.rad2deg(np.abs(stepped[::2] - units_to_rad(frames)))
            assert err_deg.max() < TICK_DEG, err_deg.max()
    again = tmp_path / "again"
    import_hdf5([out], again, skip_frames=0)
    back = columns(again)
    for key in (STATE_KEY, ACTION_KEY):
        assert np.abs(back[key] - cols[key]).max() < TICK_DEG, key


def test_a_file_of_the_other_layout_is_refused_naming_both_and_nothing_written(imported, tmp_path: Path) -> None:
    bi_src, bi_root, _ = imported
    one_src, one_root = tmp_path / "pick.hdf5", tmp_path / "one"
    write_single_arm_file(one_src)
    import_hdf5([one_src], one_root, skip_frames=0)
    single = "single-arm (so101_follower, 6 joints shoulder_pan.pos .. gripper.pos)"
    bimanual = "bimanual (bi_so_follower, 12 joints left_shoulder_pan.pos .. right_gripper.pos)"
    for src, root, dataset_is, demos_are in (
        (bi_src, one_root, single, bimanual),
        (one_src, bi_root, bimanual, single),
    ):
        before = tree_digest(root)
        with pytest.raises(HDF5FormatError) as exc:
            import_hdf5([src], root, skip_frames=0)
        assert f"the dataset is {dataset_is}, the demos are {demos_are}" in str(exc.value), exc.value
        assert tree_digest(root) == before
    # both layouts in one import: refused before any dataset exists
    fresh = tmp_path / "fresh"
    with pytest.raises(HDF5FormatError) as exc:
        import_hdf5([bi_src, one_src], fresh, skip_frames=0)
    assert bimanual in str(exc.value) and single in str(exc.value), exc.value
    assert not fresh.exists()


def test_a_demo_missing_one_arms_joints_is_refused_naming_the_key(tmp_path: Path) -> None:
    src, root = tmp_path / "torn.hdf5", tmp_path / "ds"
    write_bi_arm_file(src, demos=1)
    with h5py.File(src, "a") as f:
        del f["data/demo_0/obs/right_joint_pos"]
    with pytest.raises(HDF5FormatError) as exc:
        import_hdf5([src], root, skip_frames=0)
    assert "demo_0: missing key 'obs/right_joint_pos'" in str(exc.value), exc.value
    assert not root.exists()


def test_export_refuses_a_source_without_both_arms_initial_state(tmp_path: Path) -> None:
    src, root, out = tmp_path / "src.hdf5", tmp_path / "ds", tmp_path / "out.hdf5"
    write_bi_arm_file(src, demos=1)
    import_hdf5([src], root, skip_frames=0)
    with h5py.File(src, "a") as f:
        del f["data/demo_0/initial_state/articulation/right_arm"]
    with pytest.raises(ExportRefused) as exc:
        export_hdf5(root, "all", out)
    why = str(exc.value)
    assert "cannot export bi-arm demos" in why and "left_arm and right_arm" in why, why
    assert not out.exists()
