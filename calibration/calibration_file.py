"""LeRobot's calibration JSON for SO-101 arms: one file per arm, keyed by motor name.

A file looks like::

    {"shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": -1470,
                      "range_min": 758, "range_max": 3292}, ...}

It lives at ``$HF_LEROBOT_CALIBRATION/robots/so_follower/<id>.json`` (followers) or
``$HF_LEROBOT_CALIBRATION/teleoperators/so_leader/<id>.json`` (leaders); LeRobot before 0.6 used
``so101_follower`` / ``so101_leader`` folders, which we still read so existing calibrations work.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from calibration.conventions import JOINT_IDS, JOINT_NAMES

Role = Literal["follower", "leader"]

# (current folder, legacy folder) below the calibration root, by role.
_ROLE_DIRS: dict[str, tuple[str, str]] = {
    "follower": ("robots/so_follower", "robots/so101_follower"),
    "leader": ("teleoperators/so_leader", "teleoperators/so101_leader"),
}
_FIELDS = ("id", "drive_mode", "homing_offset", "range_min", "range_max")


class CalibrationError(ValueError):
    """A calibration file that is missing, corrupt, or does not describe an SO-101 arm."""


@dataclass(frozen=True)
class MotorCalibration:
    id: int
    drive_mode: int
    homing_offset: int
    range_min: int
    range_max: int


@dataclass(frozen=True)
class ArmCalibration:
    """Calibration of all six joints of one arm, in ``JOINT_NAMES`` order."""

    motors: dict[str, MotorCalibration]

    def __getitem__(self, joint: str) -> MotorCalibration:
        return self.motors[joint]

    def to_json_dict(self) -> dict[str, dict[str, int]]:
        return {name: asdict(self.motors[name]) for name in JOINT_NAMES}

    @classmethod
    def from_json_dict(cls, data: object, source: str = "<calibration>") -> ArmCalibration:
        """Validate a decoded JSON object; every problem names the source and the motor."""
        if not isinstance(data, dict):
            raise CalibrationError(f"{source}: expected a JSON object keyed by motor name, got {type(data).__name__}")
        missing = [name for name in JOINT_NAMES if name not in data]
        if missing:
            raise CalibrationError(f"{source}: missing motor(s) {', '.join(missing)}")
        unknown = [name for name in data if name not in JOINT_NAMES]
        if unknown:
            raise CalibrationError(f"{source}: unknown motor(s) {', '.join(sorted(unknown))} (not an SO-101 arm?)")
        motors: dict[str, MotorCalibration] = {}
        for name in JOINT_NAMES:
            entry = data[name]
            if not isinstance(entry, dict):
                raise CalibrationError(f"{source}: motor '{name}': expected an object, got {type(entry).__name__}")
            absent = [f for f in _FIELDS if f not in entry]
            if absent:
                raise CalibrationError(f"{source}: motor '{name}': missing field(s) {', '.join(absent)}")
            values: dict[str, int] = {}
            for f in _FIELDS:
                v = entry[f]
                if isinstance(v, bool) or not isinstance(v, int):
                    raise CalibrationError(f"{source}: motor '{name}': field '{f}' must be an integer, got {v!r}")
                values[f] = v
            cal = MotorCalibration(**values)
            if cal.id != JOINT_IDS[name]:
                raise CalibrationError(
                    f"{source}: motor '{name}': id {cal.id}, expected {JOINT_IDS[name]} on an SO-101"
                )
            if cal.drive_mode not in (0, 1):
                raise CalibrationError(f"{source}: motor '{name}': drive_mode {cal.drive_mode} is not 0 or 1")
            if not -2047 <= cal.homing_offset <= 2047:
                raise CalibrationError(
                    f"{source}: motor '{name}': homing_offset {cal.homing_offset} outside -2047..2047 "
                    "(the STS3215 stores it as 11-bit sign-magnitude)"
                )
            if not (0 <= cal.range_min < cal.range_max <= 4095):
                raise CalibrationError(
                    f"{source}: motor '{name}': range {cal.range_min}..{cal.range_max} must satisfy "
                    "0 <= range_min < range_max <= 4095"
                )
            motors[name] = cal
        return cls(motors)


def calibration_root() -> Path:
    """LeRobot 0.6.1's calibration root, resolved the way LeRobot resolves it.

    ``$HF_LEROBOT_CALIBRATION``, else ``$HF_LEROBOT_HOME/calibration``, else
    ``<HF_HOME>/lerobot/calibration`` with huggingface_hub's HF_HOME default
    (``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``).
    Read from the environment on every call (LeRobot freezes it at import time).
    """
    env = os.environ.get("HF_LEROBOT_CALIBRATION")
    if env:
        return Path(env).expanduser()
    lerobot_home = os.environ.get("HF_LEROBOT_HOME")
    if lerobot_home:
        return Path(lerobot_home).expanduser() / "calibration"
    hf_home = os.environ.get("HF_HOME")
    if not hf_home:
        xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
        hf_home = str(Path(xdg) / "huggingface")
    return Path(hf_home).expanduser() / "lerobot" / "calibration"


def _check_role_and_id(role: str, arm_id: str) -> None:
    if role not in _ROLE_DIRS:
        raise CalibrationError(f"unknown arm role {role!r}: expected 'follower' or 'leader'")
    # The id becomes a file name: refuse anything that could leave the calibration folder.
    if not arm_id or arm_id in (".", "..") or "/" in arm_id or "\\" in arm_id or "\0" in arm_id:
        raise CalibrationError(f"invalid arm id {arm_id!r}: use a plain name such as 'my_follower'")


def calibration_path(role: Role, arm_id: str, root: Path | None = None) -> Path:
    """Where LeRobot 0.6.1 keeps (and where we write) this arm's calibration."""
    _check_role_and_id(role, arm_id)
    return (root or calibration_root()) / _ROLE_DIRS[role][0] / f"{arm_id}.json"


