"""Policy rollout beside LeRobot's own: LeRobot 0.6.1's `lerobot-rollout` and so101d's daemon
driving the same emulated follower with the same tiny ACT checkpoint, in one run, measured at the
emulated servos: the control loop's period and jitter, and observation -> action latency.

Setup: one virtual bench in this process (drivers/emulator BusEmulator on two pseudo-terminals,
wire time modelled at 1 Mbaud), a tiny ACT (daemon/policy/tiny.py ``tiny_act_checkpoint``: chunk
10, trained for a few steps on the daemon's schema with one 64x48 camera "front"; ACT needs an
image or an environment state, so one small camera).

Row A, LeRobot: the `lerobot-rollout` CLI, unmodified, in its own process:
``--strategy.type=base`` (LeRobot's rollout loop with no recording: observe, SyncInferenceEngine,
send_action, precise_sleep; lerobot/rollout/strategies/base.py), ``--robot.type=so101_follower``
on the emulated follower's port, the camera through LeRobot's own ZMQCamera
(lerobot/cameras/zmq) fed here at 30 fps with JPEG frames as LeRobot's image_server sends them,
``--fps`` (default 30: the checkpoint's rate), ``--duration``, no dataset, no hub.
Row B, so101d: `so101d run` in its own process on the same bench (rate ``--rate-hz``, default 100,
a virtual 64x48 camera), the checkpoint loaded and started over the control socket
(``policy.load``, ``policy.start`` with record false), then stopped.

Bus-side numbers (both rows, the same definitions): timestamps taken in the emulator as each
packet is served, on the first servo of the follower (every sync read/write reaches it).
- period: between successive Goal_Position writes; jitter: |period - the loop's nominal period|.
- read -> write: from the last Present_Position read to the Goal_Position write that follows it
  (what one cycle spends between observing the arm and commanding it).
- LeRobot obs -> action: the cycles on which its ACT computes a chunk (every n_action_steps-th;
  the phase is the residue class with the longest read -> write) have the read -> write that
  carries the forward pass; that is observation read -> the first action computed from it at
  the servo, all bus-side.
- so101d obs -> action: its inference runs beside the loop, so no single cycle carries it; the
  daemon's own policy.status stages stand beside it (ask: the cycle's bus reads before the
  request; issued -> usable: request to chunk usable by the loop; pickup: until the next cycle
  takes it), as p50 / p99 over its last 64 chunks.

    .venv/bin/python bench/bench_rollout.py [--seconds 20] [--rounds 2] [--fps 30] [--rate-hz 100] [--warmup-s 2] [--lerobot-threads N]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from virtual_bench_support import VirtualBench, open_virtual_bench

from calibration.calibration_file import calibration_path, save_calibration
from daemon.api.client import ControlClient, DaemonUnavailable
from daemon.policy.tiny import synthetic_frame, synthetic_pose, tiny_act_checkpoint
from drivers.emulator import reference_calibration
from drivers.emulator.servo import ADDR_GOAL_POSITION, ADDR_PRESENT_POSITION, EmulatedServo

CAM_W, CAM_H = 64, 48
CAM_FPS = 30.0
BIN = Path(sys.executable).parent


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


@dataclass
class BusSpy:
    """When each Present_Position read and each Goal_Position write reached one emulated servo
    (perf_counter seconds, in the emulator's thread as it serves the packet)."""

    reads_s: list[float] = field(default_factory=list)
    writes_s: list[float] = field(default_factory=list)

    def attach(self, servo: EmulatedServo) -> None:
        read, write = servo.read, servo.write

        def spy_read(address: int, length: int, now: float | None = None) -> bytes:
            if address <= ADDR_PRESENT_POSITION < address + length:
                self.reads_s.append(time.perf_counter())
            return read(address, length, now)

        def spy_write(address: int, data: bytes, now: float | None = None) -> None:
            write(address, data, now)
            if address <= ADDR_GOAL_POSITION < address + len(data):
                self.writes_s.append(time.perf_counter())

        servo.read = spy_read  # type: ignore[method-assign]
        servo.write = spy_write  # type: ignore[method-assign]

    def window(self, start_s: float, end_s: float) -> tuple[np.ndarray, np.ndarray, int]:
        """(writes, reads, index of the first write in the run) inside [start, end)."""
        w, r = np.array(self.writes_s), np.array(self.reads_s)
        first = int(np.searchsorted(w, start_s))
        return w[first : np.searchsorted(w, end_s)], r[(r >= start_s - 1.0) & (r < end_s)], first


@dataclass
class Row:
    name: str
    nominal_s: float
    period_s: np.ndarray
    read_to_write_s: np.ndarray
    obs_to_action_s: np.ndarray | None  # bus-side, where a cycle carries the forward pass
    notes: list[str] = field(default_factory=list)


def merge(rows: list[Row]) -> Row:
    """One row from the rounds' rows of one engine (samples pooled, notes kept by round)."""
    starts = [r.obs_to_action_s for r in rows if r.obs_to_action_s is not None]
    return Row(
        rows[0].name,
        rows[0].nominal_s,
        np.concatenate([r.period_s for r in rows]),
        np.concatenate([r.read_to_write_s for r in rows]),
        np.concatenate(starts) if starts else None,
        [f"round {i + 1}: {n}" if len(rows) > 1 else n for i, r in enumerate(rows) for n in r.notes],
    )


def bus_row(name: str, writes: np.ndarray, reads: np.ndarray, nominal_s: float) -> Row:
    before = np.searchsorted(reads, writes) - 1
    ok = before >= 0
    return Row(name, nominal_s, np.diff(writes), writes[ok] - reads[before[ok]], None)


class ZmqFrames:
    """A publisher as LeRobot's image_server (lerobot/cameras/zmq/image_server.py) is to its
    ZMQCamera: JSON {"timestamps", "images": {name: base64 JPEG}} on a PUB socket, at CAM_FPS."""

    def __init__(self) -> None:
        import cv2
        import zmq

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.bind(f"tcp://127.0.0.1:{self.port}")
        ok, jpeg = cv2.imencode(".jpg", synthetic_frame(synthetic_pose(0.0), CAM_H, CAM_W))
        assert ok
        self._b64 = base64.b64encode(jpeg.tobytes()).decode()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zmq-frames", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        t0 = time.perf_counter()
        i = 0
        while not self._stop.is_set():
            i += 1
            msg = json.dumps({"timestamps": {"front": time.time()}, "images": {"front": self._b64}})
            try:
                self._sock.send_string(msg, zmq.NOBLOCK)
            except zmq.Again:  # no subscriber yet
                pass
            self._stop.wait(max(0.0, t0 + i / CAM_FPS - time.perf_counter()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)
        self._ctx.term()


def chunk_starts(writes_from: int, read_to_write_s: np.ndarray, n_steps: int) -> tuple[np.ndarray, str]:
    """The cycles on which a sync ACT runs its forward pass: one residue class of the cycle index
    modulo n_action_steps, the one whose read -> write is longest; how clearly it stands out."""
    idx = np.arange(writes_from, writes_from + len(read_to_write_s))
    med = np.array([np.median(read_to_write_s[idx % n_steps == k]) for k in range(n_steps)])
    phase = int(np.argmax(med))
    others = np.delete(med, phase)
    note = f"chunk cycles: every {n_steps}th, median read->write {med[phase] * 1e3:.3f} ms vs {np.median(others) * 1e3:.3f} ms on the others"
    return read_to_write_s[idx % n_steps == phase], note


def run_lerobot(bench: VirtualBench, spy: BusSpy, ckpt: Path, n_steps: int, args: argparse.Namespace) -> Row:
    root = bench.root / "lerobot_cal"
    save_calibration(reference_calibration("follower"), "follower", "bench", root)
    cal_dir = calibration_path("follower", "bench", root).parent
    frames = ZmqFrames()
    cams = (
        f"{{front: {{type: zmq, server_address: 127.0.0.1, port: {frames.port}, camera_name: front, "
        f"width: {CAM_W}, height: {CAM_H}, fps: {int(CAM_FPS)}}}}}"
    )
    cmd = [
        str(BIN / "lerobot-rollout"),
        "--strategy.type=base",
        f"--policy.path={ckpt}",
        "--policy.device=cpu",
        "--robot.type=so101_follower",
        f"--robot.port={bench.follower_port}",
        "--robot.id=bench",
        f"--robot.calibration_dir={cal_dir}",
        f"--robot.cameras={cams}",
        f"--fps={args.fps:g}",
        f"--duration={args.warmup_s + args.seconds + 1.0:g}",
        "--play_sounds=false",
        "--return_to_initial_position=false",
    ]
    log = bench.root / "rollout.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    if args.lerobot_threads:  # torch takes its intra-op thread count from OMP_NUM_THREADS
        env["OMP_NUM_THREADS"] = str(args.lerobot_threads)
    n0 = len(spy.writes_s)
    try:
        with open(log, "wb") as out:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
    finally:
        frames.close()
    if proc.returncode != 0:
        raise SystemExit(f"lerobot-rollout exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
    if len(spy.writes_s) <= n0:
        raise SystemExit(f"lerobot-rollout wrote no goal:\n{log.read_text(errors='replace')[-3000:]}")
    slow = log.read_text(errors="replace").count("Record loop is running slower")
    start = spy.writes_s[n0] + args.warmup_s
    writes, reads, first = spy.window(start, start + args.seconds)
    row = bus_row(f"LeRobot lerobot-rollout {args.fps:g} fps", writes, reads, 1.0 / args.fps)
    before = np.searchsorted(reads, writes) - 1
    starts, note = chunk_starts(first - n0, row.read_to_write_s, n_steps) if (before >= 0).all() else (None, "")
    row.obs_to_action_s = starts
    row.notes.append(note)
    row.notes.append(f"its own log: {slow} cycles 'running slower than the target FPS' over the whole run")
    return row


def _wait_status(sock: Path, pred, timeout_s: float, proc: subprocess.Popen[bytes]) -> dict:
    end = time.monotonic() + timeout_s
    st: dict = {}
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited with {proc.returncode}")
        try:
            with ControlClient(sock, timeout_s=5) as c:
                st = c.request("status")
            if pred(st):
                return st
        except DaemonUnavailable:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the daemon never got there in {timeout_s:g} s: mode {st.get('mode')!r}")


def _stats(s: dict | None) -> str:
    if not s or s.get("p50") is None:
        return "-"
    return f"{s['p50']:.3f} / {s['p99']:.3f}"


def run_daemon(bench: VirtualBench, spy: BusSpy, ckpt: Path, args: argparse.Namespace) -> Row:
    cfg = bench.write_config(
        f'[cameras.front]\nkind = "virtual"\nwidth = {CAM_W}\nheight = {CAM_H}\nfps = {int(CAM_FPS)}\n',
        rate_hz=args.rate_hz,
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with open(bench.root / "daemon.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", "--log-level", "WARNING", "run", "--config", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    sock = bench.socket_path
    try:
        _wait_status(sock, lambda st: st["mode"] == "teleop", 60, proc)
        with ControlClient(sock, timeout_s=150) as c:
            r = c.request("policy.load", path=str(ckpt), wait_s=120)
            if r.get("state") != "ready":
                raise SystemExit(f"policy.load: {r}")
            c.request("policy.start", record=False)
        _wait_status(sock, lambda st: st["mode"] == "policy", 60, proc)
        time.sleep(args.warmup_s)
        start = time.perf_counter()
        time.sleep(args.seconds)
        end = time.perf_counter()
        with ControlClient(sock, timeout_s=30) as c:
            ps = c.request("policy.status")
            st = c.request("status")
            c.request("policy.stop")
            c.request("policy.unload")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    writes, reads, _ = spy.window(start, end)
    row = bus_row(f"so101d daemon {args.rate_hz:g} Hz", writes, reads, 1.0 / args.rate_hz)
    stages = ps.get("stages_ms") or {}
    row.notes.append(
        "so101d policy.status over its last chunks, p50 / p99 ms: "
        f"ask {_stats(stages.get('ask'))}, issued -> usable {_stats(ps.get('inference_latency_ms'))} "
        f"(forward {_stats(stages.get('forward'))}, overhead {_stats(ps.get('overhead_ms'))}), "
        f"pickup {_stats(stages.get('pickup'))}; "
        f"chunks {ps.get('results')}, dropped stale actions {ps.get('actions_dropped_stale')}; "
        f"loop overruns {st.get('overruns')}, missed cycles {st.get('missed_cycles')}"
    )
    return row


def _ms(a: np.ndarray | None) -> str:
    if a is None or not a.size:
        return f"{'-':>8s} {'-':>8s} {'-':>8s}"
    return f"{pct(a, 50) * 1e3:8.3f} {pct(a, 99) * 1e3:8.3f} {float(a.max()) * 1e3:8.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per row (default 20)")
    ap.add_argument("--fps", type=float, default=30.0, help="lerobot-rollout --fps (default 30)")
    ap.add_argument("--rate-hz", type=float, default=100.0, help="the daemon's loop rate (default 100)")
    ap.add_argument("--rounds", type=int, default=2, help="rows alternated A B A B ..., pooled (default 2)")
    ap.add_argument(
        "--lerobot-threads",
        type=int,
        default=0,
        help="OMP_NUM_THREADS for lerobot-rollout (default 0: unset, torch's own, one per core; "
        "the daemon's worker leaves one core to its loop)",
    )
    ap.add_argument("--warmup-s", type=float, default=2.0, help="skipped after each loop starts (default 2)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="so101d-rb-") as d:
        t0 = time.monotonic()
        ckpt = tiny_act_checkpoint(Path(d) / "policy", {"front": (CAM_H, CAM_W)})
        n_steps = int(json.loads((ckpt / "config.json").read_text())["n_action_steps"])
        print(f"checkpoint: tiny ACT (chunk {n_steps}), one {CAM_W}x{CAM_H} camera, {time.monotonic() - t0:.1f} s")
        with open_virtual_bench(Path(d) / "b") as bench:
            spy = BusSpy()
            spy.attach(bench.follower.servos[0])
            rows_a, rows_b = [], []
            for _ in range(args.rounds):  # alternated: a machine that gets busier weighs on both
                rows_a.append(run_lerobot(bench, spy, ckpt, n_steps, args))
                rows_b.append(run_daemon(bench, spy, ckpt, args))
    lerobot, ours = merge(rows_a), merge(rows_b)
    each = f"{args.rounds} rounds of {args.seconds:g} s" if args.rounds > 1 else f"{args.seconds:g} s"
    threads = f"OMP_NUM_THREADS={args.lerobot_threads}" if args.lerobot_threads else "torch's default threads"
    print(f"policy rollout on the emulated follower, {each}, alternated, measured at the servo (ms)")
    print(f"lerobot-rollout with {threads}; the daemon's worker with its default (one core left to the loop)")
    print(f"{'':30s} {'period p50':>10s} {'p99':>8s} {'max':>8s} | {'jitter p50':>10s} {'p99':>8s} {'max':>8s}")
    for r in (lerobot, ours):
        jitter = np.abs(r.period_s - r.nominal_s)
        p = _ms(r.period_s).split()
        j = _ms(jitter).split()
        print(f"{r.name:30s} {p[0]:>10s} {p[1]:>8s} {p[2]:>8s} | {j[0]:>10s} {j[1]:>8s} {j[2]:>8s}")
    print(
        f"{'':30s} {'read->write p50':>15s} {'p99':>8s} {'max':>8s} | {'obs->action p50':>15s} {'p99':>8s} {'max':>8s}"
    )
    for r in (lerobot, ours):
        a, b = _ms(r.read_to_write_s).split(), _ms(r.obs_to_action_s).split()
        print(f"{r.name:30s} {a[0]:>15s} {a[1]:>8s} {a[2]:>8s} | {b[0]:>15s} {b[1]:>8s} {b[2]:>8s}")
    print("  read->write: last Present_Position read -> the Goal_Position write after it, every cycle")
    print("  obs->action: LeRobot's chunk cycles (forward pass inside the cycle), bus-side; so101d infers")
    print("  beside its loop, no cycle carries it: its own stages below (p50 / p99 ms)")
    for r in (lerobot, ours):
        for note in r.notes:
            print(f"{r.name}: {note}")
    jl, jo = np.abs(lerobot.period_s - lerobot.nominal_s), np.abs(ours.period_s - ours.nominal_s)
    print(
        f"so101d / LeRobot: jitter p99 {pct(jo, 99) / pct(jl, 99):.2f}x, jitter max {float(jo.max()) / float(jl.max()):.2f}x, read->write p99 {pct(ours.read_to_write_s, 99) / pct(lerobot.read_to_write_s, 99):.2f}x; writes {len(ours.period_s) + 1} / {len(lerobot.period_s) + 1}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
