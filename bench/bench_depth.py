"""What recording a RealSense's depth costs the writer per frame, beside its colour image.

The writer's own encoder (daemon/data/writer.CameraEncoder) on one thread, as in an episode:
``colour`` is the h264 encode (and sampled stats) of an HxWx3 frame; ``depth`` is LeRobot's
``quantize_depth`` to 12-bit codes plus its DepthEncoderConfig's lossless HEVC encode (and
sampled stats) of an HxWx1 uint16 map; ``quantize`` is LeRobot's quantiser alone. The frames are a
moving scene (a ramp and noise, as a depth sensor gives), so the codec has something to do.
Printed side by side, ms per frame (mean and p95 over the run, from the encoder's own clock).

    .venv/bin/python bench/bench_depth.py                       # 640x480, 90 frames
    .venv/bin/python bench/bench_depth.py --width 848 --height 480 --frames 150
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def scenes(n: int, height: int, width: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    x = np.linspace(300.0, 3000.0, width)[None, :]
    colour, depth = [], []
    for i in range(n):
        d = x + 200.0 * np.sin(np.arange(height) / 40.0 + i / 10.0)[:, None] + rng.normal(0, 4, (height, width))
        depth.append(np.clip(d, 0, 65535).astype(np.uint16)[..., None])
        c = rng.integers(0, 40, (height, width, 3), dtype=np.uint8)
        c[..., 0] += (np.arange(width) * 200 // width).astype(np.uint8)[None, :]
        colour.append(np.roll(c, i * 3, axis=1))
    return colour, depth


def encode_ms(frames: list[np.ndarray], depth: bool, root: Path, fps: int) -> float:
    from daemon.data.store import StoreConfig
    from daemon.data.writer import CameraEncoder

    enc = CameraEncoder(
        root / ("depth" if depth else "colour") / "video.mp4", fps, StoreConfig(root=str(root)), depth=depth
    )
    enc.start()
    t0 = time.perf_counter()
    for f in frames:
        enc.feed(f)
    enc.finish()
    return (time.perf_counter() - t0) * 1000.0 / len(frames)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--frames", type=int, default=90)
    ap.add_argument("--fps", type=int, default=30)
    args = ap.parse_args()
    import av
    from lerobot.configs.video import DepthEncoderConfig
    from lerobot.datasets.depth_utils import quantize_depth

    av.logging.set_level(av.logging.ERROR)
    colour, depth = scenes(args.frames, args.height, args.width)
    enc = DepthEncoderConfig()
    q = []
    for d in depth:
        t0 = time.perf_counter()
        quantize_depth(d, depth_min=enc.depth_min, depth_max=enc.depth_max, shift=enc.shift, use_log=enc.use_log)
        q.append((time.perf_counter() - t0) * 1000.0)
    with tempfile.TemporaryDirectory(prefix="so101d-depth-bench-") as d:
        root = Path(d)
        encode_ms(colour[:5], False, root / "warm", args.fps)  # imports, codec setup
        encode_ms(depth[:5], True, root / "warm", args.fps)
        colour_ms = encode_ms(colour, False, root / "run", args.fps)
        depth_ms = encode_ms(depth, True, root / "run", args.fps)
        sizes = {k: (root / "run" / k / "video.mp4").stat().st_size for k in ("colour", "depth")}
    budget = 1000.0 / args.fps
    print(f"{args.width}x{args.height}, {args.frames} frames, one encoder thread each, {os.cpu_count()} cores")
    print(f"{'':14}{'colour (h264)':>16}{'depth (HEVC lossless)':>24}{'quantize_depth':>16}")
    print(f"{'ms / frame':14}{colour_ms:>16.2f}{depth_ms:>24.2f}{float(np.mean(q)):>16.2f}")
    print(f"{'p95 quantize':14}{'':>16}{'':>24}{float(np.percentile(q, 95)):>16.2f}")
    print(
        f"{'of a period':14}{colour_ms / budget:>15.0%} {depth_ms / budget:>23.0%} {float(np.mean(q)) / budget:>15.0%}"
    )
    print(f"{'kB / frame':14}{sizes['colour'] / 1000 / args.frames:>16.1f}{sizes['depth'] / 1000 / args.frames:>24.1f}")


if __name__ == "__main__":
    main()
