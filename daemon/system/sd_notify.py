"""systemd notification protocol (sd_notify) and a watchdog gate driven by the control loop.

Why our own few lines instead of a dependency: the protocol is one datagram of ``KEY=VALUE``
lines to the AF_UNIX socket named by ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract
namespace). Outside systemd the variable is unset and every call is a cheap no-op, so the daemon
code calls the notifier unconditionally.

Sending never raises: the daemon must not die because systemd's socket went away (e.g. during a
``systemctl daemon-reexec``); failures are logged, rate-limited.

The watchdog is only meaningful if it proves the *control loop* is alive. ``WatchdogGate`` is
marked by the loop each cycle and pets systemd only while the loop keeps making progress: a thread
that pets regardless of the loop would hide exactly the hang the watchdog is there to catch.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from daemon.system.logs import RateLimitedLogger

log = logging.getLogger("so101d.sd_notify")
_rl = RateLimitedLogger(log, period_s=30.0, burst=2)


def _parse_socket_address(value: str) -> str | None:
    """``$NOTIFY_SOCKET`` -> address for ``sendto``; None when the value is unusable."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]  # abstract namespace: leading NUL byte, no filesystem entry
    # systemd >= 254 also accepts vsock:CID:PORT (VMs); not needed on a workstation.
    return None


def _watchdog_usec_from_env(env: Mapping[str, str]) -> int | None:
    """Watchdog period (µs) meant for *this* process, as sd_watchdog_enabled() decides it."""
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    try:
        usec = int(raw)
    except ValueError:
        log.warning("ignoring malformed WATCHDOG_USEC=%r", raw)
        return None
    if usec <= 0:
        return None
    pid_raw = env.get("WATCHDOG_PID")
    if pid_raw:
        try:
            if int(pid_raw) != os.getpid():
                return None  # the watchdog belongs to another process (e.g. our parent)
        except ValueError:
            log.warning("ignoring malformed WATCHDOG_PID=%r", pid_raw)
            return None
    return usec


