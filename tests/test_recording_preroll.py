"""The pre-roll buffer (daemon/data/preroll.py) on a fake clock: rows on the fps grid while no
episode records, holding references to the cameras' frames (no pixel copied), at most
ceil(ring_s * fps) of them; ``take`` hands over the newest rows with their grid and empties the
buffer; every refusal names why. The bound the configuration is checked against at load
(daemon/config/ring_bound.py) is the buffer's own, and a configuration past ring_max_mb is refused
naming both keys and both numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from daemon.config.ring_bound import MIB, StreamSize, bound_refusal, preroll_bound_bytes, preroll_frames
from daemon.config.settings import ConfigError, config_from_dict
from daemon.data.preroll import Preroll, PrerollError
from drivers.cameras import Frame

FPS = 30
CYCLE_S = 0.01  # the loop's 100 Hz


class FakeCamera:
    """A camera's newest frame: a new pixel array per capture, as drivers/cameras.py publishes."""

    def __init__(self, w: int = 8, h: int = 6) -> None:
        self.w, self.h, self.seq = w, h, 0

    def capture(self, t_s: float) -> Frame:
        self.seq += 1
        return Frame(np.full((self.h, self.w, 3), self.seq % 256, np.uint8), t_s, self.seq)


def run_loop(pre: Preroll, t0_s: float, seconds: float, cam: FakeCamera | None = None) -> list[float]:
    """100 Hz cycles from t0 for ``seconds``, a camera frame every 1/30 s; the cycle times fed."""
    fed_at: list[float] = []
    frame = None
    next_cap = t0_s
    n = round(seconds / CYCLE_S)
    for i in range(n):
        now = t0_s + i * CYCLE_S
        if cam is not None and now >= next_cap:
            frame = cam.capture(now)
            next_cap += 1 / FPS
        state = np.full(6, now, np.float32)
        if pre.feed(now, state, state + 1, state + 2, (frame,), "leader"):
            fed_at.append(now)
    return fed_at


def test_rows_on_the_grid_referencing_frames_and_bounded():
    pre = Preroll(1.0, FPS, [StreamSize(8, 6)])
    assert pre.max_frames == 30 and pre.bound_bytes == 30 * 8 * 6 * 3
    cam = FakeCamera()
    run_loop(pre, 100.0, 3.0, cam)
    assert len(pre) == 30  # three seconds fed, one kept
    st = pre.status()
    assert st["frames"] == 30 and st["max_frames"] == 30 and st["fed"] == 90 and st["buffered_s"] == 1.0
    kept = pre.take(1.0)
    rows = []
    while (row := kept.pop_kept()) is not None:
        rows.append(row)
    assert len(rows) == 30
    # row i at the first cycle at or after t0 + i / fps (the grid of an episode's frames)
    grid = kept.grid_t0_s + np.arange(30) / FPS
    cycles = np.array([r.now_monotonic_s for r in rows])
    assert (cycles >= grid - 1e-9).all() and (cycles < grid + CYCLE_S + 1e-9).all()
    assert kept.next_grid_s == pytest.approx(grid[-1] + 1 / FPS)
    # the values are the cycle's own (state = its time), copied per row, action/teleop beside it
    for r in rows:
        assert r.state[0] == np.float32(r.now_monotonic_s) and r.action[0] == r.state[0] + 1
        assert r.source == "leader"
    # frames are references to what the camera published: never copied, never more than one a row
    frames = [r.frames[0] for r in rows]
    assert all(isinstance(f, Frame) for f in frames)
    alive = {id(f.pixels): f.pixels.nbytes for f in frames}
    assert sum(alive.values()) <= pre.bound_bytes
    assert len(pre) == 0  # taken: the buffer is empty


def test_take_gives_the_newest_rows_oldest_first():
    pre = Preroll(2.0, FPS)
    run_loop(pre, 5.0, 2.5)
    kept = pre.take(0.5)
    assert kept.frames == 15 and kept.remaining() == 15 and kept.seconds == 0.5
    rows = []
    while (row := kept.pop_kept()) is not None:
        rows.append(row)
    times = [r.now_monotonic_s for r in rows]
    assert times == sorted(times) and len(times) == 15
    assert times[-1] >= 5.0 + 2.5 - CYCLE_S - 1 / FPS  # the newest, up to the last cycle
    # asking for more than is buffered (but within ring_s) gives what there is
    pre.episode_ended()
    run_loop(pre, 50.0, 0.3)
    assert pre.take(2.0).frames == len(np.arange(0, 0.3 - 1e-9, 1 / FPS))


