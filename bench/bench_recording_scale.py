"""Recording at scale, side by side: so101d's packed commit vs LeRobot 0.6.1's own save_episode,
on datasets of the same size.

so101d: episodes are staged as the writer process stages them (writer.CameraEncoder, rows,
timing, episode.json) and committed by DatasetStore, one after the other into one dataset, in this
process. Printed at the checkpoint episodes: save->durable time (the commit: the episode is on disk
and counted once it returns) and this process's RSS, each as a ratio to episode 1.

LeRobot: at each checkpoint the dataset so far is copied and, in a fresh process (one recording
session, as lerobot-record runs), LeRobot appends one episode the way its users do:
``LeRobotDataset.resume`` + ``add_frame`` per frame + ``save_episode`` + ``finalize`` (its data is
durable only after finalize, LR#2495). Printed: that time and the process's peak RSS.

Usage:
    .venv/bin/python bench/bench_recording_scale.py                  # 1000 episodes of 32x24 x 10 frames
    .venv/bin/python bench/bench_recording_scale.py --width 640 --height 480 --frames 300 \\
        --episodes 3 --checkpoints 1,2,3                             # the 10 s two-camera episode
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from daemon.data.schema import EpisodeTag, tag_to_cell

# LeRobot's writer gets the same per-frame tag column our store writes (same columns, fair race)
TAG_CELL = tag_to_cell(EpisodeTag(0, follower_kind="emulated"))


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


LEROBOT_CHILD = r"""
import json, resource, sys, time
import numpy as np
from lerobot.configs.video import RGBEncoderConfig
from lerobot.datasets.lerobot_dataset import LeRobotDataset
root, frames, h, w, tag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
t0 = time.perf_counter()
enc = RGBEncoderConfig(vcodec="h264", preset="ultrafast", crf=23, g=2)  # the codec so101d uses
ds = LeRobotDataset.resume("local/so101d", root=root, video_backend="pyav", rgb_encoder=enc, encoder_threads=1)
t1 = time.perf_counter()
for i in range(frames):
    img = np.full((h, w, 3), i % 255, np.uint8)
    ds.add_frame({"observation.state": np.zeros(6, np.float32), "action": np.zeros(6, np.float32),
                  "teleop.action": np.zeros(6, np.float32), "observation.images.front": img,
                  "observation.images.wrist": img, "so101d.episode": tag, "task": "pick the cube"})
t2 = time.perf_counter()
ds.save_episode()
ds.finalize()
t3 = time.perf_counter()
print(json.dumps({"resume_s": t1 - t0, "save_s": t3 - t2, "save_to_durable_s": (t3 - t2) + (t1 - t0),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def lerobot_append(root: Path, frames: int, h: int, w: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lr-scale-") as tmp:
        copy = Path(tmp) / "ds"
        shutil.copytree(root, copy)
        r = subprocess.run(
            [sys.executable, "-c", LEROBOT_CHILD, str(copy), str(frames), str(h), str(w), TAG_CELL],
            capture_output=True,
            text=True,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
            timeout=1800,
        )
        if r.returncode != 0:
            return {"error": (r.stderr or r.stdout)[-400:]}
        return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--checkpoints", default="1,100,500,1000")
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--height", type=int, default=24)
    ap.add_argument("--no-lerobot", action="store_true", help="skip LeRobot's side")
    args = ap.parse_args()

    import av

    av.logging.set_level(av.logging.ERROR)
    # imports the writer process does at start-up (writer_main), not part of any commit
    import datasets  # noqa: F401
    import test_recording_scale as helpers
    from lerobot.datasets.compute_stats import compute_episode_stats  # noqa: F401
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata  # noqa: F401
    from lerobot.datasets.video_utils import get_video_info  # noqa: F401

    from daemon.data.store import DatasetStore, StoreConfig

    checkpoints = sorted({int(c) for c in args.checkpoints.split(",") if int(c) <= args.episodes})
    tmp = Path(tempfile.mkdtemp(prefix="so101d-scale-"))
    root = tmp / "ds"
    cams = [("front", args.height, args.width), ("wrist", args.height, args.width)]
    store = DatasetStore(StoreConfig(root=str(root), fps=helpers.FPS, cameras=cams))
    store.repair()
    rows = []
    commit_s: list[float] = []
    print(
        f"{args.episodes} episodes of {args.frames} frames, two {args.width}x{args.height} cameras, dataset in {root}",
        flush=True,
    )
    try:
        for i in range(args.episodes):
            stage = helpers.stage_episode(store, i, args.frames)
            t0 = time.perf_counter()
            store.commit(stage)
            commit_s.append(time.perf_counter() - t0)
            n = i + 1
            if n in checkpoints:
                window = commit_s[max(0, n - 10) : n]  # the last (up to) 10 commits: less noise
                row = {"episode": n, "so101d_s": statistics.median(window), "so101d_rss_mb": rss_mb()}
                if not args.no_lerobot:
                    lr = lerobot_append(root, args.frames, args.height, args.width)
                    row["lerobot_s"] = lr.get("save_to_durable_s")
                    row["lerobot_rss_mb"] = lr.get("peak_rss_mb")
                    if "error" in lr:
                        print(f"  lerobot failed at episode {n}: {lr['error']}", flush=True)
                rows.append(row)
                print(
                    f"  episode {n}: so101d {row['so101d_s'] * 1000:.1f} ms"
                    + (f", lerobot {row['lerobot_s']:.3f} s" if row.get("lerobot_s") else ""),
                    flush=True,
                )
        store.release_ownership()
        files = {
            p: len(list(root.glob(p))) for p in ("data/*/*.parquet", "videos/*/*/*.mp4", "meta/episodes/*/*.parquet")
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(tmp / ".ds.so101d-staging", ignore_errors=True)

    base = rows[0]
    print("\nsave->durable (median of the last <=10 commits for so101d) and RSS, ratio to episode 1")
    print(
        f"{'episode':>8} {'so101d ms':>10} {'ratio':>6} {'RSS MB':>8} {'ratio':>6} | "
        f"{'LeRobot s':>10} {'ratio':>6} {'peak RSS MB':>12}"
    )
    for r in rows:
        lr = r.get("lerobot_s")
        lr_txt = (
            f"{lr:>10.3f} {lr / base['lerobot_s']:>6.2f} {r['lerobot_rss_mb']:>12.0f}"
            if lr and base.get("lerobot_s")
            else f"{'-':>10} {'-':>6} {'-':>12}"
        )
        print(
            f"{r['episode']:>8} {r['so101d_s'] * 1000:>10.1f} {r['so101d_s'] / base['so101d_s']:>6.2f} "
            f"{r['so101d_rss_mb']:>8.0f} {r['so101d_rss_mb'] / base['so101d_rss_mb']:>6.2f} | {lr_txt}"
        )
    if rows[-1].get("lerobot_s"):
        print(
            f"at episode {rows[-1]['episode']}: LeRobot / so101d save->durable = "
            f"{rows[-1]['lerobot_s'] / rows[-1]['so101d_s']:.1f}x"
        )
    print("files:", ", ".join(f"{k} {v}" for k, v in files.items()))


if __name__ == "__main__":
    main()
