"""Camera frames shared through memory between processes: the daemon writes each camera's newest
frames into a file under /dev/shm, a client on the same machine (the LeRobot plugin) maps it and
reads the newest one without any pixel crossing a socket.

Layout (native little-endian; one file per camera): a header ``[magic, width, height, slots,
latest]`` (int64 each; ``latest`` is the slot written last, -1 before the first), then per slot
``[generation, seq, capture_monotonic_ns, 0]`` (int64), then the slots' pixels (H x W x 3 uint8,
page-aligned). A slot's generation is odd while it is written and even once it is whole: a
reader copies the slot, and keeps the copy only if the generation was the same even number
before and after (a seqlock). The writer cycles through ``slots`` slots, so a reader copying the
newest one is overtaken only if the writer wrote ``slots - 1`` frames meanwhile.

Plain files and mmap, not multiprocessing.shared_memory: Python 3.12's resource tracker would
unlink a segment when a reader that attached to it exits.
"""

from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
PREFIX = "so101d-frames"
MAGIC = 0x53313031_46524D31  # "S101FRM1"
_HEADER_WORDS = 5
_META_WORDS = 4
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class SharedFrame:
    pixels: np.ndarray  # H x W x 3 uint8, the reader's own copy
    seq: int
    capture_monotonic_s: float


def _pixel_offset(slots: int) -> int:
    meta_end = 8 * (_HEADER_WORDS + _META_WORDS * slots)
    return (meta_end + _PAGE - 1) // _PAGE * _PAGE


class _Mapped:
    def __init__(self, path: Path, size: int, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o660)
        try:
            if create:
                os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.path = path

    def close(self) -> None:
        self._mm.close()


class FrameShareWriter:
    """One camera's frames into shared memory (the daemon side)."""

    def __init__(
        self,
        camera: str,
        width: int,
        height: int,
        slots: int = 4,
        directory: Path = SHM_DIR,
        file_name: str | None = None,
    ) -> None:
        """``file_name``: the file's name under ``directory`` (the daemon names it so that a killed
        daemon's files can be swept); default one made of this pid and the camera's name."""
        self.width, self.height, self.slots = width, height, slots
        self.frame_bytes = width * height * 3
        offset = _pixel_offset(slots)
        size = offset + slots * self.frame_bytes
        safe = "".join(ch if ch.isalnum() else "_" for ch in camera)[:40]
        self.path = directory / (file_name or f"{PREFIX}-{os.getpid()}-{safe}-{secrets.token_hex(4)}")
        self._map = _Mapped(self.path, size, create=True)
        buf = self._map._mm
        self._header: np.ndarray = np.ndarray((_HEADER_WORDS,), np.int64, buf, 0)
        self._meta: np.ndarray = np.ndarray((slots, _META_WORDS), np.int64, buf, 8 * _HEADER_WORDS)
        self._pixels: np.ndarray = np.ndarray((slots, height, width, 3), np.uint8, buf, offset)
        self._header[:] = (MAGIC, width, height, slots, -1)
        self._next = 0
        self.frames = 0

    def write(self, pixels: np.ndarray, seq: int, capture_monotonic_s: float) -> None:
        if pixels.shape != (self.height, self.width, 3):
            raise ValueError(f"frame of shape {pixels.shape}, this share holds {(self.height, self.width, 3)}")
        slot = self._next
        meta = self._meta[slot]
        meta[0] += 1  # odd: being written
        self._pixels[slot] = pixels  # the one copy on the daemon's side
        meta[1] = seq
        meta[2] = int(capture_monotonic_s * 1e9)
        meta[0] += 1  # even: whole
        self._header[4] = slot
        self._next = (slot + 1) % self.slots
        self.frames += 1

    def close(self) -> None:
        del self._header, self._meta, self._pixels  # no view may outlive the mapping
        self._map.close()
        self.path.unlink(missing_ok=True)


class FrameShareReader:
    """A camera's newest frame out of the daemon's shared memory (the client side)."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        size = p.stat().st_size
        self._map = _Mapped(p, size, create=False)
        buf = self._map._mm
        header: np.ndarray = np.ndarray((_HEADER_WORDS,), np.int64, buf, 0)
        if int(header[0]) != MAGIC:
            self._map.close()
            raise ValueError(f"{p} is not a so101d frame share")
        self.width, self.height, self.slots = int(header[1]), int(header[2]), int(header[3])
        self._header = header
        self._meta: np.ndarray = np.ndarray((self.slots, _META_WORDS), np.int64, buf, 8 * _HEADER_WORDS)
        self._pixels: np.ndarray = np.ndarray(
            (self.slots, self.height, self.width, 3), np.uint8, buf, _pixel_offset(self.slots)
        )

    def latest(self, tries: int = 8) -> SharedFrame | None:
        """The newest whole frame (a copy), or None before the first."""
        for _ in range(tries):
            slot = int(self._header[4])
            if slot < 0:
                return None
            meta = self._meta[slot]
            gen = int(meta[0])
            if gen % 2:
                continue
            pixels = self._pixels[slot].copy()
            seq, ns = int(meta[1]), int(meta[2])
            if int(meta[0]) == gen:
                return SharedFrame(pixels, seq, ns / 1e9)
        return None

    def close(self) -> None:
        del self._header, self._meta, self._pixels  # no view may outlive the mapping
        self._map.close()
