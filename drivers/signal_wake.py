"""Signals turned into requests a main loop picks up, with no lock taken in the handler.

A Python signal handler runs in the main thread between two bytecodes, which may be *inside*
``threading.Event.wait()`` while that thread holds the Event's internal lock. A handler that then
calls ``Event.set()`` (or anything else that takes the same lock) waits for itself forever. That
is how a daemon whose terminal was closed once hung with its stop requested and never stopped.

``SignalWake`` is the self-pipe pattern: the handler only appends the signal number to a deque
(atomic under the GIL) and writes one byte to a non-blocking pipe; the main loop waits on the pipe
with ``select`` and acts on the signals outside handler context. Other threads may ``wake()`` it
the same way.
"""

from __future__ import annotations

import collections
import os
import select
import signal
from collections.abc import Iterable
from types import FrameType
from typing import Any


class SignalWake:
    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._signals: collections.deque[int] = collections.deque()
        self._old: dict[int, Any] = {}

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        """The signal handler: lock-free (a deque append and a non-blocking pipe write)."""
        self._signals.append(signum)
        self.wake()

    def install(self, signals: Iterable[signal.Signals]) -> None:
        """Route these signals here (main thread only); ``restore()`` puts the old handlers back."""
        for sig in signals:
            self._old[sig] = signal.signal(sig, self.handler)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def wake(self) -> None:
        """Wake ``wait()`` without a signal (any thread)."""
        try:
            os.write(self._w, b"!")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is already pending) or closed

    def wait(self, timeout_s: float) -> list[int]:
        """Wait up to ``timeout_s`` for a signal or a wake-up; returns the signals received."""
        try:
            ready, _, _ = select.select((self._r,), (), (), timeout_s)
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            ready = [self._r]
        if ready:
            try:
                while os.read(self._r, 512):
                    pass
            except (BlockingIOError, OSError):
                pass
        got: list[int] = []
        while self._signals:
            got.append(self._signals.popleft())
        return got

    def close(self) -> None:
        self.restore()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