class Notifier:
    """Sends sd_notify messages; a no-op when ``address`` is None.

    Thread-safe: one datagram per call, sent under a lock so messages never interleave.
    """

    def __init__(self, address: str | None = None, watchdog_usec: int | None = None) -> None:
        self._address = address
        self._watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.sent_count = 0
        self.failed_count = 0
        self.dropped_count = 0  # of failed_count: receiver queue full

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, unset_environment: bool = False) -> Notifier:
        """Build from ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``.

        ``unset_environment`` removes the variables from ``os.environ`` (as sd_notify(3)'s
        unset_environment does) so child processes — the dataset writer, ffmpeg — do not
        notify systemd in our name.
        """
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        address = _parse_socket_address(raw) if raw else None
        if raw and address is None:
            log.warning("NOTIFY_SOCKET=%r is not a path or @abstract name; not notifying systemd", raw)
        notifier = cls(address, _watchdog_usec_from_env(env) if address else None)
        if unset_environment and environ is None:
            for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
                os.environ.pop(key, None)
        return notifier

    @classmethod
    def disabled(cls) -> Notifier:
        return cls(None, None)

    # -- properties -----------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def watchdog_period_s(self) -> float | None:
        """systemd's WatchdogSec for this process, or None when no watchdog is armed."""
        return self._watchdog_usec / 1e6 if self._watchdog_usec else None

    # -- protocol -------------------------------------------------------------------------
    def notify(self, *lines: str, wait_s: float = 1.0) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram. True if sent (False when disabled/failed).

        ``wait_s``: how long to wait when the receiver's queue is full (an AF_UNIX datagram
        socket blocks the sender then; the queue holds only ~10 datagrams). The watchdog pet
        is sent from the control loop with ``wait_s=0``: a lost ping is better than a loop
        blocked on a busy systemd.
        """
        if self._address is None:
            return False
        for line in lines:
            if "\n" in line:
                raise ValueError(f"sd_notify line must not contain a newline: {line!r}")
        payload = "\n".join(lines).encode("utf-8")
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                if wait_s > 0:
                    self._sock.settimeout(wait_s)
                    self._sock.sendto(payload, self._address)
                else:
                    self._sock.sendto(payload, socket.MSG_DONTWAIT, self._address)
            except (BlockingIOError, TimeoutError):
                self.failed_count += 1
                self.dropped_count += 1
                _rl.warning(
                    "full", "sd_notify queue full (systemd not reading?); dropped %s", lines[0] if lines else ""
                )
                return False
            except OSError as exc:
                self.failed_count += 1
                _rl.warning("send", "sd_notify to %r failed: %s", self._address.replace("\0", "@"), exc)
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None  # reconnect next time (the socket may come back)
                return False
            self.sent_count += 1
            return True

    def ready(self, status: str | None = None) -> bool:
        """READY=1: the service is up (for so101d: arms connected). Also sends MAINPID."""
        lines = ["READY=1", f"MAINPID={os.getpid()}"]
        if status is not None:
            lines.append(f"STATUS={_one_line(status)}")
        return self.notify(*lines)

    def status(self, text: str, wait_s: float = 0.2) -> bool:
        """STATUS=...: free text shown by ``systemctl status``; single line."""
        return self.notify(f"STATUS={_one_line(text)}", wait_s=wait_s)

    def watchdog(self) -> bool:
        """WATCHDOG=1, never blocking. Call through ``WatchdogGate`` so a stalled loop stops petting."""
        return self.notify("WATCHDOG=1", wait_s=0.0)

    def watchdog_trigger(self) -> bool:
        """WATCHDOG=trigger: ask systemd to treat us as hung now (Restart= applies)."""
        return self.notify("WATCHDOG=trigger")

    def stopping(self, status: str | None = None) -> bool:
        lines = ["STOPPING=1"]
        if status is not None:
            lines.append(f"STATUS={_one_line(status)}")
        return self.notify(*lines)

    def reloading(self, status: str | None = None) -> bool:
        """RELOADING=1 with MONOTONIC_USEC (required by Type=notify-reload, harmless before).

        Send ``ready()`` again when the reload is done.
        """
        lines = ["RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"]
        if status is not None:
            lines.append(f"STATUS={_one_line(status)}")
        return self.notify(*lines)

    def extend_timeout(self, seconds: float) -> bool:
        """EXTEND_TIMEOUT_USEC: ask for more time during a slow start or stop (e.g. saving)."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={max(1, int(seconds * 1e6))}")

    def errno(self, code: int) -> bool:
        return self.notify(f"ERRNO={int(code)}")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class WatchdogGate:
    """Pets systemd's watchdog only while the control loop makes progress.

    The loop calls ``progress()`` once per completed cycle (cheap: a clock read and a compare;
    a datagram at most every ``period/2``). ``healthy=False`` withholds the pet for that cycle,
    for a loop that spins but is wedged in a state a restart would fix.

    ``pet_if_alive()`` is for callers outside the loop (a loop that waits a long time on
    purpose, e.g. during a blocking reconnect, should instead call ``progress()`` from its
    wait): it pets only if the loop progressed within ``stall_after_s``.
    """

    def __init__(
        self,
        notifier: Notifier,
        stall_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifier = notifier
        period = notifier.watchdog_period_s
        self.enabled = period is not None
        # Pet twice per period, as sd_watchdog_enabled(3) recommends.
        self.pet_interval_s = period / 2 if period else float("inf")
        # The loop counts as stalled when it has not progressed for this long; must be below
        # the period, or systemd fires before we notice.
        self.stall_after_s = stall_after_s if stall_after_s is not None else (period / 2 if period else float("inf"))
        self._clock = clock
        self._last_progress_s: float | None = None
        self._last_pet_s: float = float("-inf")
        self._lock = threading.Lock()
        self.pets = 0
        self.withheld = 0

    @property
    def last_progress_s(self) -> float | None:
        return self._last_progress_s

    def progress(self, now_s: float | None = None, healthy: bool = True) -> bool:
        """Mark one loop cycle done; pet if due. Returns True when a WATCHDOG=1 was sent."""
        if not self.enabled:
            return False
        now = self._clock() if now_s is None else now_s
        if not healthy:
            self.withheld += 1
            return False
        self._last_progress_s = now
        if now - self._last_pet_s < self.pet_interval_s:
            return False
        return self._pet(now)

    def pet_if_alive(self, now_s: float | None = None) -> bool:
        """Pet only if the loop progressed within ``stall_after_s``; for non-loop callers."""
        if not self.enabled:
            return False
        now = self._clock() if now_s is None else now_s
        last = self._last_progress_s
        if last is None or now - last > self.stall_after_s:
            self.withheld += 1
            return False
        if now - self._last_pet_s < self.pet_interval_s:
            return False
        return self._pet(now)

    def stalled_for_s(self, now_s: float | None = None) -> float:
        now = self._clock() if now_s is None else now_s
        return 0.0 if self._last_progress_s is None else max(0.0, now - self._last_progress_s)

    def _pet(self, now: float) -> bool:
        with self._lock:
            if now - self._last_pet_s < self.pet_interval_s:
                return False
            self._last_pet_s = now
        ok = self.notifier.watchdog()
        if ok:
            self.pets += 1
        return ok


@dataclass
class ServiceStatus:
    """What ``systemctl status so101d`` shows on its Status: line."""

    mode: str  # e.g. "teleop", "hold", "policy", "starting", "waiting for follower"
    loop_hz: float | None = None
    episodes: int | None = None
    recording: bool = False
    detail: str = ""

    def line(self) -> str:
        parts = [self.mode]
        if self.loop_hz is not None:
            parts.append(f"loop {self.loop_hz:.1f} Hz")
        if self.episodes is not None:
            parts.append(f"{self.episodes} episode{'s' if self.episodes != 1 else ''}")
        if self.recording:
            parts.append("recording")
        if self.detail:
            parts.append(self.detail)
        return _one_line(", ".join(parts))


class StatusReporter:
    """Sends STATUS= when the text changes, at most every ``min_interval_s`` (loop rate jitters)."""

    def __init__(
        self, notifier: Notifier, min_interval_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.notifier = notifier
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._last_text: str | None = None
        self._last_sent_s = float("-inf")

    def update(self, status: ServiceStatus | str, force: bool = False, now_s: float | None = None) -> bool:
        if not self.notifier.enabled:
            return False
        text = status.line() if isinstance(status, ServiceStatus) else _one_line(status)
        now = self._clock() if now_s is None else now_s
        if not force and (text == self._last_text or now - self._last_sent_s < self.min_interval_s):
            return False
        sent = self.notifier.status(text)
        if sent:  # a dropped status is retried on the next update
            self._last_text, self._last_sent_s = text, now
        return sent
