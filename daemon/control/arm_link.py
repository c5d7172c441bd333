"""One arm and whether the control loop may use it: connection state and reconnect with backoff.

While ``connected`` is False the arm belongs to the (re)connect thread; the loop touches it only
when ``connected`` is True. ``lost()`` is called by whoever saw it fail.

While it waits out the backoff between two full attempts, the thread pings the servos that were
missing every ``probe_s`` (``FollowerArm.probe_missing``: a few bytes each, no handshake), so a
servo that answers again is picked up within a probe period instead of after the full backoff.
A port that is gone (the USB cable pulled) is looked for the same way: its path is checked every
``probe_s``, and the next attempt starts as soon as it is back.
What is missing, on which port, and when the next try is are kept for status (``waiting_text``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from daemon.control.faults import handshake_fault
from daemon.system.logs import RateLimitedLogger
from drivers.arm_interface import Arm, PortGoneError

log = logging.getLogger("so101d.loop")
_rl = RateLimitedLogger(log, period_s=5.0, burst=3)
_MONO = time.monotonic
PROBE_S = 0.2  # ping the missing servos this often while waiting for the next full attempt


@runtime_checkable
class Reconnectable(Protocol):
    """An arm that can come back after a loss without a full close + connect (our Feetech arms,
    the sim follower). One attempt per call with ``timeout_s=0``: the backoff lives in ArmLink."""

    def reconnect(self, timeout_s: float | None = None) -> None: ...


class ArmLink[ArmT: Arm]:
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
        self.port = arm.port
        self.missing: tuple[str, ...] = ()  # joints silent at the last attempt or probe (a Feetech arm)
        self.next_try_s: float | None = None  # monotonic time of the next full attempt; None: not waiting
        self.port_gone = False  # the last attempt found no device at ``port`` (unplugged)
        self.probe_s = PROBE_S
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
        self.missing = self._missing_now()
        self.next_try_s = self.since_s
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

    def _missing_now(self) -> tuple[str, ...]:
        return self.arm.missing_servos()

    def waiting_text(self, now_s: float) -> str:
        """Why the arm is not usable, for status and refused verbs: what is missing, on which
        port, when the next try is. "" while connected."""
        if self.connected:
            return ""
        what = f"{self.name} not connected on {self.port}"
        if self.missing:
            servos = ", ".join(self.missing)
            what += f": servo{'s' if len(self.missing) > 1 else ''} {servos} not answering"
        elif self.port_gone:
            what += ": the port is gone (unplugged?)"
        elif self.last_error:
            what += f": {self.last_error}"
        nxt = self.next_try_s
        if nxt is not None:
            wait = max(0.0, nxt - now_s)
            what += f"; next try in {wait:.1f} s" if wait > 0 else "; next try: in progress"
            if self.missing:
                what += (
                    f" (the missing servo{'s are' if len(self.missing) > 1 else ' is'} pinged every {self.probe_s:g} s)"
                )
            elif self.port_gone:
                what += f" (the port is looked for every {self.probe_s:g} s)"
        return what

    def _wait_backoff(self, delay_s: float) -> bool:
        """Wait until the next full attempt; with servos missing, ping them every ``probe_s`` and
        stop waiting as soon as all answer. True when stopping."""
        end = _MONO() + delay_s
        self.next_try_s = end
        while True:
            left = end - _MONO()
            if left <= 0:
                return False
            if self.port_gone:
                if self._stop.wait(min(self.probe_s, left)):
                    return True
                if os.path.exists(self.port):
                    log.info("%s: %s is back; trying now", self.name, self.port)
                    self.next_try_s = _MONO()
                    return False
                continue
            if not self.missing:
                return self._stop.wait(left)
            if self._stop.wait(min(self.probe_s, left)):
                return True
            try:
                self.missing = self.arm.probe_missing()
            except Exception as exc:  # the port itself is gone: wait out the backoff
                log.debug("%s: probing the missing servos failed: %s", self.name, exc)
                self.missing = ()
                continue
            if not self.missing:
                log.info("%s: the missing servos answer again; trying now", self.name)
                self.next_try_s = _MONO()
                return False

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
                self.missing = self._missing_now()
                # a serial device that is not there at all (a network endpoint is never "gone")
                self.port_gone = isinstance(exc, PortGoneError) and not os.path.exists(self.port)
                _rl.warning(
                    f"connect.{self.name}",
                    "%s: cannot connect (%s); next try in %.1f s",
                    self.name,
                    self.last_error,
                    delay,
                )
                if first:
                    self._close_quietly()
                if self._wait_backoff(delay):
                    return
                delay = min(self.backoff_max_s, delay * 2)
                continue
            self.connects += 1
            self.last_error = ""
            self.handshake_fault = ""
            self.missing = ()
            self.port_gone = False
            self.next_try_s = None
            self.since_s = _MONO()
            self.connected = True
            log.info("%s connected%s", self.name, "" if self.connects == 1 else " again")
            return
