"""The daemon's simulated follower: a ``FollowerArm`` whose servos live in a simulator over ZeroMQ.

``SimFollower`` connects a DEALER to a sim server (MuJoCo here, LeIsaac on a GPU workstation; the
protocol and the socket choice are documented in ``drivers.sim_protocol``). One I/O thread owns the
socket: it receives state, camera frames and episode events into plain attributes, forwards the
control loop's commands (handed over through an inproc PUSH/PULL pair, because ZeroMQ sockets must
not be shared between threads) and sends heartbeats. The control loop therefore never blocks on
the network: ``read_joints`` returns the newest measured state or raises ``PortGoneError`` when it
is older than the staleness time — the loop holds exactly as with an unplugged real arm — and
``write_goals`` is a non-blocking hand-over.

When the sim dies and another one binds the same endpoint, ZeroMQ reconnects the DEALER by
itself; the next state message makes ``read_joints`` work again (counted in
``counters.reconnects``), and the torque mode the daemon last asked for is re-sent to the new sim.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from calibration.conventions import JOINT_NAMES, sim_unit_limits
from drivers import sim_protocol as P
from drivers.arm_interface import ArmHealth, BusCounters, BusDiagnostics, HandshakeError, PortGoneError, ServoHealth
from drivers.cameras import Frame

log = logging.getLogger("so101d.sim.follower")

_instance_ids = itertools.count()
# Nominal values reported as "health" of a simulated servo (it never overheats or sags).
SIM_TEMPERATURE_C = 25.0
SIM_VOLTAGE_V = 12.0


@dataclass(frozen=True)
class EpisodeEvent:
    """An episode signal from the sim: reset_done, started, stopped, success or terminated."""

    event: str
    seq: int  # the episode command sequence number it belongs to
    detail: str
    received_monotonic_s: float


class SimCamera:
    """A camera rendered by the sim, delivered over the bridge (implements the ``Camera`` protocol).

    Frames arrive on the follower's I/O thread; ``latest_frame`` is a reference read. The frame's
    ``capture_monotonic_s`` is the daemon-side arrival time (same clock as the control loop; the
    transport adds well under a millisecond on loopback), the sim's own capture time and sequence
    number are kept in ``stats()``.

    Size: the simulator's. ``width``/``height`` stay 0 until the sim announces them (its hello,
    else its first frame); the recorder waits for them. A size the configuration asked for
    (``configured``) that differs from the announced one sets ``size_error`` naming both; frames
    of another size than announced are the recorder's to refuse (counted), never resized here.
    """

    def __init__(self, follower: SimFollower, name: str, width: int = 0, height: int = 0, fps: float = 30.0) -> None:
        self._follower = follower
        self.name = name
        self.configured: tuple[int, int] | None = (int(width), int(height)) if width > 0 and height > 0 else None
        self.width = 0
        self.height = 0
        self.size_error = ""
        self.fps = float(fps)
        self._latest: Frame | None = None
        self._seq = 0
        self._frames = 0
        self._sim_seq_gaps = 0
        self._last_sim_seq = -1
        self._last_sim_capture_s = 0.0
        self._started_s = 0.0
        self._active = False
        self._announced_by = ""

    def configure(self, width: int, height: int) -> None:
        """The size a configuration asks for (0, 0: none, take the simulator's)."""
        self.configured = (int(width), int(height)) if width > 0 and height > 0 else None
        self._check_size()

    # called on the I/O thread
    def _announce(self, width: int, height: int, source: str) -> None:
        """The simulator's size (hello, or the first frame when the hello gave none). Set once:
        a sim restarted with another size gets its frames refused by the recorder, counted."""
        if width <= 0 or height <= 0:
            return
        if self.width == 0 and self.height == 0:
            self.width, self.height = int(width), int(height)
            self._announced_by = source
            self._check_size()
        elif (width, height) != (self.width, self.height):
            log.error(
                "sim camera %s: the simulator now announces %dx%d (%s), it announced %dx%d before",
                self.name,
                width,
                height,
                source,
                self.width,
                self.height,
            )

    def _check_size(self) -> None:
        if self.configured is None or self.width == 0:
            return
        if self.configured != (self.width, self.height):
            cw, ch = self.configured
            self.size_error = (
                f"camera {self.name}: [cameras.{self.name}] asks for {cw}x{ch} but the simulator "
                f"renders {self.width}x{self.height}; remove width/height from [cameras.{self.name}] "
                f"(a sim camera takes the simulator's size) or set them to {self.width}x{self.height}"
            )
            log.error("%s", self.size_error)

    def _deliver(self, pixels: np.ndarray, sim_seq: int, sim_capture_s: float, now_s: float) -> None:
        if self._last_sim_seq >= 0 and sim_seq > self._last_sim_seq + 1:
            self._sim_seq_gaps += sim_seq - self._last_sim_seq - 1
        self._last_sim_seq = sim_seq
        self._last_sim_capture_s = sim_capture_s
        if self.width == 0:
            self._announce(int(pixels.shape[1]), int(pixels.shape[0]), "first frame")
        self._latest = Frame(pixels=pixels, capture_monotonic_s=now_s, seq=self._seq)
        self._seq += 1
        self._frames += 1

    def start(self) -> None:
        # Frames flow as soon as the follower is connected; start only marks the camera in use.
        self._active = True
        self._started_s = time.monotonic()

    def latest_frame(self) -> Frame | None:
        return self._latest

    def stop(self) -> None:
        self._active = False

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        latest = self._latest
        age = now - latest.capture_monotonic_s if latest is not None else None
        stalled = age is None or age > 5.0 / self.fps + 0.5
        return {
            "name": self.name,
            "kind": "sim",
            "width": self.width,
            "height": self.height,
            "size_from": self._announced_by,
            "error": self.size_error,
            "fps_configured": self.fps,
            "frames": self._frames,
            "sim_seq_gaps": self._sim_seq_gaps,
            "last_frame_age_s": None if age is None else round(age, 3),
            "stalled": bool(self._active and stalled),
        }


class SimFollower:
    """``FollowerArm`` (kind "sim") backed by a simulator speaking ``drivers.sim_protocol``."""

    kind = "sim"

    def __init__(
        self,
        endpoint: str,
        *,
        staleness_s: float = P.DEFAULT_STALENESS_S,
        connect_timeout_s: float = 5.0,
        client_name: str = "so101d",
        sim_mapping: str | None = None,
        arm: str = "",
    ) -> None:
        """``sim_mapping``: the ``[follower] sim_mapping`` the leader is mapped through for this
        sim, named in every sim episode's tag notes (None: not said). ``arm``: the arm of a
        two-arm sim this follower drives ("left", "right"; "" for a one-arm sim): every message
        names it (``drivers.sim_protocol``, "Arms"); a sim that does not serve it is refused."""
        if staleness_s <= 0:
            raise ValueError(f"staleness_s must be positive, got {staleness_s}")
        self.endpoint = endpoint
        self.arm = arm
        self._arm_field: dict[str, Any] = {"arm": arm} if arm else {}
        self.sim_mapping = sim_mapping
        self.staleness_s = float(staleness_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.client_name = client_name
        self.counters = BusCounters()
        self.rejects = P.RejectCounters()

        self._lock = threading.Lock()
        self._ctx: zmq.Context | None = None
        self._push: zmq.Socket | None = None
        self._inproc = f"inproc://so101d-simfollower-{next(_instance_ids)}"
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

        # state written by the I/O thread, read by callers (simple attribute swaps)
        self._pos_units: np.ndarray | None = None
        self._effort_pct: np.ndarray = np.zeros(len(JOINT_NAMES))
        self._torque_reported = True
        self._state_rx_s = -1e9
        self._scene_resets = 0  # reset_done events seen (the reset pose arrived just before each)
        self._state_seq = -1
        self._ack_seq = -1
        self._rtt_s: collections.deque[float] = collections.deque(maxlen=2048)
        self._events: collections.deque[EpisodeEvent] = collections.deque(maxlen=256)
        self._event_cv = threading.Condition(self._lock)
        self._peer_error = ""
        self._seed_error = ""  # the sim's seed-demo recording failed (its own file, not our dataset)
        self._sim_info: dict[str, Any] = {}
        self._cameras: dict[str, SimCamera] = {}
        self._was_stale = False
        self._ever_connected = False
        self._rx_messages = 0
        self._tx_dropped = 0
        self._stale_events = 0

        # commands issued by the caller
        self._target_seq = 0
        self._episode_seq = 0
        self._torque_cmd: bool | None = None

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Start the I/O thread and wait for the first state (PortGoneError if no sim answers)."""
        if self._thread is None or not self._thread.is_alive():
            self._ctx = zmq.Context()
            pull = self._ctx.socket(zmq.PULL)
            pull.bind(self._inproc)
            self._push = self._ctx.socket(zmq.PUSH)
            self._push.setsockopt(zmq.LINGER, 0)
            self._push.connect(self._inproc)
            self._stop.clear()
            self._thread = threading.Thread(target=self._io_loop, args=(pull,), name="sim-follower-io", daemon=True)
            self._thread.start()
        self._wait_for_state(self.connect_timeout_s, "connect")
        log.info("sim follower connected to %s (%s)", self.endpoint, self._sim_info.get("backend", "?"))

    def reconnect(self, timeout_s: float | None = None) -> None:
        """Wait for the sim to come back (ZeroMQ redials by itself; nothing to rebuild).

        ``timeout_s=0`` is one check (the daemon's connect thread keeps its own backoff);
        None waits up to ``connect_timeout_s``. PortGoneError while no fresh state arrives.
        """
        if self._thread is None or not self._thread.is_alive():
            self.connect()
            return
        self._wait_for_state(self.connect_timeout_s if timeout_s is None else timeout_s, "reconnect")

    def _wait_for_state(self, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._peer_error:
                raise HandshakeError(f"sim at {self.endpoint}: {self._peer_error}")
            if self._fresh():
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        if self._peer_error:
            raise HandshakeError(f"sim at {self.endpoint}: {self._peer_error}")
        raise PortGoneError(f"{what}: no simulator answering at {self.endpoint} within {timeout_s:.1f} s")

    @property
    def port(self) -> str:
        """The simulator's endpoint: what a serial arm's port is to status."""
        return self.endpoint

    def diagnostics(self) -> BusDiagnostics:
        return BusDiagnostics(counters=self.counters)  # no adapter, no servo registers to configure

    def missing_servos(self) -> tuple[str, ...]:
        return ()  # a simulator answers for the whole arm or not at all

    def probe_missing(self) -> tuple[str, ...]:
        return ()

    def close(self, torque_off: bool = True) -> None:
        """The simulated arm keeps its own state: ``torque_off`` has no servo to switch here."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        with self._lock:
            if self._push is not None:
                self._push.close(linger=0)
                self._push = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # ------------------------------------------------------------------------------------------
    # FollowerArm
    # ------------------------------------------------------------------------------------------
    def _fresh(self, now_s: float | None = None) -> bool:
        now = time.monotonic() if now_s is None else now_s
        return self._pos_units is not None and now - self._state_rx_s <= self.staleness_s

    def read_joints(self) -> np.ndarray:
        self.counters.transactions += 1
        if self._peer_error:
            self.counters.failures += 1
            raise HandshakeError(f"sim at {self.endpoint}: {self._peer_error}")
        now = time.monotonic()
        pos, rx = self._pos_units, self._state_rx_s
        if pos is None or now - rx > self.staleness_s:
            self.counters.failures += 1
            if not self._was_stale:
                self._was_stale = True
                self._stale_events += 1
            age = "never" if pos is None else f"{(now - rx) * 1000:.0f} ms ago"
            raise PortGoneError(
                f"sim at {self.endpoint} silent: last state {age} (staleness {self.staleness_s * 1000:.0f} ms)"
            )
        return pos.copy()

    def scene_resets(self) -> int:
        return self._scene_resets

    def last_known_joints(self) -> np.ndarray | None:
        """The newest state received, however old (for display; the loop uses ``read_joints``)."""
        pos = self._pos_units
        return None if pos is None else pos.copy()

    def write_goals(self, goals: np.ndarray) -> None:
        pos = P.joints_to_wire(goals)  # ValueError on bad shape / NaN: never reaches the sim
        self._target_seq += 1
        self.counters.transactions += 1
        self._hand_over(("target", self._target_seq, time.monotonic(), pos))

    def set_torque(self, enabled: bool) -> None:
        self._torque_cmd = bool(enabled)
        self._hand_over(("torque", bool(enabled)))

    def read_health(self) -> ArmHealth:
        now = time.monotonic()
        if not self._fresh(now):
            return ArmHealth(servos={}, read_at_s=now, missing=tuple(JOINT_NAMES))
        effort = self._effort_pct
        torque = self._torque_reported
        servos = {
            name: ServoHealth(
                temperature_c=SIM_TEMPERATURE_C,
                voltage_v=SIM_VOLTAGE_V,
                load_pct=float(effort[i]),
                current_ma=0.0,
                status_bits=0,
                torque_enabled=torque,
            )
            for i, name in enumerate(JOINT_NAMES)
        }
        return ArmHealth(servos=servos, read_at_s=now, missing=())

    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        return sim_unit_limits()

    # ------------------------------------------------------------------------------------------
    # episodes, cameras, stats
    # ------------------------------------------------------------------------------------------
    def _episode(self, cmd: str, seed: int | None = None) -> int:
        self._episode_seq += 1
        self._hand_over(("episode", cmd, self._episode_seq, seed))
        return self._episode_seq

    def reset_episode(self, seed: int | None = None, timeout_s: float | None = 5.0) -> int:
        """Ask the sim to reset its scene; with a timeout, wait for its reset_done (TimeoutError)."""
        seq = self._episode("reset", seed)
        if timeout_s is not None:
            self.wait_event("reset_done", seq, timeout_s)
        return seq

    def start_episode(self) -> int:
        return self._episode("start")

    def stop_episode(self) -> int:
        return self._episode("stop")

    def wait_event(self, event: str, seq: int | None = None, timeout_s: float = 5.0) -> EpisodeEvent:
        """Block until an event of this kind (for this episode seq, if given) has arrived."""
        deadline = time.monotonic() + timeout_s
        with self._event_cv:
            while True:
                for ev in self._events:
                    if ev.event == event and (seq is None or ev.seq == seq):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"sim at {self.endpoint}: no {event!r} event within {timeout_s:.1f} s")
                self._event_cv.wait(left)

    def events(self) -> list[EpisodeEvent]:
        """Drain the episode events received so far (success, terminated, reset_done...)."""
        with self._lock:
            out = list(self._events)
            self._events.clear()
        return out

    def cameras(self) -> dict[str, SimCamera]:
        """The sim's cameras (announced in its hello, or seen in frames)."""
        return dict(self._cameras)

    def camera(self, name: str, width: int = 0, height: int = 0, fps: float = 30.0) -> SimCamera:
        """A camera source by name; created on demand so the daemon can wire it before frames flow.

        ``width``/``height``: the size the configuration asks for (0: the simulator's); the
        camera's own size is always the one the simulator announces (see SimCamera)."""
        with self._lock:
            cam = self._cameras.get(name)
            if cam is None:
                cam = self._cameras[name] = SimCamera(self, name, width, height, fps)
            elif width > 0 and height > 0:
                cam.configure(width, height)
            return cam

    def _sim_camera(self, name: str, fps: float = 30.0) -> SimCamera:
        with self._lock:
            cam = self._cameras.get(name)
            if cam is None:
                cam = self._cameras[name] = SimCamera(self, name, 0, 0, fps)
            return cam

    def round_trip_s(self) -> list[float]:
        """Target-sent -> state-acknowledging-it-received times, newest last (daemon clock)."""
        return list(self._rtt_s)

    @property
    def dataset_kind(self) -> str:
        """The EpisodeTag follower_kind: "sim-mujoco" / "sim-leisaac" once the sim said hello."""
        backend = str(self._sim_info.get("backend") or "")
        return f"sim-{backend.split(':', 1)[0]}" if backend else "sim"

    @property
    def sim_info(self) -> dict[str, Any]:
        return dict(self._sim_info)

    def stats(self) -> dict[str, Any]:
        rtt = sorted(self._rtt_s)
        now = time.monotonic()
        return {
            "kind": "sim",
            "endpoint": self.endpoint,
            "arm": self.arm or None,  # the arm of a two-arm sim it drives
            "backend": self._sim_info.get("backend"),
            "connected": self._fresh(now),
            "last_state_age_s": None if self._pos_units is None else round(now - self._state_rx_s, 4),
            "received": self._rx_messages,
            "rejected": dict(self.rejects.by_reason),
            "last_reject": self.rejects.last_error,
            "send_dropped": self._tx_dropped,
            "stale_events": self._stale_events,
            "reconnects": self.counters.reconnects,
            "rtt_p50_ms": round(rtt[len(rtt) // 2] * 1000, 3) if rtt else None,
            "rtt_p99_ms": round(rtt[min(len(rtt) - 1, int(len(rtt) * 0.99))] * 1000, 3) if rtt else None,
            "seed_error": self._seed_error or None,
        }

    # ------------------------------------------------------------------------------------------
    # the I/O thread
    # ------------------------------------------------------------------------------------------
    def _hand_over(self, cmd: tuple) -> None:
        with self._lock:
            if self._push is None:
                raise PortGoneError(f"sim follower {self.endpoint} is not connected (call connect())")
            try:
                self._push.send(_pack_cmd(cmd), zmq.NOBLOCK)
            except zmq.Again:
                self._tx_dropped += 1

    def _new_dealer(self) -> zmq.Socket:
        assert self._ctx is not None
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.SNDHWM, 16)
        s.setsockopt(zmq.RCVHWM, 64)
        s.setsockopt(zmq.MAXMSGSIZE, P.ZMQ_MAXMSGSIZE)
        s.setsockopt(zmq.RECONNECT_IVL, 20)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        s.connect(self.endpoint)
        return s

    def _io_loop(self, pull: zmq.Socket) -> None:
        dealer = self._new_dealer()
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(pull, zmq.POLLIN)
        next_heartbeat = 0.0
        next_hello = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_hello:
                    self._send(dealer, P.encode("hello", client=self.client_name, **self._arm_field))
                    next_hello = now + P.HELLO_PERIOD_S
                if now >= next_heartbeat:
                    self._send(dealer, P.encode("heartbeat", sent_s=now, **self._arm_field))
                    next_heartbeat = now + P.HEARTBEAT_PERIOD_S
                timeout_ms = max(0, int((min(next_heartbeat, next_hello) - time.monotonic()) * 1000)) + 1
                events = dict(poller.poll(timeout_ms))
                if pull in events:
                    while True:
                        try:
                            raw = pull.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._forward(dealer, raw)
                if dealer in events:
                    while True:
                        try:
                            frames = dealer.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_message(dealer, frames)
        except Exception:  # pragma: no cover - a bug here must be loud, the loop then sees staleness
            log.exception("sim follower I/O thread crashed")
        finally:
            dealer.close(linger=0)
            pull.close(linger=0)

    def _send(self, dealer: zmq.Socket, frames: list) -> None:
        try:
            dealer.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            # IMMEDIATE: no sim connected right now, or its queue is full. Never queue stale commands.
            self._tx_dropped += 1

    def _forward(self, dealer: zmq.Socket, raw: bytes) -> None:
        cmd = _unpack_cmd(raw)
        kind = cmd[0]
        arm = self._arm_field
        if kind == "target":
            _, seq, sent_s, pos = cmd
            self._send(dealer, P.encode("target", seq=seq, sent_s=sent_s, pos=pos, **arm))
        elif kind == "torque":
            self._send(dealer, P.encode("torque", enabled=cmd[1], **arm))
        elif kind == "episode":
            _, what, seq, seed = cmd
            self._send(dealer, P.encode("episode", cmd=what, seq=seq, seed=seed, **arm))

    def _on_message(self, dealer: zmq.Socket, frames: list[bytes]) -> None:
        self._rx_messages += 1
        try:
            msg = P.decode(frames, P.SIM_TO_DAEMON)
        except P.ProtocolError as err:
            self.rejects.count(err)
            if err.reason == "version":
                self._peer_error = str(err)
                log.error("sim at %s: %s", self.endpoint, err)
            return
        now = time.monotonic()
        h = msg.header
        if msg.type == "state":
            if self._pos_units is not None and now - self._state_rx_s > self.staleness_s and self._ever_connected:
                self.counters.reconnects += 1
                log.warning(
                    "sim at %s: state flowing again after %.0f ms", self.endpoint, (now - self._state_rx_s) * 1000
                )
                if self._torque_cmd is not None:  # a restarted sim starts in its default torque mode
                    self._send(dealer, P.encode("torque", enabled=self._torque_cmd, **self._arm_field))
            self._pos_units = np.asarray(h["pos"], dtype=np.float64)
            if "effort" in h:
                self._effort_pct = np.asarray(h["effort"], dtype=np.float64)
            self._torque_reported = bool(h["torque"])
            if "seed_error" in h and h["seed_error"] != self._seed_error:
                log.error("sim at %s: %s", self.endpoint, h["seed_error"])
            self._seed_error = str(h.get("seed_error", ""))
            self._state_rx_s = now
            self._state_seq = h["seq"]
            self._ever_connected = True
            self._was_stale = False
            if h["ack_seq"] > self._ack_seq:
                self._ack_seq = h["ack_seq"]
                self._rtt_s.append(now - float(h["ack_sent_s"]))
        elif msg.type == "frame":
            try:
                pixels = P.frame_pixels(msg)
            except P.ProtocolError as err:
                self.rejects.count(err)
                return
            cam = self._cameras.get(h["name"]) or self._sim_camera(h["name"])
            cam._deliver(pixels, h["seq"], float(h["capture_s"]), now)
        elif msg.type == "episode":
            if h["event"] == "reset_done":
                # A sim sends the reset pose before reset_done (drivers.sim_protocol), and this thread
                # stored that pose already: a reader of the count then reads a post-reset pose.
                self._scene_resets += 1
            with self._event_cv:
                self._events.append(EpisodeEvent(h["event"], h["seq"], str(h.get("detail", "")), now))
                self._event_cv.notify_all()
        elif msg.type == "hello":
            self._check_arms(h.get("arms"))
            self._sim_info = dict(h)
            for cam in h.get("cameras", []) or []:
                if isinstance(cam, dict) and isinstance(cam.get("name"), str):
                    sc = self._sim_camera(cam["name"], float(cam.get("fps", 30.0) or 30.0))
                    sc._announce(int(cam.get("width", 0) or 0), int(cam.get("height", 0) or 0), "hello")
        elif msg.type == "error":
            if h["error"] != self._peer_error:  # a sim refusing every message says so once here
                log.error("sim at %s reports: %s", self.endpoint, h["error"])
            if "version" in h["error"] or h.get("reason") == "arm":
                self._peer_error = h["error"]

    def _check_arms(self, arms: object) -> None:
        """The arms a sim's hello says it serves, against the arm this follower drives: a one-arm
        sim for an arm of a pair (or the reverse) is a configuration error, said once, not retried."""
        served = [a for a in arms if isinstance(a, str)] if isinstance(arms, list) else []
        if self.arm and self.arm not in served:
            self._peer_error = (
                f"the bimanual configuration's arm {self.arm!r} needs a two-arm sim; this one serves "
                + (f"the arms {', '.join(served)}" if served else "one arm (start it with --arms left,right)")
            )
        elif not self.arm and served:
            self._peer_error = (
                f"this sim serves the arms {', '.join(served)} of one scene; a single-arm configuration "
                "cannot drive it (configure [arms.left] / [arms.right], or start the sim without --arms)"
            )


# Commands cross from the caller's thread to the I/O thread as msgpack (no pickle anywhere).
def _pack_cmd(cmd: tuple) -> bytes:
    import msgpack

    return msgpack.packb(list(cmd), use_bin_type=True)


def _unpack_cmd(raw: bytes) -> tuple:
    import msgpack

    return tuple(msgpack.unpackb(raw, raw=False))
