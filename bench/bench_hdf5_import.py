"""Import throughput and peak memory of `so101d import-hdf5` on a many-demo LeIsaac file.

Side by side in one run, each in a fresh subprocess (peak RSS is per process):
  - ours:  daemon.data.isaaclab_hdf5.import_hdf5 (streams demo by demo, chunk by chunk), with the
           CLI's progress bar, every step kept (--skip-frames 0 --min-frames 0) so both read the same rows
  - naive: what LeIsaac's converter does: np.array() of each demo's whole datasets, then the
           same LeRobotDataset add_frame / save_episode calls (no resampling).
Prints frames/s and peak RSS for both and the ratios.

    .venv/bin/python bench/bench_hdf5_import.py [--demos 200] [--steps 120] [--height 120 --width 160]
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


def make_file(path: Path, demos: int, steps: int, height: int, width: int) -> None:
    import h5py
    import numpy as np

    from calibration.conventions import units_to_sim_rad

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for i in range(demos):
            t = np.arange(steps) / 60.0
            units = np.stack(
                [30 * np.sin(t + i), 20 * np.cos(t), 10 * t, -5 * t, 40 * np.sin(2 * t), 50 + 40 * np.sin(t)], 1
            )
            rad = units_to_sim_rad(units).astype(np.float32)
            g = data.create_group(f"demo_{i}")
            g.create_dataset("actions", data=rad, compression="lzf")
            obs = g.create_group("obs")
            obs.create_dataset("joint_pos", data=rad, compression="lzf")
            base = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
            frames = np.repeat(base[None], steps, axis=0)
            frames[:, : height // 4] = (np.arange(steps) % 255)[:, None, None, None]
            for cam in ("front", "wrist"):
                obs.create_dataset(cam, data=frames, compression="lzf", chunks=(1, height, width, 3))
            g.attrs["num_samples"] = steps
            g.attrs["success"] = True


def run_ours(src: str, root: str) -> dict:
    from daemon.apps.commands.import_hdf5 import RichImportProgress
    from daemon.data.isaaclab_hdf5 import import_hdf5

    t0 = time.monotonic()
    # as the CLI runs it (progress bar on stderr), every step kept so both sides read the same rows
    s = import_hdf5([Path(src)], Path(root), task="bench", progress=RichImportProgress(), skip_frames=0, min_frames=0)
    return {"frames": s.frames_written, "seconds": time.monotonic() - t0}


def run_naive(src: str, root: str) -> dict:
    import h5py
    import numpy as np
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from calibration.conventions import sim_rad_to_units
    from daemon.data.schema import ROBOT_TYPE, TAG_KEY, EpisodeTag, dataset_features, tag_to_cell

    t0 = time.monotonic()
    frames = 0
    with h5py.File(src, "r") as f:
        names = sorted(f["data"].keys(), key=lambda n: int(n.split("_")[1]))
        cams = {c: tuple(f["data"][names[0]]["obs"][c].shape[1:3]) for c in ("front", "wrist")}
        ds = LeRobotDataset.create(
            "local/naive",
            fps=30,
            features=dataset_features(cams),
            root=root,
            robot_type=ROBOT_TYPE,
            use_videos=True,
            rgb_encoder=RGBEncoderConfig(vcodec="h264", preset="ultrafast", crf=23, g=2),
        )
        for name in names:
            g = f["data"][name]
            actions = np.array(g["actions"])
            joint = np.array(g["obs/joint_pos"])
            front = np.array(g["obs/front"])
            wrist = np.array(g["obs/wrist"])
            a_u = sim_rad_to_units(actions.astype(np.float64)).astype(np.float32)
            j_u = sim_rad_to_units(joint.astype(np.float64)).astype(np.float32)
            tag = tag_to_cell(EpisodeTag(ds.num_episodes, origin="import", follower_kind="hdf5", frames=len(actions)))
            for k in range(len(actions)):
                ds.add_frame(
                    {
                        "observation.state": j_u[k],
                        "action": a_u[k],
                        "teleop.action": a_u[k],
                        "observation.images.front": front[k],
                        "observation.images.wrist": wrist[k],
                        TAG_KEY: tag,
                        "task": "bench",
                    }
                )
                frames += 1
            ds.save_episode()
        ds.finalize()
    return {"frames": frames, "seconds": time.monotonic() - t0}


def child(mode: str, src: str, root: str) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = (run_ours if mode == "ours" else run_naive)(src, root)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def measure(mode: str, src: Path, root: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(src), str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{mode} run failed:\n{out.stderr[-3000:]}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demos", type=int, default=200)
    ap.add_argument("--steps", type=int, default=120, help="sim steps per demo (60 Hz)")
    ap.add_argument("--height", type=int, default=120)
    ap.add_argument("--width", type=int, default=160)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="so101d-bench-hdf5-") as tmp:
        src = Path(tmp) / "demos.hdf5"
        make_file(src, args.demos, args.steps, args.height, args.width)
        size_mb = src.stat().st_size / 1e6
        ours = measure("ours", src, Path(tmp) / "ours")
        naive = measure("naive", src, Path(tmp) / "naive")
    print(
        f"file: {args.demos} demos x {args.steps} steps @60 Hz, 2 cameras {args.height}x{args.width}, {size_mb:.0f} MB"
    )
    print(f"{'':8}{'frames':>8}{'seconds':>10}{'frames/s':>10}{'peak RSS MB':>13}")
    for name, r in (("ours", ours), ("naive", naive)):
        print(
            f"{name:8}{r['frames']:>8}{r['seconds']:>10.1f}{r['frames'] / r['seconds']:>10.0f}{r['peak_rss_mb']:>13.0f}"
        )
    print("ours writes 30 fps frames (60 Hz resampled); naive writes every 60 Hz step into a 30 fps dataset.")
    print(
        f"ratio ours/naive: time per source demo {ours['seconds'] / naive['seconds']:.2f}x, "
        f"peak memory {ours['peak_rss_mb'] / naive['peak_rss_mb']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
