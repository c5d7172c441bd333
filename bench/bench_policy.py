"""Policy serving benchmark: our local path vs LeRobot 0.6.1's async inference, same checkpoint.

1. A full-size ACT (LeRobot defaults: resnet18 backbone, dim 512, chunk 100; random backbone
   weights, no download) is trained for one step on a synthetic dataset in the daemon's schema
   with one 640x480 camera and saved as LeRobot saves checkpoints.
2. Ours: PolicySource (worker process, observation through shared memory, chunk back over a pipe
   as msgpack + raw float32, put into the action queue by the receiver thread on arrival) driven
   as the loop drives it, waking as each chunk lands; a new request as soon as each chunk lands.
   Overhead beyond the forward pass = request issued -> actions usable by the loop, minus the
   forward pass the worker measured (goal: <= 1 ms p99), split per chunk into handoff / worker /
   reply / prepare (they add up; the loop's pickup beside them). Before it: one full garbage collection with and without
   gc.freeze(), the image hand-over to LeRobot's preprocessor old vs new, and a tail run of
   ``--tail-requests`` (1000) on a tiny ACT so p99.9 means something. Also: what
   `PolicySource.target()` costs the loop.
3. LeRobot: `lerobot.async_inference.policy_server` in its own process on 127.0.0.1 (gRPC,
   inference_latency 0), driven the way its robot_client drives it (Ready, SendPolicyInstructions,
   SendObservations with must_go, GetActions), same checkpoint and observation; issued = before
   the observation is pickled, usable = after the reply is unpickled. Note: LeRobot's
   protocol is pickle both ways; this benchmark is the only place we speak it (to a server we
   started ourselves, on loopback). Its server logs each forward pass ("Preprocessing and inference
   took"; policy_server.py times predict_action_chunk alone): overhead = latency minus that,
   request by request.
3b. Ours with LeRobot's server: the same server process and checkpoint driven by our
   daemon's ``backend = "lerobot-server"`` path (PolicySource -> worker process -> gRPC client ->
   restricted unpickler -> action queue), before LeRobot's own client protocol (3). Overhead is
   latency minus the server-logged forward time, request by request; the last table prints the
   overhead beyond the forward pass three ways (p50/p99/p99.9) with ratios to our local worker.
4. Ours for other local programs: `so101d policy serve` (its own process, ZeroMQ ipc, msgpack +
   raw arrays) driven by PolicyClient, request/response like LeRobot's.
5. Control loop rate and p99 period jitter on the emulated bench in teleop vs policy mode.
6. Refill rule (docs/design/policy-refill.md), ``--refill``: the daemon on the emulated bench driven by an ACT with
   LeRobot's default chunk (100 actions at 30 fps; tiny transformer, resnet18 backbone, one 320x240
   camera) whose forward pass is padded to ``--forward-s`` (engine knob SO101D_POLICY_FORWARD_DELAY_S),
   ``max_obs_age_s`` 1 s. Rounds alternate the old rule (ask when <= refill_below actions are left,
   counting those that will expire; no cross-fade) and the new one (ask when the usable horizon falls
   to latency p99 + margin; cross-fade). Per round: time in mode policy (status sampled every 50 ms),
   the holds between chunks, the slack when each chunk lands (time left on the previous one;
   negative = the arm held that long), the largest per-cycle step of the policy's target, and the
   overhead beyond the forward pass by stage.

Ratios are printed side by side (measured in one run, interleaved where it matters).

    .venv/bin/python bench/bench_policy.py [--requests 30] [--tail-requests 1000] [--skip-tail] [--skip-lerobot] [--skip-loop]
    .venv/bin/python bench/bench_policy.py --refill [--refill-seconds 10] [--rounds 2] [--forward-s 0.15]
"""

from __future__ import annotations

import argparse
import itertools
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

from calibration.conventions import FEATURE_NAMES
from daemon.policy.action_queue import QueueConfig
from daemon.policy.runner import STAGE_KEYS, PolicyRunnerConfig, PolicySource
from daemon.policy.tiny import make_synthetic_dataset, synthetic_frame, synthetic_pose, train_tiny_policy
from drivers.cameras import Frame

H, W = 480, 640


def pct(a, q) -> float:
    return float(np.percentile(np.asarray(a, dtype=np.float64), q)) if len(a) else float("nan")


