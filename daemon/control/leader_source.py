"""The leader arm as the loop's target source in ``teleop`` (the policy is the other one).

Each cycle the loop starts a leader read (``begin_read``) and reads the follower meanwhile: with
``overlap_io`` the leader's bus time runs on a worker thread (two serial ports, and pyserial
releases the GIL while it waits on the wire). ``finish_read`` waits for it at most until the
budget the loop gives (the middle of the period): a slow or dead leader never stalls the follower;
its previous reading ages instead, and ``target`` stops offering it once it is older than the
stale limit (the loop then holds).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import numpy as np

from daemon.control.arm_link import ArmLink
from daemon.control.bus_worker import BusWorker
from daemon.control.timing_stats import RollingStats
from daemon.system.logs import RateLimitedLogger
from drivers.arm_interface import ArmError, LeaderArm, PortGoneError

log = logging.getLogger("so101d.loop")
_rl = RateLimitedLogger(log, period_s=5.0, burst=3)
_MONO = time.monotonic
_LEADER_LOST_AFTER_S = 2.0  # read failures lasting this long hand the leader to the reconnect thread


class LeaderSource:
    """The leader's latest reading, read every cycle; a ``TargetSource`` for the loop."""

    def __init__(self, link: ArmLink[LeaderArm], read_stats: RollingStats, stale_s: float) -> None:
        self.link = link
        self.read_stats = read_stats
        self.stale_s = stale_s  # safety.leader_stale_s (updated on a reload)
        self.units: np.ndarray | None = None
        self.read_at_s = -math.inf
        self.errors = 0
        self._seen_at_s = -math.inf  # read_at_s of the reading last handed to the leader hooks
        self._fail_since: float | None = None
        self._worker: BusWorker | None = None

    # ------------------------------------------------------------------ lifecycle
    def start_worker(self, on_start: Callable[[], None] | None = None) -> None:
        """Overlap the leader's reads with the follower's (``control.overlap_io``)."""
        self._worker = BusWorker(self.link.name, on_start=on_start)

    @property
    def overlapped(self) -> bool:
        return self._worker is not None

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.stop()

    # ------------------------------------------------------------------ the cycle's read
    def begin_read(self) -> bool:
        """Start this cycle's read (on the worker, or here when not overlapped). True if a worker
        read was started and ``finish_read`` should wait for it."""
        if not self.link.connected:
            return False
        if self._worker is not None:
            return self._worker.run(self.read)
        self.read()
        return False

    def finish_read(self, budget_s: float) -> None:
        """Wait at most ``budget_s`` for the worker's read. A late read keeps running: its value
        arrives for a later cycle and meanwhile the last reading ages toward stale."""
        if self._worker is not None:
            self._worker.wait(budget_s)

    def read(self) -> None:
        """One leader read (worker thread or loop thread). Never raises."""
        link = self.link
        t0 = _MONO()
        try:
            units = link.arm.read_joints()
        except PortGoneError as exc:
            self.errors += 1
            link.lost(str(exc))
            return
        except ArmError as exc:
            self.errors += 1
            now = _MONO()
            if self._fail_since is None:
                self._fail_since = now
            _rl.warning("leader.read", "leader read failed: %s", exc)
            if now - self._fail_since > _LEADER_LOST_AFTER_S:
                link.lost(f"no valid reply for {now - self._fail_since:.1f} s: {exc}")
                self._fail_since = None
            return
        except Exception as exc:
            self.errors += 1
            log.exception("leader read raised an unexpected error")
            link.lost(f"{type(exc).__name__}: {exc}")
            return
        t1 = _MONO()
        self.read_stats.add(t1 - t0)
        self._fail_since = None
        self.units = units
        self.read_at_s = t1

    def take_fresh(self) -> np.ndarray | None:
        """The reading if it arrived since the last call (for the leader hooks), else None."""
        if self.read_at_s <= self._seen_at_s:
            return None
        self._seen_at_s = self.read_at_s
        return self.units

    # ------------------------------------------------------------------ TargetSource
    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        """The latest reading while it is younger than the stale limit, else None (hold)."""
        if self.units is None or now_monotonic_s - self.read_at_s > self.stale_s:
            return None
        return self.units
