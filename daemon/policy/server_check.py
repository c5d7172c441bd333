"""`so101d policy check --server HOST:PORT`: does a checkpoint that lives on LeRobot's policy
server work with this configuration?

The daemon's own handshake (lerobot_server.ServerEngine: Ready, then SendPolicyInstructions with
the policy type, the checkpoint path or hub id as the server sees it, the device and the actions
per chunk), then one observation built from the configured cameras (black frames of their
configured size) and a neutral joint state, exactly as the daemon sends it; the reply goes through
the restricted unpickler. The first observation is the server's warm-up (its first forward
pass allocates); ``repeats`` more are timed. The answer is what came back (the chunk's shape)
and how long each part took, or the reason it did not work:

- the server is down or unreachable (gRPC UNAVAILABLE),
- it cannot load the checkpoint (the server's own exception text, e.g. the path does not exist
  on the server),
- it loaded it but produced no actions for this observation (LeRobot's server answers an empty
  reply and logs why; usually the checkpoint expects other cameras, image sizes or state),
- the chunk has the wrong shape or spacing, or is not a plain action chunk (refused unpickle).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from daemon.policy.lerobot_server import EmptyReply, ServerEngine, ServerSpec, ServerUnavailable
from daemon.policy.safe_unpickle import UnsafePickleError


class ServerCheckError(RuntimeError):
    """The check failed; the message says what the operator should look at."""


@dataclass
class ServerCheckResult:
    server: str
    setup_s: float  # Ready + SendPolicyInstructions (the server loads the checkpoint inside it)
    n_actions: int
    action_dim: int
    first_round_trip_s: float  # the warm-up observation: pickled -> chunk decoded
    round_trips_s: list[float]  # the timed observations after it
    send_s: float  # last timed one: SendObservations (upload + the server's unpickle/enqueue)
    get_s: float  # GetActions (the server's inference + the reply)
    decode_s: float  # our restricted unpickle and checks


def describe_observation(spec: ServerSpec) -> str:
    cams = ", ".join(f"{n} {w}x{h}" for n, (h, w) in sorted(spec.cameras.items())) or "no cameras"
    return f"{len(spec.joint_names)} joint positions, {cams}"


def check_server_policy(spec: ServerSpec, repeats: int = 0) -> ServerCheckResult:
    """Set the policy up on the server, run one observation through it, then ``repeats`` timed
    ones (ServerCheckError naming what failed)."""
    try:
        engine = ServerEngine(spec)
    except ValueError as exc:
        raise ServerCheckError(str(exc)) from None
    try:
        t0 = time.perf_counter()
        try:
            engine.connect()
        except ServerUnavailable as exc:
            raise ServerCheckError(str(exc)) from None
        setup_s = time.perf_counter() - t0
        state = np.zeros(len(spec.joint_names), dtype=np.float64)
        images = {n: np.zeros((int(h), int(w), 3), dtype=np.uint8) for n, (h, w) in spec.cameras.items()}
        round_trips: list[float] = []
        try:
            for _ in range(1 + max(0, repeats)):
                actions, _timings = engine.infer(state, images)
                round_trips.append(float(engine.last_link.get("round_trip_s") or 0.0))
        except EmptyReply:
            raise ServerCheckError(
                f"policy server {spec.server} set up {spec.policy_type} from {spec.checkpoint} but answered no "
                f"actions for the observation ({describe_observation(spec)}); its log says why: usually the "
                "checkpoint expects other cameras, image sizes or state than this configuration sends"
            ) from None
        except ServerUnavailable as exc:
            raise ServerCheckError(str(exc)) from None
        except (UnsafePickleError, ValueError) as exc:
            raise ServerCheckError(f"policy server {spec.server}: {exc}") from None
        link = engine.last_link
        return ServerCheckResult(
            server=spec.server,
            setup_s=setup_s,
            n_actions=int(actions.shape[0]),
            action_dim=int(actions.shape[1]),
            first_round_trip_s=round_trips[0],
            round_trips_s=round_trips[1:],
            send_s=float(link.get("send_s") or 0.0),
            get_s=float(link.get("get_s") or 0.0),
            decode_s=float(link.get("decode_s") or 0.0),
        )
    finally:
        engine.close()
