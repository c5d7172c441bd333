"""`so101d find-cameras` on a fake /dev tree: a /dev/v4l/by-id link to /dev/video0 (a video file
OpenCV really opens, as a camera node would), the driver's name in /sys; the CLI as typed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import cv2
import numpy as np
import pytest

from daemon.config.settings import config_from_dict

SO101D = [sys.executable, "-m", "daemon.apps.cli"]
BY_ID = "usb-Fake_Webcam_C920_ABC123-video-index0"


def fake_tree(root: Path) -> tuple[Path, Path]:
    dev, sysfs = root / "dev", root / "sys"
    (dev / "v4l" / "by-id").mkdir(parents=True)
    w = cv2.VideoWriter(str(root / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 30, (320, 240))
    for _ in range(1500):  # long enough that the reader is still on it when the snapshot is taken
        w.write(np.full((240, 320, 3), (40, 90, 200), np.uint8))  # BGR: red 200
    w.release()
    (root / "clip.avi").rename(dev / "video0")  # the container is read from the file, not its name
    (dev / "v4l" / "by-id" / BY_ID).symlink_to("../../video0")
    (sysfs / "class" / "video4linux" / "video0").mkdir(parents=True)
    (sysfs / "class" / "video4linux" / "video0" / "name").write_text("Fake Webcam C920\n")
    return dev, sysfs


def find_cameras(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    dev, sysfs = fake_tree(tmp_path)
    return subprocess.run(
        [*SO101D, "find-cameras", "--dev", str(dev), "--sys", str(sysfs), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
    )


def test_find_cameras_lists_the_by_id_path_a_snapshot_and_a_block_that_loads(tmp_path):
    r = find_cameras(tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    by_id = str(tmp_path / "dev" / "v4l" / "by-id" / BY_ID)
    assert "Fake Webcam C920" in out and f"path: {by_id}" in out and "video0" in out, out
    assert "opens at: 320x240 MJPG @ 30 fps" in out, out
    assert "not a character device" in out  # a file, not a V4L2 node: its modes cannot be asked
    snap = tmp_path / "camera-snapshots" / f"{BY_ID}.png"
    assert f"snapshot: {snap.relative_to(tmp_path)}" in out, out
    img = cv2.imread(str(snap))
    assert img.shape == (240, 320, 3) and abs(int(img[..., 2].mean()) - 200) < 20  # RGB stored right
    block = out[out.index("[cameras.front]") :]
    cfg = config_from_dict(tomllib.loads(block))
    cam = cfg.cameras["front"]
    assert (cam.kind, cam.device, cam.width, cam.height, cam.fps, cam.fourcc) == (
        "opencv",
        by_id,
        320,
        240,
        30,
        "MJPG",
    )


def test_a_by_id_link_to_nothing_is_named(tmp_path):
    dev, sysfs = fake_tree(tmp_path)
    gone = dev / "v4l" / "by-id" / "usb-Gone_Cam_X-video-index0"
    gone.symlink_to("../../video7")
    cmd = [*SO101D, "find-cameras", "--dev", str(dev), "--sys", str(sysfs), "--no-snapshot"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0 and f"{gone}: a by-id link to nothing" in r.stdout, r.stdout
    r = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert json.loads(r.stdout)["dangling_by_id"] == [str(gone)], r.stdout


def test_find_cameras_json_and_no_camera(tmp_path):
    r = find_cameras(tmp_path, "--json", "--no-snapshot")
    assert r.returncode == 0, r.stderr
    (cam,) = json.loads(r.stdout)["cameras"]
    assert cam["device"].endswith(BY_ID) and cam["video_node"].endswith("video0") and cam["snapshot"] == ""
    assert cam["config"].startswith("[cameras.front]")
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run(
        [*SO101D, "find-cameras", "--dev", str(empty), "--sys", str(empty)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and "no camera found" in r.stdout, r.stdout


def junk_nodes(dev: Path) -> None:
    """What a /dev tree holds besides cameras: a node that is no camera (garbage OpenCV cannot
    read) and a /dev/videoN link to nothing (a node gone mid-way)."""
    (dev / "video4").write_bytes(bytes(range(256)) * 64)
    (dev / "video5").symlink_to("video-nowhere")


def test_nodes_that_are_no_camera_are_listed_with_why_and_get_no_block(tmp_path):
    dev, sysfs = fake_tree(tmp_path)
    junk_nodes(dev)
    cmd = [*SO101D, "find-cameras", "--dev", str(dev), "--sys", str(sysfs)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.count("not usable as a camera") == 2, out
    blocks = out[out.index("# paste into") :]
    assert "[cameras.front]" in blocks and BY_ID in blocks and "video4" not in blocks and "video5" not in blocks, blocks
    assert "[cameras.wrist]" not in blocks, blocks  # no invented 640x480 block for what does not open
    (dev / "video0").unlink()  # only the junk left
    r = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stdout
    cams = json.loads(r.stdout)["cameras"]
    assert [c["usable"] for c in cams] == [False, False] and [c["config"] for c in cams] == ["", ""], cams
    assert all("does not open" in c["problem"] for c in cams), cams
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 1 and "no usable camera: 2 video node(s)" in r.stdout, r.stdout


SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.mark.skipif(
    os.geteuid() != 0 or not SYSTEM_PYTHON.exists(), reason="needs root to make a node and drop to nobody"
)
def test_a_camera_node_the_user_may_not_open_says_which_group_to_join(tmp_path):
    # discovery imports only the standard library: a system python as user nobody runs it
    # pytest's tmp_path is root's alone (0700 above it): nobody must reach the tree
    with tempfile.TemporaryDirectory(prefix="so101d-dev-") as top:
        os.chmod(top, 0o755)
        dev = Path(top) / "dev"
        dev.mkdir(mode=0o755)
        out = _modes_error_as_nobody(dev)
    assert "Permission denied" in out and "usermod -aG video" in out, out


def _modes_error_as_nobody(dev: Path) -> str:
    os.mknod(dev / "video0", 0o600 | stat.S_IFCHR, os.makedev(81, 0))  # root's, like /dev/video0 is video's
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path;"
        "from drivers.camera_discovery import find_video_nodes;"
        "print(find_video_nodes(Path(sys.argv[2]), Path(sys.argv[2]))[0].modes_error)"
    )
    repo = str(Path(__file__).resolve().parent.parent)
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(SYSTEM_PYTHON), "-c", code, repo, str(dev)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout
