"""The policy worker keeps its heap: a request's buffers are reused, not page-faulted in anew.

With glibc's defaults, buffers of a few MB freed after each request went back to the kernel
(munmap, trim) and came back as fresh zero-filled pages on the next one: thousands of minor page
faults per request, inside the forward pass and in the pre/post-processing around it
(daemon/policy/heap.py). Each case runs in a fresh interpreter: mallopt changes the process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daemon.policy.worker import torch_threads

REPO = Path(__file__).resolve().parents[1]

# A request's allocation pattern in miniature: buffers of 1-24 MB, touched, freed together.
WORKLOAD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from daemon.policy.heap import keep_heap, minor_faults

    said = keep_heap() if sys.argv[1] == "keep" else "default heap"

    def request():
        buffers = []
        for mb in (1, 3, 6, 12, 2, 24):
            b = np.empty(mb * 1024 * 1024 // 8)
            b.fill(1.0)
            buffers.append(b)
        del buffers

    request(); request()  # the first requests may grow the heap: that is the high-water mark
    before = minor_faults()
    for _ in range(10):
        request()
    print(said)
    print((minor_faults() - before) // 10)
    """
)


def _faults_per_request(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", WORKLOAD, mode], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    return out[0], int(out[1])


def test_a_kept_heap_serves_the_next_request_from_the_same_pages() -> None:
    said, kept = _faults_per_request("keep")
    assert said.startswith("heap kept"), said
    _, default = _faults_per_request("default")
    # the default heap faults thousands of the 48 MB's 12288 pages back in per request; the kept one none
    assert default > 1000, default
    assert kept < default / 100, (kept, default)


# -- the forward pass's threads ------------------------------------------------------------------


@pytest.fixture()
def two_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)


def test_by_default_the_forward_pass_leaves_a_core_to_the_loop_and_openmp_as_it_is(two_cores) -> None:
    assert torch_threads(None) == (1, "libgomp default")
    assert "OMP_WAIT_POLICY" not in os.environ


def test_a_forward_pass_on_every_core_does_not_spin_on_them(two_cores) -> None:
    # spinning OpenMP threads on every core kept the daemon's receiver thread off the CPU
    # (bench_policy tail run: ~50 ms stalls); passive waiting gives the cores back at once
    assert torch_threads(2) == (2, "PASSIVE")
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_the_operators_openmp_setting_is_kept(two_cores, monkeypatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert torch_threads(4) == (4, "ACTIVE")
