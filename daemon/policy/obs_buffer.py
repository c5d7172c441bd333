"""The latest observation in shared memory, guarded by a seqlock (one writer, one reader).

Layout (all offsets 64-byte aligned):
  seq        uint64      even = stable, odd = being written
  meta       float64[4]  obs_time_s, request_id, state_time_s, oldest camera capture time
  state      float64[state_dim]
  image i    uint8[H, W, 3] per camera, in sorted camera-name order

The daemon writes (state + the cameras' latest frames) only when the worker is asked for a new
chunk; the worker reads into its own buffers and retries if the sequence changed under it. Camera
pixels cross the process boundary once (one memcpy into the segment), never through a pipe or pickle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

_ALIGN = 64


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class ObsLayout:
    state_dim: int
    cameras: tuple[tuple[str, int, int], ...]  # (name, height, width), sorted by name

    @classmethod
    def make(cls, state_dim: int, cameras: dict[str, tuple[int, int]]) -> ObsLayout:
        return cls(state_dim, tuple((n, int(h), int(w)) for n, (h, w) in sorted(cameras.items())))

    def offsets(self) -> tuple[int, int, int, list[int], int]:
        seq_off = 0
        meta_off = _align(8)
        state_off = _align(meta_off + 4 * 8)
        off = _align(state_off + self.state_dim * 8)
        img_offs = []
        for _, h, w in self.cameras:
            img_offs.append(off)
            off = _align(off + h * w * 3)
        return seq_off, meta_off, state_off, img_offs, max(off, _ALIGN)

    def to_dict(self) -> dict:
        return {"state_dim": self.state_dim, "cameras": [list(c) for c in self.cameras]}

    @classmethod
    def from_dict(cls, d: dict) -> ObsLayout:
        return cls(int(d["state_dim"]), tuple((str(n), int(h), int(w)) for n, h, w in d["cameras"]))


class ObsBuffer:
    """Views onto the shared segment. create=True in the daemon, False (attach by name) in the worker."""

    def __init__(self, layout: ObsLayout, name: str | None = None, create: bool = True):
        self.layout = layout
        seq_off, meta_off, state_off, img_offs, size = layout.offsets()
        self._owner = create
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=size if create else 0)
        if not create and self.shm.size < size:
            raise ValueError(f"shared observation segment {name} is {self.shm.size} bytes, layout needs {size}")
        buf = self.shm.buf
        self._seq: np.ndarray = np.ndarray((1,), dtype=np.uint64, buffer=buf, offset=seq_off)
        self._meta: np.ndarray = np.ndarray((4,), dtype=np.float64, buffer=buf, offset=meta_off)
        self._state: np.ndarray = np.ndarray((layout.state_dim,), dtype=np.float64, buffer=buf, offset=state_off)
        self._images: dict[str, np.ndarray] = {
            n: np.ndarray((h, w, 3), dtype=np.uint8, buffer=buf, offset=o)
            for (n, h, w), o in zip(layout.cameras, img_offs)
        }
        if create:
            self._seq[0] = 0

    @property
    def name(self) -> str:
        return self.shm.name

    # -- writer (daemon) ----------------------------------------------------------------------
    def write(
        self,
        obs_time_s: float,
        request_id: int,
        state: np.ndarray,
        images: dict[str, np.ndarray],
        state_time_s: float | None = None,
        oldest_frame_s: float | None = None,
    ) -> None:
        for n, arr in images.items():
            dst = self._images.get(n)
            if dst is None:
                raise KeyError(f"camera {n!r} has no slot in the observation buffer")
            if arr.shape != dst.shape:
                raise ValueError(f"camera {n!r}: frame {arr.shape}, buffer expects {dst.shape}")
        self._seq[0] += 1  # odd: writing
        self._meta[0] = obs_time_s
        self._meta[1] = request_id
        self._meta[2] = obs_time_s if state_time_s is None else state_time_s
        self._meta[3] = obs_time_s if oldest_frame_s is None else oldest_frame_s
        self._state[:] = state
        for n, arr in images.items():
            np.copyto(self._images[n], arr, casting="unsafe")
        self._seq[0] += 1  # even: stable

    # -- reader (worker) ----------------------------------------------------------------------
    def read_into(
        self, state_out: np.ndarray, images_out: dict[str, np.ndarray], timeout_s: float = 0.1
    ) -> tuple[float, int, float]:
        """Consistent copy of the latest observation -> (obs_time_s, request_id, oldest_frame_s).

        Retries while a write is in progress or happened during the copy (the daemon writes once
        per request, so a retry is rare); gives up after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            s1 = int(self._seq[0])
            if not s1 & 1:
                obs_time, req, oldest = float(self._meta[0]), int(self._meta[1]), float(self._meta[3])
                state_out[:] = self._state
                for n, dst in images_out.items():
                    np.copyto(dst, self._images[n])
                if int(self._seq[0]) == s1:
                    return obs_time, req, oldest
            if time.monotonic() > deadline:
                raise TimeoutError("observation buffer kept changing while being read")
            time.sleep(0)  # let the writer finish

    def close(self) -> None:
        # Drop our numpy views first: SharedMemory.close() refuses while buffers are exported.
        self._seq = self._meta = self._state = None  # type: ignore[assignment]
        self._images = {}
        try:
            self.shm.close()
        except BufferError:
            pass
        if self._owner:
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass
