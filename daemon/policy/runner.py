"""PolicySource: the control loop's side of local inference.

The loop calls ``target(now_monotonic_s, state_units)`` every cycle; it costs microseconds and
never blocks (no lock, no wait): it moves chunks the receiver thread has made ready into the
ActionQueue, answers from the queue, and, when the queue runs low, publishes the observation
itself: the cameras' latest frames and the state into shared memory (a memcpy), then one short
message down the pipe that wakes the worker process. ``None`` means nothing fresh: the loop holds
(safety layer's job).

Why the loop publishes and no helper thread does: a thread of this process that the loop wakes
wants the GIL the loop holds. Measured with a publisher thread (driven as bench/bench_policy.py's tail run drives it,
and a per-call breakdown of ``target()``): p50 0.02 ms but a max of 13.7 ms, and the worst calls
were the ones that woke it, with under 1 ms of the loop thread's own CPU time in them (the rest
waiting for the GIL back, or for a CPU, behind the woken thread). Waking another *process* costs
the loop a pipe write; the worker runs at a lower priority (``nice``) and never takes our GIL.

A receiver thread reads, decodes and checks the worker's chunks as they arrive and hands them to
the loop through a deque, ready to use: a chunk counts as usable from then on (its stale slots
and its cross-fade are timed from its arrival), and the loop's next cycle takes it.

Timeline of one request (all times ``time.monotonic()``, shared by both processes):
  obs_time (cycle start) -> [ask: the cycle's bus reads] -> issued (target() asks) ->
  [handoff: frame copy into shared memory, pipe, worker wake] -> worker has it ->
  [worker: shared-memory read, preprocess, forward, postprocess] -> chunk ready ->
  [reply: pipe, receiver thread wake, msgpack] -> arrived -> [prepare: to float64, checks] -> usable ->
  [pickup: until the loop's next cycle takes it].
Overhead beyond the forward pass = (usable - issued) - forward: the stages handoff + worker (less
the forward pass) + reply + prepare, which sum to it exactly (``timeline`` keeps them per chunk).
"ask" (before the request exists) and "pickup" (the loop's sampling: a chunk landing mid-period
is first used at the next cycle, whoever inserts it) are reported beside it, not in it.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from calibration.conventions import NUM_JOINTS
from daemon.policy.action_queue import ActionQueue, QueueConfig
from daemon.policy.checkpoint import ExpectedIO, check_checkpoint
from daemon.policy.gc_pauses import GcPauses, freeze
from daemon.policy.lerobot_server import ServerSpec, remote_info, validate
from daemon.policy.obs_buffer import ObsBuffer, ObsLayout
from daemon.policy.worker import MAX_MESSAGE_BYTES, WorkerSpec, pack, unpack, worker_main

log = logging.getLogger("so101d.policy")

LATENCY_WINDOW = 64  # the refill lead follows the recent requests (a machine that got busier)
# issued -> usable, in order; with "forward" they sum to it exactly (overhead = the four of them)
OVERHEAD_STAGES = ("handoff", "worker", "reply", "prepare")
STAGE_KEYS = (
    "ask",
    "handoff",
    "publish",
    "worker",
    "read",
    "preprocess",
    "forward",
    "postprocess",
    "gc",
    "reply",
    "prepare",
    "pickup",
)
MIN_MARGIN_S = 0.05
MARGIN_FRACTION = 0.25


def keep_up_warning(latency_s: float, queue: QueueConfig, n_actions: int) -> str | None:
    """The sentence status and `policy check` print when inference cannot keep up with a chunk."""
    horizon_s = queue.chunk_horizon_s(n_actions)
    if latency_s <= horizon_s:
        return None
    if queue.max_obs_age_s < n_actions * queue.action_period_s:
        fix = "raise max_obs_age_s or use a faster policy"
    else:
        fix = "use a policy with a longer chunk (n_action_steps) or a faster one"
    return f"policy: inference {latency_s:.2f} s > usable horizon {horizon_s:.2f} s: {fix}"


class FrameSource(Protocol):
    """What PolicySource needs from a camera (the recording helper's Camera satisfies it)."""

    width: int  # pixels; 0 while unknown (a sim camera before the simulator announces its size)
    height: int

    def latest_frame(self) -> Any: ...  # Frame | None with .pixels (H, W, 3) uint8, .capture_monotonic_s


@dataclass
class PolicyRunnerConfig:
    checkpoint: str
    cameras: dict[str, tuple[int, int]] = field(default_factory=dict)  # configured cameras (h, w)
    queue: QueueConfig = field(default_factory=QueueConfig)
    device: str | None = None
    task: str = ""
    nice: int = 5
    torch_threads: int | None = None
    request_timeout_s: float = 2.0  # an inference taking longer (and 3x the measured latency) is abandoned
    load_timeout_s: float = 120.0
    backend: str = "local"  # "lerobot-server": the worker asks LeRobot's policy server (lerobot_server.py)
    server: ServerSpec | None = None
    # a bimanual rig's arms in the policy vector's order (LeRobot's: left, right): the state and
    # action hold every arm's joints; () for one arm
    arms: tuple[str, ...] = ()


class _Samples:
    """Last N samples; percentiles computed only when status asks (never on the hot path).

    Appends come from one thread, reads from another (status): a deque append is atomic under the
    GIL and ``list(deque)`` copies it in one C call, so a reader never sees it change mid-way."""

    def __init__(self, n: int = 2048):  # p99.9 needs ~1000 samples to mean more than the max
        self._d: deque[float] = deque(maxlen=n)

    def add(self, v: float) -> None:
        self._d.append(v)

    def values(self) -> list[float]:
        return list(self._d)

    def recent_percentile(self, q: float, last: int) -> float | None:
        """Percentile q of the newest ``last`` samples, in seconds (None when empty), linear
        interpolation as numpy's default. The loop calls this once per chunk: a sort of ``last``
        floats in pure Python (microseconds), where copying the whole ring into numpy for
        ``np.percentile`` cost 0.5 to 1 ms of the loop's CPU on this machine."""
        d = self._d
        n = min(last, len(d))
        if n == 0:
            return None
        v = sorted(itertools.islice(d, len(d) - n, None))
        pos = (n - 1) * q / 100.0
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)

    def summary_ms(self) -> dict[str, float] | None:
        v = self.values()
        if not v:
            return None
        a = np.asarray(v, dtype=np.float64) * 1e3
        p50, p99, p999 = np.percentile(a, [50, 99, 99.9])
        return {"p50": float(p50), "p99": float(p99), "p99.9": float(p999), "max": float(a.max()), "n": int(a.size)}


