"""Policy serving benchmark: our local path vs LeRobot 0.6.1's async inference, same checkpoint.

1. A full-size ACT (LeRobot defaults: resnet18 backbone, dim 512, chunk 100; random backbone
   weights, no download) is trained for one step on a synthetic dataset in the daemon's schema
   with one 640x480 camera and saved as LeRobot saves checkpoints.
2. Ours: PolicySource (worker process, observation through shared memory, chunk back over a pipe
   as msgpack + raw float32) polled the way the loop polls it, but every 0.5 ms so delivery time
   is not hidden by the loop period; a new request as soon as each chunk lands. Per request the
   worker reports its stages; we print observation -> action latency broken down (transfer in,
   preprocessing, forward, postprocessing, transfer out) and the overhead beyond the forward pass
   (target: <= 1 ms p99, transfer only). Also: what `PolicySource.target()` costs the loop.
3. LeRobot: `lerobot.async_inference.policy_server` in its own process on 127.0.0.1 (gRPC,
   inference_latency 0), driven the way its robot_client drives it (Ready, SendPolicyInstructions,
   SendObservations with must_go, GetActions), same checkpoint and observation. Note: LeRobot's
   protocol is pickle both ways; this benchmark is the only place we speak it (to a server we
   started ourselves, on loopback). Its server does not report the forward time, so its overhead
   is its latency minus our median forward time of the same model measured in the same run.
3b. Ours with LeRobot's server (issue 15): the same server process and checkpoint driven by our
   daemon's ``backend = "lerobot-server"`` path (PolicySource -> worker process -> gRPC client ->
   restricted unpickler -> action queue), before LeRobot's own client protocol (3). Overhead is
   latency minus the server-logged forward time, request by request; the last table prints the
   overhead beyond the forward pass three ways (p50/p99/p99.9) with ratios to our local worker.
4. Ours for other local programs: `so101d policy serve` (its own process, ZeroMQ ipc, msgpack +
   raw arrays) driven by PolicyClient, request/response like LeRobot's.
5. Control loop rate and p99 period jitter on the emulated bench in teleop vs policy mode.
6. Refill rule (issue 16), ``--refill``: the daemon on the emulated bench driven by an ACT with
   LeRobot's default chunk (100 actions at 30 fps; tiny transformer, resnet18 backbone, one 320x240
   camera) whose forward pass is padded to ``--forward-s`` (engine knob SO101D_POLICY_FORWARD_DELAY_S),
   ``max_obs_age_s`` 1 s. Rounds alternate the old rule (ask when <= refill_below actions are left,
   counting those that will expire; no cross-fade) and the new one (ask when the usable horizon falls
   to latency p99 + margin; cross-fade). Per round: time in mode policy (status sampled every 50 ms),
   the holds between chunks, the slack when each chunk lands (time left on the previous one;
   negative = the arm held that long), the largest per-cycle step of the policy's target, and the
   overhead beyond the forward pass by stage.

Ratios are printed side by side (measured in one run, interleaved where it matters).

    .venv/bin/python bench/bench_policy.py [--requests 30] [--skip-lerobot] [--skip-loop]
    .venv/bin/python bench/bench_policy.py --refill [--refill-seconds 10] [--rounds 2] [--forward-s 0.15]
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from calibration.conventions import FEATURE_NAMES  # noqa: E402
from daemon.policy.action_queue import QueueConfig  # noqa: E402
from daemon.policy.runner import PolicyRunnerConfig, PolicySource  # noqa: E402
from daemon.policy.tiny import make_synthetic_dataset, synthetic_frame, synthetic_pose, train_tiny_policy  # noqa: E402
from drivers.cameras import Frame  # noqa: E402

H, W = 480, 640


def pct(a, q) -> float:
    return float(np.percentile(np.asarray(a, dtype=np.float64), q)) if len(a) else float("nan")


def row(name: str, samples_s, note: str = "") -> str:
    ms = np.asarray(samples_s, dtype=np.float64) * 1e3
    if ms.size == 0:
        return f"  {name:<34} {'-':>9} {'-':>9} {'-':>9}  {note}"
    return f"  {name:<34} {pct(ms, 50):9.3f} {pct(ms, 99):9.3f} {ms.max():9.3f}  {note}"


class StillCamera:
    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels = pixels
        self.seq = 0

    def latest_frame(self) -> Frame:
        self.seq += 1
        return Frame(pixels=self.pixels, capture_monotonic_s=time.monotonic(), seq=self.seq)


def build_checkpoint(work: Path) -> Path:
    t0 = time.monotonic()
    ds = make_synthetic_dataset(work / "dataset", {"front": (H, W)}, episodes=1, frames_per_episode=12)
    ck = train_tiny_policy(ds, work / "act", policy_type="act", steps=1, batch_size=2, size="default").checkpoint
    print(f"checkpoint: full-size ACT, one 640x480 camera, built in {time.monotonic() - t0:.1f} s -> {ck}")
    return ck


# -- ours ------------------------------------------------------------------------------------------
def bench_ours(ckpt: Path, requests: int) -> dict:
    state = synthetic_pose(0.3)
    img = synthetic_frame(state, H, W)
    qcfg = QueueConfig(refill_below=1000, max_obs_age_s=60.0)  # always wants a refill: back to back
    # all cores for the forward pass here, like LeRobot's server (the daemon's default leaves one to the loop)
    src = PolicySource(PolicyRunnerConfig(str(ckpt), cameras={"front": (H, W)}, queue=qcfg, nice=0,
                                          torch_threads=os.cpu_count() or 1),
                       {"front": StillCamera(img)})
    src.start()
    if not src.wait_ready(300):
        raise SystemExit(f"policy worker failed: {src.error}")
    print(f"ours: worker ready ({src.worker_info})")
    costs = []
    warm = 3
    while src.results < warm:
        src.target(time.monotonic(), state)
        time.sleep(0.0005)
    log_start = len(src.chunk_log)
    stage_start = {k: len(s._d) for k, s in src.stage.items()}
    lat_start = len(src.latency._d)
    while src.results < warm + requests:
        src.wait_result(0.001)  # wake as soon as the chunk lands: measure the path, not a poll period
        t0 = time.perf_counter()
        src.target(time.monotonic(), state)
        costs.append(time.perf_counter() - t0)
    stages = {k: list(s._d)[stage_start[k]:] for k, s in src.stage.items()}
    lat = list(src.latency._d)[lat_start:]
    src.stop()
    n = min(len(lat), *(len(v) for k, v in stages.items() if k != "publish"))
    lat = np.array(lat[-n:])
    fwd = np.array(stages["forward"][-n:])
    pre = np.array(stages["preprocess"][-n:])
    post = np.array(stages["postprocess"][-n:])
    return {"latency": lat, "forward": fwd, "preprocess": pre, "postprocess": post,
            "publish": np.array(stages["publish"]), "read": np.array(stages["read"][-n:]),
            "deliver": np.array(stages["deliver"][-n:]), "request": np.array(stages["request"][-n:]),
            "target_cost": np.array(costs),
            "overhead": lat - fwd, "transport": lat - fwd - pre - post, "chunks": len(src.chunk_log) - log_start}


# -- ours, ZeroMQ serve path (request/response like LeRobot's, for other local programs) ---------------
def bench_serve(ckpt: Path, requests: int) -> dict:
    from daemon.policy.serve import PolicyClient

    d = tempfile.mkdtemp(prefix="so101d-serve-")
    endpoint = f"ipc://{d}/policy.ipc"
    proc = subprocess.Popen([sys.executable, "-m", "daemon.cli", "policy", "serve", str(ckpt), "--endpoint", endpoint],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        line = ""
        for _ in range(50):  # LeRobot prints its own lines while loading
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line or line.startswith("serving"):
                break
        if not line.startswith("serving"):
            return {"skipped": f"so101d policy serve did not start (last line {line!r})"}
        state = synthetic_pose(0.3)
        img = synthetic_frame(state, H, W)
        lat, fwd = [], []
        with PolicyClient(endpoint, timeout_s=60) as client:
            for i in range(requests + 3):
                t0 = time.perf_counter()
                actions, timings = client.infer(state, {"front": img})
                dt = time.perf_counter() - t0
                if i >= 3:
                    lat.append(dt)
                    fwd.append(timings["forward"] / 1e3)
        return {"latency": np.array(lat), "forward": np.array(fwd)}
    finally:
        proc.terminate()
        proc.wait(10)


# -- LeRobot async inference -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LeRobotServerProc:
    """`python -m lerobot.async_inference.policy_server` on loopback, its forward times read from its log."""

    def __init__(self) -> None:
        self.port = free_port()
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        logdir = tempfile.mkdtemp(prefix="so101d-lerobot-server-")  # it writes logs/ into its cwd
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lerobot.async_inference.policy_server", "--host=127.0.0.1", f"--port={self.port}",
             "--fps=30", "--inference_latency=0", "--obs_queue_timeout=5"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=logdir, text=True)
        self.forwards: list[float] = []
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:  # its server logs the forward pass as "Preprocessing and inference took X s"
        for line in self.proc.stdout:  # type: ignore[union-attr]
            m = re.search(r"Preprocessing and inference took ([0-9.]+)s", line)
            if m:
                self.forwards.append(float(m.group(1)))

    def wait_listening(self, timeout_s: float = 120.0) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self.proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"LeRobot's policy server did not listen on {self.port}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def bench_ours_remote(ckpt: Path, server: LeRobotServerProc, requests: int) -> dict:
    """Our daemon's path with LeRobot's server: PolicySource backend lerobot-server (worker process,
    gRPC client, restricted unpickler), polled like bench_ours. Overhead = latency minus the
    server's own forward time from its log, request by request."""
    from daemon.policy.lerobot_server import ServerSpec

    server.wait_listening()  # the daemon would retry with back-off; the bench measures steady state
    state = synthetic_pose(0.3)
    img = synthetic_frame(state, H, W)
    qcfg = QueueConfig(refill_below=1000, max_obs_age_s=60.0)
    spec = ServerSpec(server=f"127.0.0.1:{server.port}", policy_type="act", checkpoint=str(ckpt),
                      actions_per_chunk=100, cameras={"front": [H, W]}, call_timeout_s=120.0)
    src = PolicySource(PolicyRunnerConfig(str(ckpt), cameras={"front": (H, W)}, queue=qcfg, nice=0,
                                          backend="lerobot-server", server=spec, request_timeout_s=120.0),
                       {"front": StillCamera(img)})
    src.start()
    if not src.wait_ready(300) or not src.link.get("connected"):
        src.stop()
        return {"skipped": f"our lerobot-server backend did not connect: {src.error or src.link}"}
    warm = 3
    while src.results < warm:
        src.wait_result(0.001)
        src.target(time.monotonic(), state)
    lat_start = len(src.latency._d)
    fwd_start = len(server.forwards)
    while src.results < warm + requests:
        src.wait_result(0.001)
        src.target(time.monotonic(), state)
    lat = np.array(list(src.latency._d)[lat_start:])
    rt = np.array(list(src.remote["round_trip"]._d)[-len(lat):])
    src.stop()
    time.sleep(0.5)  # the log line of the last request
    fw = np.array(server.forwards[fwd_start:fwd_start + len(lat)])
    return {"latency": lat, "round_trip": rt, "forward": fw}


