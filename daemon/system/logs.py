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

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__/setStream assign it: ignored
        pass


LEVEL_ENV = "SO101D_LOG_LEVEL"  # the level a helper process (recording writer) inherits


def setup_logging(level: str | None = None, libav: bool = False) -> None:
    """One stderr handler on the root logger (calling it again replaces it, no duplicates), with
    third-party chatter below our INFO (``quiet_third_party``; ``libav``: import PyAV now to
    quiet FFmpeg too, for a process that is going to encode or decode video).

    ``level`` None: the parent's (SO101D_LOG_LEVEL, set here for the processes we start), else
    INFO. A helper process calls ``setup_logging(libav=True)`` and logs like its daemon.

    Other handlers on the root logger (a test framework's capture) are left alone; a plain
    StreamHandler (basicConfig's) is replaced so lines are not printed twice.
    """
    under_journal = bool(os.environ.get("JOURNAL_STREAM")) or bool(os.environ.get("INVOCATION_ID"))
    fmt = "%(levelname)s %(name)s: %(message)s" if under_journal else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler = CurrentStderrHandler()
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
    handler.addFilter(ThirdPartyBelowInfo())
    root = logging.getLogger()
    root.handlers[:] = [
        h for h in root.handlers if type(h) is not logging.StreamHandler and not isinstance(h, CurrentStderrHandler)
    ]
    root.addHandler(handler)
    set_log_level(level if level is not None else os.environ.get(LEVEL_ENV, "INFO"))
    quiet_third_party(libav=libav)


def set_log_level(level: str) -> None:
    """The root logger's level, here and in the helper processes started from now on."""
    root = logging.getLogger()
    try:
        root.setLevel(level.upper())
    except ValueError:
        root.setLevel(logging.INFO)
        logging.getLogger(OUR_LOGGERS[0]).warning("unknown log level %r, using INFO", level)
    os.environ[LEVEL_ENV] = logging.getLevelName(root.level)


# our loggers: "so101d.*", and the packages that log under their module names
OUR_LOGGERS = ("so101d", "drivers", "calibration", "sim_bridge", "daemon")


class ThirdPartyBelowInfo(logging.Filter):
    """Passes our records as the level says; another library's below WARNING only when the root
    logger is at DEBUG (judged at each record, so a later level change counts)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        if record.name.split(".", 1)[0] in OUR_LOGGERS:
            return True
        return logging.getLogger().getEffectiveLevel() <= logging.DEBUG


def quiet_third_party(libav: bool = False) -> None:
    """Progress bars off and FFmpeg at ERROR, here and in the processes started from here.

    HF datasets reads HF_DATASETS_DISABLE_PROGRESS_BARS when it is imported (a spawned writer
    inherits it); an operator who set it keeps their value. FFmpeg's level is per process:
    set when PyAV is already imported, or imported now with ``libav``."""
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "datasets" in sys.modules and os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1":
        import datasets

        datasets.disable_progress_bars()
    if libav or "av" in sys.modules:
        quiet_libav()


def quiet_libav() -> None:
    """FFmpeg prints errors only, whichever log callback is installed: PyAV's (forwarding to the
    "libav" logger from WARNING up) or FFmpeg's default one, which LeRobot restores after
    probing a video and which then prints libx264's per-encoder statistics at INFO."""
    import av

    av.logging.set_libav_level(av.logging.ERROR)
    forwarded = av.logging.get_level()  # None: PyAV's default, FFmpeg's messages dropped
    if forwarded is not None and forwarded > av.logging.WARNING:  # larger = more verbose
        av.logging.set_level(av.logging.WARNING)


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