def row(name: str, samples_s, note: str = "") -> str:
    ms = np.asarray(samples_s, dtype=np.float64) * 1e3
    if ms.size == 0:
        return f"  {name:<34} {'-':>9} {'-':>9} {'-':>9} {'-':>9}  {note}"
    return f"  {name:<34} {pct(ms, 50):9.3f} {pct(ms, 99):9.3f} {pct(ms, 99.9):9.3f} {ms.max():9.3f}  {note}"


HEADER = f"  {'stage':<34} {'p50':>9} {'p99':>9} {'p99.9':>9} {'max':>9}"


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
def bench_ours(
    ckpt: Path, requests: int, h: int = H, w: int = W, all_cores: bool = True, omp_wait_policy: str | None = None
) -> dict:
    """Our local path, polled the way the loop polls it but waking as each chunk lands (the chunk
    is usable on arrival; no loop period hides in the figures). Per chunk the runner's timeline:
    request issued -> usable, split into handoff / worker / forward / reply / prepare (+ the loop's pickup).

    ``all_cores``: the forward pass on every core, like LeRobot's server (the daemon's default
    leaves one core to the loop and runs the worker at nice 5: ``all_cores=False``).
    ``omp_wait_policy``: the worker's OMP_WAIT_POLICY ("" = libgomp's own default, spinning);
    None = what the worker chooses (worker.torch_threads)."""
    state = synthetic_pose(0.3)
    img = synthetic_frame(state, h, w)
    qcfg = QueueConfig(refill_below=1000, max_obs_age_s=60.0)  # always wants a refill: back to back
    cfg = PolicyRunnerConfig(str(ckpt), cameras={"front": (h, w)}, queue=qcfg)
    if all_cores:
        cfg.nice, cfg.torch_threads = 0, os.cpu_count() or 1
    src = PolicySource(cfg, {"front": StillCamera(img)})
    saved = os.environ.get("OMP_WAIT_POLICY")
    if omp_wait_policy is not None:  # the spawned worker takes the environment at start()
        os.environ["OMP_WAIT_POLICY"] = omp_wait_policy
    try:
        src.start()
    finally:
        if saved is None:
            os.environ.pop("OMP_WAIT_POLICY", None)
        else:
            os.environ["OMP_WAIT_POLICY"] = saved
    if not src.wait_ready(300):
        raise SystemExit(f"policy worker failed: {src.error}")
    print(f"ours: worker ready ({src.worker_info})")
    costs = []
    warm = 3
    while src.results < warm:
        src.target(time.monotonic(), state)
        src.wait_result(0.001)
    first = len(src.timeline)
    sub_start = {k: len(src.stage[k].values()) for k in ("publish", "read", "preprocess", "postprocess", "gc")}
    while len(src.timeline) < first + requests:
        src.wait_result(0.001)
        t0 = time.perf_counter()
        src.target(time.monotonic(), state)
        costs.append(time.perf_counter() - t0)
    src.stop()
    tl = list(src.timeline)[first : first + requests]
    out = {
        k: np.array([c[k] for c in tl])
        for k in ("handoff", "worker", "forward", "reply", "prepare", "total", "overhead")
    }
    for k, n0 in sub_start.items():
        out[k] = np.array(src.stage[k].values()[n0 : n0 + requests])
    out["target_cost"] = np.array(costs)
    out["gc_status"] = src.stats()["gc"]
    out["worker_info"] = dict(src.worker_info)
    return out


def worst_calls_line(worst_ms: dict[str, float], over: dict[str, int]) -> str:
    """The longest single call the loop made into each source and hook, checked against the
    loop's 1 ms budget (daemon/control/timing_stats.py CALL_BUDGET_S)."""
    from daemon.control.timing_stats import CALL_BUDGET_S

    budget_ms = CALL_BUDGET_S * 1e3
    parts = [
        f"{name} {ms:.3f} ms" + (f" ({over[name]} over)" if over.get(name) else "") for name, ms in worst_ms.items()
    ]
    ok = all(ms <= budget_ms for ms in worst_ms.values())
    return (
        f"          worst call: {', '.join(parts) or 'none'}   target <= {budget_ms:g} ms  [{'ok' if ok else 'MISSED'}]"
    )


