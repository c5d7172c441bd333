"""LeIsaac bridge benchmark on the CPU fake env (``tests/fixtures/leisaac_env.py``, LeIsaac's
step/reset contract; no Isaac Sim):

1. Real time: the bridge served at the env's step rate (1 / step_dt = 60 Hz) to a SimFollower (the
   daemon's driver) writing targets at 100 Hz and at 500 Hz, plus its 20 ms heartbeats: steps per
   second side by side with the step rate (the target: within 1 %).
2. Seed recording (``--seed_hdf5``) with two 640x480 cameras (LeIsaac's size): worst and p99 step
   time while recording vs not, against the frame period (16.7 ms); side by side, what writing one
   100-step chunk costs when done on the calling thread (uncompressed, as the recorder once did on
   the stepping thread, and lzf, what its writer thread does now) and the file size per second.

    .venv/bin/python bench/bench_leisaac_bridge.py [--seconds 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from fixtures.leisaac_env import FakeManagerBasedRLEnv

from drivers.sim_follower import SimFollower
from sim_bridge import seed_recorder
from sim_bridge.leisaac_follower import LeisaacBridge, LeisaacBridgeConfig, prepare_env_cfg, success_fn_for
from sim_bridge.server import SimServerEndpoint

LEISAAC_HW = (480, 640)


class TimedBridge(LeisaacBridge):
    """The bridge noting when each step started and how long it took."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.starts_s: list[float] = []
        self.durations_s: list[float] = []

    def step(self) -> None:
        t = time.perf_counter()
        super().step()
        self.starts_s.append(t)
        self.durations_s.append(time.perf_counter() - t)


def serve(env, recorder=None) -> tuple[TimedBridge, threading.Thread, SimFollower]:
    success_term = prepare_env_cfg(env.cfg)
    ep = SimServerEndpoint("tcp://127.0.0.1:0", backend="leisaac:fake")
    ep.open()
    cfg = LeisaacBridgeConfig(step_hz=1.0 / env.step_dt, daemon_staleness_s=0.1)
    b = TimedBridge(env, ep, config=cfg, success_fn=success_fn_for(env, success_term), seed_recorder=recorder)
    t = threading.Thread(target=b.run, daemon=True)
    t.start()
    f = SimFollower(ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    f.connect()
    return b, t, f


def stop(b: TimedBridge, t: threading.Thread, f: SimFollower) -> None:
    f.close()
    b.stop()
    t.join(5)
    b.ep.close()


def send_for(f: SimFollower, rate_hz: float, seconds: float) -> tuple[float, float]:
    period, ticker = 1.0 / rate_hz, threading.Event()
    start = next_s = time.perf_counter()
    i = 0
    while next_s - start < seconds:
        f.write_goals(np.array([5.0 + (i % 50) * 0.1, 0.0, 0.0, 0.0, 0.0, 40.0]))
        i += 1
        next_s += period
        ticker.wait(max(0.0, next_s - time.perf_counter()))
    return start, time.perf_counter()


def real_time(seconds: float) -> None:
    env = FakeManagerBasedRLEnv()
    step_hz = 1.0 / env.step_dt
    b, t, f = serve(env)
    try:
        print(f"== steps per second, bridge at the env's step rate {step_hz:.1f} Hz ==")
        for msg_hz in (100.0, 500.0):
            first, last = send_for(f, msg_hz, seconds)
            steps = [s for s in b.starts_s if first + 0.2 <= s <= last]
            rate = (len(steps) - 1) / (steps[-1] - steps[0])
            print(f"  daemon at {msg_hz:5.0f} Hz: {rate:7.2f} steps/s  ratio to step rate {rate / step_hz:.4f}")
    finally:
        stop(b, t, f)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def recording(seconds: float) -> None:
    period_ms = 1000.0 / 60.0
    print(f"== step time with two {LEISAAC_HW[1]}x{LEISAAC_HW[0]} cameras, frame period {period_ms:.1f} ms ==")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "seeds.hdf5"
        rec = seed_recorder.SeedDemoRecorder(path, env_name="LeIsaac-SO101-PickOrange-v0")
        env = FakeManagerBasedRLEnv(image_hw=LEISAAC_HW)
        env.cfg.seed = 1
        b, t, f = serve(env, rec)
        try:
            n0 = len(b.durations_s)
            send_for(f, 100.0, seconds)
            idle = b.durations_s[n0 + 5 :]
            f.reset_episode(timeout_s=10)
            seq = f.start_episode()
            f.wait_event("started", seq, 10)
            n1 = len(b.durations_s)
            send_for(f, 100.0, seconds)
            rec_steps = b.durations_s[n1:]
            f.wait_event("stopped", f.stop_episode(), 10)
        finally:
            stop(b, t, f)
            t_close = time.perf_counter()
            rec.close()
            close_s = time.perf_counter() - t_close
        for name, xs in (("not recording", idle), ("recording    ", rec_steps)):
            print(
                f"  {name}: worst {max(xs) * 1e3:6.2f} ms  p99 {pct(xs, 0.99) * 1e3:6.2f} ms  "
                f"(worst / frame period {max(xs) * 1e3 / period_ms:.2f}, n={len(xs)})"
            )
        print(f"  steps that waited for the writer: {rec.queue_waits}; close() waited {close_s:.2f} s for it")
        with h5py.File(path, "r") as fh:
            g = fh["data/demo_0"]
            n = int(g.attrs["num_samples"])
            size_mb = path.stat().st_size / 1e6
            print(f"  file: {n} steps, {size_mb:.1f} MB = {size_mb / (n / 60.0):.1f} MB per recorded second (lzf)")
            block = {cam: np.asarray(g[f"obs/{cam}"][:100]) for cam in ("front", "wrist")}
    print("== one 100-step chunk of both cameras written on the calling thread ==")
    with tempfile.TemporaryDirectory() as d:
        for compression in (None, "lzf"):
            with h5py.File(Path(d) / f"chunk_{compression}.hdf5", "w") as fh:
                t0 = time.perf_counter()
                for cam, data in block.items():
                    seed_recorder._append(fh, cam, data, compression)
                fh.flush()
                ms = (time.perf_counter() - t0) * 1e3
            print(
                f"  {compression!s:4s}: {ms:8.1f} ms = {ms / period_ms:6.1f} frame periods "
                "(on the stepping thread before; on the writer thread now)"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds per measurement (default %(default)s)")
    args = ap.parse_args()
    real_time(args.seconds)
    recording(args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
