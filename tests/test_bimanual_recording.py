"""The operator's story: recording a bimanual rig (two SO-101 pairs) into one LeRobot dataset.

The virtual bimanual bench (`so101d emulate --bimanual`, a subprocess: four emulated arms, the
leaders running the handover) and the daemon in-process on the configuration a user writes
([arms.left] / [arms.right], [recording] enabled, a top-level camera and a camera on the right
arm named as LeRobot names it).

- Two episodes are recorded with the episode verbs; the dataset loads with LeRobotDataset.
- Its joint vectors and cameras are named, and ordered, as LeRobot 0.6.1's ``BiSOFollower``
  declares them (lerobot/robots/bi_so_follower/bi_so_follower.py), read from the real class
  (built, never connected), through LeRobot's own ``hw_to_dataset_features``.
- Left and right columns differ, and each side follows its own leader (who drove each frame is
  in the ``so101d.source`` column; the episode tags are there).
- A single-arm recorder on that dataset, and a bimanual daemon on a single-arm dataset, are
  refused, naming both layouts; nothing is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import wait_for

from calibration.conventions import FEATURE_NAMES
from daemon.api.client import ControlClient
from daemon.config.settings import load_config
from daemon.data.recorder import Recorder, RecorderConfig
from daemon.data.schema import (
    ACTION_KEY,
    BIMANUAL_ROBOT_TYPE,
    ROBOT_TYPE,
    SOURCE_KEY,
    STATE_KEY,
    TELEOP_ACTION_KEY,
    dataset_features,
    read_episode_tags,
)
from daemon.data.store import DatasetMismatchError, staging_dir
from daemon.service.daemon import Daemon, StartupError
from drivers.emulator.process import EmulatorProcess

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.e2e  # the bimanual emulator as a user runs it, the daemon recording on its four ports

SIDES = ("left", "right")
W, H, FPS = 96, 72, 30
FRAMES = 45  # 1.5 s an episode: the handover moves both sides from the first second
REPO_ID = "local/bimanual"


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    d = tmp_path_factory.mktemp("bimanual-rec")
    with EmulatorProcess(d, bimanual=True, calibration_out=d / "calibration") as ep:
        ep.control({"cmd": "set_motion", "arm": "left_leader", "motion": "handover-left"})
        ep.control({"cmd": "set_motion", "arm": "right_leader", "motion": "handover-right"})
        yield ep


def write_config(bench: EmulatorProcess, directory: Path, dataset_root: Path) -> Path:
    """The rig's so101d.toml, as docs/configuration.md shows it, recording."""
    links = bench.links
    text = f"""
[leader]
id = "emulated_leader"

[follower]
id = "emulated_follower"

[arms.left]
leader_port = "{links["left_leader"]}"
follower_port = "{links["left_follower"]}"

[arms.right]
leader_port = "{links["right_leader"]}"
follower_port = "{links["right_follower"]}"

[calibration]
root = "{bench.directory / "calibration"}"

[control]
rate_hz = 50.0

[recording]
enabled = true
dataset_root = "{dataset_root}"
repo_id = "{REPO_ID}"
fps = {FPS}
task = "hand the cube over"

[cameras.top]
kind = "virtual"
width = {W}
height = {H}
fps = {FPS}

[cameras.right_wrist]
kind = "virtual"
width = {W}
height = {H}
fps = {FPS}

[socket]
path = "{directory / "control.sock"}"
"""
    path = directory / "so101d.toml"
    path.write_text(text)
    return path


def lerobot_bimanual_features(tmp: Path) -> tuple[dict[str, dict], str]:
    """What LeRobot's own recording of a BiSOFollower with a top-level camera "top" and a right-arm
    camera "wrist" declares: its dataset features and its robot type (the class built, not connected)."""
    from lerobot.cameras.opencv import OpenCVCameraConfig
    from lerobot.robots.bi_so_follower import BiSOFollower, BiSOFollowerConfig
    from lerobot.robots.so_follower import SOFollowerConfig
    from lerobot.utils.feature_utils import hw_to_dataset_features

    def cam() -> OpenCVCameraConfig:
        return OpenCVCameraConfig(index_or_path="/dev/null", width=W, height=H, fps=FPS)

    robot = BiSOFollower(
        BiSOFollowerConfig(
            id="emulated_follower",
            calibration_dir=tmp,
            left_arm_config=SOFollowerConfig(port="/dev/null"),
            right_arm_config=SOFollowerConfig(port="/dev/null", cameras={"wrist": cam()}),
            cameras={"top": cam()},
        )
    )
    features = {
        **hw_to_dataset_features(robot.observation_features, "observation"),
        **hw_to_dataset_features(robot.action_features, "action"),
    }
    return features, robot.name