def print_ours(ours: dict, what: str) -> None:
    print(f"\nours, {what}: {len(ours['total'])} requests, request issued -> chunk usable by the loop (ms)")
    print(HEADER)
    print(row("handoff (-> worker has it)", ours["handoff"], "publisher thread + frame copy + pipe"))
    print(row("  of which the frame copy", ours["publish"]))
    print(row("worker beyond the forward pass", ours["worker"], "of which:"))
    print(row("  shared memory -> worker", ours["read"]))
    print(row("  preprocessing", ours["preprocess"]))
    print(row("  postprocessing", ours["postprocess"]))
    print(row("  garbage-collection pauses", ours["gc"]))
    print(row("forward pass", ours["forward"]))
    print(row("reply (pipe, receiver thread)", ours["reply"]))
    print(row("prepare (decode, checks): usable", ours["prepare"]))
    print(row("total", ours["total"]))
    print(row("overhead beyond forward", ours["overhead"], "goal p99 <= 1 ms"))
    print(row("PolicySource.target() per call", ours["target_cost"], "loop-side cost"))
    worst = float(ours["target_cost"].max()) * 1e3
    print(
        f"  worst PolicySource.target() call {worst:.3f} ms, {int((ours['target_cost'] > 1e-3).sum())} of "
        f"{len(ours['target_cost'])} calls over 1 ms   target <= 1 ms  [{'ok' if worst <= 1.0 else 'MISSED'}]"
    )
    g = ours["gc_status"]
    print(
        f"  daemon process during the run: {g['daemon_collections']} collections ({g['daemon_full_collections']} full), "
        f"longest {g['daemon_max_pause_ms']:.2f} ms; {g['daemon_frozen_objects']} objects frozen at start"
    )
    info, faults = ours["worker_info"], g.get("worker_page_faults") or {}
    print(
        f"  worker: {info.get('torch_threads')} torch thread(s), OpenMP wait {info.get('omp_wait_policy')}; "
        f"{info.get('io')}; {info.get('heap')}; page faults per chunk p50 {faults.get('p50')}, max {faults.get('max')}"
    )


TAIL_H, TAIL_W = 240, 320


def build_tail_checkpoint(work: Path) -> Path:
    """A tiny ACT (short forward pass) so a thousand requests fit in a minute: the overhead's tail
    does not depend on the model, only on the frame size and the machine."""
    ds = make_synthetic_dataset(work / "tail_dataset", {"front": (TAIL_H, TAIL_W)}, episodes=1, frames_per_episode=12)
    return train_tiny_policy(ds, work / "tail_act", policy_type="act", steps=1, batch_size=2).checkpoint


def bench_gc() -> None:
    """What one full garbage collection costs in a process that has imported what the daemon
    imports (torch, LeRobot, the daemon), before and after gc.freeze(), side by side."""
    import gc

    import lerobot.datasets.lerobot_dataset  # noqa: F401
    import torch  # noqa: F401

    import daemon.service.attach_recording
    import daemon.service.daemon  # noqa: F401

    gc.unfreeze()
    n = len(gc.get_objects())
    before, after = [], []
    for _ in range(3):
        gc.unfreeze()
        t0 = time.perf_counter()
        gc.collect(2)
        before.append(time.perf_counter() - t0)
        gc.freeze()
        t0 = time.perf_counter()
        gc.collect(2)
        after.append(time.perf_counter() - t0)
    print(f"\ngarbage collector, this process ({n} tracked objects after importing torch, LeRobot, the daemon):")
    print(
        f"  one full collection: {np.median(before) * 1e3:.1f} ms unfrozen, {np.median(after) * 1e3:.3f} ms after "
        f"gc.freeze() (median of 3; ratio {np.median(before) / max(np.median(after), 1e-9):.0f}x): it stops every "
        "thread of the daemon, the control loop's included"
    )


