"""The Isaac Lab Mimic bridge, as a user runs it.

Demo files are written the way LeIsaac's streaming recorder and Isaac Lab's HDF5 file handler
write them (``tests/fixtures/isaaclab_recorder.py``: initial_state, states, obs with ee_frame_state
and joint_pos_target, actions, processed_actions; empty and unjudged demos), imported with
LeIsaac's converter's rules by default (counts checked against a transcription of it), load the dataset with LeRobot,
check values against the source, the time base (60 Hz -> 30 fps), round-trip export -> import,
and refuse corrupt files without touching the dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from fixtures.isaaclab_recorder import leisaac_episode, mimic_ik_episode, record_session, write_isaaclab_file

from calibration.conventions import sim_rad_to_units, units_to_sim_rad
from daemon.apps.cli import main as so101d
from daemon.data.isaaclab_hdf5 import (
    ExportRefused,
    HDF5FormatError,
    dataset_summary,
    export_hdf5,
    import_hdf5,
    parse_episode_selection,
    resample_indices,
)
from daemon.data.schema import read_episode_tags

os.environ.setdefault("HF_HUB_OFFLINE", "1")
H, W = 32, 48


def demo_units(n: int, phase: float) -> np.ndarray:
    """A smooth joint trajectory in LeRobot units (body degrees, gripper 0..100)."""
    t = np.arange(n) / 60.0
    return np.stack(
        [30 * np.sin(t + phase), 20 * np.cos(t), 10 * t - 20, -5 * t, 40 * np.sin(2 * t), 50 + 40 * np.sin(3 * t)], 1
    )


def write_leisaac_file(
    path: Path,
    lengths: tuple[int, ...] = (61, 61, 61),
    failed: tuple[int, ...] = (1,),
    compression: str | None = None,
    cameras: tuple[str, ...] = ("front", "wrist"),
    unjudged: tuple[int, ...] = (),
    trailing_empty: bool = False,
) -> dict[str, np.ndarray]:
    """A demo file as LeIsaac writes it; returns the joint radians per demo name.

    ``compression`` None: LeIsaac's streaming recorder (teleop recording, 100-step appends,
    uncompressed); "gzip": Isaac Lab's HDF5DatasetFileHandler (Mimic's annotate / generate output).
    ``trailing_empty``: the session ends with the initial_state-only demo the recorder writes
    after the operator's last reset.
    """
    truth: dict[str, np.ndarray] = {}
    episodes = []
    for i, n in enumerate(lengths):
        rad = units_to_sim_rad(demo_units(n, phase=i)).astype(np.float32)
        truth[f"demo_{i}"] = rad
        images = {}
        for c, cam in enumerate(cameras):
            img = np.zeros((n, H, W, 3), np.uint8)
            img[..., c] = (np.arange(n) * 3 % 200 + 20)[:, None, None]  # brightness encodes the step
            images[cam] = img
        success = None if i in unjudged else i not in failed
        episodes.append(leisaac_episode(rad, images, success, seed=7))
    if trailing_empty:
        episodes.append(
            {
                "initial_state": leisaac_episode(truth["demo_0"][:1], {}, None)["initial_state"],
                "steps": [],
                "success": False,
            }
        )
    if compression is None:
        record_session(path, episodes)
    else:
        write_isaaclab_file(path, episodes, compression=compression)
    return truth


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


def test_resample_grid_is_exact_for_60hz_to_30fps() -> None:
    assert resample_indices(61, 60, 30).tolist() == list(range(0, 61, 2))
    assert resample_indices(60, 60, 30).tolist() == list(range(0, 60, 2))  # odd duration: no frame past the end
    assert resample_indices(65, 60, 30, skip_frames=5).tolist() == list(range(5, 65, 2))
    assert resample_indices(3, 60, 30, skip_frames=5).size == 0
    assert resample_indices(11, 50, 30).tolist() == [0, 2, 3, 5, 7, 8, 10]  # nearest sample, non-integer ratio


def test_import_successful_demos_at_30fps_with_lerobot_loading(tmp_path: Path) -> None:
    src = tmp_path / "leisaac.hdf5"
    truth = write_leisaac_file(src)
    root = tmp_path / "ds"
    summary = import_hdf5([src], root, task="pick the orange", skip_frames=0)
    assert summary.demos_seen == 3 and summary.demos_imported == 2 and summary.demos_skipped_failed == 1
    assert summary.frames_written == 2 * 31

    ds = load(root)
    assert ds.meta.fps == 30 and ds.meta.total_episodes == 2 and len(ds) == 62
    assert set(ds.meta.video_keys) == {"observation.images.front", "observation.images.wrist"}
    assert ds.meta.features["observation.state"]["names"][0] == "shoulder_pan.pos"
    # episode 1 is demo_2 (demo_1 failed): frame k is sim step 2k, timestamps k/30 s.
    ep = ds.meta.episodes[1]
    start = int(ep["dataset_from_index"])
    for k in (0, 7, 30):
        item = ds[start + k]
        assert float(item["timestamp"]) == pytest.approx(k / 30, abs=1e-6)
        expect = sim_rad_to_units(truth["demo_2"][2 * k].astype(np.float64))
        np.testing.assert_allclose(item["observation.state"].numpy(), expect, atol=1e-3)
        np.testing.assert_allclose(item["action"].numpy(), expect, atol=1e-3)
        np.testing.assert_allclose(item["teleop.action"].numpy(), expect, atol=1e-3)
        img = item["observation.images.front"]
        assert tuple(img.shape) == (3, H, W)
        # brightness of the red channel carries the source step (lossy video: loose tolerance)
        assert float(img[0].mean()) * 255 == pytest.approx((2 * k) * 3 % 200 + 20, abs=8)
    tags = read_episode_tags(root)
    assert tags[1].source["demo"] == "demo_2" and tags[1].origin == "import" and tags[1].success is True


def test_all_flag_keeps_failed_demos_tagged_and_max_episodes_caps(tmp_path: Path) -> None:
    src = tmp_path / "generated_dataset.hdf5"
    write_leisaac_file(src, lengths=(21, 21, 21, 21), failed=(0, 2))
    root = tmp_path / "ds"
    s = import_hdf5([src], root, successful_only=False, max_episodes=3)
    assert s.demos_imported == 3
    tags = read_episode_tags(root)
    assert [tags[i].success for i in range(3)] == [False, True, False]
    info = dataset_summary(root)
    assert info["episodes_by_kind"]["generated"] == 3  # guessed from the Mimic output file name
    assert info["episodes_by_outcome"] == {"success": 1, "failure": 2, "unknown": 0}


def test_skip_frames_gzip_and_odd_lengths(tmp_path: Path) -> None:
    src = tmp_path / "gz.hdf5"
    truth = write_leisaac_file(src, lengths=(66, 40), failed=(), compression="gzip", cameras=("front",))
    root = tmp_path / "ds"
    s = import_hdf5([src], root, skip_frames=5, step_hz=60)
    assert s.demos_imported == 2
    ds = load(root)
    lengths = [int(e["length"]) for e in ds.meta.episodes]
    assert lengths == [31, 18]  # 61 usable steps -> 31 frames; 35 usable -> floor(34/2)+1 = 18
    first = ds[0]["observation.state"].numpy()
    np.testing.assert_allclose(first, sim_rad_to_units(truth["demo_0"][5].astype(np.float64)), atol=1e-3)


def test_appends_to_an_existing_dataset_and_refuses_a_schema_mismatch(tmp_path: Path) -> None:
    a, b = tmp_path / "a.hdf5", tmp_path / "b.hdf5"
    write_leisaac_file(a, lengths=(21,), failed=())
    write_leisaac_file(b, lengths=(21,), failed=(), cameras=("front",))
    root = tmp_path / "ds"
    import_hdf5([a], root)
    import_hdf5([a], root)
    assert load(root).meta.total_episodes == 2
    before = tree_digest(root)
    with pytest.raises(HDF5FormatError, match="feature 'observation.images.wrist'"):
        import_hdf5([b], root)
    assert tree_digest(root) == before


@pytest.mark.parametrize(
    "damage, message",
    [
        ("drop_joint_pos", r"demo_1: missing key 'obs/joint_pos'"),
        ("five_joints", r"demo_1/actions: joint count \(5,\), expected \(6,\)"),
        ("short_rows", r"demo_1/obs/joint_pos: 20 rows, expected 21"),
        ("nan", r"demo_1/obs/joint_pos: non-finite value at row 3"),
        ("truncate", r"a.hdf5"),
    ],
)
def test_corrupt_files_are_refused_and_the_dataset_is_untouched(tmp_path: Path, damage: str, message: str) -> None:
    good = tmp_path / "good.hdf5"
    write_leisaac_file(good, lengths=(21,), failed=())
    root = tmp_path / "ds"
    import_hdf5([good], root)
    before = tree_digest(root)

    bad = tmp_path / "a.hdf5"
    write_leisaac_file(bad, lengths=(21, 21), failed=(), compression=None)
    if damage == "truncate":
        size = bad.stat().st_size
        with open(bad, "r+b") as fh:
            fh.truncate(size // 2)
    else:
        with h5py.File(bad, "r+") as f:
            g = f["data/demo_1"]
            if damage == "drop_joint_pos":
                del g["obs/joint_pos"]
            elif damage == "five_joints":
                del g["actions"]
                g.create_dataset("actions", data=np.zeros((21, 5), np.float32))
            elif damage == "short_rows":
                del g["obs/joint_pos"]
                g.create_dataset("obs/joint_pos", data=np.zeros((20, 6), np.float32))
            elif damage == "nan":
                g["obs/joint_pos"][3, 2] = np.nan
            elif damage == "num_samples":
                g.attrs["num_samples"] = 99
    with pytest.raises(HDF5FormatError, match=message):
        import_hdf5([good, bad], root)
    assert tree_digest(root) == before
    assert load(root).meta.total_episodes == 1


def test_export_copies_imported_seed_demos_that_survive_a_strict_reset_to(tmp_path: Path) -> None:
    """Imported LeIsaac demos go back out verbatim: scripts/mimic/annotate_demos.py's
    reset_to(initial_state) on a scene as strict as Isaac Lab's InteractiveScene.reset_to works,
    eef_action_process.py --to_ik reads what it needs, and re-importing gives the same frames."""
    from fixtures.isaaclab_recorder import annotate_reads, eef_to_ik_reads
    from fixtures.isaaclab_scene import StrictScene

    src = tmp_path / "seed.hdf5"
    write_leisaac_file(src, lengths=(41, 41), failed=())
    root = tmp_path / "ds"
    import_hdf5([src], root)
    out = tmp_path / "seeds" / "mimic_seed.hdf5"
    assert export_hdf5(root, "0-1", out) == 2
    with h5py.File(out, "r") as f, h5py.File(src, "r") as orig:
        data = f["data"]
        assert json.loads(data.attrs["env_args"]) == {"env_name": "LeIsaac-SO101-PickOrange-v0", "type": 2}
        assert data.attrs["total"] == 82
        for i in range(2):
            g, o = data[f"demo_{i}"], orig[f"data/demo_{i}"]
            assert g.attrs["so101d_episode_index"] == i and bool(g.attrs["success"]) is True
            np.testing.assert_array_equal(g["actions"][:], o["actions"][:])
            np.testing.assert_array_equal(g["obs/front"][:], o["obs/front"][:])
            initial_state, actions = annotate_reads(g)
            StrictScene(seed=5).reset_to(initial_state, None, is_relative=True)
            assert eef_to_ik_reads(g).shape == (41, 8) and actions.shape == (41, 6)
    back = tmp_path / "back"
    import_hdf5([out], back)
    a, b = load(root), load(back)
    assert len(a) == len(b)
    for i in (0, 10, len(a) - 1):
        np.testing.assert_allclose(b[i]["observation.state"].numpy(), a[i]["observation.state"].numpy(), atol=1e-6)


def test_export_refuses_real_and_mujoco_episodes_saying_why_and_what_to_do(tmp_path: Path, capsys) -> None:
    """The holdout-style dataset: an emulated-arm episode and a MuJoCo one recorded by the daemon's
    recorder, then LeIsaac demos imported beside them (identical features). Only the imported ones
    can seed Mimic; asking for the others refuses the whole export and writes nothing."""

    from recording_support import SyntheticLoop, record_frames

    from daemon.data.recorder import Recorder, RecorderConfig

    root = tmp_path / "ds"
    rec = Recorder(RecorderConfig(root=str(root), fps=30, follower_kind="emulated"), [])
    kinds = iter(["emulated", "sim-mujoco"])
    rec.follower_kind_fn = lambda: next(kinds)
    rec.open()
    try:
        rec.wait_ready(120)
        with SyntheticLoop(rec):
            for task in ("real pick", "mujoco pick"):
                rec.start_episode(task)
                record_frames(rec, 15)
                rec.save_episode(True)
                assert rec.wait_saved(120)
    finally:
        rec.close()
    src = tmp_path / "leisaac.hdf5"
    write_leisaac_file(src, lengths=(41,), failed=(), cameras=())
    import_hdf5([src], root)
    ds = load(root)
    assert ds.meta.total_episodes == 3
    assert [read_episode_tags(root)[i].follower_kind for i in range(3)] == ["emulated", "sim-mujoco", "sim-leisaac"]

    out = tmp_path / "seeds.hdf5"
    assert so101d(["export-hdf5", "--dataset", str(root), "--episodes", "all", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "episode 0 was recorded on the emulated arm: there are no object poses in it" in err
    assert "episode 1 was recorded on the MuJoCo follower" in err
    assert "episode 2" not in err
    assert "--seed_hdf5" in err and "annotate_demos.py" in err and f"nothing was written to {out}" in err
    assert not out.exists() and not list(tmp_path.glob(".seeds.hdf5*"))
    assert so101d(["export-hdf5", "--dataset", str(root), "--episodes", "2", "--out", str(out)]) == 0
    with h5py.File(out, "r") as f:
        assert list(f["data"]) == ["demo_0"] and f["data/demo_0"].attrs["so101d_episode_index"] == 2


def test_export_refuses_a_seed_demo_without_a_seed(tmp_path: Path, capsys) -> None:
    """A seed file from before the follower recorded seeds: annotate_demos.py would stop at
    ``env.seed(int(episode.seed))``, so the export refuses that episode and writes nothing; the
    refusal and a successful export both say to run eef_action_process.py --to_ik before annotate."""
    src = tmp_path / "seeds_old.hdf5"
    write_leisaac_file(src, lengths=(41, 41), failed=(), cameras=())
    with h5py.File(src, "a") as f:
        del f["data/demo_1"].attrs["seed"]
    root = tmp_path / "ds"
    import_hdf5([src], root)
    out = tmp_path / "mimic_seed.hdf5"
    with pytest.raises(
        ExportRefused, match=r"episode 1: .*demo_1 has no seed attribute.*env.seed\(int\(episode.seed\)\)"
    ):
        export_hdf5(root, "0-1", out)
    assert not out.exists()
    assert so101d(["export-hdf5", "--dataset", str(root), "--episodes", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "eef_action_process.py" in err and "--to_ik" in err and "unmodified" not in err
    assert so101d(["export-hdf5", "--dataset", str(root), "--episodes", "0", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"eef_action_process.py --input_file {out}" in said and "--to_ik" in said


def test_import_of_a_mimic_file_with_ik_actions_takes_the_joint_targets_or_says_how_to_convert(
    tmp_path: Path,
) -> None:
    """Straight out of Mimic's generate step, actions are 8-D (end-effector pose + gripper). With
    obs/joint_pos_target beside them (LeIsaac's recorder writes it) the import takes the joint
    targets, as eef_action_process.py --to_joint would; without, it says what the file is and how
    to convert it, and writes nothing."""
    episodes = []
    for i, n in enumerate((31, 31)):
        rad = units_to_sim_rad(demo_units(n, phase=i)).astype(np.float32)
        episodes.append(mimic_ik_episode(leisaac_episode(rad, {}, True, seed=7)))
    gen = tmp_path / "generated_seeds.hdf5"
    write_isaaclab_file(gen, episodes)
    root = tmp_path / "ds"
    s = import_hdf5([gen], root, skip_frames=0)
    assert s.demos_imported == 2 and s.demos_actions_from_joint_targets == 2
    ds = load(root)
    want = sim_rad_to_units(units_to_sim_rad(demo_units(31, phase=0)).astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(ds[3]["action"].numpy(), want[6], atol=1e-3)  # frame 3 at 30 fps = step 6
    assert any("obs/joint_pos_target" in n for n in read_episode_tags(root)[0].notes)

    bare = tmp_path / "generated_no_targets.hdf5"
    write_isaaclab_file(bare, episodes)
    with h5py.File(bare, "a") as f:
        for name in f["data"]:
            del f[f"data/{name}/obs/joint_pos_target"]
    before = tree_digest(root)
    with pytest.raises(HDF5FormatError) as err:
        import_hdf5([bare], root)
    msg = str(err.value)
    assert "demo_0/actions: 8-D actions (end-effector pose + gripper" in msg
    assert "no obs/joint_pos_target: the joint targets were not recorded" in msg
    # eef_action_process.py --to_joint (ik_action_to_joint) reads that very dataset: never advised here
    assert "--to_joint --headless" not in msg and "Import the file the demos came from" in msg
    assert tree_digest(root) == before

    five = tmp_path / "generated_five_targets.hdf5"
    write_isaaclab_file(five, episodes)
    with h5py.File(five, "a") as f:
        for name in f["data"]:
            del f[f"data/{name}/obs/joint_pos_target"]
            f[f"data/{name}/obs/joint_pos_target"] = np.zeros((31, 5), np.float32)
    with pytest.raises(HDF5FormatError, match=r"obs/joint_pos_target has shape \(31, 5\), expected \(N, 6\)"):
        import_hdf5([five], root)
    assert tree_digest(root) == before


def test_a_torn_demo_is_skipped_and_named_and_the_files_other_demos_import(tmp_path: Path, capsys) -> None:
    """A seed file whose last demo was torn by a full disk (its datasets hold more rows than its
    num_samples, as the attack's ENOSPC run left demo_1): the good demos are imported, the torn
    one is named with why and left in the file."""
    src = tmp_path / "seeds.hdf5"
    write_leisaac_file(src, lengths=(21, 21, 21), failed=(), compression=None)
    with h5py.File(src, "r+") as f:
        f["data/demo_1"].attrs["num_samples"] = 11
    root = tmp_path / "ds"
    assert so101d(["import-hdf5", "--dataset", str(root), "--no-progress", "--task", "t", str(src)]) == 0
    said = capsys.readouterr().out
    assert "imported 2 of 3 demos" in said
    assert "skipped 1 damaged" in said and "demo_1: attribute num_samples=11 but 'actions' has 21 rows" in said
    assert [read_episode_tags(root)[i].source["demo"] for i in range(2)] == ["demo_0", "demo_2"]


def test_export_of_an_episode_whose_source_file_is_corrupt_says_so(tmp_path: Path, capsys) -> None:
    src = tmp_path / "src.hdf5"
    write_leisaac_file(src, lengths=(41,), failed=(), cameras=())
    root = tmp_path / "ds"
    import_hdf5([src], root)
    size = src.stat().st_size
    with open(src, "r+b") as fh:
        fh.truncate(size // 2)
    out = tmp_path / "exp.hdf5"
    assert so101d(["export-hdf5", "--dataset", str(root), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"episode 0: its source file {src} is not a readable HDF5 file" in err and "Traceback" not in err
    assert not out.exists()


def test_episode_selection_parsing() -> None:
    assert parse_episode_selection("all", 3) == [0, 1, 2]
    assert parse_episode_selection("1,3-4", 5) == [1, 3, 4]
    with pytest.raises(ValueError, match="episode 7 does not exist"):
        parse_episode_selection("7", 5)
    with pytest.raises(ValueError, match="bad episode selection"):
        parse_episode_selection("x", 5)


def test_cli_import_info_and_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "demos.hdf5"
    write_leisaac_file(src, lengths=(21, 21), failed=(), cameras=())
    root = tmp_path / "ds"
    assert so101d(["import-hdf5", str(src), "--dataset", str(root), "--task", "lift", "--human"]) == 0
    assert "frames/s" in capsys.readouterr().out
    assert so101d(["dataset", "info", str(root)]) == 0
    out = capsys.readouterr().out
    assert "sim 2" in out and "generated 0" in out
    assert so101d(["import-hdf5", str(tmp_path / "missing.hdf5"), "--dataset", str(root)]) == 1
    assert "not a readable HDF5 file" in capsys.readouterr().err


def test_import_is_refused_while_another_process_owns_the_dataset(tmp_path: Path) -> None:
    from daemon.data.store import DatasetStore, StoreConfig

    src = tmp_path / "demos.hdf5"
    write_leisaac_file(src, lengths=(21,), failed=(), cameras=())
    root = tmp_path / "ds"
    import_hdf5([src], root)
    owner = DatasetStore(StoreConfig(root=str(root), repo_id="local/ds", cameras=[]))
    owner.take_ownership()  # what a recording daemon's writer holds
    try:
        before = tree_digest(root)
        with pytest.raises(HDF5FormatError, match="in use by another so101d process"):
            import_hdf5([src], root)
        assert tree_digest(root) == before
    finally:
        owner.release_ownership()
    import_hdf5([src], root)  # free again
    assert load(root).meta.total_episodes == 2


def test_kill_9_mid_import_keeps_every_committed_episode(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    from daemon.data.isaaclab_hdf5 import COMMIT_BATCH

    demos = 2 * COMMIT_BATCH + 8
    src = tmp_path / "many.hdf5"
    write_leisaac_file(src, lengths=(41,) * demos, failed=())
    root = tmp_path / "ds"
    tags = root / "meta" / "so101d_episodes.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.apps.cli", "import-hdf5", str(src), "--dataset", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if tags.exists() and len(tags.read_text().splitlines()) >= COMMIT_BATCH:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the import finished before it could be killed (make the file bigger)"
        time.sleep(0.5)  # somewhere inside the next batch: staging or committing
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The next writer repairs whatever the kill tore, commits complete staged demos, then appends:
    # nothing committed is lost and the dataset loads.
    import_hdf5([src], root, max_episodes=1)
    ds = load(root)
    committed = ds.meta.total_episodes
    assert COMMIT_BATCH + 1 <= committed <= demos + 1
    assert len(read_episode_tags(root)) == committed
    last = ds.meta.episodes[committed - 1]
    assert int(last["length"]) == len(resample_indices(41, 60, 30, skip_frames=5))  # LeIsaac's 5 skipped
    assert tuple(ds[int(last["dataset_from_index"])]["observation.images.front"].shape) == (3, H, W)


def leisaac_session_file(path: Path) -> None:
    """A teleop session as LeIsaac's streaming recorder leaves it (enhance/datasets/
    hdf5_dataset_file_handler.py + enhance/managers/recorder_manager.py): two good demos (one
    longer than the 100-step flush), one of 8 steps, one failed, one whose success was never
    set, the initial_state-only demo after the last reset (num_samples = 0), and an episode cut
    by closing the app (its 100-step flush only, no success attribute)."""
    write_leisaac_file(
        path, lengths=(61, 8, 130, 61, 61), failed=(3,), unjudged=(4,), cameras=("front",), trailing_empty=True
    )
    with h5py.File(path, "r") as f:
        episodes = [dict(f["data"][f"demo_{i}"].attrs) for i in range(6)]
    assert episodes[5]["num_samples"] == 0 and "success" not in episodes[4]
    # append the app-closed episode the way the recorder does (its APPEND flush only)
    tmp = path.with_name("cut.hdf5")
    rad = units_to_sim_rad(demo_units(150, 0.3)).astype(np.float32)
    img = np.zeros((150, H, W, 3), np.uint8)
    record_session(tmp, [], close_mid_episode=leisaac_episode(rad, {"front": img}, None))
    with h5py.File(tmp, "r") as src, h5py.File(path, "r+") as dst:
        src.copy(src["data/demo_0"], dst["data"], name="demo_6")
    tmp.unlink()


def test_streaming_recorder_file_imports_with_leisaac_converter_counts(tmp_path: Path) -> None:
    """Mirrors scripts/convert/isaaclab2lerobot.py: same demos kept, same source steps used."""
    from fixtures.isaaclab_recorder import leisaac_converter_counts

    src = tmp_path / "dataset.hdf5"
    leisaac_session_file(src)
    with h5py.File(src, "r") as f:
        assert f["data/demo_6"].attrs["num_samples"] == 100 and "success" not in f["data/demo_6"].attrs
    saved, frames = leisaac_converter_counts(src)
    s = import_hdf5([src], tmp_path / "ds")
    assert (s.demos_imported, s.source_steps) == (saved, frames) == (2, (61 - 5) + (130 - 5))
    assert s.demos_seen == 7
    assert (s.demos_skipped_empty, s.demos_skipped_failed, s.demos_skipped_unjudged, s.demos_skipped_short) == (
        1,
        1,
        2,
        1,
    )
    tags = read_episode_tags(tmp_path / "ds")
    assert [tags[i].source["demo"] for i in range(2)] == ["demo_0", "demo_2"]
    ds = load(tmp_path / "ds")
    assert [int(e["length"]) for e in ds.meta.episodes] == [
        len(resample_indices(61, 60, 30, 5)),
        len(resample_indices(130, 60, 30, 5)),
    ]


def test_every_converter_rule_can_be_overridden(tmp_path: Path) -> None:
    src = tmp_path / "dataset.hdf5"
    leisaac_session_file(src)
    s = import_hdf5([src], tmp_path / "ds", skip_frames=0, min_frames=2, keep_unjudged=True)
    # demo_0, demo_1 (8 steps), demo_2, demo_4 and the cut demo_6; empty and failed still skipped
    assert s.demos_imported == 5 and s.source_steps == 61 + 8 + 130 + 61 + 100
    assert (s.demos_skipped_empty, s.demos_skipped_failed, s.demos_skipped_unjudged) == (1, 1, 0)
    s = import_hdf5([src], tmp_path / "all", successful_only=False, keep_unjudged=True)
    assert s.demos_imported == 5 and s.demos_skipped_short == 1 and s.demos_skipped_empty == 1


def test_cli_shows_one_progress_bar_and_a_summary_of_every_skip(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "dataset.hdf5"
    leisaac_session_file(src)
    assert so101d(["import-hdf5", str(src), "--dataset", str(tmp_path / "ds")]) == 0
    out, err = capfd.readouterr()
    assert out.splitlines()[0].startswith("imported 2 of 7 demos")
    for line in (
        "skipped 1 empty (initial_state only, num_samples = 0)",
        "skipped 1 failed (success = false)",
        "skipped 2 without a success attribute",
        "skipped 1 shorter than 10 steps",
        "first 5 steps of each demo skipped",
    ):
        assert line in out, out
    assert "demo_0" not in out + err, "no line per demo"
    assert "frames/s" in err and "ETA" in err and "2/2" in err  # the bar: rate, time left, demos done
    for noise in ("[libx264", "[mp4 @", "Using video codec", "Map:"):
        assert noise not in out + err
