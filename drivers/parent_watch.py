"""Helper processes that exit with the process that started them, even one killed -9.

The emulator started by `so101d demo` and the Rerun streamer started by the daemon are given
``--exit-with-parent PID`` (and, when started from the main thread, ``--parent-death-signal``).
The helper then asks the kernel for SIGTERM when its parent dies (Linux PR_SET_PDEATHSIG) and
also polls ``getppid()``, which covers other systems, a missed signal and a parent that died
before the prctl.

PR_SET_PDEATHSIG fires when the *thread* that started the child ends, not the process: a child
started from a short-lived thread would be killed with that thread, so the flag is only passed
from the main thread (``exit_with_parent_args``); the poll covers the rest.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("so101d.parent_watch")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def add_exit_with_parent_arguments(parser: argparse.ArgumentParser) -> None:
    """The two options a helper accepts (what ``exit_with_parent_args`` passes)."""
    parser.add_argument(
        "--exit-with-parent",
        type=int,
        metavar="PID",
        help="exit when process PID, the one that started us, is gone",
    )
    parser.add_argument(
        "--parent-death-signal",
        action="store_true",
        help="with --exit-with-parent: also ask the kernel for SIGTERM when the parent dies "
        "(PR_SET_PDEATHSIG; only valid when the parent's starting thread lives as long as it)",
    )


def exit_with_parent_args() -> list[str]:
    """The options for a helper started now, from this thread, by this process."""
    args = ["--exit-with-parent", str(os.getpid())]
    if threading.current_thread() is threading.main_thread():
        args.append("--parent-death-signal")
    return args


def watch_parent(parent_pid: int | None, death_signal: bool) -> Callable[[], bool]:
    """``parent_gone()`` for --exit-with-parent: our parent is no longer ``parent_pid`` (we were
    re-parented to init or a subreaper). With ``death_signal`` the kernel also sends SIGTERM at
    once when it dies (Linux prctl); the poll covers other systems and a missed signal."""
    if parent_pid is None:
        return lambda: False
    if death_signal and sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d); polling the parent instead", ctypes.get_errno())
    # it may have died before the prctl above: the poll sees that on its first call
    return lambda: os.getppid() != parent_pid
