"""The writer process's first step, taken before anything heavy is imported.

Its encoders must never rise above the control loop: SVT-AV1 (LeRobot's default codec) creates its
threads SCHED_FIFO 99 whenever the kernel allows it (root, CAP_SYS_NICE). Capabilities belong to
each thread and are inherited by the threads it creates, and importing LeRobot, PyAV or pyarrow
already starts threads; so the right goes first, here, while this process has one thread, and only
then is the writer (daemon/data/writer.py) imported.
"""

from __future__ import annotations

import resource
from typing import Any

from daemon.system.realtime import give_up_realtime_right


def writer_entry(
    store_cfg: dict[str, Any], ring_spec: dict[str, Any], conn: Any, parent_pid: int, follower_kind: str, origin: str
) -> None:
    """``Process`` target of the recorder: no real time for this process, then ``writer_main``."""
    try:
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))  # whatever the parent's limit was
    except (OSError, ValueError):
        pass
    scheduling = give_up_realtime_right()
    from daemon.data.writer import writer_main

    writer_main(store_cfg, ring_spec, conn, parent_pid, follower_kind, origin, scheduling=scheduling)
