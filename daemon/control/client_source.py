"""A target source fed from outside the daemon: a client on the control socket (LeRobot's tools
through the so101d plugin) sends joint targets, the loop follows the newest one.

The client's thread calls ``offer``; the loop thread calls ``target`` every cycle. The newest
offer is one tuple swapped in by reference, so neither side locks or waits. A client that stops
sending is noticed by ``target`` itself: an offer older than ``stale_s`` is no target, and the
safety layer holds the measured pose (as for a stale leader).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from calibration.conventions import NUM_JOINTS


class ClientSource:
    """The newest joint target a client offered (LeRobot units), fresh for ``stale_s``."""

    def __init__(self, stale_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.stale_s = stale_s
        self._monotonic = monotonic
        # (target, offered at) swapped as one reference: the loop never sees half an offer
        self._offer: tuple[np.ndarray | None, float] = (None, -math.inf)
        self.offers = 0

    def offer(self, target_units: np.ndarray) -> float:
        """Take a new target (six finite joint values); returns when it was taken (monotonic s)."""
        arr = np.array(target_units, dtype=np.float64)
        if arr.shape != (NUM_JOINTS,) or not np.all(np.isfinite(arr)):
            raise ValueError(f"a target is {NUM_JOINTS} finite joint values, got {arr!r}")
        now = self._monotonic()
        self._offer = (arr, now)
        self.offers += 1
        return now

    def clear(self) -> None:
        """Forget the last offer: the arm holds until a new one comes."""
        self._offer = (None, -math.inf)

    @property
    def last_offer_s(self) -> float:
        return self._offer[1]

    def last(self) -> np.ndarray | None:
        """The newest offer, fresh or not (what the recorder shows as the raw target)."""
        return self._offer[0]

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        target, at_s = self._offer
        if target is None or now_monotonic_s - at_s > self.stale_s:
            return None
        return target
