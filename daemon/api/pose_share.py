"""The arms' poses at the newest control cycle, shared through memory with clients on this machine.

``arm.observe`` over the socket costs a round trip and the daemon's selector thread (which shares
the interpreter lock with the control loop); the LeRobot plugin's ``get_observation`` reads the
same numbers here instead: the loop writes them at the end of every cycle (a cycle hook), a
client maps the file and copies the newest record. Nothing is computed on the client's side: it
is ``arm.observe``'s ``follower`` and ``leader``, as the loop measured them, for every arm (a
bimanual pair's left and right, each with its own leader).

Layout (native little-endian, one file): an int64 header ``[magic, arms, generation, cycle]``,
then float64 words ``[written_at_s, period_s]`` and per arm ``[connected, measured_at_s,
pose x 6, leader_read_at_s, leader x 6]`` (the arm's own leader, the one its teleop follows; times
on CLOCK_MONOTONIC, the same clock in every process; NaN where there is no reading). ``generation`` is odd while the loop writes and even
once the record is whole: a reader keeps its copy only if the generation was the same even number
before and after (a seqlock, as drivers/frame_shm.py).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibration.conventions import NUM_JOINTS

MAGIC = 0x53313031_504F5332  # "S101POS2": a leader per arm
_HEADER_WORDS = 4
_TOP_WORDS = 2
_ARM_WORDS = 3 + 2 * NUM_JOINTS
_LEADER_AT = 2 + NUM_JOINTS  # within an arm's words: leader_read_at_s, then the leader's pose
_GEN = struct.Struct("<q")  # the header's generation (offset 16)
_GEN_CYCLE = struct.Struct("<qq")  # generation, cycle (or magic, arms at offset 0)
_MAX_ARMS = 64


def _size(arms: int) -> int:
    return 8 * (_HEADER_WORDS + _TOP_WORDS + _ARM_WORDS * arms)


@dataclass(frozen=True)
class SharedPoses:
    """One whole record (the reader's own copy: plain floats); the fields are read on demand, a
    client reading one arm every step pays for that arm only."""

    cycle: int
    words: tuple[float, ...]

    @property
    def written_at_s(self) -> float:
        return self.words[0]  # monotonic

    @property
    def period_s(self) -> float:
        return self.words[1]  # the loop's nominal period

    @property
    def arms(self) -> int:
        return (len(self.words) - _TOP_WORDS) // _ARM_WORDS

    def arm(self, index: int) -> tuple[float, ...] | None:
        """Arm ``index``'s measured pose (None: not connected, or not read yet)."""
        b = _TOP_WORDS + _ARM_WORDS * index
        return self.words[b + 2 : b + _LEADER_AT] if self.words[b] == 1.0 else None

    def measured_at_s(self, index: int) -> float:
        return self.words[_TOP_WORDS + _ARM_WORDS * index + 1]

    def leader(self, index: int) -> tuple[float, ...] | None:
        """Arm ``index``'s leader reading, LeRobot units, JOINT_NAMES order; None: no reading
        (or the arm has no leader)."""
        b = _TOP_WORDS + _ARM_WORDS * index + _LEADER_AT
        pose = self.words[b + 1 : b + 1 + NUM_JOINTS]
        return None if any(math.isnan(v) for v in pose) else pose

    def leader_read_at_s(self, index: int) -> float:
        return self.words[_TOP_WORDS + _ARM_WORDS * index + _LEADER_AT]


def _open(path: Path, size: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o660)
    try:
        if create:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ArmPoses:
    """One arm's entry of a record, as the writer is given it."""

    measured: np.ndarray | None  # None: not connected, or not read yet
    measured_at_s: float
    leader: np.ndarray | None  # the arm's own leader's newest reading (None: none)
    leader_read_at_s: float


class PoseShareWriter:
    """The daemon's side: ``write`` once per cycle, on the loop thread (microseconds)."""

    def __init__(self, path: Path, arms: int, period_s: float) -> None:
        self.path = path
        self.arms = arms
        self._mm = _open(path, _size(arms), create=True)
        self._header: np.ndarray = np.ndarray((_HEADER_WORDS,), np.int64, self._mm, 0)
        self._words: np.ndarray = np.ndarray((_TOP_WORDS + _ARM_WORDS * arms,), np.float64, self._mm, 8 * _HEADER_WORDS)
        self._words[:] = math.nan
        self._words[1] = period_s
        self._header[:] = (MAGIC, arms, 0, -1)

    def write(
        self,
        cycle: int,
        now_s: float,
        arms: list[ArmPoses],
    ) -> None:
        """``arms``: per arm, in the share's arm order."""
        w, h = self._words, self._header
        h[2] += 1  # odd: being written
        w[0] = now_s
        for i, arm in enumerate(arms[: self.arms]):
            base = _TOP_WORDS + _ARM_WORDS * i
            lead = base + _LEADER_AT
            w[base] = 0.0 if arm.measured is None else 1.0
            w[base + 1] = arm.measured_at_s
            w[base + 2 : lead] = math.nan if arm.measured is None else arm.measured
            w[lead] = arm.leader_read_at_s
            w[lead + 1 : base + _ARM_WORDS] = math.nan if arm.leader is None else arm.leader
        h[3] = cycle
        h[2] += 1  # even: whole

    def close(self) -> None:
        del self._header, self._words  # no view may outlive the mapping
        self._mm.close()
        self.path.unlink(missing_ok=True)


class PoseShareReader:
    """A client's side: the newest whole record."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        fd = os.open(p, os.O_RDONLY)
        try:
            self._mm = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        magic, arms = _GEN_CYCLE.unpack_from(self._mm, 0) if len(self._mm) >= _size(0) else (0, 0)
        if magic != MAGIC or not 0 <= arms <= _MAX_ARMS or len(self._mm) != _size(arms):
            self._mm.close()
            raise ValueError(f"{p} is not a so101d pose share")
        self.arms = arms
        self._unpack = struct.Struct(f"<{_TOP_WORDS + _ARM_WORDS * self.arms}d")

    def read(self, tries: int = 8) -> SharedPoses | None:
        """The newest whole record, or None before the first (or when every try met a write).
        struct, not numpy views: a client calls this every step, and a few C calls cost it least."""
        mm, words = self._mm, self._unpack
        for _ in range(tries):
            (gen,) = _GEN.unpack_from(mm, 16)
            if gen == 0:
                return None
            if gen % 2:
                continue
            w = words.unpack_from(mm, 8 * _HEADER_WORDS)
            gen_after, cycle = _GEN_CYCLE.unpack_from(mm, 16)
            if gen_after != gen:
                continue
            return SharedPoses(cycle, w)
        return None

    def close(self) -> None:
        self._mm.close()
