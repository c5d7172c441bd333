"""The so101d simulation protocol: the daemon drives a simulated follower over ZeroMQ.

This docstring is the protocol's only specification.

Transport and socket pattern
----------------------------
One endpoint, ``tcp://127.0.0.1:PORT`` or ``ipc:///path``. The **sim binds a ROUTER**, the
**daemon connects a DEALER**. Why this pair:

- The daemon connects, so when the sim process dies and a new one binds the same endpoint, the
  DEALER's own reconnect logic (``RECONNECT_IVL``) finds it without any code of ours; the daemon
  never has to rebuild its socket, and a sim can start before or after the daemon.
- One bidirectional socket pair carries both directions, so an endpoint is one string (tcp and
  ipc alike) and there is no second port to keep in step. PAIR would do the same but does not
  reconnect reliably and admits exactly one peer for the socket's lifetime.
- The DEALER sets ``IMMEDIATE``: while no sim is connected, sends fail at once (``EAGAIN``, we
  count a drop) instead of queueing targets that would be replayed, stale, into the next sim.
  Small high-water marks on both sides keep a slow reader from building latency: when a queue is
  full the newest message is dropped (state and frames are superseded 30 times a second anyway).
- The ROUTER answers the *most recent* daemon it heard from (its routing id); a restarted daemon
  simply takes over. ``ROUTER_MANDATORY`` turns "that daemon is gone" into an error we count.
- ``LINGER 0`` everywhere: nothing stale is flushed at close. ``MAXMSGSIZE`` is set well above our
  own per-frame limits as a last defence; our own limits below are the ones that count rejections.

Messages
--------
Every message is a ZeroMQ multipart message: frame 0 is a **msgpack map** (the header, at most
``MAX_HEADER_BYTES``); an optional frame 1 carries **raw bytes** (camera pixels, at most
``MAX_PAYLOAD_BYTES``). No pickle, no numpy object serialisation: joint vectors are lists of six
floats in the header, pixels are the array's raw C-order bytes described by shape and dtype.
Every header has ``v`` (protocol version, int) and ``t`` (message type, str). Units on the wire
are LeRobot units (body joints degrees, gripper 0..100 with 0 closed); a sim server converts to
its joint radians itself (``calibration.conventions.units_to_sim_rad``). Times are the sender's
``time.monotonic()`` seconds; a receiver only ever compares a time with its *own* clock after the
peer has echoed it back (round trip), never across machines.

Daemon -> sim:

- ``hello``      {client: str}  sent at connect and then once a second; the sim answers ``hello``.
- ``target``     {seq: int, sent_s: float, pos: [6 floats]}  absolute joint targets.
- ``torque``     {enabled: bool}  hold (position control) or limp.
- ``episode``    {cmd: "reset"|"start"|"stop", seq: int, seed: int|None}
- ``heartbeat``  {sent_s}  every ``HEARTBEAT_PERIOD_S`` so the sim knows the daemon is alive even
  while the loop holds and sends no targets.

Sim -> daemon:

- ``hello``      {server: str, backend: str, cameras: [{name, width, height}], rate_hz: float}
- ``state``      {seq, sim_time_s, pos: [6], vel: [6], effort: [6], torque: bool,
  ack_seq: int, ack_sent_s: float, daemon_stale: bool, seed_error: str (optional)} — measured
  joints; ``ack_*`` echo the last target applied (``-1`` / ``0.0`` before the first), which gives
  the daemon its round trip; ``seed_error`` (at most ``MAX_SEED_ERROR_CHARS``) is present once the
  sim's own seed-demo recording failed, and says what became of the demo.
- ``frame``      {name, seq, capture_s, shape: [h, w, 3], dtype: "uint8", encoding: "raw"|"jpeg"}
  + frame 1 = pixels (RGB, row-major) or a JPEG file.
- ``episode``    {event: "reset_done"|"started"|"stopped"|"success"|"terminated", seq, detail}
  (a sim sends a ``state`` with the reset pose before ``reset_done``: the daemon re-aligns from it)
- ``heartbeat``  {sent_s}
- ``error``      {error: str, reason: str (optional)}  e.g. a version mismatch, naming both
  versions; ``reason`` "arm": the daemon link addressed an arm this sim does not serve (Arms).

Arms
----
A sim may serve the two arms of one scene (a bimanual task is one world: one physics step moves
both arms and the objects between them) on its one endpoint. Its ``hello`` then carries
``arms: ["left", "right"]`` (LeRobot's sides, left first) and every daemon -> sim message carries
``arm: str``, naming the arm it drives: each arm's daemon link is its own DEALER, and the sim
keeps one peer, one staleness clock and one ack per arm. ``state`` goes to each arm's own link
and carries its six joints (``arm`` set); ``episode`` events go to every arm's link (the scene is
shared: both see its reset); ``frame`` goes to the link of the first arm that is connected (the
daemon takes its cameras from its first arm). A message without ``arm`` at a two-arm sim, or
with one at a one-arm sim, or naming an arm the sim does not serve, is rejected (reason "arm")
and answered with ``error`` {error, reason: "arm"} (at most once a second per peer); the daemon
raises it as a ``HandshakeError`` from ``connect`` / ``read_joints``, which its status shows.

Rejection
---------
``decode`` raises ``ProtocolError`` with a short ``reason`` ("oversize", "frames", "header",
"version", "type", "field"; a sim's arm check adds "arm"); receivers count rejections by reason and carry on (never crash).
A version mismatch is reported as ``version mismatch: peer speaks vX, we speak vY``.

Staleness
---------
Both sides time out their peer: the daemon's ``SimFollower`` raises ``PortGoneError`` from
``read_joints`` when no state arrived for its staleness time (default 100 ms), exactly like an
unplugged arm, and recovers by itself when state flows again; the sim holds its current pose
(target := measured) when no daemon message arrived for its own staleness time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

MAX_HEADER_BYTES = 4096
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024  # enough for 1920x1080x3 raw RGB
MAX_FRAMES = 2
ZMQ_MAXMSGSIZE = 16 * 1024 * 1024  # socket-level last defence; peers above it get disconnected
MAX_IMAGE_SIDE = 4096
HEARTBEAT_PERIOD_S = 0.02
HELLO_PERIOD_S = 1.0
DEFAULT_STALENESS_S = 0.1

NUM_JOINTS = 6
MAX_SEED_ERROR_CHARS = 1024  # fits the header limit with the rest of a state message

DAEMON_TO_SIM = frozenset({"hello", "target", "torque", "episode", "heartbeat"})
SIM_TO_DAEMON = frozenset({"hello", "state", "frame", "episode", "heartbeat", "error"})
EPISODE_COMMANDS = frozenset({"reset", "start", "stop"})
EPISODE_EVENTS = frozenset({"reset_done", "started", "stopped", "success", "terminated"})
FRAME_ENCODINGS = frozenset({"raw", "jpeg"})


class ProtocolError(ValueError):
    """A message we refuse. ``reason`` is a short key for counters."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Message:
    """A decoded, validated message: its type, its header and the optional raw payload."""

    type: str
    header: dict[str, Any]
    payload: bytes | None = None


