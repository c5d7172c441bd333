"""Where a local policy's latency goes, as `so101d policy status` tells the operator.

Overhead beyond the forward pass = request issued -> chunk usable by the loop, minus the forward
pass the worker measured. The stages (handoff, worker, reply, prepare, plus the forward pass) add
up to that exactly, chunk by chunk. A chunk is usable once the receiver thread has decoded and
checked it; the wait for the loop's next cycle ("pickup", the loop's sampling) is shown beside the
overhead, not in it. Garbage-collection pauses are counted on both sides. No timing is asserted: a
loaded machine changes the numbers, not their bookkeeping.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from policy_support import tiny_act

from daemon.apps.commands.policy import format_status
from daemon.policy.action_queue import QueueConfig
from daemon.policy.runner import OVERHEAD_STAGES, STAGE_KEYS, PolicyRunnerConfig, PolicySource
from daemon.policy.tiny import synthetic_frame, synthetic_pose
from drivers.cameras import Frame

H, W = 48, 64


class StillCamera:
    width, height = W, H

    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels = pixels

    def latest_frame(self) -> Frame:
        return Frame(pixels=self.pixels, capture_monotonic_s=time.monotonic(), seq=1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_act(tmp_path_factory, {"front": (H, W)})


@pytest.fixture()
def source(ckpt: Path):
    state = synthetic_pose(0.3)
    # refill_below above the chunk: every chunk asks for the next one (back to back)
    src = PolicySource(
        PolicyRunnerConfig(
            str(ckpt), cameras={"front": (H, W)}, queue=QueueConfig(refill_below=1000, max_obs_age_s=60.0)
        ),
        {"front": StillCamera(synthetic_frame(state, H, W))},
    )
    src.start()
    try:
        assert src.wait_ready(90), src.error
        yield src, state
    finally:
        src.stop()


def test_a_chunk_is_usable_on_arrival_and_the_loops_pickup_is_not_counted_as_overhead(source) -> None:
    src, state = source
    assert src.target(time.monotonic(), state) is None  # empty queue: hold, and the first request goes out
    deadline = time.monotonic() + 30
    while not src.timeline and time.monotonic() < deadline:
        src.wait_result(0.05)  # no target() call: nothing on the loop's side runs
    assert len(src.timeline) == 1 and src.results == 0, src.stats()  # arrived, not yet in the queue
    arrived_by = time.monotonic()
    time.sleep(0.2)  # the loop's next cycle comes late
    assert src.target(time.monotonic(), state) is not None  # it takes the chunk and drives from it
    (chunk,) = list(src.timeline)
    assert chunk["usable_s"] <= arrived_by  # usable before the loop came back
    assert chunk["pickup"] >= 0.2  # the wait for the loop, beside the overhead
    assert chunk["total"] == pytest.approx(chunk["usable_s"] - chunk["issued_s"], abs=1e-9)
    assert src.stats()["stages_ms"]["pickup"]["n"] == 1 and src.results == 1


def test_the_stages_add_up_to_the_overhead_chunk_by_chunk_and_status_shows_them(source) -> None:
    src, state = source
    deadline = time.monotonic() + 60
    while len(src.timeline) < 12 and time.monotonic() < deadline:
        src.target(time.monotonic(), state)  # the loop's call, at its 100 Hz
        time.sleep(0.01)
    chunks = list(src.timeline)
    assert len(chunks) >= 12, src.stats()
    for c in chunks:
        assert all(c[k] >= 0 for k in ("ask", *OVERHEAD_STAGES, "forward")), c
        assert c["forward"] > 0
        assert sum(c[k] for k in OVERHEAD_STAGES) + c["forward"] == pytest.approx(c["total"], abs=1e-9)
        assert c["overhead"] == pytest.approx(c["total"] - c["forward"], abs=1e-9)
    st = src.stats()
    assert st["overhead_stages"] == list(OVERHEAD_STAGES)
    over = st["overhead_ms"]
    assert over["n"] == len(chunks) and over["p50"] <= over["p99"] <= over["p99.9"] <= over["max"]
    for key in STAGE_KEYS:
        if key != "pickup":  # the loop's sampling, reported beside the overhead (runner docstring)
            assert st["stages_ms"][key]["n"] >= len(chunks), key
    picked = [c for c in chunks if "pickup" in c]  # the newest may still wait for the loop's next call
    assert len(picked) >= len(chunks) - 1 and all(c["pickup"] >= 0 for c in picked)
    assert st["stages_ms"]["pickup"]["n"] >= len(picked)
    # observation -> in the loop's queue (the refill lead's figure) = the cycle's reads + the request + pickup
    lat = src.latency.values()[-len(picked) :]
    assert lat == pytest.approx([c["ask"] + c["total"] + c["pickup"] for c in picked], abs=1e-9)
    # the worker says how it runs: its heap kept (heap.py), LeRobot's pipelines fused (fused_io.py),
    # and the page faults each chunk took (0 once the heap has grown to its high-water mark)
    worker = st["worker"]
    assert worker["heap"].startswith("heap kept"), worker
    assert worker["io"].startswith("fused pre- and postprocessing"), worker
    assert worker["torch_threads"] >= 1 and worker["omp_wait_policy"]
    gc = st["gc"]
    assert gc["worker_page_faults"]["n"] >= len(chunks)
    assert gc["daemon_frozen_objects"] > 0  # what was loaded before the policy started is out of the GC's walk
    assert gc["worker_ms"]["n"] >= len(chunks)
    text = format_status({**st, "driving": False})
    assert "request -> chunk usable, minus the forward pass" in text
    assert "p99.9" in text
    assert "overhead = handoff + worker + reply + prepare" in text
    for key in ("handoff", "worker", "reply", "prepare", "pickup", "gc"):
        assert f"\n  {key:<11}" in text, key
    assert "gc         daemon" in text and "objects frozen" in text and "worker page faults per chunk p50" in text
    assert "torch thread(s), OpenMP wait" in text and "fused pre- and postprocessing" in text