def bench_preprocess(ckpt: Path, rounds: int, h: int, w: int) -> None:
    """LeRobot's pre/post-processing pipelines vs the fused form the engine measured from them
    (daemon/policy/fused_io.py), each timed inside a whole inference as the worker runs it: right
    after a forward pass, caches cold. Two engines on the same checkpoint, interleaved, one torch
    thread (the worker's default on a 2-core machine); their action chunks are checked equal."""
    import torch

    from daemon.policy.engine import PolicyEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    engines = {
        "pipeline": PolicyEngine.from_checkpoint(str(ckpt), None, "cpu", fused_io=False),
        "fused": PolicyEngine.from_checkpoint(str(ckpt), None, "cpu"),
    }
    state = synthetic_pose(0.3)
    img = synthetic_frame(state, h, w)
    pre: dict[str, list[float]] = {k: [] for k in engines}
    post: dict[str, list[float]] = {k: [] for k in engines}
    chunks = {k: e.infer(state, {"front": img})[0] for k, e in engines.items()}
    diff = float(np.abs(chunks["fused"] - chunks["pipeline"]).max())
    for _ in range(rounds):
        for name, eng in engines.items():
            _, t = eng.infer(state, {"front": img})
            pre[name].append(t.preprocess_s)
            post[name].append(t.postprocess_s)
    torch.set_num_threads(threads)
    print(
        f"\npre/post-processing one {w}x{h} frame inside an inference (after its forward pass), {rounds} "
        f"interleaved rounds, {max(1, (os.cpu_count() or 2) - 1)} torch thread(s)"
    )
    print(f"  fused engine: {engines['fused'].io}; chunks differ by at most {diff:.2g} (LeRobot units)")
    print(HEADER)
    print(row("LeRobot's preprocessor", pre["pipeline"]))
    print(row("fused preprocessing", pre["fused"]))
    print(row("LeRobot's postprocessor", post["pipeline"]))
    print(row("fused postprocessing", post["fused"]))
    print(
        f"  ratio pipeline / fused: preprocessing p50 {pct(pre['pipeline'], 50) / pct(pre['fused'], 50):.1f}x, "
        f"p99 {pct(pre['pipeline'], 99) / pct(pre['fused'], 99):.1f}x; postprocessing p50 "
        f"{pct(post['pipeline'], 50) / pct(post['fused'], 50):.1f}x"
    )


# -- ours, ZeroMQ serve path (request/response like LeRobot's, for other local programs) ---------------
def bench_serve(ckpt: Path, requests: int) -> dict:
    from daemon.policy.serve import PolicyClient

    d = tempfile.mkdtemp(prefix="so101d-serve-")
    endpoint = f"ipc://{d}/policy.ipc"
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.apps.cli", "policy", "serve", str(ckpt), "--endpoint", endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
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
                _actions, timings = client.infer(state, {"front": img})
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
            [
                sys.executable,
                "-m",
                "lerobot.async_inference.policy_server",
                "--host=127.0.0.1",
                f"--port={self.port}",
                "--fps=30",
                "--inference_latency=0",
                "--obs_queue_timeout=5",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=logdir,
            text=True,
        )
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
    spec = ServerSpec(
        server=f"127.0.0.1:{server.port}",
        policy_type="act",
        checkpoint=str(ckpt),
        actions_per_chunk=100,
        cameras={"front": [H, W]},
        call_timeout_s=120.0,
    )
    src = PolicySource(
        PolicyRunnerConfig(
            str(ckpt),
            cameras={"front": (H, W)},
            queue=qcfg,
            nice=0,
            backend="lerobot-server",
            server=spec,
            request_timeout_s=120.0,
        ),
        {"front": StillCamera(img)},
    )
    src.start()
    if not src.wait_ready(300) or not src.link.get("connected"):
        src.stop()
        return {"skipped": f"our lerobot-server backend did not connect: {src.error or src.link}"}
    warm = 3
    while src.results < warm:
        src.wait_result(0.001)
        src.target(time.monotonic(), state)
    first = len(src.timeline)
    fwd_start = len(server.forwards)
    while len(src.timeline) < first + requests:
        src.wait_result(0.001)
        src.target(time.monotonic(), state)
    lat = np.array([c["total"] for c in list(src.timeline)[first : first + requests]])  # issued -> usable
    rt = np.array(src.remote["round_trip"].values()[-len(lat) :])
    src.stop()
    time.sleep(0.5)  # the log line of the last request
    fw = np.array(server.forwards[fwd_start : fwd_start + len(lat)])
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
        fw = np.array(forwards[-len(lat) :]) if len(forwards) >= len(lat) else np.array([])
        return {"latency": np.array(lat), "empty": empty, "forward": fw}
    finally:
        if own:
            server.close()