@dataclass
class RejectCounters:
    """Rejected messages by reason; every receiver keeps one."""

    by_reason: dict[str, int] = field(default_factory=dict)
    last_error: str = ""

    def count(self, err: ProtocolError) -> None:
        self.by_reason[err.reason] = self.by_reason.get(err.reason, 0) + 1
        self.last_error = str(err)

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())


# ---------------------------------------------------------------------------------------------
# encoding
# ---------------------------------------------------------------------------------------------
def encode(msg_type: str, payload: bytes | memoryview | None = None, **fields: Any) -> list[bytes | memoryview]:
    """Header fields -> multipart frames. Raises ValueError on a message we would refuse ourselves."""
    header = {"v": PROTOCOL_VERSION, "t": msg_type, **fields}
    packed = msgpack.packb(header, use_bin_type=True)
    if len(packed) > MAX_HEADER_BYTES:
        raise ValueError(f"{msg_type} header is {len(packed)} bytes, over the {MAX_HEADER_BYTES}-byte limit")
    if payload is None:
        return [packed]
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"{msg_type} payload is {len(payload)} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit")
    return [packed, payload]


def joints_to_wire(values: np.ndarray) -> list[float]:
    v = np.asarray(values, dtype=np.float64)
    if v.shape != (NUM_JOINTS,):
        raise ValueError(f"expected {NUM_JOINTS} joint values, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"non-finite joint value(s): {v.tolist()}")
    return [float(x) for x in v]


def encode_target(seq: int, sent_s: float, pos_units: np.ndarray) -> list[bytes | memoryview]:
    return encode("target", seq=int(seq), sent_s=float(sent_s), pos=joints_to_wire(pos_units))


def encode_frame(name: str, seq: int, capture_s: float, pixels: np.ndarray) -> list[bytes | memoryview]:
    """A raw RGB uint8 frame (H, W, 3); the pixel bytes travel as frame 1 without a copy."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"camera {name!r}: expected HxWx3 uint8, got {pixels.shape} {pixels.dtype}")
    arr = np.ascontiguousarray(pixels)
    return encode(
        "frame",
        memoryview(arr).cast("B"),
        name=name,
        seq=int(seq),
        capture_s=float(capture_s),
        shape=list(arr.shape),
        dtype="uint8",
        encoding="raw",
    )


def encode_jpeg_frame(
    name: str, seq: int, capture_s: float, jpeg: bytes, shape: tuple[int, int, int]
) -> list[bytes | memoryview]:
    return encode(
        "frame",
        jpeg,
        name=name,
        seq=int(seq),
        capture_s=float(capture_s),
        shape=list(shape),
        dtype="uint8",
        encoding="jpeg",
    )


# ---------------------------------------------------------------------------------------------
# decoding and validation
# ---------------------------------------------------------------------------------------------
def _need(header: dict[str, Any], key: str, kinds: type | tuple[type, ...], msg_type: str) -> Any:
    if key not in header:
        raise ProtocolError("field", f"{msg_type}: missing field {key!r}")
    value = header[key]
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ProtocolError("field", f"{msg_type}: field {key!r} has type bool")
    if not isinstance(value, kinds):
        raise ProtocolError("field", f"{msg_type}: field {key!r} has type {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError("field", f"{msg_type}: field {key!r} is not finite")
    return value


def _need_joints(header: dict[str, Any], key: str, msg_type: str) -> list[float]:
    value = _need(header, key, list, msg_type)
    if len(value) != NUM_JOINTS:
        raise ProtocolError("field", f"{msg_type}: {key!r} has {len(value)} values, expected {NUM_JOINTS}")
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ProtocolError("field", f"{msg_type}: {key!r} holds a non-finite or non-numeric value")
    return value


_NUM = (int, float)


def _validate(msg_type: str, h: dict[str, Any], payload: bytes | None) -> None:
    needs_payload = msg_type == "frame"
    if needs_payload != (payload is not None):
        raise ProtocolError("frames", f"{msg_type}: {'missing' if needs_payload else 'unexpected'} payload frame")
    if msg_type == "target":
        _need(h, "seq", int, msg_type)
        _need(h, "sent_s", _NUM, msg_type)
        _need_joints(h, "pos", msg_type)
    elif msg_type == "torque":
        _need(h, "enabled", bool, msg_type)
    elif msg_type == "episode":
        if "cmd" in h:
            if _need(h, "cmd", str, msg_type) not in EPISODE_COMMANDS:
                raise ProtocolError("field", f"episode: unknown command {h['cmd']!r}")
        elif "event" in h:
            if _need(h, "event", str, msg_type) not in EPISODE_EVENTS:
                raise ProtocolError("field", f"episode: unknown event {h['event']!r}")
        else:
            raise ProtocolError("field", "episode: neither 'cmd' nor 'event'")
        _need(h, "seq", int, msg_type)
    elif msg_type == "state":
        _need(h, "seq", int, msg_type)
        _need(h, "sim_time_s", _NUM, msg_type)
        _need_joints(h, "pos", msg_type)
        _need(h, "ack_seq", int, msg_type)
        _need(h, "ack_sent_s", _NUM, msg_type)
        _need(h, "torque", bool, msg_type)
        for opt in ("vel", "effort"):
            if opt in h:
                _need_joints(h, opt, msg_type)
        if "seed_error" in h:
            _need(h, "seed_error", str, msg_type)
    elif msg_type == "frame":
        _need(h, "name", str, msg_type)
        _need(h, "seq", int, msg_type)
        _need(h, "capture_s", _NUM, msg_type)
        shape = _need(h, "shape", list, msg_type)
        if (
            len(shape) != 3
            or shape[2] != 3
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 < s <= MAX_IMAGE_SIDE for s in shape)
        ):
            raise ProtocolError("field", f"frame: bad shape {shape!r} (expected [h, w, 3])")
        if _need(h, "dtype", str, msg_type) != "uint8":
            raise ProtocolError("field", f"frame: unsupported dtype {h['dtype']!r}")
        encoding = _need(h, "encoding", str, msg_type)
        if encoding not in FRAME_ENCODINGS:
            raise ProtocolError("field", f"frame: unknown encoding {encoding!r}")
        if encoding == "raw" and len(payload or b"") != shape[0] * shape[1] * 3:
            raise ProtocolError("field", f"frame: {len(payload or b'')} bytes do not match shape {shape}")
    elif msg_type == "error":
        _need(h, "error", str, msg_type)
    elif msg_type in ("hello", "heartbeat"):
        pass
    if "arm" in h:
        _need(h, "arm", str, msg_type)


def decode(frames: list[bytes], allowed: frozenset[str]) -> Message:
    """Multipart frames -> a validated Message, or ProtocolError naming what is wrong."""
    if not 1 <= len(frames) <= MAX_FRAMES:
        raise ProtocolError("frames", f"expected 1 or 2 frames, got {len(frames)}")
    raw_header = frames[0]
    if len(raw_header) > MAX_HEADER_BYTES:
        raise ProtocolError("oversize", f"header of {len(raw_header)} bytes exceeds {MAX_HEADER_BYTES}")
    payload = bytes(frames[1]) if len(frames) == 2 else None
    if payload is not None and len(payload) > MAX_PAYLOAD_BYTES:
        raise ProtocolError("oversize", f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        header = msgpack.unpackb(
            raw_header, raw=False, strict_map_key=True, max_str_len=MAX_HEADER_BYTES, max_bin_len=0, max_ext_len=0
        )
    except Exception as exc:  # msgpack raises several types for garbage
        raise ProtocolError("header", f"header is not msgpack: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header", f"header is a {type(header).__name__}, not a map")
    version = header.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:  # True == 1 in Python: not a version
        raise ProtocolError("version", f"version mismatch: peer speaks v{version}, we speak v{PROTOCOL_VERSION}")
    msg_type = header.get("t")
    if not isinstance(msg_type, str) or msg_type not in allowed:
        raise ProtocolError("type", f"unexpected message type {msg_type!r}")
    _validate(msg_type, header, payload)
    return Message(msg_type, header, payload)


def frame_pixels(msg: Message) -> np.ndarray:
    """The HxWx3 uint8 RGB image of a validated ``frame`` message (decodes JPEG with OpenCV)."""
    h, w, c = msg.header["shape"]
    if msg.header["encoding"] == "raw":
        assert msg.payload is not None
        return np.frombuffer(msg.payload, dtype=np.uint8).reshape(h, w, c)
    import cv2  # opencv-python-headless comes with lerobot

    bgr = cv2.imdecode(np.frombuffer(msg.payload or b"", dtype=np.uint8), cv2.IMREAD_COLOR)
    if bgr is None or bgr.shape != (h, w, c):
        raise ProtocolError("field", f"frame: JPEG does not decode to shape {[h, w, c]}")
    return bgr[:, :, ::-1].copy()