def test_refusals_say_why_and_take_nothing():
    pre = Preroll(1.0, FPS)
    with pytest.raises(PrerollError, match="nothing buffered"):
        pre.take(0.5)
    run_loop(pre, 1.0, 1.0)
    n = len(pre)
    for bad, words in ((1.5, "longer than the buffer: \\[recording\\] ring_s = 1 s"), (0, "above 0"), (-1, "above 0")):
        with pytest.raises(PrerollError, match=words) as exc:
            pre.take(bad)
        assert exc.value.field == "last_s"
    with pytest.raises(PrerollError, match="number of seconds"):
        pre.take(float("nan"))
    assert len(pre) == n  # nothing taken by a refusal
    pre.episode_started()
    assert len(pre) == 0
    with pytest.raises(PrerollError, match="an episode is recording") as exc:
        pre.take(0.5)
    assert exc.value.field is None
    assert pre.feed(9.0, np.zeros(6), np.zeros(6), np.zeros(6), (), "") == 0  # not fed meanwhile
    with pytest.raises(PrerollError, match=r"ring_s is 0 \(off\)"):
        Preroll(0.0, FPS).take(1.0)
    with pytest.raises(ValueError, match="ring_s"):
        Preroll(601.0, FPS)


def test_a_new_run_after_an_episode_and_after_a_gap_longer_than_the_buffer():
    pre = Preroll(0.5, FPS)
    run_loop(pre, 1.0, 1.0)
    pre.episode_started()
    pre.episode_ended()
    run_loop(pre, 10.0, 0.2)
    kept = pre.take(0.5)
    assert kept.grid_t0_s == 10.0  # the new run's grid, from its first cycle
    pre.episode_ended()
    run_loop(pre, 20.0, 0.4)
    runs = pre.runs
    run_loop(pre, 30.0, 0.1)  # 9.6 s of no cycle: more than the buffer holds
    assert pre.runs == runs + 1 and len(pre) <= 4
    assert pre.take(0.5).grid_t0_s == 30.0


def test_a_stall_gives_every_grid_point_its_row():
    pre = Preroll(1.0, FPS)
    s = np.zeros(6, np.float32)
    assert pre.feed(0.0, s, s, s, (), "") == 1
    assert pre.feed(0.2, s, s, s, (), "") == 6  # grid points 1/30 .. 6/30 all passed
    assert len(pre) == 7


def test_the_bound_and_the_configuration_check():
    assert preroll_frames(0.1, 30) == 3  # not 4 (0.1 * 30 = 3.0000000000000004)
    assert preroll_frames(10, 30) == 300 and preroll_frames(0, 30) == 0
    assert preroll_frames(1 / 7, 30) == math.ceil(30 / 7)
    two = [StreamSize(640, 480), StreamSize(640, 480)]
    assert preroll_bound_bytes(60, 30, two) == 1800 * 2 * 640 * 480 * 3
    assert preroll_bound_bytes(1, 30, [StreamSize(640, 480, depth=True)]) == 30 * 640 * 480 * 5
    assert bound_refusal(10, 30, two, 1024) == ""  # 10 s of two 640x480: 527 MiB
    why = bound_refusal(60, 30, two, 1024)
    assert "recording.ring_s" in why and "recording.ring_max_mb" in why
    assert f"{1800 * 2 * 640 * 480 * 3 / MIB:.1f} MiB" in why and "1024 MiB" in why

    def cfg(ring_s, ring_max_mb=1024.0, **cam):
        return config_from_dict(
            {
                "recording": {"ring_s": ring_s, "ring_max_mb": ring_max_mb},
                "cameras": {"front": {"kind": "virtual", **cam}, "wrist": {"kind": "virtual", **cam}},
            }
        )

    assert cfg(0.0, 1.0).recording.ring_s == 0.0  # off: no bound to check
    assert cfg(10.0).recording.ring_s == 10.0
    with pytest.raises(ConfigError, match="recording.ring_max_mb = 1024 MiB") as exc:
        cfg(60.0)
    assert "3164.1 MiB" in str(exc.value) and "recording.ring_s: 60 s" in str(exc.value)
    assert cfg(60.0, 4096).recording.ring_max_mb == 4096
    assert cfg(60.0, width=160, height=120).recording.ring_s == 60.0  # small images fit
    with pytest.raises(ConfigError, match="recording.ring_s"):
        cfg(601.0)
    with pytest.raises(ConfigError, match="recording.ring_max_mb"):
        cfg(1.0, 0.0)
    d = config_from_dict({}).recording
    assert d.ring_s == 0.0 and d.ring_max_mb == 1024.0


def test_depth_counts_in_the_bound():
    with pytest.raises(ConfigError, match=r"640x480x5"):
        config_from_dict(
            {
                "recording": {"ring_s": 120.0},
                "cameras": {"rs": {"kind": "intelrealsense", "serial_number_or_name": "1", "use_depth": True}},
            }
        )