# -- control loop: teleop vs policy -------------------------------------------------------------------
def bench_loop(ckpt: Path, seconds: float) -> dict:
    from daemon.config.settings import config_from_dict
    from daemon.service.attach_policy import attach_policy
    from daemon.service.daemon import Daemon
    from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
    from drivers.feetech_arm import FeetechFollower, FeetechLeader

    pose = np.array([0.0, -20.0, 20.0, 10.0, 0.0, 40.0])
    out = {}
    with tempfile.TemporaryDirectory(prefix="so101d-bench-") as d:
        root = Path(d)
        la, fa = EmulatedArm("leader", initial_pose_units=pose), EmulatedArm("follower", initial_pose_units=pose)
        la.set_pose_units(pose)
        lb, fb = BusEmulator(root / "leader", la).start(), BusEmulator(root / "follower", fa).start()
        cfg = config_from_dict(
            {
                "socket": {"path": str(root / "c.sock")},
                "cameras": {"front": {"kind": "virtual", "width": W, "height": H}},
                "policy": {"max_obs_age_s": 5.0},
            }
        )
        daemon = Daemon(
            cfg,
            FeetechLeader(str(root / "leader"), reference_calibration("leader")),
            FeetechFollower(str(root / "follower"), reference_calibration("follower")),
        )
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
                loop.call(loop.worst_calls.reset)  # on the loop thread: the only one writing it
                c0 = loop.cycles
                t_end = time.monotonic() + seconds
                last = None
                while time.monotonic() < t_end:
                    st = loop.stats.summaries_ms()
                    last = st
                    time.sleep(0.25)
                n = loop.cycles - c0
                out.setdefault(mode, []).append(
                    {
                        "rate_hz": n / seconds,
                        "period": last["period"],
                        "jitter": last["jitter"],
                        "worst_calls_ms": loop.worst_calls.as_ms(),
                        "over_budget": dict(loop.worst_calls.over_budget),
                    }
                )
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
    """PolicySource with the refill rule that counted queued actions, to measure it beside the new one."""
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
    from daemon.api.client import ControlClient
    from daemon.config.settings import config_from_dict
    from daemon.service.attach_policy import queue_config_from
    from daemon.service.daemon import Daemon
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
        cfg = config_from_dict(
            {
                "socket": {"path": str(root / "c.sock")},
                "cameras": {"front": {"kind": "virtual", "width": REFILL_W, "height": REFILL_H}},
            }
        )
        daemon = Daemon(
            cfg,
            FeetechLeader(str(root / "leader"), reference_calibration("leader")),
            FeetechFollower(str(root / "follower"), reference_calibration("follower")),
        )
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
            chunks = list(src.chunk_log)[max(0, first_chunk - 1) :]
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
    slack = [(o0 + min(n0 * period, age)) - r1 for (_, o0, _, n0, _), (_, _, r1, _, _) in itertools.pairwise(chunks)]
    pol = [i for i in range(1, len(rows)) if rows[i][1] == "policy" and rows[i - 1][1] == "policy"]
    raw_step = max((float(np.abs(rows[i][2] - rows[i - 1][2]).max()) for i in pol), default=float("nan"))
    return {
        "in_policy": sum(m == "policy" for m in modes) / max(1, len(modes)),
        "samples": len(modes),
        "gaps": np.array(gaps),
        "slack": np.array(slack),
        "raw_step": raw_step,
        "stats": st,
    }


