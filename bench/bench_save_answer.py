"""How long `episode.save` takes to answer: on disk (durable) vs handed to the writer (before).

The same recorder, camera and episodes twice:

- ``handed``   the answer once the save is in the writer's shared-memory ring (what it was before:
               a power cut right after it lost the episode), ``save_durable_timeout_s = 0``;
- ``durable``  the answer once the writer has staged the episode and synced it to the disk (what
               a restart's repair commits from), the default.

Printed per mode: answer time p50 / p90 / max, how many answers said durable, and, for
``handed``, how long after its answer the episode actually reached the disk (the window a power
cut lost it in), and the commit's own time (what the answer does not wait for); then the ratio
durable / handed. Usage:

    .venv/bin/python bench/bench_save_answer.py [--episodes 8] [--episode-s 2.5] [--width 320 --height 240]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from daemon.data.recorder import Recorder, RecorderConfig
from drivers.cameras import Camera, CameraConfig, VirtualArmCamera


class Loop:
    """The control loop's call, 100 Hz, on its own thread (synthetic smooth joint motion)."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        nxt = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            state = 30.0 * np.sin(np.arange(6) + 0.7 * now)
            self.rec.on_cycle(now, state, state + 0.5, state + 0.25)
            nxt += 0.01
            time.sleep(max(0.0, nxt - time.monotonic()))


def run_mode(mode: str, args: argparse.Namespace, root: Path) -> dict[str, list[float]]:
    cams: list[Camera] = [VirtualArmCamera(CameraConfig("front", width=args.width, height=args.height))]
    cfg = RecorderConfig(root=str(root), min_free_mb=0)
    if mode == "handed":
        cfg.save_durable_timeout_s = 0.0
    rec = Recorder(cfg, cams)
    rec.open()
    rec.wait_ready(120)
    answer_ms: list[float] = []
    to_disk_ms: list[float] = []
    durable = 0
    staged_at: dict[int, float] = {}
    commit_ms: list[float] = []

    def on_event(m: dict[str, Any]) -> None:  # the writer's events, on the recorder's events thread
        if m.get("event") == "saved":
            commit_ms.append(1000 * float(m["commit_s"]))
        elif m.get("event") == "staged":
            staged_at.setdefault(int(m["episode_seq"]), time.monotonic())

    rec.add_listener(on_event)
    loop = Loop(rec)
    loop.t.start()
    try:
        for _ in range(args.episodes):
            rec.start_episode(f"bench {mode}")
            time.sleep(args.episode_s)  # the episode's length: what is being measured comes after
            seq = rec._seq
            t0 = time.monotonic()
            r = rec.save_episode(True)
            t1 = time.monotonic()
            answer_ms.append((t1 - t0) * 1000)
            durable += bool(r["durable"])
            deadline = time.monotonic() + 30
            while seq not in staged_at and time.monotonic() < deadline:
                time.sleep(0.001)
            if mode == "handed" and seq in staged_at:
                to_disk_ms.append(max(0.0, staged_at[seq] - t1) * 1000)
            rec.wait_saved(60)
    finally:
        loop.stop.set()
        loop.t.join(5)
        rec.close()
    return {"answer_ms": answer_ms, "to_disk_ms": to_disk_ms, "durable": [float(durable)], "commit_ms": commit_ms}


def pcts(v: list[float]) -> str:
    if not v:
        return "-"
    a = np.asarray(v)
    return f"p50 {np.percentile(a, 50):7.2f}  p90 {np.percentile(a, 90):7.2f}  max {a.max():7.2f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--episode-s", type=float, default=2.5)
    ap.add_argument("--width", type=int, default=320)
    ap.add_argument("--height", type=int, default=240)
    args = ap.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-save-") as d:
        for mode in ("handed", "durable"):
            results[mode] = run_mode(mode, args, Path(d) / mode)
    print(
        f"save answer: {args.episodes} episodes of {args.episode_s:g} s, one {args.width}x{args.height} camera, "
        f"{os.cpu_count()} CPUs"
    )
    for mode in ("handed", "durable"):
        r = results[mode]
        print(f"  {mode:<8} answer {pcts(r['answer_ms'])}   durable answers {int(r['durable'][0])}/{args.episodes}")
    print(f"  handed: on the disk after its answer {pcts(results['handed']['to_disk_ms'])} (lost by a power cut then)")
    both = results["handed"]["commit_ms"] + results["durable"]["commit_ms"]
    print(f"  the commit into the dataset, after the answer (both modes): {pcts(both)}")
    h = float(np.median(results["handed"]["answer_ms"]))
    dur = float(np.median(results["durable"]["answer_ms"]))
    print(f"  ratio durable/handed (p50): {dur / h:.1f}x  ({dur:.2f} ms vs {h:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
