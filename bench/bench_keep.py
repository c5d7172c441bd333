"""Keep the last N seconds (`episode keep --last S`): the loop's timing while kept rows are flushed.

One process, the recorder and its writer process as the daemon runs them, a 100 Hz loop thread
(synthetic follower states, bench/bench_recording.py's) and two virtual cameras drawn from the
state. With ``[recording] ring_s`` = --ring-s the pre-roll buffer fills; then, interleaved, for
--rounds rounds: ``keep --last`` --keep-s and the window while its rows go to the writer and the
episode records live ("with flush", until the feeder has handed every kept row over, at least
--window-s), saved; then an episode started as usual and recorded live for as long ("without":
the same live recording and encoding, no flush), saved; the buffer refills before the next round.
``--realtime-priority N`` runs the loop thread SCHED_FIFO N, as the daemon's ``[control]
realtime_priority`` does (docs/service.md: what a busy workstation needs for sub-ms jitter).

Printed: the loop period's p99 / max deviation from 10 ms in both kinds of window and their
difference, the hook's cost p99, how far each kept episode's frame 0 is from ``keep_s`` before the
verb (in frames), frames without their image, and the process's resident memory over its value
before the buffer filled against the buffer's stated bound. Usage:

    .venv/bin/python bench/bench_keep.py                                # 60 s of two 640x480, keep 30
    .venv/bin/python bench/bench_keep.py --ring-s 10 --keep-s 5 --rounds 1 --width 320 --height 240
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_recording import Loop, make_cameras  # the bench's own loop and cameras

FPS = 30


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def p99_dev_ms(periods: list[float]) -> tuple[float, float]:
    dev = np.abs(np.asarray(periods) - 0.01) * 1000
    return float(np.percentile(dev, 99)), float(dev.max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ring-s", type=float, default=60.0)
    ap.add_argument("--keep-s", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--realtime-priority", type=int, default=0, help="the loop thread SCHED_FIFO (0: off)")
    a = ap.parse_args()

    from daemon.config.ring_bound import MIB, StreamSize, preroll_bound_bytes
    from daemon.data.recorder import Recorder, RecorderConfig
    from daemon.data.schema import read_episode_tags

    bound = preroll_bound_bytes(a.ring_s, FPS, [StreamSize(a.width, a.height)] * 2)
    root = Path(tempfile.mkdtemp(prefix="so101d-bench-keep-")) / "ds"
    rec = Recorder(
        RecorderConfig(root=str(root), fps=FPS, ring_s=a.ring_s, ring_max_mb=bound / MIB + 1),
        make_cameras(a.width, a.height),
    )
    rec.open()
    rec.wait_ready(300)
    loop = Loop(lambda now, s: rec.on_cycle(now, s, s, s), realtime_priority=a.realtime_priority)
    loop.start()
    time.sleep(2.0)  # the cameras streaming, the buffer just begun
    rss0 = rss_bytes()
    peak = rss0
    max_frames = rec.status()["preroll"]["max_frames"]

    def wait_full() -> None:
        nonlocal peak
        while rec.status()["preroll"]["frames"] < max_frames:
            peak = max(peak, rss_bytes())
            time.sleep(0.2)

    print(f"filling the buffer: {a.ring_s:g} s of two {a.width}x{a.height} cameras (bound {bound / MIB:.0f} MiB)")
    wait_full()
    without: list[float] = []
    with_flush: list[float] = []
    costs_without: list[float] = []
    costs_with: list[float] = []
    starts: list[tuple[float, float]] = []  # (keep asked at, seconds)
    for r in range(a.rounds):
        loop.periods, loop.costs = [], []
        loop.measuring = True
        t_keep = time.monotonic()
        kept = rec.keep_episode(a.keep_s, task="bench keep")
        starts.append((t_keep, kept["kept_s"]))
        t_flush = time.monotonic()
        while True:
            st = rec.status()
            peak = max(peak, rss_bytes())
            if (st["kept"] or {}).get("flush_left", 0) == 0 and time.monotonic() - t_flush >= a.window_s:
                break
            time.sleep(0.2)
        flush_s = time.monotonic() - t_flush
        loop.measuring = False
        with_flush += loop.periods
        costs_with += loop.costs
        saved = rec.save_episode(True)
        rec.wait_saved(600)
        # the same live recording for as long, started as usual: no flush
        rec.start_episode(task="bench live")
        loop.periods, loop.costs = [], []
        loop.measuring = True
        end = time.monotonic() + flush_s
        while time.monotonic() < end:
            peak = max(peak, rss_bytes())
            time.sleep(0.2)
        loop.measuring = False
        without += loop.periods
        costs_without += loop.costs
        live = rec.save_episode(True)
        print(
            f"round {r + 1}: kept {kept['kept_frames']} frames, flushed within {flush_s:.1f} s, "
            f"saved {saved['frames']} frames; then {live['frames']} frames recorded live without a flush"
        )
        rec.wait_saved(600)
        if r + 1 < a.rounds:
            wait_full()
    st = rec.status()
    loop.stop()
    rec.close()
    tags = read_episode_tags(root)
    pw, mw = p99_dev_ms(without)
    pf, mf = p99_dev_ms(with_flush)
    print(f"loop period deviation from 10 ms, without flush: p99 {pw:.3f} ms  max {mw:.3f} ms  ({len(without)} cycles)")
    print(
        f"loop period deviation from 10 ms, with flush:    p99 {pf:.3f} ms  max {mf:.3f} ms  ({len(with_flush)} cycles)"
    )
    print(f"p99 difference (with - without): {pf - pw:+.3f} ms")
    print(f"target: the flush adds <= 0.2 ms to the loop's p99: {'met' if pf - pw <= 0.2 else 'NOT met'}")
    print(
        f"hook cost p99: without {np.percentile(costs_without, 99) * 1e3:.3f} ms, "
        f"with flush {np.percentile(costs_with, 99) * 1e3:.3f} ms"
    )
    for i, (t_keep, _kept_s) in enumerate(starts):
        t0 = tags[2 * i].kept["grid_t0_s"]  # each round: the kept episode, then the live one
        off_frames = (t_keep - a.keep_s - t0) * FPS
        print(
            f"episode {i}: frame 0 at {t_keep - t0:.3f} s before the keep (asked {a.keep_s:g}): {off_frames:+.2f} frames"
        )
    print(
        f"frames without their image: {st['counters']['frames_without_pixels']}, "
        f"missing {sum(t.missing_frames for t in tags.values())}, late {sum(t.late_frames for t in tags.values())}"
    )
    print(
        f"memory: resident +{(peak - rss0) / MIB:.0f} MiB over the start (peak), "
        f"the buffer's bound {bound / MIB:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