def run_refill(args: argparse.Namespace) -> int:
    from daemon.policy.engine import FORWARD_DELAY_ENV
    from daemon.policy.tiny import make_synthetic_dataset as mk

    os.environ[FORWARD_DELAY_ENV] = str(args.forward_s)  # the spawned workers inherit it
    with tempfile.TemporaryDirectory(prefix="so101d-bench-refill-") as d:
        t0 = time.monotonic()
        ds = mk(Path(d) / "dataset", {"front": (REFILL_H, REFILL_W)}, episodes=2, frames_per_episode=30)
        ckpt = train_tiny_policy(ds, Path(d) / "act", policy_type="act", steps=4, chunk_size=100).checkpoint
        print(
            f"checkpoint: ACT chunk 100 / n_action_steps 100 (tiny transformer, resnet18), one {REFILL_W}x{REFILL_H} "
            f"camera, built in {time.monotonic() - t0:.1f} s; forward pass padded to {args.forward_s * 1e3:.0f} ms; "
            f"30 fps, max_obs_age_s 1.0, {args.refill_seconds:g} s per round, status every 50 ms"
        )
        results: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            for rule in ("before", "after"):
                results[rule].append(bench_refill_round(ckpt, rule, args.refill_seconds))
    print(
        f"\n  {'rule':<7} {'policy %':>8} {'holds':>6} {'hold p50':>9} {'hold max':>9} {'slack p1':>9} {'slack p50':>9} "
        f"{'expired':>7} {'max raw step':>12}"
    )
    for rule, runs in results.items():
        for r in runs:
            g, sl, st = r["gaps"] * 1e3, r["slack"] * 1e3, r["stats"]
            print(
                f"  {rule:<7} {r['in_policy'] * 100:8.1f} {len(g):6d} {pct(g, 50):9.1f} {(g.max() if g.size else 0):9.1f} "
                f"{pct(sl, 1):9.1f} {pct(sl, 50):9.1f} {st['chunks_expired']:7d} {r['raw_step']:12.3f}"
            )
    print("  (holds and slack in ms; slack = time left on the previous chunk when the next one landed)")
    for rule, runs in results.items():
        st = runs[-1]["stats"]
        print(f"\n  {rule}: observation -> chunk usable by the loop, by stage (ms, last round; n = chunks)")
        print(f"  {'stage':<12} {'p50':>9} {'p99':>9} {'max':>9}")
        for key in STAGE_KEYS:
            v = st["stages_ms"].get(key)
            if v:
                print(f"  {key:<12} {v['p50']:9.2f} {v['p99']:9.2f} {v['max']:9.2f}   n={v['n']}")
        o, lat = st["overhead_ms"], st["inference_latency_ms"]
        print(f"  {'latency':<12} {lat['p50']:9.2f} {lat['p99']:9.2f} {lat['max']:9.2f}   (observation -> usable)")
        print(
            f"  {'overhead':<12} {o['p50']:9.2f} {o['p99']:9.2f} {o['max']:9.2f}   (request -> usable, minus forward)"
        )
    b = np.mean([r["in_policy"] for r in results["before"]])
    a = np.mean([r["in_policy"] for r in results["after"]])
    print(
        f"\ntime in mode policy: before {b * 100:.1f} %, after {a * 100:.1f} % "
        f"(held {(1 - b) * 1e3:.0f} vs {(1 - a) * 1e3:.0f} ms per second)"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refill", action="store_true", help="only the refill-rule comparison")
    ap.add_argument("--refill-seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--forward-s", type=float, default=0.15)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--skip-lerobot", action="store_true")
    ap.add_argument("--skip-loop", action="store_true")
    ap.add_argument("--loop-seconds", type=float, default=4.0)
    ap.add_argument("--checkpoint", type=Path, help="reuse a checkpoint folder (skips building one)")
    ap.add_argument("--skip-tail", action="store_true", help="skip the GC, preprocessing and tail-run sections")
    ap.add_argument("--tail-requests", type=int, default=1000)
    ap.add_argument("--preprocess-rounds", type=int, default=200)
    args = ap.parse_args()
    if args.refill:
        return run_refill(args)
    with tempfile.TemporaryDirectory(prefix="so101d-bench-policy-") as d:
        ckpt = args.checkpoint or build_checkpoint(Path(d))
        if not args.skip_tail:
            tail_ck = build_tail_checkpoint(Path(d))
            bench_preprocess(tail_ck, args.preprocess_rounds, TAIL_H, TAIL_W)
            bench_gc()
            print_ours(
                bench_ours(tail_ck, args.tail_requests, TAIL_H, TAIL_W, all_cores=False),
                f"local worker, tail run, the daemon's defaults (tiny ACT, one {TAIL_W}x{TAIL_H} camera)",
            )
            tails = {}
            for what, policy in (("libgomp's default spin", ""), ("as the worker sets it", None)):
                tails[what] = bench_ours(tail_ck, args.tail_requests, TAIL_H, TAIL_W, omp_wait_policy=policy)
                print_ours(tails[what], f"local worker, tail run, every core, OpenMP wait {what}")
            print("\ntail runs on every core, overhead beyond forward (ms): OpenMP wait policy")
            print(HEADER)
            for what, out in tails.items():
                print(row(f"{what} ({out['worker_info'].get('omp_wait_policy')})", out["overhead"]))
        ours = bench_ours(ckpt, args.requests)
        print_ours(ours, f"local worker (full-size ACT, one {W}x{H} camera)")
        sv = bench_serve(ckpt, args.requests)
        if sv.get("skipped"):
            print(f"\nours, ZeroMQ serve path: {sv['skipped']}")
        else:
            print(
                f"\nours, ZeroMQ serve path (so101d policy serve, ipc, msgpack + raw arrays): {len(sv['latency'])} requests"
            )
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
            print(
                f"\nours with LeRobot's server (daemon backend lerobot-server, gRPC on loopback): {len(remote['latency'])} requests"
            )
            print(row("forward pass (from its server log)", remote["forward"]))
            print(row("gRPC round trip (worker)", remote["round_trip"]))
            print(row("total", remote["latency"]))
            if len(remote["forward"]) == len(remote["latency"]):
                print(row("overhead beyond forward", remote["latency"] - remote["forward"]))
        if lr.get("skipped"):
            print(f"\nlerobot async inference: {lr['skipped']}")
        elif lr:
            print(
                f"\nlerobot async inference (gRPC on loopback): {len(lr['latency'])} requests ({lr['empty']} empty replies)"
            )
            print(row("forward pass (from its server log)", lr["forward"]))
            print(row("total", lr["latency"]))
            if len(lr["forward"]) == len(lr["latency"]):
                lr_ovh = lr["latency"] - lr["forward"]
                print(row("overhead beyond forward", lr_ovh))
                r50 = pct(lr_ovh, 50) / pct(ours["overhead"], 50)
                r99 = pct(lr_ovh, 99) / pct(ours["overhead"], 99)
                print(
                    f"\nratios lerobot / ours (loop path): overhead beyond forward p50 {r50:.1f}x, p99 {r99:.1f}x; "
                    f"total latency p50 {pct(lr['latency'], 50) / pct(ours['total'], 50):.2f}x "
                    "(forward passes vary with machine load)"
                )
                if not sv.get("skipped"):
                    so = sv["latency"] - sv["forward"]
                    print(
                        f"ratios lerobot / ours (serve path): overhead beyond forward p50 {pct(lr_ovh, 50) / pct(so, 50):.1f}x, "
                        f"p99 {pct(lr_ovh, 99) / pct(so, 99):.1f}x"
                    )
            else:
                print("  (its server log did not give one forward time per request: overhead not computed)")
        three = [("ours, local worker", ours["overhead"])]
        if remote and not remote.get("skipped") and len(remote["forward"]) == len(remote["latency"]):
            three.append(("ours + LeRobot's server", remote["latency"] - remote["forward"]))
        if lr and not lr.get("skipped") and len(lr["forward"]) == len(lr["latency"]):
            three.append(("LeRobot client + its server", lr["latency"] - lr["forward"]))
        if len(three) > 1:
            print("\noverhead beyond the forward pass (request issued -> actions usable, minus the forward pass),")
            print("three ways, same checkpoint, this run (ms; with n < 1000, p99.9 is close to the max)")
            print(f"  {'path':<30} {'p50':>8} {'p99':>8} {'p99.9':>8} {'n':>5}")
            for name, o in three:
                print(
                    f"  {name:<30} {pct(o, 50) * 1e3:8.2f} {pct(o, 99) * 1e3:8.2f} {pct(o, 99.9) * 1e3:8.2f} {len(o):5d}"
                )
            base = three[0][1]
            for name, o in three[1:]:
                print(
                    f"  ratio {name} / ours local: p50 {pct(o, 50) / pct(base, 50):.1f}x, p99 {pct(o, 99) / pct(base, 99):.1f}x"
                )
        if not args.skip_loop:
            res = bench_loop(ckpt, args.loop_seconds)
            print("\ncontrol loop on the emulated bench (100 Hz target), teleop vs policy (two rounds each)")
            for mode, runs in res.items():
                for r in runs:
                    print(
                        f"  {mode:<7} rate {r['rate_hz']:6.1f} Hz   period p50 {r['period']['p50']:.3f} ms   "
                        f"jitter p99 {r['jitter']['p99'] * 1e3:7.1f} us  max {r['jitter']['max'] * 1e3:8.1f} us"
                    )
                    print(worst_calls_line(r["worst_calls_ms"], r["over_budget"]))
            tj = np.mean([r["jitter"]["p99"] for r in res.get("teleop", [])])
            pj = np.mean([r["jitter"]["p99"] for r in res.get("policy", [])])
            print(
                f"  jitter p99 policy - teleop: {(pj - tj) * 1e3:+.1f} us (the worker, on its own cores minus one, "
                "competes with the loop for the CPU)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
