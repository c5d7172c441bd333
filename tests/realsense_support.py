"""A RealSense on the bench: the fake ``pyrealsense2`` (tests/fixtures/sdk/pyrealsense2, on the path
from tests/conftest.py) with a camera plugged in, for LeRobot's real RealSenseCamera to open.

``paired_device`` draws a scene whose colour and depth carry the frame's number (the blue channel,
and an offset in millimetres on top of the fake's ramp), so a test can tell that a colour frame
and the depth map published with it came from one frameset."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pyrealsense2 as rs  # the fake: tests/fixtures/sdk/pyrealsense2


def colour_with_index(index: int, height: int, width: int) -> np.ndarray:
    img = np.full((height, width, 3), 90, np.uint8)
    img[..., 2] = index % 256
    return img


def depth_with_index(index: int, height: int, width: int) -> np.ndarray:
    return rs.ramp_depth_mm(0, height, width) + np.uint16(index % 256)


def frame_index_of(pixels: np.ndarray) -> int:
    return int(pixels[0, 0, 2])


def depth_index_of(depth_mm: np.ndarray) -> int:
    """The frame number a ``depth_with_index`` map carries (read where the ramp is not 0)."""
    h, w = depth_mm.shape[:2]
    ramp = rs.ramp_depth_mm(0, h, w)
    return int(depth_mm[h - 1, w - 1, 0]) - int(ramp[h - 1, w - 1])


@contextlib.contextmanager
def plugged(device: rs.FakeDevice) -> Iterator[rs.FakeDevice]:
    rs.plug(device)
    try:
        yield device
    finally:
        rs.unplug(device.serial)


def paired_device(serial: str = "844212070123") -> rs.FakeDevice:
    return rs.FakeDevice(serial=serial, color=colour_with_index, depth=depth_with_index)
