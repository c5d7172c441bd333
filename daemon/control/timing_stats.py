"""Rolling timing statistics for the control loop: cheap to add to, percentiles on demand.

Each ``RollingStats`` keeps the last ``capacity`` samples in a preallocated float64 ring (no
allocation per sample: the loop adds five or six samples per cycle at 100 Hz), plus an all-time
count and maximum. Percentiles are computed only when someone asks (``status``), on a copy, from
another thread; a sample being written during that copy can at worst be the previous value, which
is fine for a display and never blocks the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    """p50/p99/max over the window (and all-time max and count), in the unit of the samples."""

    count: int
    window: int
    p50: float
    p99: float
    max: float
    max_all_time: float
    mean: float

    def as_dict(self, scale: float = 1.0, digits: int = 4) -> dict[str, float | int]:
        return {
            "count": self.count,
            "window": self.window,
            "p50": round(self.p50 * scale, digits),
            "p99": round(self.p99 * scale, digits),
            "max": round(self.max * scale, digits),
            "max_all_time": round(self.max_all_time * scale, digits),
            "mean": round(self.mean * scale, digits),
        }


class RollingStats:
    """Fixed-size ring of the most recent samples (seconds, usually)."""

    __slots__ = ("_buf", "_capacity", "_index", "count", "max_all_time")

    def __init__(self, capacity: int = 2048) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be > 0")
        self._buf = np.zeros(capacity, dtype=np.float64)
        self._capacity = capacity
        self._index = 0
        self.count = 0
        self.max_all_time = 0.0

    def add(self, value: float) -> None:
        self._buf[self._index] = value
        self._index = (self._index + 1) % self._capacity
        self.count += 1
        if value > self.max_all_time:
            self.max_all_time = value

    def reset(self) -> None:
        self._index = 0
        self.count = 0
        self.max_all_time = 0.0

    def values(self) -> np.ndarray:
        """A copy of the samples in the window (oldest first order is not guaranteed)."""
        n = min(self.count, self._capacity)
        return self._buf[:n].copy() if n < self._capacity else self._buf.copy()

    def summary(self) -> Summary:
        v = self.values()
        if v.size == 0:
            return Summary(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
        p50, p99 = np.percentile(v, [50.0, 99.0])
        return Summary(
            self.count, int(v.size), float(p50), float(p99), float(v.max()), self.max_all_time, float(v.mean())
        )


# Stage names of one control cycle, in order (status and the benchmark print these).
STAGES: tuple[str, ...] = (
    "leader_read",
    "follower_read",
    "update",
    "follower_write",
    "hooks",
    "cycle",
    "period",
    "jitter",
)


class LoopStats:
    """All rolling statistics of the control loop, one ``RollingStats`` per stage.

    ``cycle`` is the work of one cycle (start to end, before sleeping); ``period`` the time between
    two cycle starts; ``jitter`` the absolute lateness of a cycle start against its deadline.
    """

    def __init__(self, capacity: int = 2048) -> None:
        self.stages: dict[str, RollingStats] = {name: RollingStats(capacity) for name in STAGES}
        # direct attributes for the hot path (one dict lookup less per sample)
        self.leader_read = self.stages["leader_read"]
        self.follower_read = self.stages["follower_read"]
        self.update = self.stages["update"]
        self.follower_write = self.stages["follower_write"]
        self.hooks = self.stages["hooks"]
        self.cycle = self.stages["cycle"]
        self.period = self.stages["period"]
        self.jitter = self.stages["jitter"]

    def summaries_ms(self) -> dict[str, dict[str, float | int]]:
        return {name: s.summary().as_dict(scale=1000.0) for name, s in self.stages.items()}

    def reset(self) -> None:
        for s in self.stages.values():
            s.reset()


CALL_BUDGET_S = 0.001  # no single call the loop makes into a source or a hook may take longer


class WorstCalls:
    """The longest single call the loop made into each target source and hook, by name
    ("source.leader", "hook.Recorder"), and how many calls went over ``CALL_BUDGET_S``.

    Written by the loop thread only (a dict lookup and a compare per call); read by status and
    the benchmarks from any thread (a copy)."""

    def __init__(self) -> None:
        self.worst_s: dict[str, float] = {}
        self.over_budget: dict[str, int] = {}

    def note(self, name: str, took_s: float) -> None:
        if took_s > self.worst_s.get(name, 0.0):
            self.worst_s[name] = took_s
        if took_s > CALL_BUDGET_S:
            self.over_budget[name] = self.over_budget.get(name, 0) + 1

    def as_ms(self) -> dict[str, float]:
        return {name: round(s * 1000.0, 4) for name, s in sorted(self.worst_s.copy().items())}

    def reset(self) -> None:
        self.worst_s = {}
        self.over_budget = {}
