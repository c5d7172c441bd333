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
from bimanual_support import write_bimanual_config
from support import wait_for

from calibration.conventions import FEATURE_NAMES
from daemon.api.client import ControlClient
from daemon.apps.commands.policy import format_status
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
    return write_bimanual_config(
        bench,
        directory,
        f"""
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
""",
    )


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
        # (the handover is slow at some phases: degrees, not tens of them, in 1.5 s)
        assert np.ptp(teleop[:, own], axis=0).max() > 2.0, "a leader that did not move proves nothing"
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


# -------------------------------------------------------------------------------------------------
# The policy: LeRobot's own `lerobot-train` on the two recorded episodes, then the checkpoint drives
# both arms (locally, and through LeRobot's unmodified policy server), and the take-over brings
# each leader to its own follower.
# -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(recorded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ACT trained by plain `lerobot-train` (tiny, a few CPU steps) on the bimanual dataset."""
    from recording_support import train_tiny_act

    root, _ = recorded
    out = tmp_path_factory.mktemp("bimanual-train") / "train"
    train_tiny_act(REPO_ID, root, out, 5, 2, "--dataset.video_backend=pyav", save=True)
    ckpt = out / "checkpoints" / "last" / "pretrained_model"
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["input_features"]["observation.state"]["shape"] == [12], cfg["input_features"]
    assert cfg["output_features"]["action"]["shape"] == [12], cfg["output_features"]
    return ckpt


def _policy_toml(bench: EmulatorProcess, directory: Path, policy: str, record: bool) -> Path:
    """The rig's configuration with its cameras (the policy sees what it was trained on) and [policy]."""
    recording = (
        f'[recording]\nenabled = true\ndataset_root = "{directory / "datasets"}"\nrepo_id = "eval/bimanual"\nfps = {FPS}\n'
        if record
        else ""
    )
    return write_bimanual_config(
        bench,
        directory,
        f"""
{recording}
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

[policy]
{policy}

[socket]
path = "{directory / "control.sock"}"
""",
    )


def _arms_driven_by_policy(c: ControlClient) -> bool:
    arms = c.request("status")["arms"]
    return all(arms[s]["source"] == "policy" and arms[s]["mode"] == "policy" for s in SIDES)


def test_the_act_trained_on_both_arms_drives_both_followers_and_the_evaluation_is_recorded(
    bench: EmulatorProcess, trained: Path, tmp_path: Path
) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    daemon = Daemon(load_config(_policy_toml(bench, tmp_path, 'task = "hand the cube over"', record=True)))
    daemon.start()
    try:
        with ControlClient(daemon.socket_path, timeout_s=150) as c:
            wait_for(lambda: c.request("episode.status")["phase"] == "idle", 120, "the recorder ready")
            loaded = c.request("policy.load", path=str(trained), wait_s=120)
            assert loaded["state"] == "ready", loaded
            st = c.request("policy.status")
            assert st["arms"] == ["left", "right"] and st["joints"] == 12, st
            c.request("policy.start")
            wait_for(lambda: _arms_driven_by_policy(c), 30, "both arms driven by the policy")
            wait_for(lambda: c.request("policy.status")["results"] >= 3, 60, "three chunks from the policy")
            text = format_status(c.request("policy.status"))  # what `so101d policy status` prints
            assert "(driving the left and right arms, 12 joints)" in text, text
            wait_for(lambda: c.request("episode.status")["frames"] >= FRAMES, 30, f"{FRAMES} frames")
            stopped = c.request("policy.stop", success=True)
            assert stopped["mode"] == "hold", stopped
            wait_for(lambda: c.request("episode.status")["episodes_in_dataset"] == 1, 60, "the evaluation committed")
    finally:
        daemon.stop()
    root = tmp_path / "datasets" / "eval" / "bimanual"
    ds = LeRobotDataset("eval/bimanual", root=root, video_backend="pyav")
    assert ds.meta.robot_type == BIMANUAL_ROBOT_TYPE and ds.features[ACTION_KEY]["shape"] == (12,)
    rows = [ds.hf_dataset[i] for i in range(len(ds))]
    # every frame: both arms the policy's (none is an intervention), no leader drove either
    assert {r[SOURCE_KEY] for r in rows} == {"left=policy,right=policy"}
    assert read_episode_tags(root)[0].origin == "policy"
    # the policy's raw targets per arm: its own half of the action, not one arm's copied to both
    raw = np.stack([np.asarray(r[TELEOP_ACTION_KEY]) for r in rows])
    assert np.max(np.abs(raw[:, :6] - raw[:, 6:])) > 5.0, raw[-1]


