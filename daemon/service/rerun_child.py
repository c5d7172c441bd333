"""The daemon's Rerun streamer: `so101d rerun` as a child process, for ``[display] rerun`` or
``so101d run|demo --rerun HOST:PORT``.

The daemon only starts it, relays its log lines and stops it. The streaming itself (the Rerun
SDK, its threads, the polling) lives in the child, a client of the control socket like the
browser console, so the control thread never shares a GIL with it. The child exits with the
daemon even when the daemon is killed -9 (drivers/parent_watch.py), and is in a session of its
own: the terminal's Ctrl-C reaches the daemon, which stops it.

Its failures are log lines, never the daemon's: rerun-sdk missing (the child logs how to install
it and exits 3), a viewer that is not there (the child says so and waits for it), a child that
cannot be started or that exits (logged here with its exit status; teleoperation goes on).
"""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import threading
from typing import IO

from drivers.parent_watch import exit_with_parent_args

log = logging.getLogger("so101d.rerun")

STOP_TIMEOUT_S = 5.0
# a line as daemon/system/logs.py formats it: optional "HH:MM:SS ", the level, the logger, the message
_LOG_LINE = re.compile(r"^(?:\d\d:\d\d:\d\d )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) ([\w.]+): (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RerunChild:
    def __init__(self, address: str, socket_path: str) -> None:
        self.address = address
        self.socket_path = socket_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._relay: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        return [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "--log-level",
            str(level),
            "rerun",
            "--connect",
            self.address,
            "--socket",
            self.socket_path,
            *exit_with_parent_args(),
        ]

    def start(self) -> None:
        """Start the child; a failure to start is logged, never raised."""
        try:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            log.error("cannot start the Rerun streamer for %s: %s; the daemon runs on without it", self.address, exc)
            return
        log.info("Rerun streamer for %s started (pid %d)", self.address, self.proc.pid)
        assert self.proc.stdout is not None
        self._relay = threading.Thread(
            target=self._relay_lines, args=(self.proc.stdout,), name="rerun-streamer-log", daemon=True
        )
        self._relay.start()

    def _relay_lines(self, stream: IO[bytes]) -> None:
        """The child's lines into the daemon's log (journal, terminal) at the level it wrote them;
        then its exit, when the daemon did not ask for it."""
        for raw in stream:
            line = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip()
            if not line:
                continue
            m = _LOG_LINE.match(line)
            if m:
                level = logging.getLevelNamesMapping()[m.group(1)]
                logging.getLogger(m.group(2)).log(level, "%s", m.group(3))
            else:  # a traceback or a library's own line
                log.warning("Rerun streamer: %s", line)
        stream.close()
        proc = self.proc
        if proc is None:
            return
        code = proc.wait()
        if not self._stopping:
            log.error(
                "the Rerun streamer for %s exited with status %d; the daemon runs on without it", self.address, code
            )

    def stop(self) -> None:
        """SIGTERM, a short wait, SIGKILL if it hangs (a shutdown hook: never raises)."""
        proc = self.proc
        if proc is None:
            return
        self._stopping = True
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("the Rerun streamer did not stop within %g s: killed", STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()
        if self._relay is not None:
            self._relay.join(timeout=2.0)