def bench_lerobot(ckpt: Path, requests: int, server: LeRobotServerProc | None = None) -> dict:
    try:
        import grpc
        from lerobot.async_inference.helpers import RemotePolicyConfig, TimedObservation
        from lerobot.transport import services_pb2, services_pb2_grpc
        from lerobot.transport.utils import grpc_channel_options, send_bytes_in_chunks
        from lerobot.utils.feature_utils import hw_to_dataset_features
    except ImportError as exc:
        return {"skipped": f"LeRobot async inference cannot run here: {exc} (install lerobot[async]: grpcio, protobuf)"}
    own = server is None
    server = server or LeRobotServerProc()
    port, forwards = server.port, server.forwards
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", grpc_channel_options())
        grpc.channel_ready_future(channel).result(timeout=120)
        stub = services_pb2_grpc.AsyncInferenceStub(channel)
        stub.Ready(services_pb2.Empty())
        hw = {name: float for name in FEATURE_NAMES}
        hw["front"] = (H, W, 3)
        features = hw_to_dataset_features(hw, "observation", use_video=False)
        spec = RemotePolicyConfig("act", str(ckpt), features, actions_per_chunk=100, device="cpu")
        t0 = time.monotonic()
        stub.SendPolicyInstructions(services_pb2.PolicySetup(data=pickle.dumps(spec)))
        print(f"lerobot: policy_server loaded the checkpoint in {time.monotonic() - t0:.1f} s")
        state = synthetic_pose(0.3)
        raw = {name: float(v) for name, v in zip(FEATURE_NAMES, state)}
        raw["front"] = synthetic_frame(state, H, W)
        raw["task"] = ""
        lat, empty = [], 0
        for i in range(requests + 3):
            t_start = time.perf_counter()
            obs = TimedObservation(timestamp=time.time(), observation=raw, timestep=i, must_go=True)
            stub.SendObservations(send_bytes_in_chunks(pickle.dumps(obs), services_pb2.Observation, silent=True))
            reply = stub.GetActions(services_pb2.Empty())
            if not reply.data:
                empty += 1
                continue
            actions = pickle.loads(reply.data)
            dt = time.perf_counter() - t_start
            assert len(actions) == 100
            if i >= 3:
                lat.append(dt)
        time.sleep(0.5)
        fw = np.array(forwards[-len(lat):]) if len(forwards) >= len(lat) else np.array([])
        return {"latency": np.array(lat), "empty": empty, "forward": fw}
    finally:
        if own:
            server.close()


