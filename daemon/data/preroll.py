"""The pre-roll buffer: the last ``ring_s`` seconds of frames, kept while no episode records.

With ``[recording] ring_s`` set, the recorder feeds this buffer on the loop's thread every time a
frame is due on the fps grid and no episode is recording: the same per-cycle sample an episode's
row is made of (joint state, action, teleop action, who drove) and a *reference* to each camera's
newest Frame (a published Frame is never modified: drivers/cameras.py), so no pixel is copied and
a row costs a tuple. ``take`` hands the newest rows over to become the start of an episode
(``episode keep --last S``). LeRobot 0.6.1's highlight strategy keeps its frames in memory too
(lerobot/rollout/ring_buffer.py: bounded by seconds and by MiB, evicting the oldest frame past
either); here every row's size is known from the configuration, so the MiB bound is checked once,
at load, and the buffer never holds fewer seconds than ``ring_s`` says.

Memory: the buffer holds at most ``max_frames = ceil(ring_s * fps)`` rows, each referencing at most
one image per camera (and one depth map per depth stream), so what it keeps alive is at most
``max_frames x sum(W*H*3 + W*H*2 per depth)`` bytes: ``bound_bytes``, the figure the configuration
is checked against at load (``[recording] ring_max_mb``: daemon/config/ring_bound.py).

Grid: as an episode's (daemon/data/recorder.py), row i of a run is the state at the first cycle at
or after ``t0 + i / fps``; a stall past several grid points gives each its row (the same, late
state). A gap longer than the whole buffer starts a new run instead (its rows would all repeat one
stale state). The rows taken keep their grid times, so the episode they start continues on the same
grid: its live frame n is the grid point right after the last row taken, none lost, none twice.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from daemon.config.ring_bound import MIB, RING_S_MAX, StreamSize, preroll_bound_bytes, preroll_frames

__all__ = ["KeptRows", "Preroll", "PrerollError", "PrerollRow", "StreamSize", "preroll_bound_bytes", "preroll_frames"]


class PrerollError(ValueError):
    """A ``take`` that cannot be done now; the message says why (nothing was taken), ``field``
    names the argument at fault ("last_s") when it is one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class PrerollRow:
    """One grid point's sample, as the recorder would have queued it for an episode."""

    grid_index: int  # in its run: the grid point at run_t0 + grid_index / fps
    now_monotonic_s: float  # the loop's cycle time of the state
    state: np.ndarray  # float32, copied (the loop reuses its arrays)
    action: np.ndarray
    teleop: np.ndarray
    frames: tuple[Any, ...]  # per camera: its newest Frame (a reference) or None
    source: str  # who drove the arms (schema.SOURCE_KEY)


@dataclass
class KeptRows:
    """What ``take`` hands over: the buffer's rows (the whole deque, swapped out in O(1): the
    ``skip`` oldest are not kept) and where the kept ones sit on the grid."""

    rows: collections.deque[PrerollRow]
    skip: int  # the oldest rows of ``rows`` that were not asked for
    frames: int  # rows kept: len(rows) - skip
    grid_t0_s: float  # monotonic grid time of the first kept row (the episode's frame 0)
    fps: int

    @property
    def seconds(self) -> float:
        return self.frames / self.fps

    @property
    def next_grid_s(self) -> float:
        """The grid time of the episode's first live frame (frame ``frames``)."""
        return self.grid_t0_s + self.frames / self.fps

    def pop_kept(self) -> PrerollRow | None:
        """The next kept row, oldest first, released from the deque as it goes (its pixels are
        freed once the feeder has copied them); None when all are out."""
        while self.skip > 0 and self.rows:
            self.rows.popleft()
            self.skip -= 1
        return self.rows.popleft() if self.rows else None

    def remaining(self) -> int:
        return max(0, len(self.rows) - self.skip)


