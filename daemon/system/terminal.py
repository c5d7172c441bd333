"""A foreground daemon and its terminal: helpers that outlive the terminal's signals, and telling a
closed terminal from a reload request.

Closing a terminal makes the shell (the session leader) send SIGHUP to every process group it
started; Ctrl-C sends SIGINT to the foreground group. Our helper processes (recording writer,
policy worker, Python's multiprocessing resource tracker, which unlinks shared memory) are in that
group. Killed by those signals they would leave shared-memory segments behind and make the
daemon's later shutdown fail, so ``helpers_shielded()`` blocks the terminal's signals in the
calling thread while the daemon starts: every process spawned meanwhile (and every thread created
meanwhile, and the processes those threads spawn later) inherits the blocked mask across
fork+exec and never receives them. The daemon stops its helpers itself (pipes, SIGTERM,
SIGKILL), which stay deliverable. CPython's resource tracker relies on the same inheritance for
SIGINT/SIGTERM (multiprocessing/resource_tracker.py, ResourceTracker.ensure_running).

``TerminalWatch`` decides what a SIGHUP means:

- no controlling terminal when the daemon started (systemd, a service manager): a reload;
- a controlling terminal that is still there (``kill -HUP PID`` from another shell): a reload;
- a controlling terminal that is gone (the window was closed, ssh dropped): terminal loss. The
  daemon stops as for SIGTERM (episodes saved or discarded per [recording] on_shutdown, the
  writer commits, shared memory released), unless SIGHUP was ignored when it started
  (``nohup so101d run ...``): then it says so and runs on. Either way, output that went to the
  dead terminal now goes to /dev/null (writes to a hung-up terminal fail with EIO).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass

# What a terminal sends its foreground process group: hang-up, Ctrl-C, Ctrl-\.
TERMINAL_SIGNALS: frozenset[signal.Signals] = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGQUIT})


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now (it is otherwise started by the first
    shared-memory segment or spawned process, from whatever thread that happens in)."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


@contextlib.contextmanager
def helpers_shielded() -> Iterator[None]:
    """Block the terminal's signals in this thread for the duration, and start the resource
    tracker inside it: processes and threads created meanwhile keep them blocked.

    Signals sent meanwhile stay pending and are delivered when the mask is restored."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)
    try:
        start_resource_tracker()
        # ensure_running() unblocks SIGINT/SIGTERM in this thread on its way out (it blocked them
        # for its own child): block ours again before any thread or helper is created
        signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def has_controlling_terminal() -> bool:
    """True while this process has a controlling terminal (after a hang-up the kernel detaches
    it from the whole session, and /dev/tty can no longer be opened)."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


@dataclass(frozen=True)
class TerminalWatch:
    """What the daemon's terminal looked like at start, to judge a later SIGHUP."""

    had_terminal: bool
    tty_fds: tuple[int, ...]  # stdin/stdout/stderr that were terminals (isatty fails once hung up)
    survive_hangup: bool  # SIGHUP was ignored at start: nohup asked us to outlive the terminal

    @classmethod
    def at_start(cls) -> TerminalWatch:
        try:
            ignored = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        except ValueError:  # pragma: no cover - not the main interpreter
            ignored = False
        return cls(has_controlling_terminal(), tuple(fd for fd in (0, 1, 2) if _isatty(fd)), ignored)

    def terminal_lost(self) -> bool:
        """A SIGHUP now means the terminal went away (not a reload request)."""
        return self.had_terminal and not has_controlling_terminal()

    def detach_output(self) -> None:
        """Point the file descriptors that were the terminal at /dev/null, so later writes
        (log lines, the demo's status) do not fail with EIO."""
        if not self.tty_fds:
            return
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for fd in self.tty_fds:
                os.dup2(null, fd)
        finally:
            os.close(null)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False