# -- control loop: teleop vs policy -------------------------------------------------------------------
def bench_loop(ckpt: Path, seconds: float) -> dict:
    from daemon.config import config_from_dict
    from daemon.policy.attach import attach_policy
    from daemon.service import Daemon
    from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
    from drivers.feetech_arm import FeetechFollower, FeetechLeader

    pose = np.array([0.0, -20.0, 20.0, 10.0, 0.0, 40.0])
    out = {}
    with tempfile.TemporaryDirectory(prefix="so101d-bench-") as d:
        root = Path(d)
        la, fa = EmulatedArm("leader", initial_pose_units=pose), EmulatedArm("follower", initial_pose_units=pose)
        la.set_pose_units(pose)
        lb, fb = BusEmulator(root / "leader", la).start(), BusEmulator(root / "follower", fa).start()
        cfg = config_from_dict({"socket": {"path": str(root / "c.sock")},
                                "cameras": {"front": {"kind": "virtual", "width": W, "height": H}},
                                "policy": {"max_obs_age_s": 5.0}})
        daemon = Daemon(cfg, FeetechLeader(str(root / "leader"), reference_calibration("leader")),
                        FeetechFollower(str(root / "follower"), reference_calibration("follower")))
        ctl = attach_policy(daemon, cameras={"front": StillCamera(synthetic_frame(pose, H, W))})
        daemon.start()
        try:
            loop = daemon.loop
            ctl.load(str(ckpt), wait_s=300)
            end = time.monotonic() + 20
            while loop.state.mode not in ("idle", "teleop", "hold") and time.monotonic() < end:
                time.sleep(0.05)
            for mode in ("teleop", "policy", "teleop", "policy"):
                if mode == "policy":
                    ctl.start(record=False)
                else:
                    loop.call(lambda: loop.set_intent("teleop"))
                time.sleep(1.0)  # alignment
                loop.stats.reset()  # the window then holds this phase only
                c0 = loop.cycles
                t_end = time.monotonic() + seconds
                last = None
                while time.monotonic() < t_end:
                    st = loop.stats.summaries_ms()
                    last = st
                    time.sleep(0.25)
                n = loop.cycles - c0
                out.setdefault(mode, []).append({"rate_hz": n / seconds, "period": last["period"], "jitter": last["jitter"]})
                if mode == "policy":
                    ctl.stop()
        finally:
            daemon.stop()
            lb.stop()
            fb.stop()
    return out


