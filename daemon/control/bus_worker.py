"""One serial bus's own thread: a second (third, fourth) arm's reads and writes run there while the
loop thread does the first arm's, so a bimanual cycle over four independent ports costs about what
a single-arm cycle costs (pyserial releases the GIL while it waits on the wire).

The loop hands it one call at a time (``run``) and waits for it (``wait``) before it uses what the
call produced or hands it the next: one bus is never used by two threads at once, and the arm's
attributes the call writes are read only after ``wait`` returned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("so101d.loop")


class BusWorker:
    """Runs the calls it is handed on its own thread, one at a time (see the module docstring)."""

    def __init__(self, name: str, on_start: Callable[[], None] | None = None) -> None:
        self._on_start = on_start
        self._call: Callable[[], None] | None = None
        self._go = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._stop = False
        self.errors = 0  # calls that raised (the arm's own methods never do: a bug, logged)
        self._thread = threading.Thread(target=self._run, name=f"so101d-bus-{name}", daemon=True)
        self._thread.start()

    def run(self, call: Callable[[], None]) -> bool:
        """Start ``call`` on the worker; False (nothing started) while the previous call still
        runs: a stuck bus is skipped, never queued behind."""
        if not self._done.is_set():
            return False
        self._call = call
        self._done.clear()
        self._go.set()
        return True

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the call in flight; True once it is done (at once when none is)."""
        return self._done.wait(timeout_s)

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        while True:
            self._go.wait()
            self._go.clear()
            if self._stop:
                return
            call, self._call = self._call, None
            try:
                if call is not None:
                    call()
            except Exception:
                self.errors += 1
                log.exception("bus worker call raised")
            finally:
                self._done.set()

    def stop(self) -> bool:
        """End the thread; False when a call is still in flight after the wait (the bus is not
        free: whoever stopped it must not make calls on that bus)."""
        self._done.wait(2.0)
        self._stop = True
        self._go.set()
        self._thread.join(timeout=2.0)
        return not self._thread.is_alive()
