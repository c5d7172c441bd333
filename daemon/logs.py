"""Logging: plain lines with level and component; no timestamps of our own under systemd.

journald stamps every line itself, so when stdout is the journal (JOURNAL_STREAM is set) we print
``LEVEL component: message``; at an interactive terminal we add a monotonic-ish wall time.
``RateLimitedLogger`` keeps a flapping bus from flooding the log.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time


class CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not when it was set up.

    ``main()`` can run inside a process that swaps stderr (pytest's capture, a test calling the
    CLI in-process): a stream bound at setup would be closed by then and every later log call
    would print "--- Logging error ---" instead of the message.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201 - the live sys.stderr
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__/setStream assign it: ignored
        pass


def setup_logging(level: str = "INFO") -> None:
    """One stderr handler on the root logger (calling it again replaces it, no duplicates).

    Other handlers on the root logger (a test framework's capture) are left alone; a plain
    StreamHandler (basicConfig's) is replaced so lines are not printed twice.
    """
    under_journal = bool(os.environ.get("JOURNAL_STREAM")) or bool(os.environ.get("INVOCATION_ID"))
    fmt = "%(levelname)s %(name)s: %(message)s" if under_journal else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler = CurrentStderrHandler()
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if type(h) is not logging.StreamHandler and not isinstance(h, CurrentStderrHandler)]
    root.addHandler(handler)
    try:
        root.setLevel(level.upper())
    except ValueError:
        root.setLevel(logging.INFO)
        root.warning("unknown log level %r, using INFO", level)


class RateLimitedLogger:
    """Lets at most ``burst`` messages per key through every ``period_s``; counts the rest.

    When a key's window reopens, the first message says how many were suppressed.
    """

    def __init__(self, logger: logging.Logger, period_s: float = 5.0, burst: int = 3) -> None:
        self.logger = logger
        self.period_s = period_s
        self.burst = burst
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int, int]] = {}  # key -> (window start, sent, suppressed)

    def log(self, level: int, key: str, msg: str, *args: object) -> bool:
        now = time.monotonic()
        with self._lock:
            start, sent, suppressed = self._windows.get(key, (now, 0, 0))
            if now - start >= self.period_s:
                start, sent = now, 0
            if sent >= self.burst:
                self._windows[key] = (start, sent, suppressed + 1)
                return False
            self._windows[key] = (start, sent + 1, 0)
        if suppressed:
            msg = f"{msg} ({suppressed} similar messages suppressed)"
        self.logger.log(level, msg, *args)
        return True

    def warning(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def error(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.ERROR, key, msg, *args)
