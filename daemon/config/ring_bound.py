"""The pre-roll buffer's memory bound (``[recording] ring_s``, ``ring_max_mb``), one arithmetic for the
configuration's check at load (settings.py) and the recorder's buffer (daemon/data/preroll.py).

The buffer keeps ``ceil(ring_s * fps)`` rows; each references at most one image per camera (HxWx3
uint8) and one depth map per depth stream (HxWx1 uint16), so what it keeps alive is at most rows x
the bytes of one frame of every stream. MiB, as LeRobot 0.6.1's ``ring_buffer_max_memory_mb``
(lerobot/rollout/configs.py, ring_buffer.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

RING_S_MAX = 600.0  # ten minutes at most: a longer one is a continuous recording
DEFAULT_RING_MAX_MB = 1024.0  # LeRobot's highlight default (ring_buffer_max_memory_mb)
MIB = 1024 * 1024


def preroll_frames(ring_s: float, fps: float) -> int:
    """Rows ``ring_s`` seconds hold at ``fps``: ceil(ring_s * fps), 0 when off. Rounded to 1e-9
    first: 0.1 s at 30 fps is 3 rows, not the 4 that 3.0000000000000004 would ceil to."""
    if ring_s <= 0 or fps <= 0:
        return 0
    return math.ceil(round(ring_s * fps, 9))


@dataclass(frozen=True)
class StreamSize:
    """One recorded camera's image size, and whether its depth map is recorded with it."""

    width: int
    height: int
    depth: bool = False

    @property
    def frame_bytes(self) -> int:
        """One frame: the HxWx3 uint8 image, plus the HxWx1 uint16 depth map."""
        return self.width * self.height * (3 + (2 if self.depth else 0))


def preroll_bound_bytes(ring_s: float, fps: float, streams: Sequence[StreamSize]) -> int:
    """Rows x the bytes of one frame of every camera."""
    return preroll_frames(ring_s, fps) * sum(s.frame_bytes for s in streams)


def bound_refusal(ring_s: float, fps: float, streams: Sequence[StreamSize], ring_max_mb: float) -> str:
    """Why the buffer does not fit ``ring_max_mb`` (both numbers and how the bound comes), or ""."""
    bound = preroll_bound_bytes(ring_s, fps, streams)
    if bound <= ring_max_mb * MIB:
        return ""
    per_frame = " + ".join(f"{s.width}x{s.height}x{5 if s.depth else 3}" for s in streams)
    return (
        f"recording.ring_s: {ring_s:g} s at {fps:g} fps keeps up to {bound / MIB:.1f} MiB of camera frames "
        f"({preroll_frames(ring_s, fps)} frames x ({per_frame}) bytes), more than recording.ring_max_mb = "
        f"{ring_max_mb:g} MiB; shorten ring_s, raise ring_max_mb or record smaller images"
    )
