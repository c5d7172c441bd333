"""Locked memory and real-time priority for the control loop (opt-in: [service] lock_memory,
and systemd/so101d.service.d/realtime.conf).

Why: a 100 Hz loop has 10 ms per cycle; one major page fault (a page of the loop's code or
data swapped out while the arm sat idle) or a preemption by a video encoder costs that much.
Both are best-effort: failing to lock or to raise priority logs one clear warning with the fix,
and the daemon runs on — an arm that teleoperates slightly less smoothly beats one that refuses
to start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import resource
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

log = logging.getLogger("so101d.realtime")

MCL_CURRENT = 1
MCL_FUTURE = 2


@dataclass
class LockResult:
    locked: bool
    detail: str


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _memlock_limit_text() -> str:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"


def lock_memory(future: bool = True) -> LockResult:
    """mlockall(MCL_CURRENT | MCL_FUTURE); a warning (not an exception) when it fails.

    MCL_FUTURE also locks what torch or the camera buffers map later, so RLIMIT_MEMLOCK must
    cover the whole process: the realtime drop-in sets LimitMEMLOCK=infinity.
    """
    flags = MCL_CURRENT | (MCL_FUTURE if future else 0)
    try:
        rc = _libc().mlockall(flags)
    except (OSError, AttributeError) as exc:  # no libc / no mlockall (not Linux)
        result = LockResult(False, f"mlockall unavailable: {exc}")
        log.warning("service.lock_memory: %s; running with unlocked memory", result.detail)
        return result
    if rc == 0:
        return LockResult(True, f"memory locked (RLIMIT_MEMLOCK {_memlock_limit_text()})")
    err = ctypes.get_errno()
    why = os.strerror(err)
    hint = (
        "raise the limit: LimitMEMLOCK=infinity (systemd/so101d.service.d/realtime.conf) or `ulimit -l unlimited`"
        if err in (12, 1)  # ENOMEM: over RLIMIT_MEMLOCK; EPERM: limit 0 without CAP_IPC_LOCK
        else "see mlockall(2)"
    )
    result = LockResult(False, f"mlockall failed: {why} (RLIMIT_MEMLOCK {_memlock_limit_text()}); {hint}")
    log.warning("service.lock_memory: %s; running with unlocked memory", result.detail)
    return result


def unlock_memory() -> None:
    try:
        _libc().munlockall()
    except (OSError, AttributeError):
        pass


def current_policy() -> str:
    """SCHED_FIFO/SCHED_RR/SCHED_OTHER of the calling thread, for the status output."""
    names = {os.SCHED_OTHER: "other", os.SCHED_FIFO: "fifo", os.SCHED_RR: "rr"}
    for name in ("SCHED_BATCH", "SCHED_IDLE"):
        if hasattr(os, name):
            names[getattr(os, name)] = name.removeprefix("SCHED_").lower()
    try:
        policy = os.sched_getscheduler(0)
        prio = os.sched_getparam(0).sched_priority
    except OSError:
        return "unknown"
    return f"{names.get(policy, str(policy))}:{prio}" if prio else names.get(policy, str(policy))


def make_current_thread_realtime(priority: int) -> bool:
    """SCHED_FIFO for the calling thread only (Linux: pid 0 = this thread).

    For a loop thread when the whole process is not already FIFO (CPUSchedulingPolicy= in the
    drop-in does the process); needs LimitRTPRIO >= priority (or CAP_SYS_NICE) and
    RestrictRealtime=no. Returns False with a warning otherwise.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, AttributeError) as exc:
        soft, _ = resource.getrlimit(resource.RLIMIT_RTPRIO)
        log.warning(
            "real-time priority %d for the control loop refused (%s; RLIMIT_RTPRIO %s): "
            "install systemd/so101d.service.d/realtime.conf (LimitRTPRIO, RestrictRealtime=no)",
            priority,
            getattr(exc, "strerror", None) or exc,
            soft,
        )
        return False
    return True


# -- keeping background work (video encoders) below the control loop ---------------------------
# SVT-AV1, LeRobot's default video encoder, creates every one of its threads SCHED_FIFO 99 when it
# may (root, or CAP_SYS_NICE) and the thread that opens it ends up FIFO 99 as well. That is above
# the control loop (FIFO 40 at most) and the kernel's IRQ threads (50): on a 2-core workstation run
# as root (`sudo so101d ...`, a container) an episode's encode could starve the loop and the serial
# I/O. SVT-AV1 falls back to normal threads when the kernel says EPERM, so the remedy is to take
# the right away from the thread that encodes: capabilities are per thread and inherited by the
# threads it creates, so the loop keeps its own right.

CAP_SYS_NICE = 23
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def give_up_realtime_right() -> str:
    """Drop CAP_SYS_NICE from the calling thread (and so from every thread it creates later).

    Afterwards SCHED_FIFO/RR is refused to these threads unless RLIMIT_RTPRIO (process-wide)
    allows it; the result says which. For background work only: it cannot be undone."""
    try:
        libc = _libc()
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)  # pid 0: the calling thread
        data = (_CapData * 2)()  # version 3: capabilities 0..31, then 32..63
        if libc.capget(ctypes.byref(header), data) != 0:
            return f"capget failed: {os.strerror(ctypes.get_errno())}"
        bit = 1 << CAP_SYS_NICE
        held = bool((data[0].effective | data[0].permitted) & bit)
        if held:
            data[0].effective &= ~bit
            data[0].permitted &= ~bit
            data[0].inheritable &= ~bit
            if libc.capset(ctypes.byref(header), data) != 0:
                return f"capset failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:  # no libc capget/capset (not Linux)
        return f"capabilities unavailable: {exc}"
    soft, _hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
    what = "CAP_SYS_NICE dropped" if held else "no CAP_SYS_NICE held"
    if soft == 0:
        return f"{what}; real-time scheduling refused (RLIMIT_RTPRIO 0)"
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    return f"{what}; RLIMIT_RTPRIO {limit} still allows FIFO up to that priority"


def run_without_realtime[T](fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own that has given up the real-time right (see above), so an
    encoder it opens cannot raise itself above the control loop; its result, or its exception."""
    done: Future[T] = Future()

    def body() -> None:
        give_up_realtime_right()
        try:
            done.set_result(fn())
        except BaseException as exc:  # handed to the caller's thread
            done.set_exception(exc)

    worker = threading.Thread(target=body, name="so101d-no-realtime")
    worker.start()
    worker.join()
    return done.result()