class Preroll:
    """The bounded buffer. Not thread-safe by itself: the recorder calls it under its lock (the
    loop's ``feed`` and the verb's ``take`` never interleave)."""

    def __init__(self, ring_s: float, fps: int, streams: Sequence[StreamSize] = ()) -> None:
        if not 0 <= ring_s <= RING_S_MAX:
            raise ValueError(f"ring_s must be 0 (off) or up to {RING_S_MAX:g} s, got {ring_s!r}")
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.ring_s = float(ring_s)
        self.fps = int(fps)
        self.max_frames = preroll_frames(ring_s, fps)
        self.bound_bytes = preroll_bound_bytes(ring_s, fps, streams)
        self._rows: collections.deque[PrerollRow] = collections.deque(maxlen=max(1, self.max_frames))
        self._recording = False
        self._run_t0: float | None = None  # the current run's grid origin (monotonic s)
        self._index = 0  # grid points of the run so far
        self._next_grid_s = 0.0
        self.runs = 0  # runs started (a new one after each episode and after a long gap)
        self.rows_fed = 0

    @property
    def enabled(self) -> bool:
        return self.max_frames > 0

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def buffered_s(self) -> float:
        return len(self._rows) / self.fps

    def due(self, now_monotonic_s: float) -> bool:
        """A row is due at this cycle (cheap: the loop asks before it reads any camera)."""
        return self.enabled and not self._recording and now_monotonic_s >= self._next_grid_s

    def feed(
        self,
        now_monotonic_s: float,
        state: np.ndarray,
        action: np.ndarray,
        teleop: np.ndarray,
        frames: tuple[Any, ...],
        source: str,
    ) -> int:
        """This cycle's sample for every grid point that has passed; returns the rows added."""
        if not self.due(now_monotonic_s):
            return 0
        if self._run_t0 is not None and (now_monotonic_s - self._next_grid_s) * self.fps >= self.max_frames:
            self._new_run()  # a gap longer than the buffer: its rows would all be one stale state
        if self._run_t0 is None:
            self._run_t0 = self._next_grid_s = now_monotonic_s
            self._index = 0
            self.runs += 1
        added = 0
        while self._next_grid_s <= now_monotonic_s:
            self._rows.append(PrerollRow(self._index, now_monotonic_s, state, action, teleop, frames, source))
            self._index += 1
            self._next_grid_s = self._run_t0 + self._index / self.fps
            added += 1
        self.rows_fed += added
        return added

    def refusal(self, last_s: float) -> PrerollError | None:
        """Why ``take(last_s)`` cannot be done now, or None when it can."""
        if not self.enabled:
            return PrerollError("no pre-roll buffer: [recording] ring_s is 0 (off); set it to keep the last seconds")
        if isinstance(last_s, bool) or not isinstance(last_s, (int, float)) or not math.isfinite(last_s):
            return PrerollError(f"last_s must be a number of seconds, got {last_s!r}", "last_s")
        if last_s <= 0:
            return PrerollError(f"last_s must be above 0 s, got {last_s:g}", "last_s")
        if last_s > self.ring_s:
            return PrerollError(
                f"last_s = {last_s:g} s is longer than the buffer: [recording] ring_s = {self.ring_s:g} s", "last_s"
            )
        if self._recording:
            return PrerollError(
                "an episode is recording: the buffer is kept only between episodes; save or discard it first"
            )
        if not self._rows:
            return PrerollError("nothing buffered yet (no frame since the recorder started or since the last episode)")
        return None

    def take(self, last_s: float) -> KeptRows:
        """The newest ceil(last_s * fps) rows (all there are, when fewer), oldest first; the buffer
        is empty after it and is not fed again until ``episode_ended``. PrerollError, nothing
        taken: the buffer is off, ``last_s`` is not in (0, ring_s], nothing is buffered, or an
        episode is recording."""
        refused = self.refusal(last_s)
        if refused is not None:
            raise refused
        assert self._run_t0 is not None  # rows come with a run
        want = preroll_frames(last_s, self.fps)
        rows = self._rows
        n = min(want, len(rows))
        first = rows[len(rows) - n]
        kept = KeptRows(rows, len(rows) - n, n, self._run_t0 + first.grid_index / self.fps, self.fps)
        self._rows = collections.deque(maxlen=rows.maxlen)
        self._recording = True
        self._run_t0 = None
        return kept

    def episode_started(self) -> None:
        """An episode records (started, or kept): the buffer empties and is not fed meanwhile."""
        self._rows.clear()
        self._recording = True
        self._run_t0 = None

    def episode_ended(self) -> None:
        """No episode records any more: the buffer fills again, a new run on a new grid."""
        self._recording = False
        self._new_run()

    def _new_run(self) -> None:
        self._rows.clear()
        self._run_t0 = None
        self._next_grid_s = 0.0

    def status(self) -> dict[str, Any]:
        return {
            "ring_s": self.ring_s,
            "max_frames": self.max_frames,
            "frames": len(self._rows),
            "buffered_s": round(self.buffered_s, 3),
            "bound_mb": round(self.bound_bytes / MIB, 3),
            "paused": self._recording,  # an episode records: nothing buffered meanwhile
            "fed": self.rows_fed,  # rows buffered since the recorder opened (a count to wait on)
        }
