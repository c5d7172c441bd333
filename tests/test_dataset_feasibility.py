"""Offline feasibility in `so101d dataset check` (no arm) and after `so101d import-hdf5`.

A synthetic generated ("Mimic") episode has a 40 degree jump at a subtask boundary and a segment at
twice the STS3215's rated speed; a second one leaves the follower's calibrated range; a third
is the smooth motion a person teleoperates. The check names the first two with frame numbers and
why, leaves the third alone, and `--tag` writes the findings into the episodes' tags.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from dataset_support import FPS, Ep, make_dataset, so101d_here
from fixtures.isaaclab_recorder import leisaac_episode, write_isaaclab_file

from calibration.calibration_file import save_calibration
from calibration.conventions import unit_limits, units_to_sim_rad
from daemon.data.feasibility import RATED_SPEED_DEG_S, rated_speed_deg_s
from daemon.data.schema import read_episode_tags
from drivers.emulator import reference_calibration

RATED_74 = RATED_SPEED_DEG_S["sts3215"][7.4]
POSE = np.array([0.0, -40.0, 45.0, 30.0, 0.0, 50.0], np.float32)


def _mimic(state: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.tile(POSE, (len(state), 1))
    a[:, 0] = -50.0
    a[30:, 2] += 40.0  # the jump, at frame 30
    for k, f in enumerate(range(60, 66), start=1):  # 2x rated speed on shoulder_pan, frames 60..65
        a[f:, 0] = -50.0 + k * 2 * RATED_74 / FPS
    return a.copy(), a


def _past_range(state: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo, _ = unit_limits(reference_calibration("follower"))
    a = np.tile(POSE, (len(state), 1))
    a[:, 3] = np.linspace(POSE[3], lo[3] - 10.0, len(a))  # wrist_flex ends past its lower limit
    return a.copy(), a


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("feas") / "mix"
    gen = {"generated": True}
    return make_dataset(
        root,
        [
            Ep(frames=100, follower_kind="sim-leisaac", origin="import", source=gen, rows=_mimic),
            Ep(frames=90, follower_kind="sim-leisaac", origin="import", source=gen, rows=_past_range),
            Ep(frames=90),
        ],
    )


def _config(tmp_path: Path, extra: str = "") -> Path:
    save_calibration(reference_calibration("follower"), "follower", "follower", tmp_path / "cal")
    cfg = tmp_path / "so101d.toml"
    cfg.write_text(f'[calibration]\nroot = "{tmp_path / "cal"}"\n[control]\nrate_hz = 60\n{extra}')
    return cfg


def _blocks(out: str) -> dict[int, str]:
    """The check's table: episode -> its lines."""
    blocks: dict[int, str] = {}
    current = None
    for line in out.splitlines():
        head = re.match(r"^\s*(\d+)\s+\d+\s+[\d.]+\s+(ok|FLAGGED)$", line)
        if head:
            current = int(head.group(1))
            blocks[current] = line
        elif current is not None and line.startswith(" "):
            blocks[current] += "\n" + line
        else:
            current = None
    return blocks


def test_check_names_the_jump_and_the_fast_segment_with_frames_and_the_range(dataset: Path, tmp_path: Path, capsys):
    rc, out, err = so101d_here(capsys, "dataset", "check", str(dataset), "--config", str(_config(tmp_path)))
    assert rc == 0, err
    eps = _blocks(out)
    assert "jump: elbow_flex.pos moves 40 deg in one frame at frame 30" in eps[0], out
    assert (
        f"speed: shoulder_pan.pos at up to {2 * RATED_74:.0f} deg/s, 2.0x the STS3215's rated 316 deg/s at 7.4 V, "
        "frames 60-65"
    ) in eps[0], out
    assert "step limit: " in eps[0] and "frames 30, 60-65" in eps[0], out  # 10 deg x 2 cycles per frame
    assert "range: wrist_flex.pos outside the follower's calibrated" in eps[1], out
    for word in ("jump:", "speed:", "step limit:", "range:", "gripper:"):
        assert word not in eps[2], out
    assert "the follower's calibrated range" in out and "rated 316 deg/s" in out


def test_the_supply_voltage_picks_the_rated_speed_and_a_voltage_not_in_the_table_is_an_error(
    dataset: Path, tmp_path: Path, capsys
):
    rc, out, _ = so101d_here(
        capsys,
        "dataset",
        "check",
        str(dataset),
        "--config",
        str(_config(tmp_path, "[follower]\nsupply_voltage_v = 12.0\n")),
    )
    assert rc == 0 and "rated 270 deg/s" in out and "at 12 V" in out, out
    with pytest.raises(ValueError, match=r"supply_voltage_v 9: the sts3215 table has 7.4 V, 12 V"):
        rated_speed_deg_s("sts3215", 9.0)
    rc, _, err = so101d_here(
        capsys,
        "dataset",
        "check",
        str(dataset),
        "--config",
        str(_config(tmp_path, "[follower]\nsupply_voltage_v = 9\n")),
    )
    assert rc == 1 and "supply_voltage_v 9" in err, err


def test_tag_writes_the_findings_into_the_flagged_episodes_tags(dataset: Path, tmp_path: Path, capsys):
    rc, out, err = so101d_here(capsys, "dataset", "check", str(dataset), "--config", str(_config(tmp_path)), "--tag")
    assert rc == 0 and "tagged 2 flagged episodes" in out, (out, err)
    tags = read_episode_tags(dataset)
    assert any(n.startswith("check: jump: elbow_flex.pos") for n in tags[0].notes), tags[0].notes
    assert any(n.startswith("check: range: wrist_flex.pos") for n in tags[1].notes), tags[1].notes
    assert not any(n.startswith("check: ") for n in tags[2].notes), tags[2].notes


def test_import_hdf5_runs_the_check_and_says_what_it_found(tmp_path: Path, capsys):
    n = 70
    units = np.tile(POSE.astype(np.float64), (n, 1))
    units[40:, 1] += 45.0  # a 45 degree jump of shoulder_lift at a subtask boundary
    src = tmp_path / "mimic.hdf5"
    write_isaaclab_file(src, [leisaac_episode(units_to_sim_rad(units).astype(np.float32), {}, True, seed=3)])
    rc, out, err = so101d_here(capsys, "import-hdf5", str(src), "--dataset", str(tmp_path / "ds"), "--no-progress")
    assert rc == 0, err
    assert "feasibility (STS3215 at 7.4 V): 1 of 1 imported episodes ask what the arm cannot do" in out, out
    assert "episode 0: jump: shoulder_lift.pos moves 45 deg in one frame at frame" in out, out
    rc, out, err = so101d_here(
        capsys, "import-hdf5", str(src), "--dataset", str(tmp_path / "ds2"), "--no-progress", "--no-check"
    )
    assert rc == 0 and "feasibility" not in out, out