# -- refill rule: old (count) vs new (usable horizon), same daemon, same checkpoint ------------------
REFILL_H, REFILL_W = 240, 320


def _old_rule_source():
    """PolicySource with the refill rule before issue 16, to measure it beside the new one."""
    import math

    class OldRule(PolicySource):
        def wants_chunk(self, now_s: float) -> bool:
            q = self.queue
            newest = q._chunks[-1] if len(q) else None
            if newest is None:
                return True
            left = newest.n - max(0, math.ceil((now_s - newest.obs_time_s) / q.config.action_period_s))
            return left <= q.config.refill_below  # counts actions that will expire before their slot

    return OldRule


def bench_refill_round(ckpt: Path, rule: str, seconds: float) -> dict:
    from daemon.config import config_from_dict
    from daemon.control_client import ControlClient
    from daemon.policy.attach import queue_config_from
    from daemon.service import Daemon
    from drivers.cameras import CameraConfig as CamCfg
    from drivers.cameras import VirtualArmCamera
    from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
    from drivers.feetech_arm import FeetechFollower, FeetechLeader

    pose = np.array([0.0, -20.0, 20.0, 10.0, 0.0, 40.0])
    with tempfile.TemporaryDirectory(prefix="so101d-bench-refill-") as d:
        root = Path(d)
        la, fa = EmulatedArm("leader", initial_pose_units=pose), EmulatedArm("follower", initial_pose_units=pose)
        la.set_pose_units(pose)
        fa.set_pose_units(pose)
        lb, fb = BusEmulator(root / "leader", la).start(), BusEmulator(root / "follower", fa).start()
        cfg = config_from_dict({"socket": {"path": str(root / "c.sock")},
                                "cameras": {"front": {"kind": "virtual", "width": REFILL_W, "height": REFILL_H}}})
        daemon = Daemon(cfg, FeetechLeader(str(root / "leader"), reference_calibration("leader")),
                        FeetechFollower(str(root / "follower"), reference_calibration("follower")))
        cam = VirtualArmCamera(CamCfg(name="front", width=REFILL_W, height=REFILL_H, fps=30))
        loop = daemon.loop
        cycles: list[tuple[float, str, np.ndarray]] = []

        class Hook:
            def on_cycle(self, now, state, action, raw):
                cam.set_state(state)
                cycles.append((now, loop.state.mode, np.array(raw, dtype=np.float64)))

        loop.add_hook(Hook())
        qcfg = queue_config_from(cfg.policy)
        if rule == "before":
            qcfg.blend_s = 0.0
        cls = _old_rule_source() if rule == "before" else PolicySource
        src = cls(PolicyRunnerConfig(str(ckpt), cameras={"front": (REFILL_H, REFILL_W)}, queue=qcfg), {"front": cam})
        cam.start()
        daemon.start()
        try:
            src.start()
            if not src.wait_ready(300):
                raise SystemExit(f"policy worker failed: {src.error}")
            end = time.monotonic() + 20
            while not (loop.follower_link.connected and loop.measured is not None) and time.monotonic() < end:
                time.sleep(0.05)
            loop.policy_source = src
            loop.call(lambda: loop.set_intent("policy"))
            end = time.monotonic() + 30
            while loop.state.mode != "policy" and time.monotonic() < end:
                time.sleep(0.01)
            first_cycle, first_chunk = len(cycles), len(src.chunk_log)
            modes = []
            with ControlClient(str(root / "c.sock"), timeout_s=10) as c:
                t_end = time.monotonic() + seconds
                nxt = time.monotonic()
                while nxt < t_end:
                    modes.append(c.request("status")["mode"])
                    nxt += 0.05
                    time.sleep(max(0.0, nxt - time.monotonic()))
            rows = cycles[first_cycle:]
            chunks = list(src.chunk_log)[max(0, first_chunk - 1):]
            st = src.stats()
            loop.call(lambda: loop.set_intent("hold"))
        finally:
            loop.policy_source = None
            src.stop()
            daemon.stop()
            cam.stop()
            lb.stop()
            fb.stop()
    # holds between chunks: runs of cycles not in mode policy
    gaps, run_start = [], None
    for now, mode, _ in rows:
        if mode != "policy" and run_start is None:
            run_start = now
        elif mode == "policy" and run_start is not None:
            gaps.append(now - run_start)
            run_start = None
    # slack when each chunk lands: time left on the chunk before it (negative: the arm held)
    period, age = qcfg.action_period_s, qcfg.max_obs_age_s
    slack = [(o0 + min(n0 * period, age)) - r1 for (_, o0, _, n0, _), (_, _, r1, _, _) in zip(chunks[:-1], chunks[1:])]
    pol = [i for i in range(1, len(rows)) if rows[i][1] == "policy" and rows[i - 1][1] == "policy"]
    raw_step = max((float(np.abs(rows[i][2] - rows[i - 1][2]).max()) for i in pol), default=float("nan"))
    return {"in_policy": sum(m == "policy" for m in modes) / max(1, len(modes)), "samples": len(modes),
            "gaps": np.array(gaps), "slack": np.array(slack), "raw_step": raw_step, "stats": st}


