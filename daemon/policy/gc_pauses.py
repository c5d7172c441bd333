"""Python's garbage collector as a latency source: measure its pauses, keep the big one away.

A collection holds the GIL: every thread of the process stops (the control loop, the policy
publisher and receiver). Young generations are cheap; a full (generation 2) collection walks every
tracked object, and a daemon that has imported torch and LeRobot holds hundreds of thousands
(bench/bench_policy.py prints the count and what one full collection costs here). It fires
rarely (when the survivors since the last one reach a quarter of the long-lived objects) and
then stops the loop for a whole pass.

``freeze()`` moves what is alive now (imported modules, the loaded policy) into the collector's
permanent generation, so later full collections walk only what came after; it is O(1) and frees
nothing (it does not collect first: that would be the very pause we avoid).

``GcPauses`` counts the pauses through ``gc.callbacks`` (a few microseconds per collection), so
status and the benchmark can show whether GC is where a tail came from.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass


@dataclass
class GcTally:
    collections: int = 0
    pause_s: float = 0.0
    max_pause_s: float = 0.0
    full_collections: int = 0  # generation 2


class GcPauses:
    """Accumulates collection pauses of this process from ``install()`` on; ``take()`` resets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tally = GcTally()
        self._total = GcTally()
        self._started_s = 0.0
        self._installed = False

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started_s = time.perf_counter()
            return
        pause = time.perf_counter() - self._started_s
        full = info.get("generation") == 2
        with self._lock:
            for t in (self._tally, self._total):
                t.collections += 1
                t.pause_s += pause
                t.max_pause_s = max(t.max_pause_s, pause)
                t.full_collections += full

    def install(self) -> GcPauses:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
        return self

    def uninstall(self) -> None:
        if self._installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self._installed = False

    def take(self) -> GcTally:
        """Pauses since the last take (and start a new tally)."""
        with self._lock:
            t, self._tally = self._tally, GcTally()
        return t

    def total(self) -> GcTally:
        with self._lock:
            return GcTally(**self._total.__dict__)


def freeze() -> int:
    """Move every object alive now out of the collector's reach; returns how many are frozen."""
    gc.freeze()
    return gc.get_freeze_count()
