"""Remote inference on LeRobot 0.6.1's async policy server (gRPC), from our policy worker process.

Speaks what LeRobot's own robot client speaks (lerobot/async_inference/robot_client.py,
``RobotClient.start`` / ``send_observation`` / ``receive_actions``) to an unmodified
``python -m lerobot.async_inference.policy_server``:

1. ``Ready(Empty)`` (the server flushes its state for a new client),
2. ``SendPolicyInstructions(PolicySetup(data=pickle(RemotePolicyConfig)))``: the server loads
   the policy (type, checkpoint path or hub id on the server, device, actions per chunk),
3. per chunk: ``SendObservations(stream Observation)`` with ``pickle(TimedObservation)`` chunked
   by LeRobot's ``send_bytes_in_chunks``, then ``GetActions(Empty)`` -> ``Actions(data=pickle(list[TimedAction]))``.

The server requires pickles from us; we never ``pickle.loads`` its replies: they go through
``safe_unpickle.loads_actions`` (allow-list; anything else is refused, naming the type).

Every observation is sent with ``must_go=True``: we only send when our action queue wants a chunk,
and without it the server may silently skip an observation as "too similar" to the last one
(policy_server.py ``_obs_sanity_checks``) and ``GetActions`` would answer nothing.

A failed call (server down, dropped, restarted without the policy, empty reply) raises
``ServerUnavailable`` with the reason and a back-off; the next ``infer`` reconnects from step 1
(a restarted server has forgotten the policy). The control loop holds meanwhile: no chunk, the
queue's stale-target rule.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from calibration.conventions import FEATURE_NAMES, NUM_JOINTS
from daemon.config.settings import parse_host_port
from daemon.policy.checkpoint import CheckpointInfo
from daemon.policy.engine import InferenceTimings
from daemon.policy.safe_unpickle import UnsafePickleError, loads_actions

BACKENDS = ("local", "lerobot-server")
# policy_server/constants.py SUPPORTED_POLICIES in 0.6.1 (the server refuses others with ValueError)
SERVER_POLICY_TYPES = ("act", "smolvla", "diffusion", "tdmpc", "vqbet", "pi0", "pi05", "groot")
MAX_MESSAGE_BYTES = 4 * 1024 * 1024 * 8
BACKOFF_START_S = 0.25
BACKOFF_MAX_S = 4.0


class ServerUnavailable(RuntimeError):
    """The server cannot answer now; ``retry_after_s`` says when to try again."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EmptyReply(ServerUnavailable):
    """GetActions answered nothing: inference failed on the server, or it lost the policy."""


@dataclass
class ServerSpec:
    """[policy] keys of the lerobot-server backend, as plain data for the worker."""

    server: str  # HOST:PORT
    policy_type: str
    checkpoint: str  # path or hub repo id, as the SERVER sees it
    device: str = "cpu"
    actions_per_chunk: int = 50
    action_fps: float = 30.0
    cameras: dict[str, list[int]] = field(default_factory=dict)  # name -> [h, w] we send
    task: str = ""
    setup_timeout_s: float = 120.0  # SendPolicyInstructions: the server loads the checkpoint inside it
    call_timeout_s: float = 10.0  # SendObservations / GetActions
    # the state's and action's feature names, in order: one arm's ("shoulder_pan.pos" ..), or a
    # bimanual rig's as LeRobot's BiSOFollower names them ("left_shoulder_pan.pos" .. "right_gripper.pos")
    joint_names: list[str] = field(default_factory=lambda: list(FEATURE_NAMES))


def remote_info(spec: ServerSpec) -> CheckpointInfo:
    """What the daemon knows of a policy that lives on the server: what we send and ask for.

    The checkpoint is on the server (often not on this machine), so cameras are the configured
    ones and the chunk length is ``actions_per_chunk``; the server checks the rest when it loads."""
    return CheckpointInfo(
        path=Path(spec.checkpoint),
        policy_type=spec.policy_type,
        state_shape=(len(spec.joint_names),),
        cameras={n: (3, int(h), int(w)) for n, (h, w) in spec.cameras.items()},
        other_inputs={},
        action_shape=(len(spec.joint_names),),
        chunk_size=spec.actions_per_chunk,
        n_action_steps=spec.actions_per_chunk,
        n_obs_steps=1,
        device=spec.device,
    )