def _status(daemon: Daemon) -> dict:
    with ControlClient(daemon.socket_path) as c:
        return c.request("status")


@pytest.fixture(scope="module")
def recorded(bench: EmulatorProcess, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """Two episodes of the handover, saved as successes, then the daemon stopped."""
    d = tmp_path_factory.mktemp("rig")
    cfg = load_config(write_config(bench, d, d / "datasets"))
    daemon = Daemon(cfg)
    daemon.start()
    saves = []
    try:
        wait_for(lambda: _status(daemon)["recording"]["phase"] == "idle", 120, "the recorder ready")
        wait_for(lambda: all(a["mode"] == "teleop" for a in _status(daemon)["arms"].values()), 30, "both arms tracking")
        with ControlClient(daemon.socket_path) as c:
            for _ in range(2):
                c.request("episode.start")
                wait_for(lambda: c.request("episode.status")["frames"] >= FRAMES, 30, f"{FRAMES} frames")
                saves.append(c.request("episode.save", success=True))
            wait_for(lambda: c.request("episode.status")["episodes_in_dataset"] == 2, 60, "both episodes committed")
    finally:
        daemon.stop()
    return d / "datasets" / REPO_ID, saves


def test_two_episodes_of_both_arms_load_as_lerobots_bimanual_dataset(recorded, tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root, saves = recorded
    assert [s["episode"] for s in saves] == [0, 1], saves
    ds = LeRobotDataset(REPO_ID, root=root, video_backend="pyav")
    assert ds.meta.total_episodes == 2 and ds.meta.robot_type == BIMANUAL_ROBOT_TYPE == "bi_so_follower"
    theirs, robot_type = lerobot_bimanual_features(tmp_path)
    assert robot_type == BIMANUAL_ROBOT_TYPE
    # the joint vectors: LeRobot's names in LeRobot's order (left_shoulder_pan.pos .. right_gripper.pos)
    for key in (STATE_KEY, ACTION_KEY):
        assert ds.features[key]["names"] == theirs[key]["names"], key
        assert tuple(ds.features[key]["shape"]) == (12,)
    assert ds.features[TELEOP_ACTION_KEY]["names"] == theirs[ACTION_KEY]["names"]
    # the cameras: a top-level one unprefixed, the right arm's prefixed, as LeRobot names them
    ours_cams = sorted(k for k in ds.features if k.startswith("observation.images."))
    assert ours_cams == sorted(k for k in theirs if k.startswith("observation.images.")), ours_cams
    assert ours_cams == ["observation.images.right_wrist", "observation.images.top"]
    for key in ours_cams:
        assert tuple(ds.features[key]["shape"]) == tuple(theirs[key]["shape"]), key
    item = ds[3]
    assert tuple(item[STATE_KEY].shape) == (12,) and tuple(item["observation.images.top"].shape) == (3, H, W)

    # each arm: its own columns, following its own leader (the raw target is that leader's reading)
    state = np.stack([np.asarray(ds.hf_dataset[i][STATE_KEY]) for i in range(len(ds))])
    teleop = np.stack([np.asarray(ds.hf_dataset[i][TELEOP_ACTION_KEY]) for i in range(len(ds))])
    left, right = slice(0, 6), slice(6, 12)
    assert np.max(np.abs(state[:, left] - state[:, right])) > 10.0, "left and right columns are the same"
    for own, other in ((left, right), (right, left)):
        err_own = np.median(np.abs(state[:, own] - teleop[:, own]))
        err_other = np.median(np.abs(state[:, own] - teleop[:, other]))
        assert err_own < 5.0 and err_own < err_other / 2, (own, err_own, err_other)
        assert np.ptp(teleop[:, own], axis=0).max() > 5.0, "a leader that did not move proves nothing"
    # gripper per arm in LeRobot's 0 (closed) .. 100 (open)
    grippers = state[:, [FEATURE_NAMES.index("gripper.pos"), 6 + FEATURE_NAMES.index("gripper.pos")]]
    assert grippers.min() >= -1.0 and grippers.max() <= 101.0

    # who drove each frame, and the episode tags
    sources = {ds.hf_dataset[i][SOURCE_KEY] for i in range(len(ds))}
    assert sources == {"left=left_leader,right=right_leader"}, sources
    tags = read_episode_tags(root)
    assert sorted(tags) == [0, 1] and all(t.success is True and t.origin == "teleop" for t in tags.values())
    assert all(t.follower_kind == "emulated" and t.frames >= FRAMES for t in tags.values()), tags


def test_dataset_check_reports_each_arm(recorded) -> None:
    """`so101d dataset check --config` on the bimanual dataset: each arm's gripper, and each arm's
    feasibility against its own follower's calibrated range (LeRobot's <id>_left / <id>_right)."""
    from daemon.data.check import check_dataset, feasibility_limits

    root, _ = recorded
    limits = feasibility_limits(root.parents[2] / "so101d.toml", root)  # the rig's configuration
    assert set(limits.per_arm) == set(SIDES) and all(lim.lower is not None for lim in limits.per_arm.values())
    reports = check_dataset(root, limits=limits)
    assert [r.episode_index for r in reports] == [0, 1]
    for r in reports:
        assert {"left/gripper_range", "right/gripper_range"} <= set(r.metrics), r.metrics
        assert set(r.metrics["feasibility"]) == set(SIDES), r.metrics
        assert not [why for why in r.reasons if "range:" in why], r.reasons  # the emulated arms stay in range


def test_an_arm_missing_for_some_cycles_repeats_its_newest_values_and_the_tag_says_so(tmp_path: Path) -> None:
    """The loop leaves an arm whose pose is not current out of its CycleRecord (its follower lost
    for a moment): the frame keeps both arms, that arm's newest values repeated, noted in the tag."""
    from daemon.control.seams import ArmRecord, CycleRecord

    root = tmp_path / "ds"
    rec = Recorder(RecorderConfig(root=str(root), repo_id=REPO_ID, fps=FPS, arms=SIDES), [])
    rec.open()
    rec.wait_ready(120)
    try:
        rec.start_episode("right arm drops out")
        t0 = 1000.0
        for i in range(150):  # 1.5 s of a 100 Hz loop, on the loop's own clock
            left = np.full(6, float(i))
            right = np.full(6, -float(i))
            arms = [ArmRecord("left", "left_leader", left, left, left)]
            if not 50 <= i < 100:  # the right follower lost for half a second
                arms.append(ArmRecord("right", "right_leader", right, right, right))
            rec.on_record(CycleRecord(t0 + i / 100, tuple(arms)))
        rec.save_episode(None)
        assert rec.wait_saved(90), rec.status()
    finally:
        rec.close()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset(REPO_ID, root=root, video_backend="pyav")
    state = np.stack([np.asarray(ds.hf_dataset[i][STATE_KEY]) for i in range(len(ds))])
    t_s = np.arange(len(state)) / FPS
    gap = (t_s >= 0.5 + 1 / FPS) & (t_s < 1.0)  # frames taken while the right arm was missing
    assert gap.any() and np.all(state[gap, 6:] == -49.0), state[gap, 6:]  # its value at cycle 49, repeated
    assert np.ptp(state[gap, 0]) > 10.0  # the left arm moves on meanwhile
    sources = [ds.hf_dataset[i][SOURCE_KEY] for i in range(len(ds))]
    assert {sources[i] for i in np.flatnonzero(gap)} == {"left=left_leader"}  # who drove: only the left
    (tag,) = read_episode_tags(root).values()
    assert any(n.startswith("right arm: pose not current from frame 15") for n in tag.notes), tag.notes


def test_a_staged_episode_of_the_other_layout_is_never_committed(tmp_path: Path) -> None:
    """A bimanual daemon's staged episode (kept across a crash) found by a single-arm writer
    before the dataset exists: the commit refuses it whole; no dataset is made from it."""
    from daemon.data.store import DatasetStore, StoreConfig

    root = tmp_path / "ds"
    store = DatasetStore(StoreConfig(root=str(root), repo_id=REPO_ID))
    stage = store.staging / "ep-00000000000000000001-bimanual"
    stage.mkdir()
    n = 3
    rows = np.zeros((n, 12), np.float32)
    np.savez(stage / "rows.npz", state=rows, action=rows, teleop=rows, source=np.asarray(["left=l,right=r"] * n))
    (stage / "episode.json").write_text(
        json.dumps({"uid": stage.name, "task": "t", "episode": 0, "frames": n, "tag": {}, "video_stats": {}})
    )
    with pytest.raises(ValueError, match=r"recorded with 12 joints a frame, the dataset records 6 \(one arm\)"):
        store.commit(stage)
    assert not (root / "meta" / "info.json").exists() and stage.exists()


def _dataset_files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_a_single_arm_episode_is_never_appended_to_the_bimanual_dataset(recorded) -> None:
    root, _ = recorded
    before = _dataset_files(root)
    rec = Recorder(RecorderConfig(root=str(root), repo_id=REPO_ID, fps=FPS), [])
    with pytest.raises(DatasetMismatchError) as refused:
        rec.open()
    why = str(refused.value)
    assert "the dataset is bimanual (bi_so_follower, 12 joints left_shoulder_pan.pos .. right_gripper.pos)" in why
    assert "the configuration records single-arm (so101_follower, 6 joints shoulder_pan.pos .. gripper.pos)" in why
    assert _dataset_files(root) == before


def test_a_bimanual_daemon_refuses_a_single_arm_dataset(bench: EmulatorProcess, tmp_path: Path) -> None:
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

    root = tmp_path / "datasets" / REPO_ID
    LeRobotDatasetMetadata.create(
        REPO_ID, fps=FPS, features=dataset_features({"top": (H, W)}), robot_type=ROBOT_TYPE, root=root
    )
    before = _dataset_files(root)
    cfg = load_config(write_config(bench, tmp_path, tmp_path / "datasets"))
    with pytest.raises(StartupError) as refused:
        Daemon(cfg).start()
    why = str(refused.value)
    assert why.startswith("recording: ") and "single-arm (so101_follower, 6 joints" in why, why
    assert "the configuration records bimanual (bi_so_follower, 12 joints" in why, why
    assert _dataset_files(root) == before
    assert not any(staging_dir(root).glob("ep-*"))
    assert json.loads((root / "meta" / "info.json").read_text())["total_episodes"] == 0


def test_so101d_demo_bimanual_records_both_arms_and_says_how_to_load_them(tmp_path: Path) -> None:
    """`so101d demo --bimanual`: the two-pair bench, both arms recorded like `so101d demo`."""
    import subprocess
    import sys

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    run_dir, out_path = tmp_path / "bench", tmp_path / "demo.out"
    args = ["demo", "--bimanual", "--dir", str(run_dir), "--record", "2", "--episode-time", "1"]
    with open(out_path, "w") as out, open(tmp_path / "demo.err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", *args, "--socket", str(tmp_path / "d.sock")],
            stdout=out,
            stderr=err,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        )
    try:

        def recorded() -> bool:
            assert proc.poll() is None, (tmp_path / "demo.err").read_text()[-3000:]
            return "episodes in the dataset" in out_path.read_text()

        wait_for(recorded, 240, "the demo's episodes in the dataset")
        proc.send_signal(2)  # SIGINT: Ctrl-C
        assert proc.wait(timeout=120) == 0, (tmp_path / "demo.err").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out_path.read_text()
    ds_root = run_dir / "datasets" / "local" / "so101d-demo-bimanual"
    assert "demo: 2 episodes in the dataset" in text and f"dataset: {ds_root}" in text, text[-2000:]
    ds = LeRobotDataset("local/so101d-demo-bimanual", root=ds_root, video_backend="pyav")
    assert ds.meta.total_episodes == 2 and ds.meta.robot_type == "bi_so_follower"
    assert ds.features[STATE_KEY]["names"][0] == "left_shoulder_pan.pos" and len(ds.features[STATE_KEY]["names"]) == 12
    cams = sorted(k.removeprefix("observation.images.") for k in ds.features if k.startswith("observation.images."))
    assert cams == ["front", "left_wrist", "right_wrist"]
    assert ds[0]["task"] == "demo: hand over"