def test_policy_check_names_the_joints_of_a_rig_the_checkpoint_was_not_trained_for(
    bench: EmulatorProcess, trained: Path, tmp_path: Path
) -> None:
    """`so101d policy check`: the bimanual checkpoint fits the bimanual configuration; on a single
    pair it is refused, naming both vectors (a 12-wide policy must never drive one arm)."""
    import subprocess
    import sys

    def check(config: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "daemon.apps.cli", "policy", "check", str(trained), "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = check(_policy_toml(bench, tmp_path, "", record=False))
    assert ok.returncode == 0 and ok.stdout.startswith("ok: act policy, state (12,)"), (ok.stdout, ok.stderr)
    single = tmp_path / "single"
    single.mkdir()
    (single / "so101d.toml").write_text(
        f'[leader]\nport = "{bench.links["left_leader"]}"\nid = "emulated_leader_left"\n'
        f'[follower]\nport = "{bench.links["left_follower"]}"\nid = "emulated_follower_left"\n'
        f'[calibration]\nroot = "{bench.directory / "calibration"}"\n'
        f'[cameras.top]\nkind = "virtual"\nwidth = {W}\nheight = {H}\n'
        f'[cameras.right_wrist]\nkind = "virtual"\nwidth = {W}\nheight = {H}\n'
    )
    refused = check(single / "so101d.toml")
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert (
        "observation.state: policy expects shape (12,) (2 arms' joints), the daemon provides (6,): "
        "shoulder_pan.pos .. gripper.pos, one arm" in refused.stderr
    ), refused.stderr
    assert "action: policy outputs shape (12,) (2 arms' joints), the follower takes (6,)" in refused.stderr


def test_through_lerobots_policy_server_both_arms_are_driven_then_both_leaders_are_brought_over(
    bench: EmulatorProcess, trained: Path, tmp_path: Path
) -> None:
    from policy_support import LeRobotServer, free_port

    port = free_port()
    server = LeRobotServer(port, tmp_path)
    server.start()
    policy = (
        f'backend = "lerobot-server"\nserver = "127.0.0.1:{port}"\nserver_policy_type = "act"\n'
        f'path = "{trained}"\nactions_per_chunk = 5\naction_fps = 30\n'
    )
    daemon = Daemon(load_config(_policy_toml(bench, tmp_path, policy, record=False)))
    daemon.start()
    try:
        with ControlClient(daemon.socket_path, timeout_s=150) as c:
            wait_for(lambda: all(a["mode"] == "teleop" for a in c.request("status")["arms"].values()), 30, "teleop")
            assert c.request("policy.load", wait_s=120)["state"] == "ready"
            c.request("policy.start", record=False)
            wait_for(lambda: _arms_driven_by_policy(c), 60, "both arms driven by the policy")
            wait_for(lambda: c.request("policy.status")["results"] >= 3, 90, "three chunks from LeRobot's server")
            st = c.request("policy.status")
            assert st["backend"] == "lerobot-server" and st["server"]["connected"] and st["joints"] == 12, st
            r = c.request("policy.takeover")
            assert r["phase"] in ("torque_on", "moving"), r
            ctl = daemon.policy
            wait_for(lambda: ctl.takeover_state.finished, 30, "both leaders brought over")
            assert ctl.takeover_state.phase == "done", ctl.takeover_state.error
            wait_for(lambda: all(a["mode"] == "teleop" for a in c.request("status")["arms"].values()), 15, "teleop")
            loop = daemon.loop
            for arm in loop.arms:  # each leader where its own follower was, released for the hand
                leader = loop.leaders[arm.teleop_source].units
                assert np.abs(np.asarray(leader) - np.asarray(arm.measured)).max() < 6.0, arm.name
    finally:
        daemon.stop()
        server.kill()
