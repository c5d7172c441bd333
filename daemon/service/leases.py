"""Who holds what a control-socket client took (an arm, the leader): the client's words, and its
process as the kernel names it, so a holder that died without giving it back is told apart."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from daemon.system.processes import start_ticks


@dataclass(frozen=True)
class Lease:
    """Who holds an arm."""

    arm: str
    token: str
    client: str
    pid: int | None
    since_s: float  # wall clock, for the refusal's words
    pid_started: int | None = None  # the holder's start time (/proc): a reused pid is another process

    def words(self) -> str:
        who = f"{self.client} (pid {self.pid})" if self.pid is not None else self.client
        return f"{who}, since {time.strftime('%H:%M:%S', time.localtime(self.since_s))}"

    def alive(self) -> bool:
        """False once the holder's process is gone (a client without a pid is taken at its word)."""
        if self.pid is None:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: it exists
            pass
        return self.pid_started is None or start_ticks(self.pid) == self.pid_started
