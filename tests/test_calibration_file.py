"""Calibration JSON: LeRobot's locations and format, and a clear error for every bad file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.calibration_file import (
    ArmCalibration,
    CalibrationError,
    MotorCalibration,
    calibration_path,
    calibration_root,
    find_calibration,
    load_calibration,
    load_calibration_file,
    save_calibration,
    save_calibration_file,
)
from calibration.conventions import JOINT_IDS, JOINT_NAMES

SAMPLE = {
    "shoulder_pan": (1, 0, -1470, 758, 3292),
    "shoulder_lift": (2, 0, 153, 812, 3210),
    "elbow_flex": (3, 0, -1076, 865, 3102),
    "wrist_flex": (4, 0, 1230, 847, 3216),
    "wrist_roll": (5, 0, -1821, 0, 4095),
    "gripper": (6, 1, 1388, 2031, 3459),
}


def sample_cal() -> ArmCalibration:
    return ArmCalibration({n: MotorCalibration(*SAMPLE[n]) for n in JOINT_NAMES})


def sample_json() -> dict:
    return sample_cal().to_json_dict()


# ---------------------------------------------------------------------------------------------
# locations
# ---------------------------------------------------------------------------------------------
def test_root_follows_lerobots_environment_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HF_LEROBOT_CALIBRATION", "HF_LEROBOT_HOME", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert calibration_root() == tmp_path / "home/.cache/huggingface/lerobot/calibration"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert calibration_root() == tmp_path / "xdg/huggingface/lerobot/calibration"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert calibration_root() == tmp_path / "hf/lerobot/calibration"
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lrhome"))
    assert calibration_root() == tmp_path / "lrhome/calibration"
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(tmp_path / "cal"))
    assert calibration_root() == tmp_path / "cal"


def test_paths_are_lerobots_for_each_role(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(tmp_path))
    assert calibration_path("follower", "f1") == tmp_path / "robots/so_follower/f1.json"
    assert calibration_path("leader", "l1") == tmp_path / "teleoperators/so_leader/l1.json"
    # The same folders LeRobot 0.6.1's classes compute.
    from lerobot.robots.so_follower import SOFollower
    from lerobot.teleoperators.so_leader import SOLeader
    from lerobot.utils.constants import ROBOTS, TELEOPERATORS

    assert Path(ROBOTS) / SOFollower.name == Path("robots/so_follower")
    assert Path(TELEOPERATORS) / SOLeader.name == Path("teleoperators/so_leader")


def test_save_then_load_at_lerobots_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(tmp_path))
    path = save_calibration(sample_cal(), "follower", "bench")
    assert path == tmp_path / "robots/so_follower/bench.json"
    assert load_calibration("follower", "bench") == sample_cal()
    assert json.loads(path.read_text()) == sample_json()
    # No temp files left behind.
    assert sorted(p.name for p in path.parent.iterdir()) == ["bench.json"]


def test_resaving_keeps_a_backup_of_the_previous_file(tmp_path: Path) -> None:
    first = sample_cal()
    path = save_calibration(first, "leader", "lead", root=tmp_path)
    motors = dict(first.motors)
    motors["elbow_flex"] = MotorCalibration(3, 0, 0, 900, 3000)
    second = ArmCalibration(motors)
    save_calibration(second, "leader", "lead", root=tmp_path)
    assert load_calibration_file(path) == second
    assert load_calibration_file(path.with_name("lead.json.bak")) == first


def test_an_invalid_calibration_is_never_written(tmp_path: Path) -> None:
    motors = dict(sample_cal().motors)
    motors["gripper"] = MotorCalibration(6, 0, 0, 3000, 2000)
    with pytest.raises(CalibrationError, match="gripper"):
        save_calibration_file(ArmCalibration(motors), tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    "role,legacy", [("follower", "robots/so101_follower"), ("leader", "teleoperators/so101_leader")]
)
def test_legacy_folders_are_read(tmp_path: Path, role: str, legacy: str) -> None:
    old = tmp_path / legacy / "old_arm.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps(sample_json()))
    assert find_calibration(role, "old_arm", tmp_path) == old
    assert load_calibration(role, "old_arm", tmp_path) == sample_cal()
    # A file in the current folder wins over the legacy one.
    save_calibration(sample_cal(), role, "old_arm", root=tmp_path)
    assert find_calibration(role, "old_arm", tmp_path) == calibration_path(role, "old_arm", tmp_path)


def test_missing_file_says_where_it_was_expected_and_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError) as exc:
        load_calibration("follower", "nobody", tmp_path)
    msg = str(exc.value)
    assert str(tmp_path / "robots/so_follower/nobody.json") in msg
    assert "so101d calibrate follower --id nobody" in msg


@pytest.mark.parametrize("bad_id", ["", ".", "..", "../escape", "a/b", "a\\b"])
def test_arm_ids_cannot_leave_the_calibration_folder(tmp_path: Path, bad_id: str) -> None:
    with pytest.raises(CalibrationError, match="invalid arm id"):
        calibration_path("follower", bad_id, tmp_path)


def test_unknown_role_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="unknown arm role"):
        calibration_path("camera", "x", tmp_path)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# LeRobot's own writer and reader
# ---------------------------------------------------------------------------------------------
def _lerobot_follower(tmp_path: Path, arm_id: str):
    from lerobot.robots.so_follower import SOFollower, SOFollowerRobotConfig

    cfg = SOFollowerRobotConfig(
        port="/dev/null-so101d-test", id=arm_id, calibration_dir=tmp_path / "robots/so_follower"
    )
    return SOFollower(cfg)


def test_a_file_written_by_lerobot_loads(tmp_path: Path) -> None:
    from lerobot.motors import MotorCalibration as LRCal

    robot = _lerobot_follower(tmp_path, "written_by_lerobot")
    robot.calibration = {n: LRCal(*SAMPLE[n]) for n in JOINT_NAMES}
    robot._save_calibration()
    path = find_calibration("follower", "written_by_lerobot", tmp_path)
    assert path == robot.calibration_fpath
    assert load_calibration_file(path) == sample_cal()


def test_lerobot_loads_a_file_we_wrote(tmp_path: Path) -> None:
    save_calibration(sample_cal(), "follower", "written_by_us", root=tmp_path)
    robot = _lerobot_follower(tmp_path, "written_by_us")
    assert set(robot.calibration) == set(JOINT_NAMES)
    for name in JOINT_NAMES:
        assert tuple(vars(robot.calibration[name]).values()) == SAMPLE[name]


# ---------------------------------------------------------------------------------------------
# bad files: the error names the file and the motor
# ---------------------------------------------------------------------------------------------
def _write(tmp_path: Path, content: str) -> Path:
    path = tmp_path / "robots/so_follower/bad.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


def _mutated(motor: str, **fields: object) -> str:
    data = sample_json()
    data[motor].update(fields)
    return json.dumps(data)


@pytest.mark.parametrize(
    "content,motor,fragment",
    [
        ('{"shoulder_pan": {"id": 1,', None, "corrupt calibration JSON"),
        ("", None, "corrupt calibration JSON"),
        ("[1, 2, 3]", None, "expected a JSON object"),
        (json.dumps({k: v for k, v in sample_json().items() if k != "wrist_flex"}), "wrist_flex", "missing motor"),
        (json.dumps({**sample_json(), "base_yaw": sample_json()["gripper"]}), "base_yaw", "unknown motor"),
        (_mutated("elbow_flex", id=7), "elbow_flex", "id 7, expected 3"),
        (_mutated("gripper", drive_mode=2), "gripper", "drive_mode 2"),
        (_mutated("shoulder_lift", homing_offset=2048), "shoulder_lift", "outside -2047..2047"),
        (_mutated("wrist_roll", range_min=4095, range_max=0), "wrist_roll", "range 4095..0"),
        (_mutated("wrist_flex", range_min=1000, range_max=1000), "wrist_flex", "range 1000..1000"),
        (_mutated("shoulder_pan", range_max=5000), "shoulder_pan", "range 758..5000"),
        (_mutated("gripper", range_min="2031"), "gripper", "must be an integer"),
        (_mutated("gripper", range_min=2031.5), "gripper", "must be an integer"),
        (_mutated("gripper", drive_mode=True), "gripper", "must be an integer"),
        (json.dumps({**sample_json(), "elbow_flex": {"id": 3, "drive_mode": 0}}), "elbow_flex", "missing field"),
        (json.dumps({**sample_json(), "elbow_flex": [3, 0, 0, 1, 2]}), "elbow_flex", "expected an object"),
    ],
)
def test_bad_file_error_names_file_and_motor(tmp_path: Path, content: str, motor: str | None, fragment: str) -> None:
    path = _write(tmp_path, content)
    with pytest.raises(CalibrationError) as exc:
        load_calibration("follower", "bad", tmp_path)
    msg = str(exc.value)
    assert str(path) in msg
    assert fragment in msg
    if motor is not None:
        assert motor in msg


def test_unreadable_path_is_a_calibration_error(tmp_path: Path) -> None:
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(CalibrationError, match="cannot read calibration"):
        load_calibration_file(tmp_path / "dir.json")


def test_json_layout_matches_lerobots_keys(tmp_path: Path) -> None:
    path = save_calibration(sample_cal(), "follower", "layout", root=tmp_path)
    data = json.loads(path.read_text())
    assert list(data) == list(JOINT_NAMES)
    for name in JOINT_NAMES:
        assert list(data[name]) == ["id", "drive_mode", "homing_offset", "range_min", "range_max"]
        assert data[name]["id"] == JOINT_IDS[name]