def run_refill(args: argparse.Namespace) -> int:
    from daemon.policy.engine import FORWARD_DELAY_ENV
    from daemon.policy.tiny import make_synthetic_dataset as mk

    os.environ[FORWARD_DELAY_ENV] = str(args.forward_s)  # the spawned workers inherit it
    with tempfile.TemporaryDirectory(prefix="so101d-bench-refill-") as d:
        t0 = time.monotonic()
        ds = mk(Path(d) / "dataset", {"front": (REFILL_H, REFILL_W)}, episodes=2, frames_per_episode=30)
        ckpt = train_tiny_policy(ds, Path(d) / "act", policy_type="act", steps=4, chunk_size=100).checkpoint
        print(f"checkpoint: ACT chunk 100 / n_action_steps 100 (tiny transformer, resnet18), one {REFILL_W}x{REFILL_H} "
              f"camera, built in {time.monotonic() - t0:.1f} s; forward pass padded to {args.forward_s * 1e3:.0f} ms; "
              f"30 fps, max_obs_age_s 1.0, {args.refill_seconds:g} s per round, status every 50 ms")
        results: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            for rule in ("before", "after"):
                results[rule].append(bench_refill_round(ckpt, rule, args.refill_seconds))
    print(f"\n  {'rule':<7} {'policy %':>8} {'holds':>6} {'hold p50':>9} {'hold max':>9} {'slack p1':>9} {'slack p50':>9} "
          f"{'expired':>7} {'max raw step':>12}")
    for rule, runs in results.items():
        for r in runs:
            g, sl, st = r["gaps"] * 1e3, r["slack"] * 1e3, r["stats"]
            print(f"  {rule:<7} {r['in_policy'] * 100:8.1f} {len(g):6d} {pct(g, 50):9.1f} {(g.max() if g.size else 0):9.1f} "
                  f"{pct(sl, 1):9.1f} {pct(sl, 50):9.1f} {st['chunks_expired']:7d} {r['raw_step']:12.3f}")
    print("  (holds and slack in ms; slack = time left on the previous chunk when the next one landed)")
    for rule, runs in results.items():
        st = runs[-1]["stats"]
        print(f"\n  {rule}: observation -> chunk in the loop, by stage (ms, last round; n = chunks)")
        print(f"  {'stage':<12} {'p50':>9} {'p99':>9} {'max':>9}")
        for key in ("request", "ask", "handoff", "publish", "read", "preprocess", "forward", "postprocess", "pipe",
                    "poll", "deliver"):
            v = st["stages_ms"].get(key)
            if v:
                print(f"  {key:<12} {v['p50']:9.2f} {v['p99']:9.2f} {v['max']:9.2f}   n={v['n']}")
        o, lat = st["overhead_ms"], st["inference_latency_ms"]
        print(f"  {'total':<12} {lat['p50']:9.2f} {lat['p99']:9.2f} {lat['max']:9.2f}")
        print(f"  {'overhead':<12} {o['p50']:9.2f} {o['p99']:9.2f} {o['max']:9.2f}   (total minus forward)")
    b = np.mean([r["in_policy"] for r in results["before"]])
    a = np.mean([r["in_policy"] for r in results["after"]])
    print(f"\ntime in mode policy: before {b * 100:.1f} %, after {a * 100:.1f} % "
          f"(held {(1 - b) * 1e3:.0f} vs {(1 - a) * 1e3:.0f} ms per second)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refill", action="store_true", help="only the refill-rule comparison (issue 16)")
    ap.add_argument("--refill-seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--forward-s", type=float, default=0.15)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--skip-lerobot", action="store_true")
    ap.add_argument("--skip-loop", action="store_true")
    ap.add_argument("--loop-seconds", type=float, default=4.0)
    ap.add_argument("--checkpoint", type=Path, help="reuse a checkpoint folder (skips building one)")
    args = ap.parse_args()
    if args.refill:
        return run_refill(args)
    with tempfile.TemporaryDirectory(prefix="so101d-bench-policy-") as d:
        ckpt = args.checkpoint or build_checkpoint(Path(d))
        ours = bench_ours(ckpt, args.requests)
        print(f"\nours: {len(ours['latency'])} requests, observation -> action chunk in the loop (ms)")
        print(f"  {'stage':<34} {'p50':>9} {'p99':>9} {'max':>9}")
        print(row("transfer in (daemon: frames->shm)", ours["publish"]))
        print(row("request (loop -> worker has it)", ours["request"], "publisher thread + copy + pipe"))
        print(row("transfer in (worker: shm->local)", ours["read"]))
        print(row("preprocessing (LeRobot pipeline)", ours["preprocess"]))
        print(row("forward pass", ours["forward"]))
        print(row("postprocessing (unnormalise)", ours["postprocess"]))
        print(row("transfer out (pipe + poll)", ours["deliver"]))
        print(row("total", ours["latency"]))
        print(row("overhead beyond forward", ours["overhead"]))
        print(row("  of which transport (no pre/post)", ours["transport"], "target p99 <= 1 ms"))
        print(row("PolicySource.target() per call", ours["target_cost"], "loop-side cost"))
        sv = bench_serve(ckpt, args.requests)
        if sv.get("skipped"):
            print(f"\nours, ZeroMQ serve path: {sv['skipped']}")
        else:
            print(f"\nours, ZeroMQ serve path (so101d policy serve, ipc, msgpack + raw arrays): {len(sv['latency'])} requests")
            print(row("forward pass (server-reported)", sv["forward"]))
            print(row("total (client round trip)", sv["latency"]))
            print(row("overhead beyond forward", sv["latency"] - sv["forward"]))
        remote, lr = {}, {}
        if not args.skip_lerobot:
            server = LeRobotServerProc()  # one server, the same checkpoint, both clients in turn
            try:
                remote = bench_ours_remote(ckpt, server, args.requests)
                lr = bench_lerobot(ckpt, args.requests, server)
            finally:
                server.close()
        if remote.get("skipped"):
            print(f"\nours with LeRobot's server: {remote['skipped']}")
        elif remote:
            print(f"\nours with LeRobot's server (daemon backend lerobot-server, gRPC on loopback): {len(remote['latency'])} requests")
            print(row("forward pass (from its server log)", remote["forward"]))
            print(row("gRPC round trip (worker)", remote["round_trip"]))
            print(row("total", remote["latency"]))
            if len(remote["forward"]) == len(remote["latency"]):
                print(row("overhead beyond forward", remote["latency"] - remote["forward"]))
        if lr.get("skipped"):
            print(f"\nlerobot async inference: {lr['skipped']}")
        elif lr:
            print(f"\nlerobot async inference (gRPC on loopback): {len(lr['latency'])} requests ({lr['empty']} empty replies)")
            print(row("forward pass (from its server log)", lr["forward"]))
            print(row("total", lr["latency"]))
            if len(lr["forward"]) == len(lr["latency"]):
                lr_ovh = lr["latency"] - lr["forward"]
                print(row("overhead beyond forward", lr_ovh))
                r50 = pct(lr_ovh, 50) / pct(ours["overhead"], 50)
                r99 = pct(lr_ovh, 99) / pct(ours["overhead"], 99)
                print(f"\nratios lerobot / ours (loop path): overhead beyond forward p50 {r50:.1f}x, p99 {r99:.1f}x; "
                      f"total latency p50 {pct(lr['latency'], 50) / pct(ours['latency'], 50):.2f}x "
                      "(forward passes vary with machine load)")
                if not sv.get("skipped"):
                    so = sv["latency"] - sv["forward"]
                    print(f"ratios lerobot / ours (serve path): overhead beyond forward p50 {pct(lr_ovh, 50) / pct(so, 50):.1f}x, "
                          f"p99 {pct(lr_ovh, 99) / pct(so, 99):.1f}x")
            else:
                print("  (its server log did not give one forward time per request: overhead not computed)")
        three = [("ours, local worker", ours["overhead"])]
        if remote and not remote.get("skipped") and len(remote["forward"]) == len(remote["latency"]):
            three.append(("ours + LeRobot's server", remote["latency"] - remote["forward"]))
        if lr and not lr.get("skipped") and len(lr["forward"]) == len(lr["latency"]):
            three.append(("LeRobot client + its server", lr["latency"] - lr["forward"]))
        if len(three) > 1:
            print("\noverhead beyond the forward pass, three ways, same checkpoint, this run (ms)")
            print(f"  {'path':<30} {'p50':>8} {'p99':>8} {'p99.9':>8} {'n':>5}")
            for name, o in three:
                print(f"  {name:<30} {pct(o, 50) * 1e3:8.2f} {pct(o, 99) * 1e3:8.2f} {pct(o, 99.9) * 1e3:8.2f} {len(o):5d}")
            base = three[0][1]
            for name, o in three[1:]:
                print(f"  ratio {name} / ours local: p50 {pct(o, 50) / pct(base, 50):.1f}x, p99 {pct(o, 99) / pct(base, 99):.1f}x")
        if not args.skip_loop:
            res = bench_loop(ckpt, args.loop_seconds)
            print("\ncontrol loop on the emulated bench (100 Hz target), teleop vs policy (two rounds each)")
            for mode, runs in res.items():
                for r in runs:
                    print(f"  {mode:<7} rate {r['rate_hz']:6.1f} Hz   period p50 {r['period']['p50']:.3f} ms   "
                          f"jitter p99 {r['jitter']['p99'] * 1e3:7.1f} us  max {r['jitter']['max'] * 1e3:8.1f} us")
            tj = np.mean([r["jitter"]["p99"] for r in res.get("teleop", [])])
            pj = np.mean([r["jitter"]["p99"] for r in res.get("policy", [])])
            print(f"  jitter p99 policy - teleop: {(pj - tj) * 1e3:+.1f} us (the worker, on its own cores minus one, "
                  "competes with the loop for the CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
