"""Throughput and peak memory of `so101d dataset check` on a many-episode dataset.

The dataset (default 200 episodes of 90 frames, no cameras: the check reads tables, not video)
is written once by the real DatasetStore (tests/dataset_support.py). Then, side by side in one
run, each in a fresh subprocess (peak RSS is per process):
  - ours:  daemon.data.check.check_dataset (the data parquet read column-wise, file by file)
  - naive: the same per-episode arrays read through LeRobotDataset (hf_dataset, one episode at a
           time), as a script built on LeRobot's loader would, without any checking
Prints episodes/s and peak RSS for both and the ratios.

    .venv/bin/python bench/bench_dataset_check.py [--episodes 200] [--frames 90]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def child(which: str, root: str) -> None:
    t0 = time.perf_counter()
    if which == "ours":
        from daemon.data.check import check_dataset

        n = len(check_dataset(Path(root)))
    else:
        import numpy as np
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        ds = LeRobotDataset(f"local/{Path(root).name}", root=root)
        n = 0
        hf = ds.hf_dataset.with_format("numpy")
        for e in ds.meta.episodes:
            rows = hf[int(e["dataset_from_index"]) : int(e["dataset_to_index"])]
            np.isfinite(rows["observation.state"]).all()
            n += 1
    dt = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"episodes": n, "seconds": dt, "peak_rss_mb": peak_mb}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--frames", type=int, default=90)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dataset_support import Ep, make_dataset

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bench_check"
        t0 = time.perf_counter()
        make_dataset(root, [Ep(frames=a.frames) for _ in range(a.episodes)])
        print(f"dataset: {a.episodes} episodes x {a.frames} frames written in {time.perf_counter() - t0:.1f} s")
        res = {}
        for which in ("ours", "naive"):
            p = subprocess.run(
                [sys.executable, __file__, "--child", which, str(root)], capture_output=True, text=True, check=True
            )
            res[which] = json.loads(p.stdout.strip().splitlines()[-1])
            r = res[which]
            print(
                f"{which:6s} {r['episodes']} episodes in {r['seconds']:.2f} s = "
                f"{r['episodes'] / r['seconds']:.1f} episodes/s, peak RSS {r['peak_rss_mb']:.0f} MB"
            )
        o, n = res["ours"], res["naive"]
        print(
            f"ratio  ours/naive: {(o['episodes'] / o['seconds']) / (n['episodes'] / n['seconds']):.2f}x episodes/s, "
            f"{o['peak_rss_mb'] / n['peak_rss_mb']:.2f}x peak RSS"
        )


if __name__ == "__main__":
    main()