def validate(spec: ServerSpec) -> None:
    try:
        parse_host_port(spec.server)
    except ValueError as exc:
        raise ValueError(f"policy.server: {exc} (LeRobot's policy server)") from None
    if spec.policy_type not in SERVER_POLICY_TYPES:
        raise ValueError(
            f"policy.server_policy_type: {spec.policy_type!r}; LeRobot's server runs {', '.join(SERVER_POLICY_TYPES)}"
        )
    if not spec.checkpoint:
        raise ValueError("policy.path: the checkpoint (path or hub repo id on the server) is empty")
    if spec.actions_per_chunk < 1:
        raise ValueError(f"policy.actions_per_chunk: {spec.actions_per_chunk!r} must be >= 1")
    names = list(spec.joint_names)
    if not names or len(names) % NUM_JOINTS or len(set(names)) != len(names):
        raise ValueError(f"joint names {names!r}: {NUM_JOINTS} distinct names per arm")


class ServerEngine:
    """``infer(state, images) -> (actions, timings)`` like PolicyEngine, answered by the server.

    ``last_link`` holds the last call's split (seconds): ``send_s`` (SendObservations: pickling +
    upload + the server's unpickle/enqueue, our network-time figure), ``get_s`` (GetActions: the
    server's prepare + forward + postprocess + pickle, plus the reply's transfer), ``decode_s``.
    LeRobot's server sends no compute timing, so server compute alone is unknown (None)."""

    def __init__(self, spec: ServerSpec):
        validate(spec)
        import grpc
        from lerobot.async_inference.helpers import RemotePolicyConfig, TimedObservation
        from lerobot.transport import services_pb2, services_pb2_grpc
        from lerobot.transport.utils import send_bytes_in_chunks
        from lerobot.utils.feature_utils import hw_to_dataset_features

        self._grpc, self._pb2, self._pb2_grpc = grpc, services_pb2, services_pb2_grpc
        self._send_chunks = send_bytes_in_chunks
        self._TimedObservation = TimedObservation
        self.spec = spec
        self.camera_names = tuple(sorted(spec.cameras))
        # the robot's features as LeRobot's own client sends them (RobotClient: robot.observation_features
        # through hw_to_dataset_features): the server orders observation.state by these names
        self.joint_names = tuple(spec.joint_names)
        hw: dict[str, Any] = dict.fromkeys(self.joint_names, float)
        hw.update({n: (int(h), int(w), 3) for n, (h, w) in spec.cameras.items()})
        self._features = hw_to_dataset_features(hw, "observation", use_video=False)
        self._policy_config = RemotePolicyConfig(
            policy_type=spec.policy_type,
            pretrained_name_or_path=spec.checkpoint,
            lerobot_features=self._features,
            actions_per_chunk=spec.actions_per_chunk,
            device=spec.device,
        )
        self._channel: Any = None
        self._stub: Any = None
        self.connected = False
        self.connects = 0
        self.failures = 0
        self._backoff_s = BACKOFF_START_S
        self._next_try_s = 0.0
        self._timestep = 0
        self.last_error: str | None = None
        self.last_link: dict[str, float | None] = {}
        self.max_actions: int | None = None

    # -- connection ---------------------------------------------------------------------------
    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
        self.connected = False

    def connect(self) -> None:
        """Ready + SendPolicyInstructions on a fresh channel (ServerUnavailable on failure)."""
        self._close_channel()
        grpc = self._grpc
        # A fresh channel per attempt, no gRPC-level retries: we do our own back-off, and a
        # channel stuck in gRPC's reconnect back-off would keep failing after the server is back.
        self._channel = grpc.insecure_channel(
            self.spec.server,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.enable_retries", 0),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._stub = self._pb2_grpc.AsyncInferenceStub(self._channel)
        try:
            self._stub.Ready(self._pb2.Empty(), timeout=self.spec.call_timeout_s)
            setup = self._pb2.PolicySetup(data=pickle.dumps(self._policy_config))
            self._stub.SendPolicyInstructions(setup, timeout=self.spec.setup_timeout_s)
        except grpc.RpcError as exc:
            self._fail(f"cannot set the policy up on {self.spec.server}: {_rpc_reason(exc)}")
        self.connected = True
        self.connects += 1
        self._backoff_s = BACKOFF_START_S
        self.last_error = None

    def _fail(self, why: str, kind: type[ServerUnavailable] = ServerUnavailable) -> NoReturn:
        self._close_channel()
        self.failures += 1
        self.last_error = why
        wait = self._backoff_s
        self._backoff_s = min(BACKOFF_MAX_S, self._backoff_s * 2)
        self._next_try_s = time.monotonic() + wait
        raise kind(why, wait)

    def close(self) -> None:
        self._close_channel()

    def reset(self) -> None:
        """Episode start. The server keeps no per-episode history we can clear except through
        Ready (which also forgets the policy), so a reconnect happens on the next request."""
        self._close_channel()

    # -- inference ----------------------------------------------------------------------------
    def infer(self, state: np.ndarray, images: dict[str, np.ndarray]) -> tuple[np.ndarray, InferenceTimings]:
        now = time.monotonic()
        if not self.connected:
            if now < self._next_try_s:
                raise ServerUnavailable(self.last_error or "policy server unavailable", self._next_try_s - now)
            self.connect()
        grpc = self._grpc
        state = np.asarray(state, dtype=np.float32)
        width = len(self.joint_names)
        if state.shape != (width,) or not np.all(np.isfinite(state)):
            raise ValueError(f"state {state.shape} is not {width} finite joint positions")
        raw: dict[str, Any] = {name: float(v) for name, v in zip(self.joint_names, state)}
        for n in self.camera_names:
            raw[n] = images[n]
        raw["task"] = self.spec.task
        self._timestep += 1
        step = self._timestep
        obs = self._TimedObservation(timestamp=time.time(), timestep=step, observation=raw, must_go=True)
        t0 = time.perf_counter()
        try:
            data = pickle.dumps(obs)
            self._stub.SendObservations(
                self._send_chunks(data, self._pb2.Observation), timeout=self.spec.call_timeout_s
            )
            t1 = time.perf_counter()
            reply = self._stub.GetActions(self._pb2.Empty(), timeout=self.spec.call_timeout_s)
            t2 = time.perf_counter()
        except grpc.RpcError as exc:
            self._fail(f"policy server {self.spec.server}: {_rpc_reason(exc)}")
        if not reply.data:
            # policy_server.py answers Empty when inference failed (or the policy is not set up,
            # e.g. the server restarted): set it up again on the next request
            self._fail(
                f"policy server {self.spec.server} answered no actions (it logs why; "
                "a restarted server has lost the policy: setting it up again)",
                EmptyReply,
            )
        try:
            chunk = loads_actions(reply.data)
        except UnsafePickleError as exc:
            self._close_channel()  # a server that sends this is not trusted again without a reconnect
            raise UnsafePickleError(f"policy server {self.spec.server}: {exc}") from None
        actions = self._to_array(chunk, step)
        t3 = time.perf_counter()
        self.last_link = {
            "send_s": t1 - t0,
            "get_s": t2 - t1,
            "decode_s": t3 - t2,
            "round_trip_s": t3 - t0,
            "server_compute_s": None,
        }
        if self.max_actions is not None:
            actions = actions[: self.max_actions]
        # preprocess = the upload, forward = GetActions (server work + reply), postprocess = decode
        return actions, InferenceTimings(t1 - t0, t2 - t1, t3 - t2)

    def _to_array(self, chunk: Any, step: int) -> np.ndarray:
        from lerobot.async_inference.helpers import TimedAction

        if not isinstance(chunk, list) or not chunk or not all(isinstance(a, TimedAction) for a in chunk):
            raise ValueError(f"policy server reply is {type(chunk).__name__}, not a non-empty list of TimedAction")
        steps = [int(a.timestep) for a in chunk]
        if steps != list(range(step, step + len(chunk))):
            raise ValueError(f"policy server answered timesteps {steps[0]}..{steps[-1]} for observation {step}")
        if len(chunk) > 1:
            dt = float(chunk[1].timestamp) - float(chunk[0].timestamp)
            want = 1.0 / self.spec.action_fps
            if abs(dt - want) > 1e-3:
                raise ValueError(
                    f"policy server spaces actions {dt * 1e3:.1f} ms apart but [policy] action_fps "
                    f"= {self.spec.action_fps:g} ({want * 1e3:.1f} ms): start it with --fps={self.spec.action_fps:g}"
                )
        rows = []
        for a in chunk:
            v = a.action
            v = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
            rows.append(np.asarray(v, dtype=np.float32).reshape(-1))
        out = np.stack(rows)
        width = len(self.joint_names)
        if out.shape[1] != width or not np.all(np.isfinite(out)):
            raise ValueError(f"policy server actions have shape {out.shape} or non-finite values; need (n, {width})")
        return np.ascontiguousarray(out)


def _rpc_reason(exc: Any) -> str:
    try:
        return f"{exc.code().name}: {exc.details()}"
    except Exception:
        return str(exc)
