"""Finding the cameras plugged in: their paths, names, the modes they offer, one snapshot each.

Linux names a USB camera twice: ``/dev/videoN`` (N changes with the plug order) and a stable
``/dev/v4l/by-id/usb-<vendor>_<product>_<serial>-video-index0`` link (the one to configure: it
finds the same camera after a replug). The modes (pixel format, size, rates) are asked of the
V4L2 driver itself (VIDIOC_ENUM_FMT / ENUM_FRAMESIZES / ENUM_FRAMEINTERVALS, linux/videodev2.h);
the snapshot and the default mode come from opening it through LeRobot's OpenCV camera.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

V4L2_BUF_TYPE_VIDEO_CAPTURE = 1
V4L2_FRMSIZE_TYPE_DISCRETE = 1
V4L2_FRMIVAL_TYPE_DISCRETE = 1


class _FmtDesc(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_uint32),
        ("type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("description", ctypes.c_char * 32),
        ("pixelformat", ctypes.c_uint32),
        ("mbus_code", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32 * 3),
    ]


class _FrmSizeEnum(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_uint32),
        ("pixel_format", ctypes.c_uint32),
        ("type", ctypes.c_uint32),
        ("u", ctypes.c_uint32 * 6),  # discrete: width, height; stepwise: min/max/step w and h
        ("reserved", ctypes.c_uint32 * 2),
    ]


class _FrmIvalEnum(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_uint32),
        ("pixel_format", ctypes.c_uint32),
        ("width", ctypes.c_uint32),
        ("height", ctypes.c_uint32),
        ("type", ctypes.c_uint32),
        ("u", ctypes.c_uint32 * 6),  # discrete: numerator, denominator (a frame interval)
        ("reserved", ctypes.c_uint32 * 2),
    ]


def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("V") << 8) | nr


VIDIOC_ENUM_FMT = _iowr(2, ctypes.sizeof(_FmtDesc))
VIDIOC_ENUM_FRAMESIZES = _iowr(74, ctypes.sizeof(_FrmSizeEnum))
VIDIOC_ENUM_FRAMEINTERVALS = _iowr(75, ctypes.sizeof(_FrmIvalEnum))


def fourcc_text(code: int) -> str:
    return "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4)).strip()


@dataclass(frozen=True)
class CameraMode:
    fourcc: str
    width: int
    height: int
    fps: tuple[float, ...]


@dataclass
class FoundCamera:
    """One camera: ``device`` is the path to configure (by-id when there is one)."""

    device: str
    video_node: str  # /dev/videoN
    name: str
    by_id: str = ""
    modes: list[CameraMode] = field(default_factory=list)
    modes_error: str = ""  # why the driver could not be asked (not a V4L2 device, ...)
    default: dict[str, Any] = field(default_factory=dict)  # what it opens at: width, height, fps, fourcc
    snapshot: str = ""
    snapshot_error: str = ""
    open_error: str = ""  # why it did not open (empty: it opened, or it was not tried)

    def unusable(self) -> str:
        """Why this node cannot be configured as a camera ("" when it can, or when nothing says it
        cannot: not opened and its modes not readable): its modes are unreadable and it does not open."""
        if self.modes or self.default or not self.open_error:
            return ""
        return f"its modes are not readable ({self.modes_error}) and it does not open ({self.open_error})"


def _ioctl_each(fd: int, request: int, make: Any) -> list[Any]:
    out = []
    index = 0
    while index < 4096:
        buf = make(index)
        try:
            fcntl.ioctl(fd, request, buf)
        except OSError:  # EINVAL: no more entries
            break
        out.append(buf)
        index += 1
    return out


def v4l2_modes(node: str) -> list[CameraMode]:
    """Every discrete mode the driver offers (a metadata node offers none). OSError when the node
    cannot be opened or is not a V4L2 device."""
    fd = os.open(node, os.O_RDWR | os.O_NONBLOCK)
    try:
        fmts = _ioctl_each(fd, VIDIOC_ENUM_FMT, lambda i: _FmtDesc(index=i, type=V4L2_BUF_TYPE_VIDEO_CAPTURE))
        if not fmts:
            fcntl.ioctl(fd, VIDIOC_ENUM_FMT, _FmtDesc(index=0, type=V4L2_BUF_TYPE_VIDEO_CAPTURE))  # the real error
        modes: list[CameraMode] = []
        for f in fmts:
            sizes = _ioctl_each(
                fd, VIDIOC_ENUM_FRAMESIZES, lambda i, pf=f.pixelformat: _FrmSizeEnum(index=i, pixel_format=pf)
            )
            for s in sizes:
                if s.type != V4L2_FRMSIZE_TYPE_DISCRETE:
                    continue
                w, h = int(s.u[0]), int(s.u[1])
                ivals = _ioctl_each(
                    fd,
                    VIDIOC_ENUM_FRAMEINTERVALS,
                    lambda i, pf=f.pixelformat, w=w, h=h: _FrmIvalEnum(index=i, pixel_format=pf, width=w, height=h),
                )
                rates = tuple(
                    sorted(
                        {
                            round(iv.u[1] / iv.u[0], 2)
                            for iv in ivals
                            if iv.type == V4L2_FRMIVAL_TYPE_DISCRETE and iv.u[0]
                        },
                        reverse=True,
                    )
                )
                modes.append(CameraMode(fourcc_text(int(f.pixelformat)), w, h, rates))
        return modes
    finally:
        os.close(fd)


def _sys_name(sys_root: Path, node: Path) -> str:
    try:
        return (sys_root / "class" / "video4linux" / node.name / "name").read_text().strip()
    except OSError:
        return ""


def find_video_nodes(dev_root: Path = Path("/dev"), sys_root: Path = Path("/sys")) -> list[FoundCamera]:
    """Every /dev/videoN, with its by-id link where udev made one (a camera's second node, its
    metadata, is left out when the driver says it captures nothing)."""
    by_node: dict[str, str] = {}
    by_id_dir = dev_root / "v4l" / "by-id"
    if by_id_dir.is_dir():
        for link in sorted(by_id_dir.iterdir()):
            try:
                by_node.setdefault(str(link.resolve()), str(link))
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop (pathlib's, before 3.13)
                continue
    found = []
    nodes = sorted(dev_root.glob("video*"), key=lambda p: (len(p.name), p.name))
    for node in nodes:
        try:
            real = str(node.resolve())
        except (OSError, RuntimeError):  # a link loop: no node; its stat below says so
            real = str(node)
        by_id = by_node.get(real, "")
        name = _sys_name(sys_root, node) or (Path(by_id).name if by_id else node.name)
        cam = FoundCamera(device=by_id or str(node), video_node=str(node), name=name, by_id=by_id)
        try:
            if not stat.S_ISCHR(os.stat(node).st_mode):
                raise OSError(f"{node} is not a character device (not a V4L2 camera)")
            cam.modes = v4l2_modes(str(node))
        except PermissionError as exc:
            cam.modes_error = (
                f"{exc.strerror}: {node} (add yourself to the group that owns it, usually 'video': "
                "sudo usermod -aG video $USER, then log in again)"
            )
        except OSError as exc:
            cam.modes_error = str(exc)
        else:
            if not cam.modes:
                continue  # a metadata node: nothing to capture
        found.append(cam)
    return found


def dangling_by_id(dev_root: Path = Path("/dev")) -> list[str]:
    """By-id links whose /dev/videoN is not there: a camera unplugged since udev named it (udev
    removes the link with the node; one left behind says the node went away another way)."""
    by_id_dir = dev_root / "v4l" / "by-id"
    if not by_id_dir.is_dir():
        return []
    return [str(link) for link in sorted(by_id_dir.iterdir()) if link.is_symlink() and not link.exists()]


def open_default(cam: FoundCamera, snapshot_dir: Path | None) -> None:
    """Opens the camera through LeRobot's OpenCV camera as it is (no size or rate asked): its
    default mode, and one frame saved as PNG in ``snapshot_dir``."""
    import cv2
    from lerobot.cameras.opencv import OpenCVCamera, OpenCVCameraConfig

    lr = OpenCVCamera(OpenCVCameraConfig(index_or_path=Path(cam.device), warmup_s=0))
    try:
        lr.connect(warmup=False)
    except Exception as exc:
        cam.open_error = str(exc)
        cam.snapshot_error = f"cannot open {cam.device}: {exc}"
        return
    try:
        vc = lr.videocapture
        cam.default = {
            "width": int(lr.width or 0),
            "height": int(lr.height or 0),
            "fps": float(vc.get(cv2.CAP_PROP_FPS)) if vc is not None else 0.0,
            "fourcc": fourcc_text(int(vc.get(cv2.CAP_PROP_FOURCC))) if vc is not None else "",
        }
        if snapshot_dir is not None:
            try:
                rgb = lr.read()
            except Exception as exc:
                cam.snapshot_error = f"no frame from {cam.device}: {exc}"
                return
            snapshot_dir.mkdir(parents=True, exist_ok=True)
            out = snapshot_dir / f"{Path(cam.device).name}.png"
            cv2.imwrite(str(out), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
            cam.snapshot = str(out)
    finally:
        lr.disconnect()


def suggested_mode(cam: FoundCamera, width: int = 640, height: int = 480, fps: float = 30.0) -> dict[str, Any]:
    """What to configure: MJPG at width x height and fps when the camera offers it (it fits a
    USB 2 bus beside other cameras), else any format there, else what it opens at."""
    at_size = [m for m in cam.modes if (m.width, m.height) == (width, height) and fps in m.fps]
    for fourcc in ("MJPG", "YUYV"):
        if any(m.fourcc == fourcc for m in at_size):
            return {"width": width, "height": height, "fps": int(fps), "fourcc": fourcc}
    if at_size:
        return {"width": width, "height": height, "fps": int(fps), "fourcc": at_size[0].fourcc}
    d = cam.default
    if d.get("width"):
        return {
            "width": int(d["width"]),
            "height": int(d["height"]),
            "fps": round(float(d["fps"])) or int(fps),
            "fourcc": str(d.get("fourcc", "")),
        }
    return {"width": width, "height": height, "fps": int(fps), "fourcc": ""}


def config_block(table: str, cam: FoundCamera) -> str:
    """The [cameras.<table>] block to paste into so101d.toml."""
    m = suggested_mode(cam)
    lines = [f"[cameras.{table}]", 'kind = "opencv"', f'device = "{cam.device}"']
    if not cam.modes and not cam.default:
        lines.append("# the size and rate below are not the camera's (its modes were not read, it was not opened)")
    lines += [f"width = {m['width']}", f"height = {m['height']}", f"fps = {m['fps']}"]
    if m["fourcc"]:
        lines.append(f'fourcc = "{m["fourcc"]}"')
    return "\n".join(lines)
