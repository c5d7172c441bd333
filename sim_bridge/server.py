"""The sim side of the protocol, shared by every simulator backend (MuJoCo here, LeIsaac on a GPU).

``SimServerEndpoint`` owns the bound ROUTER socket (see ``drivers.sim_protocol`` for why ROUTER),
tracks the daemon it answers, decodes and counts what it receives, and sends state, frames and
episode events. A backend calls ``poll()`` once per tick and reads the resulting ``ServerInbox``;
it never touches ZeroMQ itself, so the backend's stepping logic stays testable with a fake env.

Both backends keep their own clock: ``StepClock`` holds the next step's deadline and
``SimServerEndpoint.serve_until`` hands every message that arrives before it to the backend, so
the step rate is the sim's, not the daemon's message rate.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from drivers import sim_protocol as P

log = logging.getLogger("so101d.sim.server")


# Messages taken per poll at most: a daemon flooding faster than they are read cannot starve the step.
MAX_DRAIN_PER_POLL = 4096


def _peek_target_seq(frames: list[bytes]) -> tuple[str, int] | None:
    """A target's (arm, seq) from its header without validating it (None for anything else, or
    for what ``P.decode`` will reject anyway): superseded targets are never decoded in full."""
    if len(frames) != 2 or len(frames[1]) > P.MAX_HEADER_BYTES:
        return None
    try:
        header = msgpack.unpackb(frames[1], raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception:  # msgpack raises several types for garbage; P.decode names it
        return None
    if not isinstance(header, dict) or header.get("t") != "target":
        return None
    seq, arm = header.get("seq"), header.get("arm", "")
    return (arm, seq) if type(seq) is int and isinstance(arm, str) else None


@dataclass
class ServerInbox:
    """What arrived for one arm since the last poll (only the newest target and torque command
    matter); ``arm`` is "" at a one-arm sim."""

    arm: str = ""
    target_units: np.ndarray | None = None
    target_seq: int = -1
    target_sent_s: float = 0.0
    torque: bool | None = None
    episode_cmds: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ServerStats:
    received: int = 0
    sent: int = 0
    send_dropped: int = 0
    targets: int = 0
    rejects: P.RejectCounters = field(default_factory=P.RejectCounters)
    peers_seen: int = 0


@dataclass
class StepClock:
    """The deadline of the next step, ``period_s`` apart, kept within one period of real time.

    Falling behind by more than ``max_behind_s`` (a host stall, a slow GPU step) restarts the
    schedule at now instead of racing to catch up; the deadline never runs more than one period
    ahead of now either, so a burst of messages or a clock quirk can never leave the sim waiting
    with no steps.
    """

    period_s: float
    max_behind_s: float = 0.25
    next_s: float = field(default_factory=time.monotonic)
    overruns: int = 0

    def advance(self, now_s: float | None = None) -> float:
        """Move to the next step's deadline; returns it."""
        now = time.monotonic() if now_s is None else now_s
        self.next_s += self.period_s
        if now - self.next_s > self.max_behind_s:
            self.overruns += 1
            self.next_s = now
        elif self.next_s - now > self.period_s:
            self.next_s = now + self.period_s
        return self.next_s


@dataclass
class _ArmPeer:
    """The daemon link driving one arm: the most recent one heard from for it."""

    peer: bytes | None = None
    last_rx_s: float = -1e9


