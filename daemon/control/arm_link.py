"""One arm and whether the control loop may use it: connection state and reconnect with backoff.

While ``connected`` is False the arm belongs to the (re)connect thread; the loop touches it only
when ``connected`` is True. ``lost()`` is called by whoever saw it fail.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from daemon.control.faults import handshake_fault
from daemon.system.logs import RateLimitedLogger
from drivers.arm_interface import LeaderArm

log = logging.getLogger("so101d.loop")
_rl = RateLimitedLogger(log, period_s=5.0, burst=3)
_MONO = time.monotonic


@runtime_checkable
class Reconnectable(Protocol):
    """An arm that can come back after a loss without a full close + connect (our Feetech arms,
    the sim follower). One attempt per call with ``timeout_s=0``: the backoff lives in ArmLink."""

    def reconnect(self, timeout_s: float | None = None) -> None: ...


class ArmLink[ArmT: LeaderArm]:  # a FollowerArm offers connect/read_joints/close too
    """One arm (leader or follower) and its connection state, reconnected by its own thread."""

    def __init__(
        self,
        name: str,
        arm: ArmT,
        backoff_min_s: float,
        backoff_max_s: float,
        on_connect: Callable[[ArmT], None] | None = None,
    ) -> None:
        self.name = name
        self.arm = arm
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self.on_connect = on_connect
        self.connected = False
        self.connects = 0  # successful connects (first one included)
        self.losses = 0
        self.last_error = ""
        self.handshake_fault = ""  # set while (re)connecting fails because servos are missing or wrong
        self.since_s = _MONO()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._spawn(first=True)

    def lost(self, reason: str) -> None:
        if not self.connected:
            return
        self.connected = False
        self.losses += 1
        self.last_error = reason
        self.since_s = _MONO()
        _rl.error(f"lost.{self.name}", "%s lost: %s; retrying with backoff", self.name, reason)
        self._spawn(first=False)

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)

    def _spawn(self, first: bool) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._connect_loop, args=(first,), name=f"so101d-connect-{self.name}", daemon=True
            )
            self._thread.start()

    def _close_quietly(self) -> None:
        try:
            self.arm.close()
        except Exception as exc:  # a half-open port may fail to close; the next connect reopens it
            log.debug("%s: close before reconnect failed: %s", self.name, exc)

    def _attempt(self, first: bool) -> None:
        """First start: connect(); after a loss: one reconnect() attempt when the arm has one,
        else close + connect."""
        arm = self.arm
        if not first and isinstance(arm, Reconnectable):
            arm.reconnect(timeout_s=0.0)  # one attempt per try: the backoff lives here, not in the driver
        else:
            if not first:
                self._close_quietly()
            arm.connect()
        if self.on_connect is not None:
            self.on_connect(arm)

    def _connect_loop(self, first: bool) -> None:
        delay = self.backoff_min_s
        while not self._stop.is_set():
            try:
                self._attempt(first)
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.handshake_fault = handshake_fault(exc) or self.handshake_fault
                _rl.warning(
                    f"connect.{self.name}",
                    "%s: cannot connect (%s); next try in %.1f s",
                    self.name,
                    self.last_error,
                    delay,
                )
                if first:
                    self._close_quietly()
                if self._stop.wait(delay):
                    return
                delay = min(self.backoff_max_s, delay * 2)
                continue
            self.connects += 1
            self.last_error = ""
            self.handshake_fault = ""
            self.since_s = _MONO()
            self.connected = True
            log.info("%s connected%s", self.name, "" if self.connects == 1 else " again")
            return
