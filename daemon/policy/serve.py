"""Serve a policy to other local programs (a sim evaluation loop, a notebook) over ZeroMQ.

Transport: a ROUTER socket bound on loopback only (``ipc://PATH`` or ``tcp://127.0.0.1:PORT``);
clients use REQ (``PolicyClient``) or DEALER. No pickle anywhere: each message is a multipart
message whose first frame is a msgpack header and whose further frames are raw array bytes.

Request  (protocol version 1):
  frame 0  msgpack {"v": 1, "cmd": "infer" | "info" | "ping" | "reset",
                    "arrays": [{"name": str, "dtype": "uint8"|"float32"|"float64", "shape": [...]}, ...]}
  frame i  the raw C-order bytes of arrays[i-1]
  infer needs "observation.state" (6,) and "observation.images.<camera>" (H, W, 3) uint8 for every
  camera the policy uses (the daemon's dataset keys and units).
Reply:
  frame 0  msgpack {"v": 1, "ok": true, "arrays": [{"name": "action", "dtype": "float32",
                    "shape": [n, 6]}], "timings_ms": {...}, ...}   or   {"v": 1, "ok": false, "error": str}
  frame 1  the action chunk bytes (LeRobot units; action k is for k policy periods after the observation)

Limits: header <= 64 KiB, <= 16 arrays, each frame <= 64 MiB (ZMQ_MAXMSGSIZE: bigger messages are
dropped by ZeroMQ before they reach us). Every bad request gets an error reply; the server never
dies of one.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from daemon.data.schema import IMAGE_KEY_PREFIX, STATE_KEY

log = logging.getLogger("so101d.policy.serve")

PROTOCOL_VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
MAX_ARRAYS = 16
MAX_FRAME_BYTES = 64 * 1024 * 1024
DTYPES = {"uint8": np.uint8, "float32": np.float32, "float64": np.float64}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


class ProtocolError(ValueError):
    """A request (or reply) that does not follow the protocol; its message goes back to the client."""


def default_endpoint() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/so101d-{os.getuid()}"
    return f"ipc://{base}/so101d/policy.ipc"


def check_endpoint(endpoint: str) -> str:
    """Only loopback TCP or ipc: a policy server must never listen on the network."""
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return endpoint
    if endpoint.startswith("tcp://"):
        host = endpoint[len("tcp://") :].rsplit(":", 1)[0]
        if host in LOOPBACK_HOSTS:
            return endpoint
    raise ValueError(f"endpoint {endpoint!r}: use ipc://PATH or tcp://127.0.0.1:PORT (loopback only)")


# -- message codec (shared by server and client) ------------------------------------------------
def encode(header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> list[bytes | memoryview]:
    header = dict(header)
    header.setdefault("v", PROTOCOL_VERSION)
    frames: list[bytes | memoryview] = []
    specs = []
    for name, arr in (arrays or {}).items():
        a = np.ascontiguousarray(arr)
        if a.dtype.name not in DTYPES:
            raise ProtocolError(f"array {name!r}: dtype {a.dtype} not supported ({', '.join(DTYPES)})")
        specs.append({"name": name, "dtype": a.dtype.name, "shape": list(a.shape)})
        frames.append(memoryview(a).cast("B"))
    header["arrays"] = specs
    return [msgpack.packb(header, use_bin_type=True), *frames]


def decode(frames: list[Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """frames (bytes or zmq.Frame) -> (header, arrays), arrays are zero-copy views on the frames."""
    if not frames:
        raise ProtocolError("empty message")
    head = frames[0].buffer if hasattr(frames[0], "buffer") else frames[0]
    if len(head) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header larger than {MAX_HEADER_BYTES} bytes")
    try:
        header = msgpack.unpackb(
            bytes(head), raw=False, max_bin_len=MAX_HEADER_BYTES, max_str_len=MAX_HEADER_BYTES, strict_map_key=True
        )
    except Exception as exc:  # msgpack raises several types
        raise ProtocolError(f"header is not msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header must be a msgpack map")
    if header.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {header.get('v')!r} not supported (this server speaks {PROTOCOL_VERSION})"
        )
    specs = header.get("arrays", [])
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise ProtocolError(f"'arrays' must be a list of at most {MAX_ARRAYS} specs")
    if len(specs) != len(frames) - 1:
        raise ProtocolError(f"header lists {len(specs)} arrays but {len(frames) - 1} data frames follow")
    arrays: dict[str, np.ndarray] = {}
    for spec, frame in zip(specs, frames[1:]):
        if not isinstance(spec, dict):
            raise ProtocolError("array spec must be a map")
        name, dtype, shape = spec.get("name"), spec.get("dtype"), spec.get("shape")
        if not isinstance(name, str) or dtype not in DTYPES:
            raise ProtocolError(f"array spec {spec!r}: needs a name and a dtype in {', '.join(DTYPES)}")
        if (
            not isinstance(shape, list)
            or len(shape) > 4
            or not all(isinstance(d, int) and 0 <= d <= 1 << 16 for d in shape)
        ):
            raise ProtocolError(f"array {name!r}: bad shape {shape!r}")
        buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
        if len(buf) != expected:
            raise ProtocolError(f"array {name!r}: {len(buf)} bytes for {dtype} {shape} (expected {expected})")
        arrays[name] = np.frombuffer(buf, dtype=DTYPES[dtype]).reshape(shape)
    return header, arrays


# -- server --------------------------------------------------------------------------------------
class PolicyServer:
    """Answers requests with ``engine`` (a PolicyEngine) on one thread; ``serve_forever``/``stop``."""

    def __init__(self, engine: Any, endpoint: str, context: zmq.Context | None = None):
        self.engine = engine
        self.endpoint = check_endpoint(endpoint)
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._stop = threading.Event()
        self.requests = 0
        self.errors = 0

    def bind(self) -> PolicyServer:
        if self.endpoint.startswith("ipc://"):
            path = Path(self.endpoint[len("ipc://") :])
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        if self.endpoint.startswith("ipc://"):
            os.chmod(self.endpoint[len("ipc://") :], 0o600)  # only our user may ask
        self._sock = sock
        return self

    def stop(self) -> None:
        self._stop.set()

    def serve_forever(self, poll_ms: int = 100) -> None:
        if self._sock is None:
            self.bind()
        sock = self._sock
        assert sock is not None
        try:
            while not self._stop.is_set():
                if not sock.poll(poll_ms):
                    continue
                frames = sock.recv_multipart(copy=False)
                # envelope: identity [, empty delimiter from REQ]
                if len(frames) >= 2 and len(frames[1].buffer) == 0:
                    envelope, body = frames[:2], frames[2:]
                else:
                    envelope, body = frames[:1], frames[1:]
                reply = self.handle(body)
                sock.send_multipart([*(f.bytes for f in envelope), *reply], copy=False)
        finally:
            sock.close(0)
            self._sock = None
            if self.endpoint.startswith("ipc://"):
                try:
                    os.unlink(self.endpoint[len("ipc://") :])
                except OSError:
                    pass

    def handle(self, body: list[Any]) -> list[bytes | memoryview]:
        """One request -> reply frames. Never raises."""
        self.requests += 1
        t0 = time.perf_counter()
        try:
            header, arrays = decode(body)
            cmd = header.get("cmd")
            if cmd == "ping":
                return encode({"ok": True, "pong": True})
            if cmd == "info":
                info = self.engine.info
                return encode(
                    {
                        "ok": True,
                        "policy_type": info.policy_type,
                        "chunk_size": info.chunk_size,
                        "n_action_steps": info.n_action_steps,
                        "cameras": {n: [h, w] for n, (c, h, w) in info.cameras.items()},
                        "state_shape": list(info.state_shape or ()),
                    }
                )
            if cmd == "reset":
                self.engine.reset()
                return encode({"ok": True})
            if cmd != "infer":
                raise ProtocolError(f"unknown cmd {cmd!r} (infer, info, ping, reset)")
            state = arrays.get(STATE_KEY)
            if state is None:
                raise ProtocolError(f"infer needs {STATE_KEY!r}")
            images = {k[len(IMAGE_KEY_PREFIX) :]: v for k, v in arrays.items() if k.startswith(IMAGE_KEY_PREFIX)}
            t1 = time.perf_counter()
            actions, timings = self.engine.infer(state, images)
            t2 = time.perf_counter()
            return encode(
                {
                    "ok": True,
                    "timings_ms": {
                        "decode": (t1 - t0) * 1e3,
                        "preprocess": timings.preprocess_s * 1e3,
                        "forward": timings.forward_s * 1e3,
                        "postprocess": timings.postprocess_s * 1e3,
                        "server_total": (t2 - t0) * 1e3,
                    },
                },
                {"action": actions},
            )
        except (ProtocolError, ValueError) as exc:
            self.errors += 1
            return encode({"ok": False, "error": str(exc)})
        except Exception as exc:
            self.errors += 1
            log.exception("policy server: request failed")
            return encode({"ok": False, "error": f"{type(exc).__name__}: {exc}"})


# -- client --------------------------------------------------------------------------------------
class PolicyServerError(RuntimeError):
    """The server answered with an error (or not at all)."""


class PolicyClient:
    """Blocking client: ``infer(state, images) -> (actions (n, 6) float32, timings_ms)``."""

    def __init__(self, endpoint: str, timeout_s: float = 10.0, context: zmq.Context | None = None):
        self.endpoint = check_endpoint(endpoint)
        self.timeout_ms = int(timeout_s * 1000)
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket | None = None

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            s = self._ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
            s.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
            s.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
            s.connect(self.endpoint)
            self._sock = s
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self, header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        sock = self._socket()
        try:
            sock.send_multipart(encode(header, arrays), copy=False)
            frames = sock.recv_multipart(copy=False)
        except zmq.Again:
            self.close()  # a REQ socket that missed its reply cannot be reused
            raise PolicyServerError(f"no reply from {self.endpoint} within {self.timeout_ms} ms") from None
        reply, out = decode(frames)
        if not reply.get("ok"):
            raise PolicyServerError(str(reply.get("error", "unknown error")))
        return reply, out

    def send_raw(self, frames: list[bytes]) -> dict[str, Any]:
        """Send frames as they are (tests of malformed requests); returns the reply header."""
        sock = self._socket()
        try:
            sock.send_multipart(frames)
            reply = sock.recv_multipart(copy=False)
        except zmq.Again:
            self.close()
            raise PolicyServerError(f"no reply from {self.endpoint}") from None
        return decode(reply)[0]

    def ping(self) -> bool:
        return bool(self.request({"cmd": "ping"})[0].get("pong"))

    def info(self) -> dict[str, Any]:
        return self.request({"cmd": "info"})[0]

    def reset(self) -> None:
        self.request({"cmd": "reset"})

    def infer(
        self, state: np.ndarray, images: dict[str, np.ndarray] | None = None
    ) -> tuple[np.ndarray, dict[str, float]]:
        arrays = {STATE_KEY: np.asarray(state, dtype=np.float32)}
        for name, img in (images or {}).items():
            arrays[IMAGE_KEY_PREFIX + name] = np.asarray(img, dtype=np.uint8)
        reply, out = self.request({"cmd": "infer"}, arrays)
        if "action" not in out:
            raise PolicyServerError("reply carries no action array")
        return out["action"].copy(), dict(reply.get("timings_ms", {}))


def serve_main(path: str, endpoint: str | None, device: str = "cpu", task: str = "") -> int:
    """`so101d policy serve DIR`: load, bind, serve until SIGINT/SIGTERM."""
    import sys

    from daemon.policy.checkpoint import CheckpointError
    from daemon.policy.engine import PolicyEngine
    from daemon.policy.worker import torch_threads

    # like the daemon's worker: one core left to the control loop on the same machine, OpenMP
    # passive if that is every core (before torch is imported: libgomp reads it when it loads)
    threads, _ = torch_threads(None)
    import torch

    torch.set_num_threads(threads)
    endpoint = endpoint or default_endpoint()
    try:
        check_endpoint(endpoint)
        engine = PolicyEngine.from_checkpoint(path, device=device, task=task)
        server = PolicyServer(engine, endpoint).bind()
    except (CheckpointError, ValueError, zmq.ZMQError) as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: server.stop())
    print(f"serving {engine.info.policy_type} policy on {endpoint} (Ctrl-C to stop)", flush=True)
    server.serve_forever()
    return 0
