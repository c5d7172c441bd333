"""The policy worker's heap: keep freed memory instead of handing it back to the kernel.

With glibc's defaults one ACT request takes thousands of minor page faults (measured in
docs/design/policy-worker.md). A forward pass allocates and frees tensors of a few hundred
kB to tens of MB; glibc serves blocks above its mmap threshold with a fresh ``mmap`` and returns
them with ``munmap`` on free, and trims the top of the heap once more than its trim threshold is
free. Either way the next request's buffers are new pages, and the kernel zero-fills each one on
its first touch. That cost lands inside the forward pass and, after it, in the pre- and
post-processing of the next request, where it is overhead.

``keep_heap()`` fixes both thresholds at start-up (``mallopt``), so after the first request the
same pages are reused; the worker's resident size settles at its high-water mark (a few hundred
MB for a full-size ACT, what it touches anyway). ``minor_faults()`` lets the worker send the
count with each chunk, so status shows whether the fix holds on the machine it runs on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# Above this a block is still mmapped: a frame or a model larger than this is not a per-request
# buffer. glibc caps the mmap threshold at 32 MiB on 64-bit (HEAP_MAX / 2); a larger value is refused.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024  # keep up to 1 GiB of freed heap rather than trim it


def keep_heap() -> str:
    """Fix glibc's mmap and trim thresholds for this process. Returns what was done, in words
    (shown in the worker's info): not glibc (musl, macOS) is said, not an error."""
    name = ctypes.util.find_library("c")
    if not name:
        return "default heap (no C library found)"
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "default heap (mallopt not available: not glibc)"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok_trim = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if ok_mmap and ok_trim:
        return f"heap kept (mmap threshold {MMAP_THRESHOLD_BYTES >> 20} MiB, no trim below {TRIM_THRESHOLD_BYTES >> 20} MiB)"
    return f"default heap (mallopt refused: mmap threshold {ok_mmap}, trim threshold {ok_trim})"


def minor_faults() -> int:
    """Minor page faults of this process so far (all threads)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
