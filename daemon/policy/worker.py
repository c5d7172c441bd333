"""The policy worker process: loads the checkpoint, waits for requests, answers with action chunks.

It runs in its own (spawned) process so the control loop never waits on torch. Messages over the
multiprocessing Pipe are msgpack dicts (never pickle; the pipe carries only small control
messages and the action chunk as raw float32 bytes). The observation itself is read from the
shared-memory ObsBuffer.

daemon -> worker: {"t": "infer", "req": id}, {"t": "reset"}, {"t": "stop"}
worker -> daemon: {"t": "ready", "info": {...}}, {"t": "error", "error": str, "fatal": bool},
                  {"t": "result", "req": id, "obs_time_s": f, "n": n, "dim": d, "actions": bytes,
                   "read_s": f, "preprocess_s": f, "forward_s": f, "postprocess_s": f,
                   "got_s": monotonic time the request arrived, "done_s": ... the chunk was ready,
                   "gc_s"/"gc_n": the worker's garbage-collection pauses while it computed this chunk,
                   "faults_n": minor page faults the worker took while it computed this chunk}
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
import numpy as np

MAX_MESSAGE_BYTES = 8 * 1024 * 1024


def pack(msg: dict[str, Any]) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def unpack(data: bytes) -> dict[str, Any]:
    msg = msgpack.unpackb(data, raw=False, max_bin_len=MAX_MESSAGE_BYTES, strict_map_key=True)
    if not isinstance(msg, dict) or "t" not in msg:
        raise ValueError("malformed worker message")
    return msg


@dataclass
class WorkerSpec:
    """Everything the worker needs, as plain data (sent once at spawn)."""

    checkpoint: str
    shm_name: str
    layout: dict[str, Any]
    cameras: dict[str, list[int]] = field(default_factory=dict)  # name -> [h, w] for the mismatch check
    device: str | None = None
    task: str = ""
    max_actions: int | None = None
    nice: int = 5  # lower priority than the control loop: the loop's rate matters more
    torch_threads: int | None = None
    backend: str = "local"  # or "lerobot-server": LeRobot's policy server answers (lerobot_server.py)
    server: dict[str, Any] | None = None  # ServerSpec fields for the lerobot-server backend


def worker_main(conn, spec_dict: dict[str, Any]) -> None:
    """Process entry point (spawn). Never raises: failures become an "error" message."""
    spec = WorkerSpec(**spec_dict)
    try:
        if spec.nice:
            os.nice(spec.nice)
    except OSError:
        pass
    buf = None
    try:
        from daemon.policy.heap import keep_heap, minor_faults

        # before torch allocates anything: its buffers are then reused from request to request
        # instead of being page-faulted in anew each time (heap.py)
        heap = keep_heap()
        threads, omp_wait = torch_threads(spec.torch_threads)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        from daemon.policy.checkpoint import ExpectedIO
        from daemon.policy.engine import PolicyEngine
        from daemon.policy.gc_pauses import GcPauses, freeze
        from daemon.policy.obs_buffer import ObsBuffer, ObsLayout

        torch.set_num_threads(threads)
        layout = ObsLayout.from_dict(spec.layout)
        # Spawned children share the daemon's resource tracker, so attaching registers the same
        # name again (a no-op) and the daemon's unlink at stop unregisters it once: no leak warning.
        buf = ObsBuffer(layout, name=spec.shm_name, create=False)
        if spec.backend == "lerobot-server":
            _serve_remote(conn, spec, buf, layout)
            buf.close()
            return
        width = layout.state_dim  # six joints per arm: the daemon checked the names (runner.py)
        cams = {n: (int(h), int(w)) for n, (h, w) in spec.cameras.items()}
        expected = ExpectedIO(cameras=cams, state_dim=width, action_dim=width)
        engine = PolicyEngine.from_checkpoint(spec.checkpoint, expected, spec.device, task=spec.task)
        engine.max_actions = spec.max_actions
        info = engine.info
        state = np.zeros(layout.state_dim, dtype=np.float64)
        images = {n: np.zeros((h, w, 3), dtype=np.uint8) for n, h, w in layout.cameras if n in info.cameras}
        # Warm-up: the first forward pass allocates; do it before saying ready.
        t0 = time.perf_counter()
        engine.infer(state, {n: img for n, img in images.items()})
        engine.reset()
        warmup_s = time.perf_counter() - t0
        # torch, LeRobot and the policy are loaded: out of the collector's reach from now on
        # (gc_pauses.py); the per-request pauses are measured and sent with each chunk
        freeze()
        gc_pauses = GcPauses().install()
        conn.send_bytes(
            pack(
                {
                    "t": "ready",
                    "info": {
                        "policy_type": info.policy_type,
                        "chunk_size": info.chunk_size,
                        "n_action_steps": info.n_action_steps,
                        "cameras": list(info.camera_names),
                        "device": engine.loaded.device,
                        "warmup_s": warmup_s,
                        "pid": os.getpid(),
                        "heap": heap,
                        "io": engine.io,
                        "torch_threads": threads,
                        "omp_wait_policy": omp_wait,
                    },
                }
            )
        )
    except BaseException as exc:  # report, never crash silently
        try:
            conn.send_bytes(pack({"t": "error", "error": f"{type(exc).__name__}: {exc}", "fatal": True}))
        except OSError:
            pass
        if buf is not None:
            buf.close()
        return
    try:
        for msg in _infer_requests(conn, on_reset=engine.reset):
            got_s = time.monotonic()
            gc_pauses.take()  # only the pauses while this chunk is computed count for it
            faults0 = minor_faults()
            t0 = time.perf_counter()
            try:
                obs_time, req, _oldest = buf.read_into(state, images)
                t1 = time.perf_counter()
                actions, timings = engine.infer(state, images)
            except Exception as exc:
                conn.send_bytes(
                    pack({"t": "error", "error": f"inference failed: {exc}", "fatal": False, "req": msg.get("req")})
                )
                continue
            extra = _gc_fields(gc_pauses)
            extra["faults_n"] = minor_faults() - faults0
            conn.send_bytes(pack(_result(req, obs_time, actions, t1 - t0, timings, got_s, extra)))
    finally:
        buf.close()


def torch_threads(configured: int | None) -> tuple[int, str]:
    """How many threads the forward pass gets, and OpenMP's wait policy for them (call before
    torch is imported: libgomp reads its environment when it loads).

    By default one core is left to the control loop and its bus I/O: a forward pass on every core
    starved the loop on small machines. When the forward pass is given every core anyway, its
    OpenMP threads must not spin after each parallel region (libgomp's default): spinning on
    every core kept the daemon's receiver thread off the CPU (docs/design/policy-worker.md has
    the measurements). An OMP_WAIT_POLICY set by the operator is kept."""
    cores = len(os.sched_getaffinity(0))  # the cores this process may use (a cpuset, taskset)
    threads = configured or max(1, cores - 1)
    if threads >= cores and threads > 1:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return threads, os.environ.get("OMP_WAIT_POLICY") or "libgomp default"


def _result(
    req: Any, obs_time: float, actions: np.ndarray, read_s: float, timings: Any, got_s: float, extra: dict[str, Any]
) -> dict[str, Any]:
    """The "result" message both workers (local and LeRobot-server) send for one chunk."""
    return {
        "t": "result",
        "req": req,
        "obs_time_s": obs_time,
        "n": int(actions.shape[0]),
        "dim": int(actions.shape[1]),
        "actions": actions.astype(np.float32).tobytes(),
        "read_s": read_s,
        **asdict(timings),
        "got_s": got_s,
        "done_s": time.monotonic(),
        **extra,
    }


def _gc_fields(pauses) -> dict[str, Any]:
    t = pauses.take()
    return {"gc_s": t.pause_s, "gc_n": t.collections}


def _infer_requests(conn, on_reset: Callable[[], None]) -> Iterator[dict[str, Any]]:
    """The worker's request loop, one for both backends: yields each ``infer`` request; ``reset``
    calls ``on_reset``; an undecodable or unknown request gets a non-fatal error; ``stop`` or a
    closed pipe ends it."""
    while True:
        try:
            msg = unpack(conn.recv_bytes(MAX_MESSAGE_BYTES))
        except (EOFError, OSError):
            return
        except ValueError as exc:
            conn.send_bytes(pack({"t": "error", "error": str(exc), "fatal": False}))
            continue
        kind = msg["t"]
        if kind == "stop":
            return
        if kind == "reset":
            on_reset()
            continue
        if kind != "infer":
            conn.send_bytes(pack({"t": "error", "error": f"unknown request {kind!r}", "fatal": False}))
            continue
        yield msg


def _serve_remote(conn, spec: WorkerSpec, buf, layout) -> None:
    """The worker's loop for the lerobot-server backend: same requests and replies, the chunk
    computed by LeRobot's policy server. A server that is down or drops is a non-fatal error with
    a retry time (the daemon holds, status says why, the next request reconnects)."""
    from daemon.policy.lerobot_server import ServerEngine, ServerSpec, ServerUnavailable
    from daemon.policy.safe_unpickle import UnsafePickleError

    engine = ServerEngine(ServerSpec(**(spec.server or {})))
    engine.max_actions = spec.max_actions
    state = np.zeros(layout.state_dim, dtype=np.float64)
    images = {n: np.zeros((h, w, 3), dtype=np.uint8) for n, h, w in layout.cameras}

    def link() -> dict[str, Any]:
        return {
            "server": engine.spec.server,
            "connected": engine.connected,
            "connects": engine.connects,
            "failures": engine.failures,
            "error": engine.last_error,
        }

    # Set the policy up and run one warm-up inference now (the server's first forward pass
    # allocates); a server that is down is not fatal: ready, holding, reconnecting on requests.
    t0 = time.perf_counter()
    try:
        engine.infer(state, images)
    except ServerUnavailable:
        pass
    except (UnsafePickleError, ValueError) as exc:
        engine.last_error = str(exc)
    conn.send_bytes(
        pack(
            {
                "t": "ready",
                "info": {
                    "policy_type": engine.spec.policy_type,
                    "chunk_size": engine.spec.actions_per_chunk,
                    "n_action_steps": engine.spec.actions_per_chunk,
                    "cameras": list(engine.camera_names),
                    "device": f"{engine.spec.device} on {engine.spec.server}",
                    "warmup_s": time.perf_counter() - t0,
                    "pid": os.getpid(),
                    "backend": "lerobot-server",
                },
                "link": link(),
            }
        )
    )
    try:
        # reset: nothing to do, the server keeps no history for ACT-style chunks (and Ready would
        # drop the policy)
        for msg in _infer_requests(conn, on_reset=lambda: None):
            got_s = time.monotonic()
            t0 = time.perf_counter()
            try:
                obs_time, req, _oldest = buf.read_into(state, images)
                t1 = time.perf_counter()
                actions, timings = engine.infer(state, images)
            except ServerUnavailable as exc:
                conn.send_bytes(
                    pack(
                        {
                            "t": "error",
                            "error": str(exc),
                            "fatal": False,
                            "req": msg.get("req"),
                            "retry_after_s": exc.retry_after_s,
                            "link": link(),
                        }
                    )
                )
                continue
            except Exception as exc:  # unsafe reply, malformed chunk: hold, say why, keep serving
                engine.last_error = str(exc)
                conn.send_bytes(
                    pack(
                        {
                            "t": "error",
                            "error": f"inference failed: {exc}",
                            "fatal": False,
                            "req": msg.get("req"),
                            "retry_after_s": 0.5,
                            "link": link(),
                        }
                    )
                )
                continue
            extra = {"link": link(), "times": engine.last_link}
            conn.send_bytes(pack(_result(req, obs_time, actions, t1 - t0, timings, got_s, extra)))
    finally:
        engine.close()
