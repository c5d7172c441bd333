"""Wires local inference into the running Daemon: socket verbs, mode ``policy``, status, stop.

``attach_policy(daemon)`` registers ``policy.load`` / ``policy.start`` / ``policy.stop`` /
``policy.unload`` / ``policy.status`` on the daemon-core's control server, adds ``policy`` to
``status`` and stops the worker on shutdown. The loop side is ``daemon.loop.policy_source``
(a PolicySource): in mode ``policy`` the loop asks it for the target instead of the leader and
the same safety layer (alignment, step limit, joint limits, stale hold) applies.

Camera frames come from the same Camera objects the recorder uses (pass ``cameras``; by default
the recorder's, when one is attached).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from daemon.api.server import RequestError
from daemon.config.settings import PolicyConfig, keys_given
from daemon.policy.action_queue import QueueConfig
from daemon.policy.checkpoint import CheckpointError, admit_checkpoint_path
from daemon.policy.lerobot_server import ServerSpec
from daemon.policy.runner import FrameSource, PolicyRunnerConfig, PolicySource
from daemon.policy.takeover import LeaderActuator, Takeover, TakeoverConfig
from daemon.service.attach_replay import SOURCE_NAME as REPLAY_SOURCE
from daemon.service.context import DaemonContext, EpisodeRecorder, HasContext, context_of
from drivers.cameras import VirtualArmCamera

log = logging.getLogger("so101d.policy")
_TAKEOVER = "the policy's take-over"  # its name in the leader's claim (daemon/policy/leader_drive.py)


class PolicyError(RuntimeError):
    """A policy verb cannot be done now (message is the socket's error reply)."""


def _request_error(msg: str) -> Exception:
    return RequestError(msg)


def queue_config_from(policy_cfg: Any) -> QueueConfig:
    """[policy] keys -> QueueConfig (errors name the key)."""
    try:
        if not policy_cfg.action_fps > 0:
            raise ValueError(f"policy.action_fps: {policy_cfg.action_fps!r} must be > 0")
        if policy_cfg.refill_below < 0:
            raise ValueError(f"policy.refill_below: {policy_cfg.refill_below!r} must be >= 0")
        if not policy_cfg.max_obs_age_s > 0:
            raise ValueError(f"policy.max_obs_age_s: {policy_cfg.max_obs_age_s!r} must be > 0")
        return QueueConfig(
            action_period_s=1.0 / float(policy_cfg.action_fps),
            merge=policy_cfg.merge,
            ensemble_coeff=float(policy_cfg.ensemble_coeff),
            max_obs_age_s=float(policy_cfg.max_obs_age_s),
            refill_below=int(policy_cfg.refill_below),
        )
    except ValueError as exc:
        raise PolicyError(str(exc)) from None


def server_spec_from(policy_cfg: PolicyConfig, path: str, cameras: Mapping[str, tuple[int, int]]) -> ServerSpec | None:
    """[policy] keys -> the lerobot-server backend's ServerSpec (None for the local backend)."""
    if policy_cfg.backend != "lerobot-server":
        return None
    if not policy_cfg.server:
        raise PolicyError('policy.backend = "lerobot-server" needs policy.server = "HOST:PORT"')
    return ServerSpec(
        server=policy_cfg.server,
        policy_type=policy_cfg.server_policy_type,
        checkpoint=path,
        device=policy_cfg.device or "cpu",
        actions_per_chunk=int(policy_cfg.actions_per_chunk),
        action_fps=float(policy_cfg.action_fps),
        cameras={n: [h, w] for n, (h, w) in cameras.items()},
        task=policy_cfg.task,
    )


class PolicyController:
    """Owns the PolicySource of a daemon and implements the policy verbs."""

    def __init__(
        self,
        daemon: DaemonContext,
        cameras: Mapping[str, FrameSource] | None = None,
        recorder: EpisodeRecorder | None = None,
    ):
        self.daemon = daemon
        self.cfg = daemon.cfg.policy
        self.cameras = dict(cameras or {})
        self.recorder = recorder
        self.source: PolicySource | None = None
        self.episode_open = False
        self._lock = threading.Lock()
        self.takeover_state: Takeover | None = None
        self._takeover_thread: threading.Thread | None = None

    # -- verbs -------------------------------------------------------------------------------
    def _camera_size(self, name: str, cfg: Any) -> tuple[int, int]:
        """(height, width) the policy will see: the configured size, except for a camera whose
        size the configuration left out (a sim camera takes the simulator's, announced at run
        time): then the live camera's, once known."""
        given = keys_given(cfg)
        live = self.cameras.get(name)
        if (
            given is not None
            and "width" not in given
            and "height" not in given
            and live is not None
            and live.width > 0
            and live.height > 0
        ):
            return (live.height, live.width)
        return (cfg.height, cfg.width)

    def load(self, path: str | None = None, wait_s: float = 0.0) -> dict[str, Any]:
        """Check the checkpoint (readable mismatch list), then start its worker process."""
        asked = bool(path) and path != self.cfg.path
        path = path or self.cfg.path
        if not path:
            raise PolicyError("no checkpoint given (so101d policy load DIR, or [policy] path)")
        if asked and self.cfg.backend == "local":  # (a server's path names a folder on the server)
            try:
                path = str(admit_checkpoint_path(path, self.cfg.allowed_dirs, os.geteuid()))
            except CheckpointError as exc:
                raise PolicyError(str(exc)) from None
        with self._lock:
            if self.source is not None and self.daemon.loop.intent == "policy":
                raise PolicyError("a policy is driving the arm; `so101d policy stop` first")
            configured = {n: self._camera_size(n, c) for n, c in self.daemon.cfg.cameras.items()}
            try:
                src = PolicySource(
                    PolicyRunnerConfig(
                        checkpoint=path,
                        cameras=configured,
                        queue=queue_config_from(self.cfg),
                        device=self.cfg.device or None,
                        task=self.cfg.task,
                        backend=self.cfg.backend,
                        torch_threads=self.cfg.torch_threads or None,
                        server=server_spec_from(self.cfg, path, configured),
                    ),
                    self.cameras,
                )
            except (CheckpointError, ValueError) as exc:
                raise PolicyError(str(exc)) from None
            old, self.source = self.source, src
            if old is not None:
                self.daemon.loop.policy_source = None
                old.stop()
            src.start()
            self.daemon.loop.policy_source = src
        if wait_s > 0:
            src.wait_ready(wait_s)
        where = f"on LeRobot's policy server {self.cfg.server}" if src.config.backend == "lerobot-server" else ""
        link = src.link if src.config.backend == "lerobot-server" else {}
        if link and not link.get("connected"):
            where += f" (not reachable now: {link.get('error')}; the follower holds and the daemon keeps retrying)"
        return {
            "message": f"loading {src.info.policy_type} policy from {src.info.path}" + (f" {where}" if where else ""),
            "state": src.state,
            "error": src.error,
            "cameras": list(src.info.camera_names),
        }

    def _require_ready(self) -> PolicySource:
        src = self.source
        if src is None:
            raise PolicyError("no policy loaded (so101d policy load DIR)")
        if src.state == "loading":
            raise PolicyError("policy still loading; try again in a moment (see so101d policy status)")
        if src.state != "ready":
            raise PolicyError(f"policy not usable: {src.error or src.state}")
        return src

    def start(self, record: bool | None = None, task: str | None = None) -> dict[str, Any]:
        replaying = [a.name for a in self.daemon.loop.arms if a.source_name == REPLAY_SOURCE]
        if replaying:
            # the replay keeps its arm (policy intent leaves an arm on a source of its own) and, when
            # it ends, holds: "policy driving the follower" would not be so
            raise PolicyError(f"a replay drives the {', '.join(replaying)} (replay.stop or hold first)")
        src = self._require_ready()
        if self.daemon.loop.intent == "policy":
            # a second start would clear the queue under the running policy (a hold) and say
            # "aligning first" about an arm that is already following it
            raise PolicyError("the policy is already driving the follower (so101d policy stop first)")
        src.reset()
        record = self.cfg.record if record is None else bool(record)
        episode = None
        if record and self.recorder is not None:
            episode = self._start_episode(task or self.cfg.task or "policy evaluation")
        try:
            self.daemon.loop.call(lambda: self.daemon.loop.set_intent("policy"), timeout_s=3.0)
        except Exception as exc:
            if episode is not None:
                self._end_episode(discard=True)
            raise PolicyError(f"cannot switch to policy mode: {exc}") from None
        mode = self._mode()
        return {"message": self._start_message(mode), "episode": episode, "mode": mode}

    def _start_message(self, mode: str | None) -> str:
        """What the arm does right after `policy start` (the first chunk may still be computing)."""
        if mode in ("aligning", "policy"):
            return "policy driving the follower (aligning first)"
        if mode == "hold":
            return "policy started: the follower holds until the first chunk, then aligns to it"
        reason = getattr(self.daemon.loop.state, "reason", "")
        return f"policy started, but the follower is {mode}" + (f" ({reason})" if reason else "")

    def stop(self, success: bool | None = None, discard: bool = False) -> dict[str, Any]:
        """Hold the follower where it is; close the evaluation episode (saved unless discard).

        Refused when no policy is driving: the arm keeps doing what it does (following the
        leader, holding), and an answer of "stopped: holding" would say otherwise.
        An evaluation episode left open (the operator switched to teleop by hand) is still closed."""
        loop = self.daemon.loop
        if loop.intent != "policy":
            if self.episode_open:
                saved = self._end_episode(discard=discard, success=success)
                return {
                    "message": f"no policy was driving (mode {self._mode()}); evaluation episode closed",
                    "episode": saved,
                    "mode": self._mode(),
                }
            raise PolicyError(
                f"no policy is driving; nothing to stop (mode {self._mode()}, "
                f"policy {self.source.state if self.source is not None else 'not loaded'})"
            )
        return self._hold(success, discard)

    def _hold(self, success: bool | None = None, discard: bool = False) -> dict[str, Any]:
        loop = self.daemon.loop
        if loop.intent == "policy":
            try:
                loop.call(lambda: loop.set_intent("hold"), timeout_s=3.0)
            except Exception as exc:
                raise PolicyError(f"cannot leave policy mode: {exc}") from None
        saved = self._end_episode(discard=discard, success=success) if self.episode_open else None
        mode = self._mode()
        # say what the arm does now (a fault or a lost follower is not "holding")
        message = "policy stopped: holding" if mode == "hold" else f"policy stopped; follower mode {mode}"
        return {"message": message, "episode": saved, "mode": mode}

    def _mode(self) -> str | None:
        loop = self.daemon.loop
        try:  # read at the start of the next cycle: the mode the change led to
            return loop.call(lambda: loop.state.mode, timeout_s=3.0)
        except Exception:
            return None

    def takeover(self, config: TakeoverConfig | None = None) -> dict[str, Any]:
        """Policy -> teleop without a jump: hold, bring the leader to the follower, release, teleop."""
        loop = self.daemon.loop
        leader = getattr(self.daemon, "leader", None)
        if leader is None:
            raise PolicyError("no leader arm: nothing to take over with")
        if self._takeover_thread is not None and self._takeover_thread.is_alive():
            state = self.takeover_state
            raise PolicyError(f"take-over already running ({state.phase if state is not None else '?'})")
        if loop.leader_link is not None and not loop.leader_link.connected:
            raise PolicyError("the leader is not connected")
        if loop.intent == "teleop":
            raise PolicyError("the follower already follows the leader (teleop); nothing to take over")
        claim = self.daemon.leader_claim
        holder = claim.take(_TAKEOVER)  # one driver of the leader's motors at a time
        if holder is not None:
            raise PolicyError(f"the leader is driven by {holder} now: it must release it first")
        try:
            stopped = self._hold()  # also from a hold after `policy stop`: the leader still has to come over
        except BaseException:
            claim.give(_TAKEOVER)
            raise
        t = Takeover(LeaderActuator(leader), config or TakeoverConfig())
        self.takeover_state = t

        def run() -> None:
            try:
                while not t.finished:
                    pose = loop.measured
                    t.step(time.monotonic(), None if pose is None else np.array(pose, dtype=np.float64))
                    time.sleep(0.02)
            finally:
                claim.give(_TAKEOVER)
            if t.phase == "done":
                try:
                    loop.call(lambda: loop.set_intent("teleop"), timeout_s=3.0)
                except Exception as exc:
                    t.error = f"leader released, but teleop did not start: {exc}"

        self._takeover_thread = threading.Thread(target=run, name="so101d-takeover", daemon=True)
        self._takeover_thread.start()
        return {
            "message": "taking over: the leader moves to the follower's pose, then teleop resumes",
            "episode": stopped.get("episode"),
            "phase": t.phase,
        }

    def unload(self) -> dict[str, Any]:
        if self.source is None:
            raise PolicyError("no policy loaded; nothing to unload")
        was_driving = self.daemon.loop.intent == "policy"
        stopped = self._hold() if was_driving or self.episode_open else None
        with self._lock:
            src, self.source = self.source, None
            self.daemon.loop.policy_source = None
        if src is not None:
            src.stop()
        msg = f"policy stopped ({stopped['mode']}) and unloaded" if was_driving and stopped else "policy unloaded"
        return {"message": msg, "episode": None if stopped is None else stopped.get("episode")}

    def status(self) -> dict[str, Any]:
        src = self.source
        if src is None:
            return {"state": "none", "takeover": None}
        st = src.stats()
        st["driving"] = self.daemon.loop.intent == "policy"
        t = self.takeover_state
        st["takeover"] = None if t is None else {"phase": t.phase, "error": t.error, "max_error": t.max_error}
        st["episode_open"] = self.episode_open
        return st

    def close(self) -> None:
        src, self.source = self.source, None
        if src is not None:
            self.daemon.loop.policy_source = None
            src.stop()

    # -- evaluation episodes (recording helper's Recorder) ---------------------------------------
    def _start_episode(self, task: str) -> Any:
        rec = self.recorder
        assert rec is not None  # start() opens an evaluation episode only with a recorder
        try:
            out = rec.start_episode(task, origin="policy")
        except Exception as exc:
            raise PolicyError(f"cannot start the evaluation episode: {exc}") from None
        self.episode_open = True
        return out

    def _episode_notes(self) -> list[str]:
        """The evaluation episode's tag notes: which backend (and server) computed its actions."""
        src = self.source
        backend = self.cfg.backend
        where = f"policy backend {backend}"
        if backend == "lerobot-server":
            where += f", server {self.cfg.server}"
        if src is not None:
            where += f", {src.info.policy_type} {src.info.path}"
        return [where]

    def _end_episode(self, discard: bool = False, success: bool | None = None) -> Any:
        rec = self.recorder
        self.episode_open = False
        if rec is None:
            return None
        try:
            if discard:
                return rec.discard_episode()
            return rec.save_episode(success, notes=self._episode_notes())
        except Exception as exc:  # the episode may have been saved/discarded by hand
            return {"error": str(exc)}


def _verb(fn):
    def handler(req: dict[str, Any]) -> Any:
        try:
            return fn(req)
        except PolicyError as exc:
            raise _request_error(str(exc)) from None

    return handler


def _opt_bool(req: dict[str, Any], key: str) -> bool | None:
    v = req.get(key)
    if v is None or isinstance(v, bool):
        return v
    raise PolicyError(f'"{key}" must be true, false or null, got {v!r}')


def attach_policy(
    daemon: DaemonContext | HasContext,
    cameras: Mapping[str, FrameSource] | None = None,
    recorder: EpisodeRecorder | None = None,
) -> PolicyController:
    """Register the policy verbs and status on the daemon (its context); load [policy] path if enabled."""
    ctx = context_of(daemon)
    if recorder is None:
        recorder = ctx.recorder
    if cameras is None and recorder is not None:
        cameras = {c.name: c for c in recorder.cameras}
    if cameras is None and ctx.cfg.cameras:
        cameras = _own_cameras(ctx)
    ctl = PolicyController(ctx, cameras, recorder)
    reg = ctx.server.register
    reg("policy.load", _verb(lambda req: ctl.load(req.get("path"), float(req.get("wait_s") or 0.0))))
    reg("policy.start", _verb(lambda req: ctl.start(_opt_bool(req, "record"), req.get("task"))))
    reg("policy.stop", _verb(lambda req: ctl.stop(_opt_bool(req, "success"), bool(req.get("discard", False)))))
    reg("policy.takeover", _verb(lambda req: ctl.takeover()))
    reg("policy.unload", _verb(lambda req: ctl.unload()))
    reg("policy.status", _verb(lambda req: ctl.status()))
    ctx.status_extras["policy"] = ctl.status
    ctx.on_stop.append(ctl.close)
    ctx.policy = ctl
    if ctx.cfg.policy.enabled and ctx.cfg.policy.path:
        try:
            ctl.load()
        except PolicyError as exc:
            log.error("policy: %s", exc)
    return ctl


class _CameraFeed:
    """CycleHook: virtual cameras draw the follower's measured pose (the recorder does this when it runs)."""

    def __init__(self, cams: list[Any]):
        self.cams = [c for c in cams if isinstance(c, VirtualArmCamera)]

    def on_cycle(self, now: float, state: Any, action: Any, raw: Any) -> None:
        for c in self.cams:
            c.set_state(state)


def _own_cameras(daemon: DaemonContext) -> dict[str, FrameSource]:
    """No recorder: start the daemon's cameras (they stop with the daemon).

    Kind "sim" cameras come from the simulated follower and need the recorder's wiring; they are
    left out (a policy that needs them then gets a readable "no frame source" error at load).
    """
    cams = daemon.cameras.named(sorted(n for n, c in daemon.cfg.cameras.items() if c.kind != "sim"))
    for c in cams:
        c.start()
    if any(isinstance(c, VirtualArmCamera) for c in cams):
        daemon.loop.add_hook(_CameraFeed(cams))
    return {c.name: c for c in cams}