class SimServerEndpoint:
    """Bound ROUTER: one daemon link per arm at a time (the most recent one heard from for it).

    ``arms`` (): one arm, its link names none; ("left", "right"): one scene's two arms, every
    daemon message names its arm (``drivers.sim_protocol``, "Arms")."""

    def __init__(
        self,
        bind: str,
        *,
        backend: str,
        cameras: list[dict[str, Any]] | None = None,
        rate_hz: float = 30.0,
        daemon_staleness_s: float = P.DEFAULT_STALENESS_S,
        context: zmq.Context | None = None,
        arms: tuple[str, ...] = (),
    ) -> None:
        if len(set(arms)) != len(arms) or "" in arms:
            raise ValueError(f"arms must be distinct non-empty names, got {arms!r}")
        self.arms = tuple(arms)
        self._links = {name: _ArmPeer() for name in (self.arms or ("",))}
        self.bind_endpoint = bind
        self.backend = backend
        self.cameras = list(cameras or [])
        self.rate_hz = rate_hz
        self.daemon_staleness_s = daemon_staleness_s
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._error_answered_s: dict[bytes, float] = {}  # refused peer -> when it was last told why
        self._state_seq = 0
        self._event_seq = 0
        self.stats = ServerStats()

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        if self.bind_endpoint.startswith("ipc://"):
            path = self.bind_endpoint[len("ipc://") :]
            # A previous sim killed with SIGKILL leaves its socket file behind; binding over it works
            # on Linux, but remove it so a stale file never looks like a live sim.
            if path and os.path.exists(path):
                os.unlink(path)
        s = self._ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTER_MANDATORY, 1)
        s.setsockopt(zmq.SNDHWM, 32)
        s.setsockopt(zmq.RCVHWM, 256)
        s.setsockopt(zmq.MAXMSGSIZE, P.ZMQ_MAXMSGSIZE)
        s.bind(self.bind_endpoint)
        self._sock = s
        log.info("sim server (%s) bound at %s", self.backend, self.bind_endpoint)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    @property
    def endpoint(self) -> str:
        """The bound endpoint (the resolved port when bound to tcp://...:0)."""
        assert self._sock is not None
        return self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    # -- receiving -------------------------------------------------------------------------
    def daemon_stale(self, now_s: float | None = None, arm: str = "") -> bool:
        """No valid message from the link of ``arm`` ("": the one arm's; at a two-arm sim, "" is
        every link's) for the staleness time."""
        return self.daemon_silent_s(now_s, arm) > self.daemon_staleness_s

    def daemon_silent_s(self, now_s: float | None = None, arm: str = "") -> float:
        """Seconds since the last valid message from the link of ``arm`` ("": any link's)."""
        now = time.monotonic() if now_s is None else now_s
        links = [self._links[arm]] if arm else self._links.values()
        return now - max(link.last_rx_s for link in links)

    @property
    def has_peer(self) -> bool:
        return any(link.peer is not None for link in self._links.values())

    def poll(self, timeout_s: float = 0.0) -> ServerInbox:
        """``poll_arms`` at a one-arm sim: its one inbox."""
        if self.arms:
            raise RuntimeError(f"this sim serves arms {', '.join(self.arms)}: poll_arms() gives each arm's inbox")
        return self.poll_arms(timeout_s)[""]

    def poll_arms(self, timeout_s: float = 0.0) -> dict[str, ServerInbox]:
        """Drain everything that arrived, into one inbox per arm; wait up to ``timeout_s`` for
        the first message.

        Only each arm's newest target is used, so targets are only peeked at (the header's type,
        arm and seq) while draining and just the newest valid one per arm is decoded and checked
        in full; every other message (torque, episode, hello, heartbeat) is decoded in order. A
        burst of queued targets then costs a msgpack peek each, not a full decode before the step.
        """
        inboxes = {name: ServerInbox(arm=name) for name in self._links}
        assert self._sock is not None
        if timeout_s > 0 and not self._sock.poll(int(timeout_s * 1000)):
            return inboxes
        targets: dict[str, list[tuple[int, list[bytes]]]] = {}  # per arm: (seq, frames), to decode the newest
        for _ in range(MAX_DRAIN_PER_POLL):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            self.stats.received += 1
            peeked = _peek_target_seq(frames)
            if peeked is not None:
                targets.setdefault(peeked[0], []).append((peeked[1], frames))
                continue
            self._take(frames, inboxes)
        # per arm, newest first; an invalid one is counted as rejected and the next newest is tried
        for arm_targets in targets.values():
            for _seq, frames in sorted(arm_targets, key=lambda t: t[0], reverse=True):
                if self._take(frames, inboxes):
                    break
            self.stats.targets += len(arm_targets)
        return inboxes

    def _may_answer_error(self, peer: bytes) -> bool:
        """A refused peer (wrong version, wrong arm) is told at most once per hello period: it
        sends heartbeats 50 times a second, each one refused."""
        now = time.monotonic()
        if now - self._error_answered_s.get(peer, -1e9) < P.HELLO_PERIOD_S:
            return False
        if len(self._error_answered_s) >= 64:  # bounded: a stream of new peers cannot grow it
            self._error_answered_s.clear()
        self._error_answered_s[peer] = now
        return True

    def _arm_of(self, msg: P.Message) -> str:
        """The arm a daemon message drives; ProtocolError("arm") when this sim does not serve it."""
        arm = msg.header.get("arm")
        if not self.arms:
            if arm is not None:
                raise P.ProtocolError(
                    "arm",
                    f"this sim serves one arm; the daemon link names arm {arm!r} (a bimanual configuration "
                    "needs a two-arm sim: so101d sim-follower --arms left,right)",
                )
            return ""
        if arm is None:
            raise P.ProtocolError(
                "arm",
                f"this sim serves the arms {', '.join(self.arms)} of one scene; the daemon link names no arm "
                "(a single-arm configuration cannot drive it: configure [arms.left] / [arms.right])",
            )
        if arm not in self._links:
            raise P.ProtocolError("arm", f"this sim serves the arms {', '.join(self.arms)}; it has no arm {arm!r}")
        return arm

    def _take(self, frames: list[bytes], inboxes: dict[str, ServerInbox]) -> bool:
        """Decode and apply one message; False when it was rejected."""
        if len(frames) < 2:
            self.stats.rejects.count(P.ProtocolError("frames", "message without routing id"))
            return False
        peer, body = frames[0], frames[1:]
        try:
            msg = P.decode(body, P.DAEMON_TO_SIM)
            arm = self._arm_of(msg)
        except P.ProtocolError as err:
            self.stats.rejects.count(err)
            log.debug("rejected message: %s", err)
            if err.reason in ("version", "arm") and self._may_answer_error(peer):
                self._send_to(peer, P.encode("error", error=str(err), reason=err.reason))
            return False
        link = self._links[arm]
        inbox = inboxes[arm]
        if peer != link.peer:
            self.stats.peers_seen += 1
            log.info("daemon connected (peer #%d%s)", self.stats.peers_seen, f", arm {arm}" if arm else "")
            link.peer = peer
            self.send_hello(arm)  # the daemon's own hello may have been dropped before it connected
        link.last_rx_s = time.monotonic()
        h = msg.header
        if msg.type == "target":
            if h["seq"] > inbox.target_seq:
                inbox.target_units = np.asarray(h["pos"], dtype=np.float64)
                inbox.target_seq = h["seq"]
                inbox.target_sent_s = float(h["sent_s"])
        elif msg.type == "torque":
            inbox.torque = bool(h["enabled"])
        elif msg.type == "episode":
            inbox.episode_cmds.append({"cmd": h["cmd"], "seq": h["seq"], "seed": h.get("seed")})
        elif msg.type == "hello":
            self.send_hello(arm)
        return True

    def serve_until(
        self,
        deadline_s: float,
        on_inbox: Callable[[ServerInbox], None],
        stop: Callable[[], bool] = lambda: False,
        max_wait_s: float = 0.05,
    ) -> None:
        """Hand what arrives to ``on_inbox`` as it arrives (one inbox per arm, ``inbox.arm``),
        until ``deadline_s`` (monotonic).

        Always polls at least once, so a late step still picks up what came meanwhile; each wait
        is at most ``max_wait_s`` so ``stop`` is seen promptly.
        """
        while True:
            wait = deadline_s - time.monotonic()
            for inbox in self.poll_arms(max(0.0, min(wait, max_wait_s))).values():
                on_inbox(inbox)
            if wait <= 0 or stop():
                return

    # -- sending ---------------------------------------------------------------------------
    def _send_to(self, peer: bytes, frames: list[bytes | memoryview]) -> bool:
        assert self._sock is not None
        try:
            self._sock.send_multipart([peer, *frames], zmq.NOBLOCK, copy=False)
        except (zmq.Again, zmq.ZMQError):
            # Again: the daemon's queue is full (it is slow); EHOSTUNREACH: it is gone.
            self.stats.send_dropped += 1
            return False
        self.stats.sent += 1
        return True

    def _send(self, frames: list[bytes | memoryview], arm: str = "") -> bool:
        """To the link of ``arm`` ("" at a one-arm sim)."""
        peer = self._links[arm].peer
        if peer is None:
            return False
        return self._send_to(peer, frames)

    def _frame_arm(self) -> str | None:
        """The arm whose link takes the camera frames: the first one connected (None: none is)."""
        now = time.monotonic()
        for name, link in self._links.items():
            if link.peer is not None and not self.daemon_stale(now, name):
                return name
        return next((name for name, link in self._links.items() if link.peer is not None), None)

    def send_hello(self, arm: str = "") -> bool:
        both: dict[str, Any] = {"arms": list(self.arms), "arm": arm} if self.arms else {}
        return self._send(
            P.encode(
                "hello", server="so101d-sim", backend=self.backend, cameras=self.cameras, rate_hz=self.rate_hz, **both
            ),
            arm,
        )

    def send_state(
        self,
        pos_units: np.ndarray,
        *,
        sim_time_s: float,
        torque: bool,
        ack_seq: int,
        ack_sent_s: float,
        vel_units: np.ndarray | None = None,
        effort: np.ndarray | None = None,
        seed_error: str | None = None,
        arm: str = "",
    ) -> bool:
        """One arm's state, to that arm's link (``arm`` "" at a one-arm sim)."""
        self._state_seq += 1
        fields: dict[str, Any] = dict(
            seq=self._state_seq,
            sim_time_s=float(sim_time_s),
            pos=P.joints_to_wire(pos_units),
            torque=bool(torque),
            ack_seq=int(ack_seq),
            ack_sent_s=float(ack_sent_s),
            daemon_stale=self.daemon_stale(None, arm),
        )
        if arm:
            fields["arm"] = arm
        if vel_units is not None:
            fields["vel"] = P.joints_to_wire(vel_units)
        if effort is not None:
            fields["effort"] = P.joints_to_wire(effort)
        if seed_error is not None:
            fields["seed_error"] = seed_error[: P.MAX_SEED_ERROR_CHARS]
        return self._send(P.encode("state", **fields), arm)

    def send_frame(
        self, name: str, seq: int, capture_s: float, pixels: np.ndarray, jpeg_quality: int | None = None
    ) -> bool:
        arm = self._frame_arm()
        if arm is None:
            return False
        if jpeg_quality is None:
            return self._send(P.encode_frame(name, seq, capture_s, pixels), arm)
        import cv2

        ok, buf = cv2.imencode(
            ".jpg", np.ascontiguousarray(pixels[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, int(jpeg_quality)]
        )
        if not ok:
            return False
        return self._send(P.encode_jpeg_frame(name, seq, capture_s, buf.tobytes(), tuple(pixels.shape)), arm)

    def send_event(self, event: str, detail: str = "", seq: int | None = None) -> bool:
        """An episode event, to every arm's link (the scene they share reset, succeeded, ...)."""
        self._event_seq += 1
        frames = P.encode("episode", event=event, seq=self._event_seq if seq is None else int(seq), detail=detail)
        sent = [self._send(frames, arm) for arm in self._links]
        return any(sent)

    def send_heartbeat(self) -> bool:
        frames = P.encode("heartbeat", sent_s=time.monotonic())
        return any([self._send(frames, arm) for arm in self._links])
