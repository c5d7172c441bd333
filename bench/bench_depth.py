"""What recording a RealSense's depth costs the writer per frame, beside its colour image, and
what x265's settings change in it.

The writer's own encoder (daemon/data/writer.CameraEncoder) on one thread, as in an episode:
``colour`` is the h264 encode (and sampled stats) of an HxWx3 frame; each depth row is LeRobot's
``quantize_depth`` to 12-bit codes plus a lossless HEVC encode (and sampled stats) of an HxWx1
uint16 map, with one set of x265 settings given through LeRobot's DepthEncoderConfig (its
``preset``, ``frame-threads`` in its x265-params); ``quantize_depth alone`` is LeRobot's quantiser.
The frames are a moving scene (a ramp and noise, as a depth sensor gives), so the codec has
something to do. Every setting runs ``--rounds`` times, interleaved (a load spike from elsewhere
on the machine hits one run, not one setting), and its best run is printed: ms per frame from
the first frame fed to the encoder's end. Each depth video is decoded back and checked: the
12-bit codes that differ from quantize_depth's (lossless: 0), the worst error in millimetres, the
pixels beyond half a code plus the decoder's rounding, and that no frame is reordered (B-frames).

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


def encode_ms(frames: list[np.ndarray], depth: bool, root: Path, fps: int, encoder: object = None) -> float:
    from daemon.data.store import StoreConfig
    from daemon.data.writer import CameraEncoder

    enc = CameraEncoder(
        root / ("depth" if depth else "colour") / "video.mp4", fps, StoreConfig(root=str(root)), depth, encoder
    )
    enc.start()
    t0 = time.perf_counter()
    for f in frames:
        enc.feed(f)
    enc.finish()
    return (time.perf_counter() - t0) * 1000.0 / len(frames)


def depth_variants() -> dict[str, object]:
    """x265 settings through LeRobot's DepthEncoderConfig (its ``preset`` field, its
    ``extra_options`` x265-params ``frame-threads``), each the store's own
    (daemon/data/store.depth_encoder_config: lossless=1, bframes=0) with another preset or
    frame-threads; ``preset default`` is LeRobot's (none given: x265's medium), so101d's before."""
    from lerobot.configs.video import DepthEncoderConfig

    from daemon.data.store import StoreConfig

    ours = StoreConfig(root="/nonexistent").depth_encoder_config()

    def with_(preset: str | None, extra_params: str = "") -> DepthEncoderConfig:
        params = str(ours.extra_options["x265-params"]) + (f":{extra_params}" if extra_params else "")
        return DepthEncoderConfig(preset=preset, extra_options={**ours.extra_options, "x265-params": params})

    return {
        "preset default": with_(None),  # LeRobot's DepthEncoderConfig leaves it to x265 (medium)
        "superfast": with_("superfast"),
        f"{ours.preset} (so101d)": ours,
        f"{ours.preset} ft=1": with_(ours.preset, "frame-threads=1"),
        f"{ours.preset} ft=2": with_(ours.preset, "frame-threads=2"),
    }