def find_calibration(role: Role, arm_id: str, root: Path | None = None) -> Path | None:
    """The existing calibration file for an arm: current folder first, then the legacy one."""
    _check_role_and_id(role, arm_id)
    base = root or calibration_root()
    for sub in _ROLE_DIRS[role]:
        path = base / sub / f"{arm_id}.json"
        if path.is_file():
            return path
    return None


def load_calibration_file(path: Path) -> ArmCalibration:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read calibration: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: corrupt calibration JSON: {exc}") from exc
    return ArmCalibration.from_json_dict(data, source=str(path))


def load_calibration(role: Role, arm_id: str, root: Path | None = None) -> ArmCalibration:
    path = find_calibration(role, arm_id, root)
    if path is None:
        expected = calibration_path(role, arm_id, root)
        raise CalibrationError(
            f"no calibration for {role} '{arm_id}': expected {expected} (run `so101d calibrate {role} --id {arm_id}`)"
        )
    return load_calibration_file(path)


def save_calibration_file(cal: ArmCalibration, path: Path, keep_backup: bool = True) -> Path:
    """Write ``cal`` to ``path`` atomically (temp file, fsync, rename): a crash never leaves half a file.

    With ``keep_backup`` an existing file at ``path`` is first copied to ``<name>.bak`` so that
    recalibrating never loses the previous calibration.
    """
    path = Path(path)
    # Validate before touching the disk: a file we write must load.
    ArmCalibration.from_json_dict(cal.to_json_dict(), source=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    if keep_backup and path.is_file():
        backup = path.with_name(path.name + ".bak")
        _atomic_write_text(backup, path.read_text())
    _atomic_write_text(path, json.dumps(cal.to_json_dict(), indent=4) + "\n")
    return path


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # Make the rename itself durable.
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_calibration(
    cal: ArmCalibration, role: Role, arm_id: str, root: Path | None = None, keep_backup: bool = True
) -> Path:
    """Write an arm's calibration where LeRobot 0.6.1 looks for it (atomic; see save_calibration_file)."""
    return save_calibration_file(cal, calibration_path(role, arm_id, root), keep_backup=keep_backup)
