"""The shared-memory observation (seqlock): a reader in one process never sees a torn observation
while a writer in another process keeps rewriting it."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from daemon.policy.obs_buffer import ObsBuffer, ObsLayout

LAYOUT = ObsLayout.make(6, {"front": (120, 160), "wrist": (60, 80)})


def _writer(name: str, layout_dict: dict, seconds: float) -> None:
    buf = ObsBuffer(ObsLayout.from_dict(layout_dict), name=name, create=False)
    frames = {n: np.zeros((h, w, 3), np.uint8) for n, h, w in buf.layout.cameras}
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        k += 1
        v = k % 251
        for f in frames.values():
            f.fill(v)
        buf.write(float(k), k, np.full(6, float(k)), frames)
        time.sleep(0.0002)  # far more often than the daemon writes (once per inference request)
    buf.close()


def test_reader_never_sees_a_torn_observation() -> None:
    buf = ObsBuffer(LAYOUT, create=True)
    try:
        buf.write(0.0, 0, np.zeros(6), {n: np.zeros((h, w, 3), np.uint8) for n, h, w in LAYOUT.cameras})
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=_writer, args=(buf.name, LAYOUT.to_dict(), 2.0))
        p.start()
        state = np.zeros(6)
        images = {n: np.zeros((h, w, 3), np.uint8) for n, h, w in LAYOUT.cameras}
        seen = set()
        while p.is_alive() or not seen:
            obs_time, req, _ = buf.read_into(state, images)
            # one consistent write: every field carries the same k
            assert obs_time == req == state[0] and np.all(state == state[0])
            v = req % 251
            for img in images.values():
                assert img.min() == img.max() == v
            seen.add(req)
        p.join(5)
        assert p.exitcode == 0
        assert len(seen) > 10  # the reader really raced a moving writer
    finally:
        buf.close()


def test_wrong_frames_are_refused_before_anything_is_written() -> None:
    buf = ObsBuffer(LAYOUT, create=True)
    try:
        good = {n: np.full((h, w, 3), 7, np.uint8) for n, h, w in LAYOUT.cameras}
        buf.write(1.0, 1, np.ones(6), good)
        with pytest.raises(ValueError, match="front"):
            buf.write(2.0, 2, np.ones(6) * 2, {**good, "front": np.zeros((480, 640, 3), np.uint8)})
        with pytest.raises(KeyError, match="side"):
            buf.write(2.0, 2, np.ones(6) * 2, {"side": np.zeros((1, 1, 3), np.uint8)})
        state = np.zeros(6)
        images = {n: np.zeros((h, w, 3), np.uint8) for n, h, w in LAYOUT.cameras}
        assert buf.read_into(state, images)[1] == 1 and state[0] == 1.0 and images["front"][0, 0, 0] == 7
    finally:
        buf.close()
