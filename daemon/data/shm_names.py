"""Names for the recording rings' shared-memory segments (and the camera frame shares'), and the
sweep of our own stale ones.

A power cut clears /dev/shm, but a SIGKILL of the daemon's process group (an OOM kill, systemd's
stop timeout) does not: Python's resource tracker dies with the group and the ring's segments
(about 23 MB each run) stay. Each segment is named after the process that made it, its pid and
that process's start time (from /proc, so a reused pid is told apart); a segment is removed only
when its name is ours and that process is gone.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from pathlib import Path

from daemon.system.processes import start_ticks

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PREFIX = "so101d-ring"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-[a-z]+-[0-9a-f]{{8}}$")
SWEEP_LIMIT = 64  # segments removed per start at most: a sweep is bounded, the next start goes on


def segment_name(kind: str) -> str:
    pid = os.getpid()
    return f"{PREFIX}-{pid}-{start_ticks(pid) or 0}-{kind}-{secrets.token_hex(4)}"


def sweep_stale(shm_dir: Path = SHM_DIR, limit: int = SWEEP_LIMIT) -> list[str]:
    """Removes our segments whose maker is no longer running; returns their names."""
    removed: list[str] = []
    try:
        names = sorted(p.name for p in shm_dir.iterdir())
    except OSError:
        return removed
    for name in names:
        m = _NAME.match(name)
        if m is None:
            continue  # not ours (another program's, or a Python default psm_* name)
        pid, ticks = int(m.group(1)), int(m.group(2))
        if start_ticks(pid) == ticks:
            continue  # its maker is alive (another daemon recording now)
        if len(removed) >= limit:
            log.warning("shared memory: more than %d stale ring segments; the rest at the next start", limit)
            break
        try:
            size = (shm_dir / name).stat().st_size
            (shm_dir / name).unlink()
        except FileNotFoundError:
            continue  # another daemon's sweep took it
        except OSError as exc:
            log.warning("shared memory: cannot remove stale ring segment %s: %s", name, exc)
            continue
        removed.append(name)
        log.warning("shared memory: removed stale ring segment %s (%d bytes; its process %d is gone)", name, size, pid)
    return removed
