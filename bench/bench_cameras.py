"""What adding cameras costs the loop: jitter p99 recording with two 640x480 camera sources vs none.

One run, one process, the same 100 Hz loop thread (bench_recording.Loop, synthetic follower
states) and Recorder.on_cycle every cycle, two phases, interleaved over ``--rounds``:

- ``none``     recording an episode without cameras;
- ``cameras``  recording an episode from two real-camera paths: LeRobot's OpenCV camera on named
               pipes fed 640x480 YUV4MPEG2 at 30 fps by child processes (tests/cameras_support.py;
               the feeders' CPU is part of the cost, as a real camera's USB interrupts would be).

Printed: loop period p99 / max deviation from 10 ms, hook cost p99, frames missing, per phase;
then the difference and the ratio. Usage:

    .venv/bin/python bench/bench_cameras.py                 # 2 rounds x 10 s per phase
    .venv/bin/python bench/bench_cameras.py --rounds 4 --episode-s 30
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
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENCV_FFMPEG_CAPTURE_OPTIONS", "probesize;65536|analyzeduration;0")

from bench_recording import PERIOD_S, Loop


def record_phase(root: Path, cameras: list, episode_s: float) -> dict:
    from daemon.data.recorder import Recorder, RecorderConfig
    from daemon.data.schema import read_episode_tags

    rec = Recorder(RecorderConfig(root=str(root)), cameras)
    rec.open()
    rec.wait_ready(300)
    loop = Loop(lambda now, s: rec.on_cycle(now, s, s, s))
    loop.start()
    try:
        deadline = time.monotonic() + 60
        while any(getattr(c, "state", "streaming") != "streaming" for c in cameras):
            if time.monotonic() > deadline:
                raise SystemExit(f"cameras did not open: {[c.stats() for c in cameras]}")
            time.sleep(0.1)
        rec.start_episode("bench")
        loop.measuring = True
        time.sleep(episode_s)
        loop.measuring = False
        rec.save_episode(True)
        rec.wait_saved(600)
    finally:
        loop.stop()
        rec.close()
    tags = read_episode_tags(root)
    return {
        "periods": list(loop.periods),
        "costs": list(loop.costs),
        "frames": sum(t.frames for t in tags.values()),
        "missing": sum(t.missing_frames for t in tags.values()),
    }


def summarize(runs: list[dict]) -> dict:
    dev = np.abs(np.concatenate([r["periods"] for r in runs]) - PERIOD_S) * 1e3
    costs = np.concatenate([r["costs"] for r in runs])
    return {
        "jitter_p99_ms": float(np.percentile(dev, 99)),
        "jitter_max_ms": float(dev.max()),
        "hook_p99_us": float(np.percentile(costs, 99) * 1e6),
        "frames": sum(r["frames"] for r in runs),
        "missing": sum(r["missing"] for r in runs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episode-s", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2, help="none/cameras pairs, interleaved")
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    a = ap.parse_args()
    from cameras_support import PipeCamera

    from drivers.camera_lerobot import LeRobotCamera
    from drivers.cameras import CameraConfig

    runs: dict[str, list[dict]] = {"none": [], "cameras": []}
    with tempfile.TemporaryDirectory(prefix="bench-cameras-") as d:
        tmp = Path(d)
        for i in range(a.rounds):  # interleaved: a machine whose load drifts weighs on both alike
            runs["none"].append(record_phase(tmp / f"none-{i}", [], a.episode_s))
            sources = [PipeCamera(tmp / f"{n}-{i}", width=a.width, height=a.height).plug() for n in ("front", "wrist")]
            try:
                cams = [
                    LeRobotCamera(CameraConfig(n, device=str(s.path), width=a.width, height=a.height, fps=30))
                    for n, s in zip(("front", "wrist"), sources)
                ]
                runs["cameras"].append(record_phase(tmp / f"cameras-{i}", cams, a.episode_s))
            finally:
                for s in sources:
                    s.unplug()
    results = {k: summarize(v) for k, v in runs.items()}
    print(
        f"loop 100 Hz, {a.rounds} x {a.episode_s:g} s episodes per phase (interleaved), cameras {a.width}x{a.height} @ 30 fps (two)"
    )
    print(f"{'phase':<10}{'jitter p99 ms':>15}{'jitter max ms':>15}{'hook p99 us':>13}{'frames':>8}{'missing':>9}")
    for name, r in results.items():
        print(
            f"{name:<10}{r['jitter_p99_ms']:>15.3f}{r['jitter_max_ms']:>15.3f}{r['hook_p99_us']:>13.1f}"
            f"{r['frames']:>8}{r['missing']:>9}"
        )
    none, cams_r = results["none"], results["cameras"]
    print(
        f"two cameras vs none: jitter p99 {cams_r['jitter_p99_ms'] - none['jitter_p99_ms']:+.3f} ms "
        f"(x{cams_r['jitter_p99_ms'] / max(none['jitter_p99_ms'], 1e-9):.2f}), "
        f"hook p99 x{cams_r['hook_p99_us'] / max(none['hook_p99_us'], 1e-9):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
