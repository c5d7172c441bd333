"""Where a local policy's latency goes, as `so101d policy status` tells the operator.

Overhead beyond the forward pass = request issued -> chunk usable by the loop, minus the forward
pass the worker measured. The stages (handoff, worker, reply, enqueue, plus the forward pass) add
up to that exactly, chunk by chunk; a chunk is in the action queue as soon as it arrives (the loop
does not have to pick it up); garbage-collection pauses are counted on both sides. No timing is
asserted: a loaded machine changes the numbers, not their bookkeeping.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from daemon.commands.policy import format_status
from daemon.policy.action_queue import QueueConfig
from daemon.policy.runner import OVERHEAD_STAGES, PolicyRunnerConfig, PolicySource
from daemon.policy.tiny import synthetic_frame, synthetic_pose, tiny_act_checkpoint
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
    return tiny_act_checkpoint(tmp_path_factory.mktemp("latency_policy"), {"front": (H, W)})


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


def test_a_chunk_is_usable_the_moment_it_arrives_without_the_loop_picking_it_up(source) -> None:
    src, state = source
    assert src.target(time.monotonic(), state) is None  # empty queue: hold, and the first request goes out
    deadline = time.monotonic() + 30
    while src.results == 0 and time.monotonic() < deadline:
        src.wait_result(0.05)  # no target() call: nothing on the loop's side runs
    assert src.results == 1, src.stats()
    assert len(src.queue) == 1  # already in the queue, before the loop's next cycle
    assert src.target(time.monotonic(), state) is not None


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
    for key in (
        "ask",
        "handoff",
        "publish",
        "worker",
        "read",
        "preprocess",
        "forward",
        "postprocess",
        "gc",
        "reply",
        "enqueue",
    ):
        assert st["stages_ms"][key]["n"] >= len(chunks), key
    # the observation -> usable latency is the request's plus the cycle's own reads before it
    lat = src.latency.values()[-len(chunks) :]
    assert lat == pytest.approx([c["ask"] + c["total"] for c in chunks], abs=1e-9)
    gc = st["gc"]
    assert gc["daemon_frozen_objects"] > 0  # what was loaded before the policy started is out of the GC's walk
    assert gc["worker_ms"]["n"] >= len(chunks)
    text = format_status({**st, "driving": False})
    assert "request -> chunk usable, minus the forward pass" in text
    assert "p99.9" in text
    assert "overhead = handoff + worker + reply + enqueue" in text
    for key in ("handoff", "worker", "reply", "enqueue", "gc"):
        assert f"\n  {key:<11}" in text, key
    assert "gc         daemon" in text and "objects frozen" in text