class PolicySource:
    """Runs a policy worker process and serves its chunks to the control loop."""

    def __init__(self, config: PolicyRunnerConfig, cameras: Mapping[str, FrameSource] | None = None):
        self.config = config
        self.cameras = dict(cameras or {})
        # Cheap JSON-only checks in our process first: a readable error right away.
        if config.backend == "lerobot-server":
            if config.server is None:
                raise ValueError('policy.backend = "lerobot-server" needs policy.server = "HOST:PORT"')
            validate(config.server)
            self.info = remote_info(config.server)  # the checkpoint lives on the server
        elif config.backend == "local":
            self.info = check_checkpoint(config.checkpoint, ExpectedIO.for_arms(dict(config.cameras), config.arms))
        else:
            raise ValueError(f'policy.backend: {config.backend!r} must be "local" or "lerobot-server"')
        missing = [n for n in self.info.cameras if n not in self.cameras]
        if missing:
            raise ValueError(f"policy needs camera(s) {', '.join(missing)} but no frame source was given for them")
        # refill_below >= n_action_steps keeps the worker busy back to back (freshest chunks, most CPU)
        self.width = NUM_JOINTS * max(1, len(config.arms))  # joints in the state and in each action
        self.queue = ActionQueue(config.queue, action_dim=self.width)
        # The next chunk is asked for when the queue's usable horizon falls to this (seconds):
        # measured latency (high percentile) + margin. 0 until the first chunk has been timed (the
        # empty queue asks at once anyway).
        self.refill_lead_s = 0.0
        self.latency_estimate_s: float | None = None
        self._timeout_s = config.request_timeout_s
        self.state = "stopped"  # stopped | loading | ready | error
        self.error: str | None = None
        self.worker_info: dict[str, Any] = {}
        self._layout = ObsLayout.make(self.width, {n: (c[1], c[2]) for n, c in self.info.cameras.items()})
        self._buf: ObsBuffer | None = None
        self._proc: mp.process.BaseProcess | None = None
        self._req_w: Any = None  # our end of daemon -> worker (a multiprocessing Connection)
        self._res_r: Any = None  # our end of worker -> daemon
        self._req_id = 0
        self._in_flight: int | None = None
        self._in_flight_since = 0.0
        self._retry_after = 0.0
        self._started_at = 0.0
        self._stopping = False
        self._publish_failed: str | None = None
        # stats
        self.latency = _Samples()  # obs_time -> chunk in the loop's queue (what the refill lead needs)
        self.overhead = _Samples()  # request issued -> chunk usable, minus the forward pass
        self.stage = {k: _Samples() for k in STAGE_KEYS}
        # per chunk: the stage split in seconds (tests check it adds up; the bench reads it)
        self.timeline: deque[dict[str, float]] = deque(maxlen=4096)
        self._issued: dict[int, float] = {}  # request id -> when target() issued it (monotonic s)
        # Chunks decoded and checked by the receiver thread, ready for the loop: (request id,
        # obs_time_s, actions float64, usable_s, timeline entry or None). A deque, not a lock: the
        # loop never waits on a thread that a busy machine may have descheduled mid-insert.
        self._ready: deque[tuple[int, float, np.ndarray, float, dict[str, float] | None]] = deque()
        self.gc_pauses = GcPauses()  # this (the daemon's) process, from start() on
        # minor page faults the worker took per chunk (heap.py: near 0 once its heap is kept)
        self.worker_faults: deque[int] = deque(maxlen=2048)
        self.gc_frozen = 0
        # worker -> daemon messages, decoded by the receiver thread: (arrived monotonic s, msg or None = closed)
        self._inbox: deque[tuple[float, dict[str, Any] | None]] = deque()
        self._inbox_event = threading.Event()
        self._rx_thread: threading.Thread | None = None
        self.requests = 0
        self.results = 0
        self.timeouts = 0
        self.worker_errors = 0
        self.cameras_not_ready = 0
        self.last_error: str | None = None
        # lerobot-server backend: the worker's view of the server, and the remote split per chunk
        self.link: dict[str, Any] = {}
        self.remote = {k: _Samples() for k in ("round_trip", "send", "get", "decode")}
        # (request id, obs_time_s, received_s, actions in chunk, actions kept) of recent chunks
        self.chunk_log: deque[tuple[int, float, float, int, int]] = deque(maxlen=64)
        # A correction (`policy correct`) pauses the policy: no target, no request; ``reset`` at
        # resume forgets what was queued or asked for before it (chunks of requests up to
        # ``_discard_through`` are dropped when they arrive, counted in ``chunks_discarded``).
        self.paused = False
        self._discard_through = 0
        self.chunks_discarded = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the worker (returns at once; ``state`` goes loading -> ready or error)."""
        if self.state in ("loading", "ready"):
            return
        ctx = mp.get_context("spawn")
        self._buf = ObsBuffer(self._layout, create=True)
        req_r, self._req_w = ctx.Pipe(duplex=False)
        self._res_r, res_w = ctx.Pipe(duplex=False)
        spec = WorkerSpec(
            checkpoint=str(self.info.path),
            shm_name=self._buf.name,
            layout=self._layout.to_dict(),
            cameras={n: [h, w] for n, (h, w) in self.config.cameras.items()},
            device=self.config.device,
            task=self.config.task,
            max_actions=self.info.n_action_steps,
            nice=self.config.nice,
            torch_threads=self.config.torch_threads,
            backend=self.config.backend,
            server=None if self.config.server is None else dict(self.config.server.__dict__),
        )
        self._proc = ctx.Process(
            target=_worker_entry, args=(req_r, res_w, spec.__dict__), name="so101d-policy", daemon=True
        )
        self._proc.start()
        # Everything the daemon has loaded so far (torch and LeRobot included when recording) out
        # of the collector's reach: a full collection would otherwise stop the loop for a whole
        # walk over it (gc_pauses.py); instant, frees nothing.
        self.gc_frozen = freeze()
        self.gc_pauses.install()
        req_r.close()
        res_w.close()
        self.state = "loading"
        self.error = None
        self._started_at = time.monotonic()
        self._stopping = False
        self._inbox.clear()
        self._rx_thread = threading.Thread(
            target=self._receiver, args=(self._res_r,), name="policy-receiver", daemon=True
        )
        self._rx_thread.start()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until the worker is ready or failed (for CLIs and tests, never the loop)."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.config.load_timeout_s)
        while self.state == "loading" and time.monotonic() < deadline:
            if self.wait_result(0.05):
                self._drain(time.monotonic())
            self._check_worker_alive()
        return self.state == "ready"

    def wait_result(self, timeout_s: float) -> bool:
        """Block until the worker has sent something (benchmarks and tests; never the loop)."""
        if self._inbox:
            return True
        self._inbox_event.clear()
        return bool(self._inbox) or self._inbox_event.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping = True
        self.gc_pauses.uninstall()  # a load/unload cycle must not pile callbacks up
        if self._req_w is not None:
            try:
                self._req_w.send_bytes(pack({"t": "stop"}))
            except (OSError, ValueError):
                pass
        if self._proc is not None:
            self._proc.join(timeout_s)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(2.0)
        if self._rx_thread is not None:
            self._rx_thread.join(2.0)  # the worker's exit closed its end: the receiver saw EOF
            self._rx_thread = None
        self._inbox.clear()
        for c in (self._req_w, self._res_r):
            if c is not None:
                c.close()
        self._req_w = self._res_r = None
        if self._buf is not None:
            self._buf.close()
            self._buf = None
        self._proc = None
        self._ready.clear()
        self.queue.clear()
        self._in_flight = None
        if self.state != "error":
            self.state = "stopped"

    def reset(self) -> None:
        """Episode start (and a correction's resume): forget queued actions, the policy's
        observation history, and every request already made (its chunk, arriving later, would
        start from a pose the arm has left): the next chunk is computed from the pose measured
        when the loop next asks."""
        self._discard_through = self._req_id
        self._ready.clear()
        self.queue.clear()
        self._in_flight = None
        if self._req_w is not None and self.state == "ready":
            self._req_w.send_bytes(pack({"t": "reset"}))

    # -- hot path ------------------------------------------------------------------------------
    def target(self, now_s: float, state_units: np.ndarray) -> np.ndarray | None:
        """Target joint positions for now (LeRobot units), or None (hold). Never blocks."""
        if self._ready:  # chunks the receiver thread decoded and checked: into the queue
            self._take_ready()
        if self._inbox:  # ready / errors / a closed pipe
            self._drain(now_s)
        if self.state != "ready" or self.paused:
            return None
        if self._in_flight is not None and now_s - self._in_flight_since > self._timeout_s:
            self.timeouts += 1
            self.last_error = f"inference request {self._in_flight} timed out"
            self._in_flight = None
        if self._in_flight is None and now_s >= self._retry_after and self.wants_chunk(now_s):
            self._request(now_s, state_units)
        return self.queue.target(now_s)

    def _take_ready(self) -> None:
        """Loop thread: ready chunks join the queue as of their arrival (stale slots and the
        cross-fade count from then: the loop's sampling period is not the policy's latency)."""
        taken_s = time.monotonic()
        while self._ready:
            req, obs_time, actions, usable_s, split = self._ready.popleft()
            if req <= self._discard_through:  # asked for before the last reset: never replayed
                self.chunks_discarded += 1
                if req == self._in_flight:
                    self._in_flight = None
                continue
            try:
                kept = self.queue.add_chunk(obs_time, actions, usable_s)
            except ValueError as exc:
                kept = 0
                self.last_error = f"chunk rejected: {exc}"
            self.chunk_log.append((req, obs_time, usable_s, int(actions.shape[0]), kept))
            self.results += 1  # counted with the queue's own counters: status never sees one without the other
            if req == self._in_flight:
                self._in_flight = None
            # the refill lead needs what the loop lives with: observation -> in its queue
            self.latency.add(taken_s - obs_time)
            self.stage["pickup"].add(taken_s - usable_s)
            if split is not None:
                split["pickup"] = taken_s - usable_s
        self._update_refill_lead()

    def wants_chunk(self, now_s: float) -> bool:
        """The refill rule: what is left of the queue lasts no longer than the measured latency
        plus margin (bench/bench_policy.py overrides it to measure the old count rule beside it)."""
        return self.queue.needs_refill(now_s, self.refill_lead_s)

    def _update_refill_lead(self) -> None:
        """After each timed chunk: latency p99 of the recent requests plus a margin.

        The margin (a quarter of the latency, at least 50 ms, for the jitter of a loaded machine and
        the loop's poll period) plus the cross-fade time makes the next chunk land while the current
        one still drives, so the new one fades in from it instead of from a hold."""
        est = self.latency.recent_percentile(99, LATENCY_WINDOW)
        if est is None:
            return
        self.latency_estimate_s = est
        self.refill_lead_s = est + max(MIN_MARGIN_S, MARGIN_FRACTION * est) + self.queue.config.blend_s
        # a policy that is merely slow is not stuck: abandoning its requests would pile them up
        self._timeout_s = max(self.config.request_timeout_s, 3.0 * est)

    def chunk_horizon_s(self) -> float:
        """How long one fresh chunk can drive: chunk length or max_obs_age_s, whichever is shorter."""
        n = int(self.worker_info.get("n_action_steps") or self.info.n_action_steps or 1)
        return self.queue.config.chunk_horizon_s(n)

    def keep_up_warning(self) -> str | None:
        """A plain sentence when inference is slower than a chunk can drive (the arm will hold
        between chunks), None while it keeps up (or nothing was timed yet)."""
        if self.latency_estimate_s is None:
            return None
        return keep_up_warning(
            self.latency_estimate_s,
            self.queue.config,
            int(self.worker_info.get("n_action_steps") or self.info.n_action_steps or 1),
        )

    def _request(self, now_s: float, state_units: np.ndarray) -> None:
        self._req_id += 1
        req = self._req_id
        self._in_flight = req
        self._in_flight_since = now_s
        if len(self._issued) > 64:  # timed-out requests whose chunk never came
            self._issued.clear()
        self._issued[req] = time.monotonic()
        self.requests += 1
        self._publish(req, now_s, state_units)

    def _publish(self, req: int, obs_time: float, state_units: np.ndarray) -> None:
        """Frames + state into shared memory, then the request down the pipe (the caller's
        thread: see the module docstring). A camera with no frame yet, or a stopped worker,
        abandons the request; the loop asks again after a short pause."""
        t0 = time.perf_counter()
        images: dict[str, np.ndarray] = {}
        oldest = obs_time
        try:
            for name in self.info.camera_names:
                frame = self.cameras[name].latest_frame()
                if frame is None:
                    raise LookupError(name)
                images[name] = frame.pixels
                oldest = min(oldest, float(frame.capture_monotonic_s))
            buf, req_w = self._buf, self._req_w
            if buf is None or req_w is None or self._stopping:
                raise OSError("the policy worker is stopped")
            buf.write(obs_time, req, state_units, images, oldest_frame_s=oldest)
            req_w.send_bytes(pack({"t": "infer", "req": req}))
        except LookupError as exc:
            self.cameras_not_ready += 1
            self._retry_after = time.monotonic() + 0.05
            self._abandon(req)
            if self.cameras_not_ready == 1:
                log.warning("policy: camera %s has no frame yet; holding", exc)
            return
        except (ValueError, KeyError, OSError, AttributeError) as exc:
            self.last_error = f"publishing the observation failed: {exc}"
            self._retry_after = time.monotonic() + 0.5
            self._abandon(req)
            return
        self.stage["publish"].add(time.perf_counter() - t0)

    def _abandon(self, req: int) -> None:
        """A request that never reached the worker: the loop may ask again."""
        if self._in_flight == req:
            self._in_flight = None
        self._issued.pop(req, None)

    def _receiver(self, conn) -> None:
        """Reads the worker's messages as they arrive (off the loop thread); ends at EOF."""
        while True:
            try:
                data = conn.recv_bytes(MAX_MESSAGE_BYTES)
            except (EOFError, OSError):
                self._inbox.append((time.monotonic(), None))
                self._inbox_event.set()
                return
            try:
                msg: dict[str, Any] = unpack(data)
            except ValueError as exc:
                msg = {"t": "_bad", "error": str(exc)}
            arrived = time.monotonic()  # read and msgpack-decoded ("reply" ends here)
            if msg["t"] == "result":
                self._on_result(msg, arrived)
                if isinstance(msg.get("link"), dict):
                    self.link = msg["link"]
                self._inbox_event.set()  # wait_result(): something arrived
                continue
            self._inbox.append((arrived, msg))
            self._inbox_event.set()

    def _drain(self, now_s: float) -> None:
        """The worker's other messages (ready, errors, the pipe closing), in order."""
        inbox = self._inbox
        while inbox:
            _arrived, msg = inbox.popleft()
            if msg is None:
                self._pipe_closed()
                return
            kind = msg["t"]
            if isinstance(msg.get("link"), dict):
                self.link = msg["link"]
            if kind == "_bad":
                self.last_error = f"bad message from the worker: {msg['error']}"
            elif kind == "ready":
                self.worker_info = dict(msg.get("info") or {})
                self.state = "ready"
                log.info("policy ready: %s", self.worker_info)
            elif kind == "error":
                self.worker_errors += 1
                self.last_error = str(msg.get("error"))
                if msg.get("fatal"):
                    self.state = "error"
                    self.error = self.last_error
                    log.error("policy worker failed: %s", self.error)
                elif msg.get("req") == self._in_flight:
                    self._in_flight = None
                retry = msg.get("retry_after_s")
                if isinstance(retry, (int, float)) and retry > 0:  # the server's back-off: no request storm
                    self._retry_after = time.monotonic() + min(float(retry), 10.0)

    def _pipe_closed(self) -> None:
        if self._stopping or self.state == "error":
            return  # a fatal error was reported before the worker exited: keep that reason
        proc = self._proc
        code = proc.exitcode if proc is not None and not proc.is_alive() else None
        self._worker_died(
            f"the policy worker exited (code {code})" if code is not None else "the policy worker closed its pipe"
        )

    def _on_result(self, msg: dict[str, Any], arrived_s: float) -> None:
        """A chunk from the worker (receiver thread): decoded and checked here, then handed to the
        loop ready to use (``_take_ready``), then the statistics."""
        req = int(msg["req"])
        n, dim = int(msg["n"]), int(msg["dim"])
        raw = msg["actions"]
        if dim != self.width or len(raw) != n * dim * 4:
            self.last_error = f"malformed chunk from the worker ({n}x{dim}, {len(raw)} bytes)"
            return
        actions = np.frombuffer(raw, dtype=np.float32).reshape(n, dim).astype(np.float64)
        if not np.all(np.isfinite(actions)):
            self.last_error = "chunk rejected: action chunk contains NaN or inf"
            return
        obs_time = float(msg["obs_time_s"])
        usable_s = time.monotonic()
        issued_s = self._issued.pop(req, None)
        split = None
        fwd = float(msg.get("forward_s", 0.0))
        if issued_s is not None and "got_s" in msg and "done_s" in msg:
            got_s, done_s = float(msg["got_s"]), float(msg["done_s"])
            split = {
                "ask": issued_s - obs_time,
                "handoff": got_s - issued_s,
                "worker": done_s - got_s - fwd,
                "forward": fwd,
                "reply": arrived_s - done_s,
                "prepare": usable_s - arrived_s,
                "total": usable_s - issued_s,
                "issued_s": issued_s,
                "usable_s": usable_s,
            }
            split["overhead"] = split["total"] - fwd
        self._ready.append((req, obs_time, actions, usable_s, split))
        for k in ("read", "preprocess", "forward", "postprocess", "gc"):
            v = msg.get(f"{k}_s")
            if v is not None:
                self.stage[k].add(float(v))
        faults = msg.get("faults_n")
        if isinstance(faults, int):
            self.worker_faults.append(faults)
        times = msg.get("times")
        if isinstance(times, dict):
            for k in ("round_trip", "send", "get", "decode"):
                v = times.get(f"{k}_s")
                if isinstance(v, (int, float)):
                    self.remote[k].add(float(v))
        if split is None:
            return  # not a request of ours (or an old worker): no split
        self.timeline.append(split)
        self.overhead.add(split["overhead"])
        for k in ("ask", *OVERHEAD_STAGES):
            self.stage[k].add(split[k])

    def _check_worker_alive(self) -> None:
        if self._proc is not None and not self._proc.is_alive() and self.state in ("loading", "ready"):
            rx = self._rx_thread
            if rx is not None and rx is not threading.current_thread():
                rx.join(0.5)  # it reads what the worker sent before exiting, then EOF
            self._drain(time.monotonic())
            if self.state in ("loading", "ready"):
                self._worker_died(f"the policy worker exited (code {self._proc.exitcode})")

    def _worker_died(self, why: str) -> None:
        self.state = "error"
        self.error = why
        self.last_error = why
        self._in_flight = None
        log.error("policy: %s", why)

    # -- status --------------------------------------------------------------------------------
    def stats(self, now_s: float | None = None) -> dict[str, Any]:
        now_s = time.monotonic() if now_s is None else now_s
        self._check_worker_alive()
        q = self.queue
        newest = q.newest_obs_time()
        depth, horizon_s, live = q.depth(now_s), q.usable_horizon_s(now_s), len(q)
        return {
            "state": self.state,
            "error": self.error,
            "checkpoint": str(self.info.path),
            "policy_type": self.info.policy_type,
            "cameras": list(self.info.camera_names),
            "worker": self.worker_info,
            "merge": q.config.merge,
            "queue_depth": depth,
            "usable_horizon_ms": horizon_s * 1e3,
            "chunk_horizon_ms": self.chunk_horizon_s() * 1e3,
            "refill_lead_ms": self.refill_lead_s * 1e3,
            "warning": self.keep_up_warning(),
            "chunks_live": live,
            "chunk_age_ms": None if newest is None else (now_s - newest) * 1e3,
            "inference_latency_ms": self.latency.summary_ms(),
            "overhead_ms": self.overhead.summary_ms(),
            "stages_ms": {k: s.summary_ms() for k, s in self.stage.items()},
            "overhead_stages": list(OVERHEAD_STAGES),
            "gc": self._gc_stats(),
            "requests": self.requests,
            "results": self.results,
            "timeouts": self.timeouts,
            "actions_dropped_stale": q.actions_dropped_stale,
            "chunks_rejected": q.chunks_rejected,
            "chunks_expired": q.chunks_expired,
            "chunks_discarded": self.chunks_discarded,
            "cameras_not_ready": self.cameras_not_ready,
            "worker_errors": self.worker_errors,
            "last_error": self.last_error,
            "backend": self.config.backend,
            "server": self._server_stats() if self.config.backend == "lerobot-server" else None,
        }

    def _gc_stats(self) -> dict[str, Any]:
        t = self.gc_pauses.total()
        return {
            "daemon_collections": t.collections,
            "daemon_full_collections": t.full_collections,
            "daemon_max_pause_ms": t.max_pause_s * 1e3,
            "daemon_frozen_objects": self.gc_frozen,
            "worker_ms": self.stage["gc"].summary_ms(),
            "worker_page_faults": _count_summary(self.worker_faults),
        }

    def _server_stats(self) -> dict[str, Any]:
        """Round trip, network and server compute, kept apart (status and `policy status`)."""
        spec = self.config.server
        return {
            "address": spec.server if spec else None,
            "checkpoint": spec.checkpoint if spec else None,
            "connected": bool(self.link.get("connected")),
            "connects": self.link.get("connects", 0),
            "failures": self.link.get("failures", 0),
            "error": self.link.get("error"),
            "round_trip_ms": self.remote["round_trip"].summary_ms(),
            # SendObservations: upload + the server's unpickle/enqueue (an upper bound on network time)
            "network_ms": self.remote["send"].summary_ms(),
            # GetActions: the server's prepare/forward/postprocess/pickle plus the reply's transfer
            "get_actions_ms": self.remote["get"].summary_ms(),
            "decode_ms": self.remote["decode"].summary_ms(),
            "server_compute_ms": None,
            "server_compute_note": "unknown: LeRobot's policy server sends no compute timing (at most get_actions_ms)",
        }


def _count_summary(counts: deque[int]) -> dict[str, int] | None:
    """p50 / p99 / max of a per-chunk count (None before the first chunk)."""
    v = list(counts)
    if not v:
        return None
    p50, p99 = np.percentile(np.asarray(v, dtype=np.float64), [50, 99])
    return {"p50": int(p50), "p99": int(p99), "max": int(max(v)), "n": len(v)}


def _worker_entry(req_conn, res_conn, spec_dict: dict[str, Any]) -> None:
    """Adapt our two one-way pipes to worker_main's single connection interface."""
    worker_main(_Duplex(req_conn, res_conn), spec_dict)


class _Duplex:
    """recv from the request pipe, send on the result pipe."""

    def __init__(self, rx, tx):
        self._rx, self._tx = rx, tx

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        return self._rx.recv_bytes(maxlength)

    def send_bytes(self, data: bytes) -> None:
        self._tx.send_bytes(data)
