"""Recording, side by side: so101d's recorder vs LeRobot 0.6.1's own add_frame/save_episode flow.

Each mode runs in its own subprocess (clean peak memory), with the same 100 Hz loop thread
(synthetic follower states), the same two virtual cameras (drawn from the state, 30 fps) and the
same episodes:

- ``baseline``   the loop and cameras, nothing recorded (the jitter floor of this machine now;
                 so101d also measures its own not-recording periods, interleaved with its episodes,
                 which is the fair "same loop without recording" on a machine whose load varies);
- ``so101d``     Recorder.on_cycle every cycle; save queues the episode (writer process, h264);
- ``lerobot``    what lerobot-record does: add_frame on the fps grid inside the loop (PNG images
                 through its AsyncImageWriter threads), save_episode blocking between episodes
                 (default codec libsvtav1, or --lerobot-vcodec), then finalize();
- ``lerobot-streaming``  the same with streaming_encoding=True.

Printed per mode: loop period p99/max deviation from 10 ms while recording, hook cost p99,
inter-episode gap (time the save call blocks), frames that are late / missing / dropped (video
shorter than the table), peak RSS of the process tree, and time until the data is on disk; then
ratios against LeRobot. Usage:

    .venv/bin/python bench/bench_recording.py                       # 2 x 10 s episodes, 640x480
    .venv/bin/python bench/bench_recording.py --episodes 10 --episode-s 60 --modes so101d   # 10 min
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PERIOD_S = 0.01


def state_at(t: float) -> np.ndarray:
    return np.array(
        [
            40 * np.sin(0.8 * t),
            20 + 15 * np.sin(0.5 * t),
            -30 + 20 * np.cos(0.6 * t),
            10 * np.sin(1.1 * t),
            90 * np.sin(0.3 * t),
            50 + 45 * np.sin(1.5 * t),
        ]
    )


class Loop:
    """100 Hz loop thread; ``hook(now, state)`` each cycle; periods measured while ``measuring``."""

    def __init__(self, hook, realtime_priority: int = 0) -> None:
        self.hook = hook
        self.realtime_priority = realtime_priority  # > 0: SCHED_FIFO, as [control] realtime_priority
        self.measuring = False
        self.measuring_idle = False
        self.idle_periods: list[float] = []
        self.periods: list[float] = []
        self.costs: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        sys.setswitchinterval(0.001)  # what the daemon's control loop sets (daemon/control/loop.py)
        self._t.start()

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)

    def _run(self) -> None:
        if self.realtime_priority > 0:
            from daemon.system.realtime import make_current_thread_realtime

            if not make_current_thread_realtime(self.realtime_priority):
                print(f"the loop thread stays SCHED_OTHER: SCHED_FIFO {self.realtime_priority} was refused")
        nxt = time.monotonic()
        last = None
        while not self._stop.is_set():
            now = time.monotonic()
            if last is not None and self.measuring:
                self.periods.append(now - last)
            elif last is not None and self.measuring_idle:
                self.idle_periods.append(now - last)
            last = now
            s = state_at(now)
            t0 = time.perf_counter()
            self.hook(now, s)
            if self.measuring:
                self.costs.append(time.perf_counter() - t0)
            nxt += PERIOD_S
            d = nxt - time.monotonic()
            if d > 0:
                time.sleep(d)
            else:
                nxt = time.monotonic()


class TreeMemory:
    """Peak RSS of this process and its children, sampled at 5 Hz."""

    def __init__(self) -> None:
        import psutil

        self.p = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for proc in [self.p, *self.p.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except Exception:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.2)

    def stop(self) -> int:
        self._stop.set()
        self._t.join(2)
        return self.peak


def make_cameras(w: int, h: int):
    from drivers.cameras import CameraConfig, VirtualArmCamera

    return [VirtualArmCamera(CameraConfig(n, width=w, height=h, fps=30)) for n in ("front", "wrist")]


def video_frames(path: Path, from_s: float = 0.0, to_s: float = float("inf")) -> int:
    """Decoded frames of one episode (LeRobot may append several episodes to one file)."""
    import av

    n = 0
    with av.open(str(path)) as c:
        for f in c.decode(video=0):
            t = float(f.pts * f.time_base)
            n += from_s - 1e-4 <= t < to_s - 1e-4
    return n


def episode_video_frames(ds, root: Path, e: int, key: str) -> int:
    ep = ds.meta.episodes[e]
    return video_frames(
        root / ds.meta.get_video_file_path(e, key), ep[f"videos/{key}/from_timestamp"], ep[f"videos/{key}/to_timestamp"]
    )


def run_baseline(a, root: Path) -> dict:
    cams = make_cameras(a.width, a.height)
    for c in cams:
        c.start()
    loop = Loop(lambda now, s: [c.set_state(s) for c in cams])
    mem = TreeMemory()
    loop.start()
    time.sleep(1.0)
    loop.measuring = True
    time.sleep(a.episodes * a.episode_s)
    loop.stop()
    for c in cams:
        c.stop()
    return {
        "periods": loop.periods,
        "costs": loop.costs,
        "gaps": [],
        "peak_rss": mem.stop(),
        "rows": 0,
        "late": 0,
        "missing": 0,
        "dropped": 0,
        "durable_s": 0.0,
    }


def run_so101d(a, root: Path) -> dict:
    from daemon.data.recorder import Recorder, RecorderConfig
    from daemon.data.schema import read_episode_tags

    rec = Recorder(RecorderConfig(root=str(root)), make_cameras(a.width, a.height))
    mem = TreeMemory()
    rec.open()
    rec.wait_ready(300)
    loop = Loop(lambda now, s: rec.on_cycle(now, s, s, s))
    loop.start()
    gaps = []
    for _i in range(a.episodes):
        loop.measuring_idle = True  # same process, same minutes, cameras on, not recording
        time.sleep(min(10.0, a.episode_s / 2))
        loop.measuring_idle = False
        rec.start_episode("bench")
        loop.measuring = True
        time.sleep(a.episode_s)
        t0 = time.perf_counter()
        rec.save_episode(True)
        gaps.append(time.perf_counter() - t0)
        loop.measuring = False
    t_last = time.monotonic()
    ok = rec.wait_saved(600)
    durable = time.monotonic() - t_last
    st = rec.status()
    loop.stop()
    rec.close()
    peak = mem.stop()
    tags = read_episode_tags(root)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/so101d", root=root)
    short = 0
    for e in range(ds.num_episodes):
        for key in ds.meta.video_keys:
            short += ds.meta.episodes[e]["length"] - episode_video_frames(ds, root, e, key)
    return {
        "periods": loop.periods,
        "idle_periods": loop.idle_periods,
        "costs": loop.costs,
        "gaps": gaps,
        "peak_rss": peak,
        "rows": int(ds.num_frames),
        "episodes": int(ds.num_episodes),
        "saved_ok": ok,
        "late": sum(t.late_frames for t in tags.values()),
        "missing": sum(t.missing_frames for t in tags.values()),
        "dropped": short + st["counters"]["records_lost"],
        "frames_without_pixels": st["counters"]["frames_without_pixels"],
        "worst_skew_ms": max((t.worst_camera_skew_ms for t in tags.values()), default=0.0),
        "durable_s": durable,
    }


def run_lerobot(a, root: Path, streaming: bool) -> dict:
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from daemon.data.schema import TAG_KEY, EpisodeTag, dataset_features, tag_to_cell

    cams = make_cameras(a.width, a.height)
    feats = dataset_features({c.name: (c.height, c.width) for c in cams})
    tag_cell = tag_to_cell(EpisodeTag(0, follower_kind="emulated"))  # the same column our store writes
    enc = RGBEncoderConfig(vcodec=a.lerobot_vcodec) if a.lerobot_vcodec else None
    mem = TreeMemory()
    ds = LeRobotDataset.create(
        "local/lerobot_bench",
        fps=30,
        features=feats,
        root=root,
        robot_type="so101_follower",
        use_videos=True,
        image_writer_threads=4 * len(cams),
        streaming_encoding=streaming,
        rgb_encoder=enc,
    )
    for c in cams:
        c.start()
    state = {"recording": False, "next": 0.0, "t0": 0.0, "k": 0, "late": 0, "missing": 0, "last_seq": {}}

    def hook(now: float, s: np.ndarray) -> None:
        for c in cams:
            c.set_state(s)
        if not state["recording"] or now < state["next"]:
            return
        if state["k"] == 0:
            state["t0"] = now
        if now - (state["t0"] + state["k"] / 30) > 1 / 60:
            state["late"] += 1
        frame = {
            "observation.state": s.astype(np.float32),
            "action": s.astype(np.float32),
            "teleop.action": s.astype(np.float32),
            TAG_KEY: tag_cell,
            "task": "bench",
        }
        for c in cams:
            f = c.latest_frame()
            if f is None:
                state["missing"] += 1
                continue
            frame[f"observation.images.{c.name}"] = f.pixels
        ds.add_frame(frame)
        state["k"] += 1
        state["next"] = state["t0"] + state["k"] / 30

    loop = Loop(hook)
    loop.start()
    time.sleep(0.5)
    gaps = []
    for _i in range(a.episodes):
        state.update(recording=True, k=0, next=0.0)
        loop.measuring = True
        time.sleep(a.episode_s)
        state["recording"] = False
        t0 = time.perf_counter()
        ds.save_episode()  # lerobot-record saves from its main loop: teleop waits for it
        gaps.append(time.perf_counter() - t0)
        loop.measuring = False
    t_last = time.monotonic()
    ds.finalize()
    durable = time.monotonic() - t_last
    loop.stop()
    for c in cams:
        c.stop()
    peak = mem.stop()
    ds2 = LeRobotDataset("local/lerobot_bench", root=root)
    short = 0
    for e in range(ds2.num_episodes):
        for key in ds2.meta.video_keys:
            short += ds2.meta.episodes[e]["length"] - episode_video_frames(ds2, root, e, key)
    return {
        "periods": loop.periods,
        "costs": loop.costs,
        "gaps": gaps,
        "peak_rss": peak,
        "rows": int(ds2.num_frames),
        "episodes": int(ds2.num_episodes),
        "late": state["late"],
        "missing": state["missing"],
        "dropped": short,
        "durable_s": durable,
    }


def one(mode: str, a) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-rec-{mode}-"))
    try:
        root = tmp / "ds"
        if mode == "baseline":
            return run_baseline(a, root)
        if mode == "so101d":
            return run_so101d(a, root)
        return run_lerobot(a, root, streaming=mode == "lerobot-streaming")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def summarize(r: dict) -> dict:
    dev = np.abs(np.array(r["periods"]) - PERIOD_S) * 1000 if r["periods"] else np.zeros(1)
    costs = np.array(r["costs"]) * 1e6 if r["costs"] else np.zeros(1)
    idle = np.abs(np.array(r.get("idle_periods") or [PERIOD_S]) - PERIOD_S) * 1000
    return {
        "jitter_p99_ms": float(np.percentile(dev, 99)),
        "jitter_max_ms": float(dev.max()),
        "idle_jitter_p99_ms": float(np.percentile(idle, 99)) if r.get("idle_periods") else None,
        "hook_p99_us": float(np.percentile(costs, 99)),
        "gap_max_s": max(r["gaps"]) if r["gaps"] else 0.0,
        "rows": r.get("rows", 0),
        "late": r["late"],
        "missing": r["missing"],
        "dropped": r["dropped"],
        "peak_rss_mb": r["peak_rss"] / 2**20,
        "durable_s": r["durable_s"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--episode-s", type=float, default=10.0)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--modes", default="baseline,so101d,lerobot,lerobot-streaming")
    ap.add_argument("--lerobot-vcodec", default="", help="LeRobot's codec (default: its own default, libsvtav1)")
    ap.add_argument("--run-one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run_one:
        print("RESULT " + json.dumps(summarize(one(a.run_one, a))), flush=True)
        return 0
    results: dict[str, dict] = {}
    for mode in a.modes.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--run-one",
            mode,
            "--episodes",
            str(a.episodes),
            "--episode-s",
            str(a.episode_s),
            "--width",
            str(a.width),
            "--height",
            str(a.height),
        ]
        if a.lerobot_vcodec:
            cmd += ["--lerobot-vcodec", a.lerobot_vcodec]
        print(f"running {mode} ...", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            err = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith(" ")]
            print(f"{mode} FAILED: {err[-1] if err else 'no output'}")
            continue
        results[mode] = json.loads(line[7:])
    cols = [
        "jitter_p99_ms",
        "idle_jitter_p99_ms",
        "jitter_max_ms",
        "hook_p99_us",
        "gap_max_s",
        "rows",
        "late",
        "missing",
        "dropped",
        "peak_rss_mb",
        "durable_s",
    ]
    print(
        f"{a.episodes} episodes x {a.episode_s:.0f} s, two {a.width}x{a.height} cameras at 30 fps, 100 Hz loop, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'mode':<18}" + "".join(f"{c:>15}" for c in cols))
    for mode, r in results.items():
        print(
            f"{mode:<18}"
            + "".join(
                f"{r[c]:>15.3f}" if isinstance(r[c], float) else f"{r[c] if r[c] is not None else '-'!s:>15}"
                for c in cols
            )
        )
    ours = results.get("so101d")
    if ours:
        if ours.get("idle_jitter_p99_ms") is not None:
            print(
                f"so101d jitter p99 recording minus not recording (same run, interleaved): "
                f"{ours['jitter_p99_ms'] - ours['idle_jitter_p99_ms']:+.3f} ms (target: within 0.5 ms)"
            )
        if "baseline" in results:
            print(
                f"so101d jitter p99 minus baseline run: {ours['jitter_p99_ms'] - results['baseline']['jitter_p99_ms']:+.3f} ms"
            )
        for ref in ("lerobot", "lerobot-streaming"):
            if ref in results:
                r = results[ref]
                ratio = lambda k: (r[k] / ours[k]) if ours[k] else float("inf")  # noqa: E731
                print(
                    f"{ref}/so101d: inter-episode gap x{ratio('gap_max_s'):.0f}, jitter p99 x{ratio('jitter_p99_ms'):.1f}, "
                    f"peak RSS x{ratio('peak_rss_mb'):.2f}; dropped {r['dropped']} vs {ours['dropped']}, "
                    f"late {r['late']} vs {ours['late']}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