def round_trip(path: Path, depth: list[np.ndarray], encoder: object) -> tuple[int, float, int, bool]:
    """For one video: 12-bit codes that differ from quantize_depth's (0: lossless), the worst error
    in mm, the pixels over the bound (half a code plus the decoder's rounding to whole mm, inside
    depth_min..depth_max), and whether decode order is display order (no B-frames)."""
    import math

    import av
    from lerobot.configs.video import DEPTH_QMAX
    from lerobot.datasets.depth_utils import dequantize_depth, quantize_depth

    e = encoder
    kw = dict(depth_min=e.depth_min, depth_max=e.depth_max, shift=e.shift, use_log=e.use_log)  # type: ignore[attr-defined]
    wrong = 0
    worst_mm = 0.0
    over = 0
    half_code = (math.log(e.depth_max + e.shift) - math.log(e.depth_min + e.shift)) / DEPTH_QMAX / 2  # type: ignore[attr-defined]
    with av.open(str(path)) as c:
        packets = [p.pts for p in c.demux(video=0) if p.pts is not None]
    with av.open(str(path)) as c:
        decoded = [f.to_ndarray() for f in c.decode(video=0)]
    assert len(decoded) == len(depth), (len(decoded), len(depth))
    for d, got in zip(depth, decoded):
        codes = quantize_depth(d, video_backend=None, **kw)
        got = got.reshape(codes.shape)
        wrong += int(np.count_nonzero(got != codes))
        back = dequantize_depth(got, output_tensor=False, output_channel_last=True, **kw).astype(np.float64)
        truth = d.astype(np.float64)
        inside = (truth >= e.depth_min * 1000) & (truth <= e.depth_max * 1000)  # type: ignore[attr-defined]
        allowed = (truth / 1000.0 + e.shift) * math.expm1(half_code) * 1000.0 + 0.5  # type: ignore[attr-defined]
        err = np.abs(back - truth)
        worst_mm = max(worst_mm, float(err[inside].max()))
        over += int(np.count_nonzero((err > allowed)[inside]))
    no_reorder = packets == sorted(packets)
    return wrong, worst_mm, over, no_reorder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--frames", type=int, default=90)
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each setting, interleaved; the best is shown")
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
    variants = depth_variants()
    runs: dict[str, list[float]] = {name: [] for name in ("colour", *variants)}
    checks: dict[str, tuple[int, float, int, bool]] = {}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="so101d-depth-bench-") as d:
        root = Path(d)
        encode_ms(colour[:5], False, root / "warm", args.fps)  # imports, codec setup
        encode_ms(depth[:5], True, root / "warm", args.fps)
        for r in range(args.rounds):  # interleaved: a load spike from elsewhere hits one run, not one setting
            runs["colour"].append(encode_ms(colour, False, root / f"colour{r}", args.fps))
            sizes["colour"] = (root / f"colour{r}" / "colour" / "video.mp4").stat().st_size
            for i, (name, encoder) in enumerate(variants.items()):
                where = root / f"v{i}r{r}"
                runs[name].append(encode_ms(depth, True, where, args.fps, encoder))
                video = where / "depth" / "video.mp4"
                sizes[name] = video.stat().st_size
                if r == 0:
                    checks[name] = round_trip(video, depth, encoder)
    budget = 1000.0 / args.fps
    best = {k: min(v) for k, v in runs.items()}
    print(
        f"{args.width}x{args.height}, {args.frames} frames, one encoder thread each, {os.cpu_count()} cores, "
        f"best of {args.rounds} interleaved runs"
    )
    print(
        f"colour (h264): {best['colour']:.2f} ms / frame ({best['colour'] / budget:.0%} of a period), "
        f"{sizes['colour'] / 1000 / args.frames:.1f} kB / frame"
    )
    print(f"quantize_depth alone: {float(np.mean(q)):.2f} ms / frame (p95 {float(np.percentile(q, 95)):.2f})")
    print(
        f"{'depth (HEVC lossless)':24}{'ms / frame':>11}{'of a period':>12}{'kB / frame':>11}"
        f"{'codes off':>10}{'worst mm':>9}{'over bound':>11}{'B-frames':>9}"
    )
    for name in variants:
        wrong, worst, over, in_order = checks[name]
        print(
            f"{name:24}{best[name]:>11.2f}{best[name] / budget:>12.0%}{sizes[name] / 1000 / args.frames:>11.1f}"
            f"{wrong:>10}{worst:>9.2f}{over:>11}{'none' if in_order else 'YES':>9}"
        )
    base = best["preset default"]
    for name in variants:
        if name != "preset default":
            print(f"{name} / preset default: {best[name] / base:.2f}x ms per frame")


if __name__ == "__main__":
    main()
