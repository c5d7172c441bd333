"""Sim bridge benchmark: bridge round trip vs a real follower cycle, and MuJoCo's real-time factor.

1. Bridge round trip (``SimFollower.write_goals`` -> sim -> state acknowledging that target back in
   the follower's I/O thread), p50/p99, over tcp loopback and ipc, without and with camera frames
   (two 320x240 RGB frames sent with every state). The sim side is an echo server on
   ``SimServerEndpoint`` that answers at once, so this is the transport's own cost.
2. Side by side: one control cycle of a real follower (``FeetechFollower.write_goals`` +
   ``read_joints``) on the emulated STS3215 bus at 1 Mbaud, when the emulator is available.
3. MuJoCo follower: real-time factor with two 320x240 cameras and without (physics + render run
   as fast as possible: simulated seconds per wall second, >= 1 means real time at 30 fps), then
   served for a few seconds at 30 Hz to a SimFollower: overruns, round trip, frames received.

    .venv/bin/python bench/bench_sim.py [--samples 400]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from drivers.sim_follower import SimFollower
from sim_bridge.server import SimServerEndpoint


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


class EchoSim:
    def __init__(self, bind: str, frames: bool) -> None:
        self.ep = SimServerEndpoint(bind, backend="echo")
        self.ep.open()
        self.frames = frames
        rng = np.random.default_rng(0)
        self.imgs = [rng.integers(0, 255, (240, 320, 3), dtype=np.uint8) for _ in range(2)]
        self._stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        seq = 0
        pos = np.zeros(6)
        while not self._stop.is_set():
            inbox = self.ep.poll(0.01)
            if inbox.target_units is None:
                if self.ep.has_peer:  # keep the daemon's staleness clock happy
                    self.ep.send_state(pos, sim_time_s=0, torque=True, ack_seq=-1, ack_sent_s=0.0)
                continue
            pos = inbox.target_units
            self.ep.send_state(pos, sim_time_s=0, torque=True, ack_seq=inbox.target_seq, ack_sent_s=inbox.target_sent_s)
            if self.frames:
                for name, img in zip(("front", "wrist"), self.imgs):
                    self.ep.send_frame(name, seq, time.monotonic(), img)
            seq += 1
        self.ep.close()

    def close(self) -> None:
        self._stop.set()
        self.t.join(2)


def bridge_round_trip(bind: str, frames: bool, n: int) -> list[float]:
    sim = EchoSim(bind, frames)
    f = SimFollower(sim.ep.endpoint, staleness_s=1.0)
    f.connect()
    try:
        goal = np.zeros(6)
        for i in range(n + 20):
            before = len(f.round_trip_s())
            goal[0] = i % 10
            f.write_goals(goal)
            deadline = time.monotonic() + 1.0
            while len(f.round_trip_s()) == before and time.monotonic() < deadline:
                time.sleep(0.0002)
            time.sleep(0.002)  # a control loop does other work between cycles
        return f.round_trip_s()[20:]
    finally:
        f.close()
        sim.close()


def real_follower_cycle(n: int) -> list[float] | str:
    try:
        from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
        from drivers.feetech_arm import FeetechFollower
    except ImportError as exc:
        return f"emulator not available ({exc})"
    with tempfile.TemporaryDirectory() as d:
        arm = EmulatedArm("follower")
        emu = BusEmulator(Path(d) / "follower", arm).start()
        f = FeetechFollower(str(Path(d) / "follower"), reference_calibration("follower"))
        try:
            f.connect()
            goal = f.read_joints()
            out = []
            for _ in range(n):
                t = time.perf_counter()
                f.write_goals(goal)
                f.read_joints()
                out.append(time.perf_counter() - t)
                time.sleep(0.002)
            return out
        finally:
            f.close()
            emu.stop()


def mujoco_numbers(serve_s: float) -> dict[str, float]:
    from sim_bridge.mujoco_follower import MujocoFollower, MujocoFollowerConfig

    out: dict[str, float] = {}
    cam = MujocoFollower(MujocoFollowerConfig(bind="tcp://127.0.0.1:0"))
    r = cam.measure_real_time_factor(90)
    cam.close_renderer()
    out["rtf_2cams"] = r["real_time_factor"]
    out["ms_per_frame_2cams"] = r["ms_per_frame"]
    out["render_ms_2cams"] = r["render_ms_per_frame"]
    out["cpu_ms_per_frame_2cams"] = r["cpu_ms_per_frame"]
    out["rtf_cpu_2cams"] = r["real_time_factor_cpu"]
    nocam = MujocoFollower(MujocoFollowerConfig(bind="tcp://127.0.0.1:0", cameras=()))
    out["rtf_nocam"] = nocam.measure_real_time_factor(90)["real_time_factor"]

    served = MujocoFollower(MujocoFollowerConfig(bind="tcp://127.0.0.1:0"))
    ep = served.open()
    t = threading.Thread(target=served.run, daemon=True)
    t.start()
    f = SimFollower(ep, staleness_s=0.5, connect_timeout_s=20)
    f.connect()
    cams = f.cameras()
    t0 = time.monotonic()
    ticks0 = served.ticks
    frames0 = {n: c.stats()["frames"] for n, c in cams.items()}
    goal = np.array([10.0, -40.0, 50.0, 20.0, 0.0, 50.0])
    while time.monotonic() - t0 < serve_s:
        f.write_goals(goal)
        time.sleep(1 / 30)
    wall = time.monotonic() - t0
    rtt = f.round_trip_s()
    out["served_tick_hz"] = (served.ticks - ticks0) / wall
    out["served_overruns"] = served.overruns
    out["served_frames_per_s_per_cam"] = min((c.stats()["frames"] - frames0[n]) / wall for n, c in cams.items())
    out["served_rtt_p50_ms"] = pct(rtt, 0.5) * 1000
    out["served_rtt_p99_ms"] = pct(rtt, 0.99) * 1000
    f.close()
    served.stop()
    t.join(5)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--serve-s", type=float, default=4.0)
    args = ap.parse_args()

    print("== bridge round trip (target -> state acknowledging it), echo sim ==")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for transport, bind in (("tcp", "tcp://127.0.0.1:0"), ("ipc", f"ipc://{d}/bench.sock")):
            for frames in (False, True):
                s = bridge_round_trip(bind, frames, args.samples)
                rows.append((transport, frames, s))
                print(
                    f"  {transport:3s} {'2x320x240 frames' if frames else 'no frames       '}  "
                    f"p50 {pct(s, 0.5) * 1e3:6.3f} ms  p99 {pct(s, 0.99) * 1e3:6.3f} ms  (n={len(s)})"
                )
    real = real_follower_cycle(args.samples)
    print("== real follower cycle on the emulated bus (write_goals + read_joints) ==")
    if isinstance(real, str):
        print(f"  {real}")
    else:
        rp50, rp99 = pct(real, 0.5), pct(real, 0.99)
        print(f"  p50 {rp50 * 1e3:6.3f} ms  p99 {rp99 * 1e3:6.3f} ms  (n={len(real)})")
        for transport, frames, s in rows:
            print(
                f"  ratio bridge/real  {transport} {'frames' if frames else 'plain '}: "
                f"p50 {pct(s, 0.5) / rp50:5.2f}  p99 {pct(s, 0.99) / rp99:5.2f}"
            )
    print("== MuJoCo follower ==")
    m = mujoco_numbers(args.serve_s)
    print(
        f"  real-time factor, 2 cameras 320x240 at 30 fps: {m['rtf_2cams']:.2f} "
        f"({m['ms_per_frame_2cams']:.1f} ms per 33.3 ms frame, render {m['render_ms_2cams']:.1f} ms)"
    )
    print(
        f"  CPU time per frame, 2 cameras: {m['cpu_ms_per_frame_2cams']:.1f} ms -> real-time factor on an idle "
        f"machine {m['rtf_cpu_2cams']:.2f} (load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )
    print(f"  real-time factor, no cameras:                 {m['rtf_nocam']:.1f}")
    print(
        f"  served at 30 Hz for {args.serve_s:.0f} s: {m['served_tick_hz']:.1f} ticks/s, {m['served_overruns']} overruns, "
        f"{m['served_frames_per_s_per_cam']:.1f} frames/s per camera, "
        f"round trip p50 {m['served_rtt_p50_ms']:.1f} ms p99 {m['served_rtt_p99_ms']:.1f} ms (includes waiting for the next tick)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
