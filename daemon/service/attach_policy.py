"""Wires local inference into the running Daemon: socket verbs, mode ``policy``, status, stop.

``attach_policy(daemon)`` registers ``policy.load`` / ``policy.start`` / ``policy.stop`` /
``policy.takeover`` / ``policy.correct`` / ``policy.resume`` / ``policy.unload`` /
``policy.status`` on the daemon-core's control server, adds ``policy`` to ``status`` and stops
the worker on shutdown. The loop side is ``daemon.loop.policy_source``
(a PolicySource): in mode ``policy`` the loop asks it for the target instead of the leader and
the same safety layer (alignment, step limit, joint limits, stale hold) applies.

Camera frames come from the same Camera objects the recorder uses (pass ``cameras``; by default
the recorder's, when one is attached).

Corrections (DAgger, as LeRobot 0.6.1's ``lerobot-rollout --strategy.type=dagger`` records it:
lerobot/rollout/strategies/dagger.py): ``policy correct`` pauses the policy (the arm holds, still
the policy's: ``ControlLoop.set_intent("hold", keep_sources=True)``), brings the leader to the
follower's pose (takeover.py, as DAgger's ``teleop_smooth_move_to`` on AUTONOMOUS -> PAUSED) and
lets it go: the leader drives, and the cycle record names it, so those frames are the dataset's
``intervention`` frames (daemon/data/interventions.py). ``policy resume`` hands the arm back in
the same episode: the policy's queue and every request made before are dropped
(``PolicySource.reset``), its next chunk is computed from the pose measured then, and the safety
layer aligns to it (a change of source always re-aligns). With ``[policy] corrections =
"episodes"`` (DAgger's default ``record_autonomous = false``) the policy's own driving is not
recorded; each correction is an episode of its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from daemon.api.server import RequestError
from daemon.config.settings import PolicyConfig, keys_given
from daemon.data.recorder import Rotation
from daemon.data.schema import arm_joint_names
from daemon.policy.action_queue import QueueConfig
from daemon.policy.arm_split import ArmSplit
from daemon.policy.checkpoint import CheckpointError, admit_checkpoint_path
from daemon.policy.leader_drive import DrivableLeader
from daemon.policy.lerobot_server import ServerSpec
from daemon.policy.runner import FrameSource, PolicyRunnerConfig, PolicySource
from daemon.policy.takeover import LeaderActuator, Takeover, TakeoverConfig, TakeoverLeader, TakeoverSet
from daemon.service.attach_recording import SimEpisodes, rotation_from_request
from daemon.service.attach_replay import SOURCE_NAME as REPLAY_SOURCE
from daemon.service.context import DaemonContext, EpisodeRecorder, HasContext, context_of
from drivers.cameras import VirtualArmCamera

log = logging.getLogger("so101d.policy")
_TAKEOVER = "the policy's take-over"  # its name in the leader's claim (daemon/policy/leader_drive.py)


class PolicyError(RuntimeError):
    """A policy verb cannot be done now (message is the socket's error reply)."""


@dataclass
class Correction:
    """One operator correction inside a policy run (``policy correct`` ... ``policy resume``).

    phase: ``taking_over`` (the arm holds, the leader is moved to it), ``operator`` (the leader
    drives), ``failed`` (the take-over failed: the arm holds; resume or stop)."""

    number: int  # 1 for the run's first
    takeover: Takeover
    phase: str = "taking_over"
    error: str = ""
    operator_since_s: float | None = None  # monotonic; when the leader began to drive


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


def server_spec_from(
    policy_cfg: PolicyConfig, path: str, cameras: Mapping[str, tuple[int, int]], arms: tuple[str, ...] = ()
) -> ServerSpec | None:
    """[policy] keys -> the lerobot-server backend's ServerSpec (None for the local backend);
    ``arms``: a bimanual rig's, whose joints the server gets named as LeRobot's BiSOFollower names them."""
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
        joint_names=arm_joint_names(arms if len(arms) > 1 else ()),
    )


class PolicyController:
    """Owns the PolicySource of a daemon and implements the policy verbs."""

    @property
    def correcting(self) -> bool:
        return self.correction is not None

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
        self.takeover_state: Takeover | TakeoverSet | None = None
        self._takeover_thread: threading.Thread | None = None
        # the correction in progress (None: the policy drives, or no run); its transitions under
        # _corr_lock (the take-over's thread hands the arm to the leader, the verbs end it)
        self.correction: Correction | None = None
        self._corr_lock = threading.Lock()
        self.corrections = 0  # corrections of this run (`policy start` to `stop`)
        self.correction_s = 0.0  # the operator's time in them, seconds
        self._task = ""

    @property
    def arms(self) -> tuple[str, ...]:
        """The arms one policy drives together, in its vector's order (a bimanual rig's left and
        right, LeRobot's order); () for one arm."""
        arms = self.daemon.loop.arms
        return tuple(a.name for a in arms) if len(arms) > 1 else ()

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
            if self.correction is not None:
                raise PolicyError("a correction of the running policy is in progress; `so101d policy stop` first")
            configured = {n: self._camera_size(n, c) for n, c in self.daemon.cfg.cameras.items()}
            arms = self.arms
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
                        server=server_spec_from(self.cfg, path, configured, arms),
                        arms=arms,
                    ),
                    self.cameras,
                )
            except (CheckpointError, ValueError) as exc:
                raise PolicyError(str(exc)) from None
            old, self.source = self.source, src
            loop = self.daemon.loop
            if old is not None:
                loop.policy_source = None
                old.stop()
            src.start()
            # two arms: one observation of both, one action split between them (arm_split.py)
            loop.policy_source = ArmSplit(src, loop.arms) if arms else src
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

    def start(
        self, record: bool | None = None, task: str | None = None, rotation: Rotation | None = None
    ) -> dict[str, Any]:
        """``rotation``: the evaluation recording is continuous (LeRobot's sentry strategy): the
        recorder saves an episode and starts the next at each limit, the policy running on (its
        state is not reset between the parts); ``policy stop`` saves the last, partial one."""
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
        if self.correction is not None:
            raise PolicyError("a correction of the running policy is in progress (so101d policy resume, or stop)")
        loop = self.daemon.loop
        src.reset()
        self.corrections, self.correction_s = 0, 0.0
        record = self.cfg.record if record is None else bool(record)
        if rotation is not None and (not record or self.recorder is None or self.cfg.corrections == "episodes"):
            raise PolicyError(
                "continuous: the policy's driving is not recorded here (no recorder, record = false, or "
                '[policy] corrections = "episodes")'
            )
        self._task = task or self.cfg.task or "policy evaluation"
        before = loop.intent
        # The arm is the (paused: holding) policy's before the episode starts, so its first frame
        # is already the policy's: one recorded while the leader still drove would read as the
        # operator's (``intervention``). It drives once the episode has started (a sim's reset
        # done).
        src.paused = True
        try:
            loop.call(lambda: loop.set_intent("policy"), timeout_s=3.0)
        except Exception as exc:
            src.paused = False
            raise PolicyError(f"cannot switch to policy mode: {exc}") from None
        episode = None
        try:
            # corrections-only: the policy's own driving is not recorded (each correction is an episode)
            if record and self.recorder is not None and self.cfg.corrections != "episodes":
                episode = self._start_episode(self._task, rotation)
        except PolicyError:
            try:  # not started: the arm goes back to what it did
                loop.call(lambda: loop.set_intent(before), timeout_s=3.0)
            except Exception as exc:
                log.error("policy start: the episode did not start, and mode %s not restored: %s", before, exc)
            raise
        finally:
            src.paused = False
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
        if self.correction is not None:  # the run ends in its correction: hold where the arm is
            self._end_correction()
            return self._hold(success, discard, from_any=True)
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

    def _hold(self, success: bool | None = None, discard: bool = False, from_any: bool = False) -> dict[str, Any]:
        """Close the episode, then hold (``from_any``: whatever the intent, a correction's teleop).
        The episode first: a hold's frames name the leader's source (set_intent), and would
        read as the operator's (``intervention``) at the end of every episode."""
        loop = self.daemon.loop
        saved = self._end_episode(discard=discard, success=success) if self.episode_open else None
        if loop.intent == "policy" or from_any:
            try:
                loop.call(lambda: loop.set_intent("hold"), timeout_s=3.0)
            except Exception as exc:
                raise PolicyError(f"cannot leave policy mode: {exc}") from None
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

    def _leaders_to_bring(self) -> list[tuple[str, TakeoverLeader]]:
        """Each driven arm's name and the leader that teleoperates it (a bimanual rig: both pairs),
        every one connected; PolicyError naming the first that is missing or not connected."""
        loop = self.daemon.loop
        if len(loop.arms) == 1:
            leader = self.daemon.leader
            if leader is None:
                raise PolicyError("no leader arm: nothing to take over with")
            if loop.leader_link is not None and not loop.leader_link.connected:
                raise PolicyError("the leader is not connected")
            if not isinstance(leader, DrivableLeader):
                raise PolicyError("the leader's motors cannot be driven (a simulated leader): no take-over")
            return [(loop.primary.name, leader)]
        pairs: list[tuple[str, TakeoverLeader]] = []
        for arm in loop.arms:
            src = loop.leaders.get(arm.teleop_source)
            if src is None:
                raise PolicyError(f"the {arm.name} arm has no leader: nothing to take over with")
            if not src.link.connected:
                raise PolicyError(f"the {arm.teleop_source} is not connected")
            if not isinstance(src.link.arm, DrivableLeader):
                raise PolicyError(f"the {arm.teleop_source}'s motors cannot be driven: no take-over")
            pairs.append((arm.name, src.link.arm))
        return pairs

    def takeover(self, config: TakeoverConfig | None = None) -> dict[str, Any]:
        """Policy -> teleop without a jump: hold, bring the leader to the follower, release, teleop
        (a bimanual rig: each leader to its own follower, teleop once both are over)."""
        loop = self.daemon.loop
        if self._takeover_thread is not None and self._takeover_thread.is_alive():
            state = self.takeover_state
            raise PolicyError(f"take-over already running ({state.phase if state is not None else '?'})")
        pairs = self._leaders_to_bring()
        if self.correction is not None:
            raise PolicyError(
                "a correction is in progress: the leader is the operator's (so101d policy resume, or stop)"
            )
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
        cfg = config or TakeoverConfig()
        t: Takeover | TakeoverSet
        if len(pairs) == 1:
            t = single = Takeover(LeaderActuator(pairs[0][1]), cfg)

            def step(now: float) -> None:
                pose = loop.measured
                single.step(now, None if pose is None else np.array(pose, dtype=np.float64))
        else:
            t = both = TakeoverSet({name: Takeover(LeaderActuator(leader), cfg) for name, leader in pairs})

            def step(now: float) -> None:
                both.step(now, {a.name: None if a.measured is None else np.array(a.measured) for a in loop.arms})

        self.takeover_state = t

        def run() -> None:
            try:
                while not t.finished:
                    step(time.monotonic())
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

    # -- corrections (DAgger) -----------------------------------------------------------------------
    def correct(self, config: TakeoverConfig | None = None) -> dict[str, Any]:
        """The operator takes the arm inside the running policy episode: the policy pauses (the arm
        holds), the leader is brought to the follower's pose and let go, then the leader drives."""
        loop = self.daemon.loop
        src = self.source
        if src is None:
            raise PolicyError("no policy loaded: nothing to correct (so101d policy load DIR, then policy start)")
        corr = self.correction
        if corr is not None:
            raise PolicyError(
                f"already correcting (correction {corr.number}: {corr.phase}); so101d policy resume hands the arm back"
            )
        if loop.intent != "policy":
            raise PolicyError(
                f"no policy is running: nothing to correct (mode {self._mode()}; so101d policy start first)"
            )
        if len(loop.arms) > 1:
            raise PolicyError(f"corrections take one arm; this daemon drives {len(loop.arms)} (not supported yet)")
        if (
            self.cfg.corrections == "episodes"
            and self.recorder is not None
            and isinstance(self.daemon.follower, SimEpisodes)
        ):
            # each correction's episode would start the simulator's own episode: a scene reset mid-run
            raise PolicyError(
                'corrections as episodes of their own would reset the simulated scene at each one; use [policy] corrections = "in_episode"'
            )
        leader = self.daemon.leader
        if leader is None:
            raise PolicyError("no leader arm: nothing to correct with")
        if not isinstance(leader, DrivableLeader):  # the take-over drives its motors
            raise PolicyError("the leader's motors cannot be driven (a simulated leader): no take-over to correct with")
        if loop.leader_link is not None and not loop.leader_link.connected:
            raise PolicyError("the leader is not connected")
        claim = self.daemon.leader_claim
        holder = claim.take(_TAKEOVER)
        if holder is not None:
            raise PolicyError(f"the leader is driven by {holder} now: it must release it first")

        def pause() -> None:  # loop thread, one cycle boundary: no request, the arm holds, still the policy's
            src.paused = True
            loop.set_intent("hold", keep_sources=True)

        try:
            loop.call(pause, timeout_s=3.0)
        except Exception as exc:
            claim.give(_TAKEOVER)
            src.paused = False
            raise PolicyError(f"cannot pause the policy: {exc}") from None
        t = Takeover(LeaderActuator(leader), config or TakeoverConfig())
        self.takeover_state = t
        self.corrections += 1
        corr = Correction(number=self.corrections, takeover=t)
        with self._corr_lock:
            self.correction = corr
        thread = threading.Thread(target=self._run_correction, args=(corr,), name="so101d-correction", daemon=True)
        self._takeover_thread = thread
        thread.start()
        return {
            "message": f"correction {corr.number}: the arm holds while the leader moves to its pose, then the "
            "leader drives (so101d policy resume hands it back to the policy)",
            "phase": t.phase,
            "mode": self._mode(),
        }

    def _run_correction(self, corr: Correction) -> None:
        """The take-over, then the leader drives (its thread); a correction ended meanwhile
        (`policy stop`) releases the leader and changes nothing else."""
        loop = self.daemon.loop
        t = corr.takeover
        try:
            while not t.finished and self.correction is corr:
                pose = loop.measured
                t.step(time.monotonic(), None if pose is None else np.array(pose, dtype=np.float64))
                time.sleep(0.02)
            if not t.finished:  # ended mid-way: the leader's torque off, for the hand
                try:
                    t.leader.set_torque(False)
                except Exception as exc:
                    log.error("correction %d: releasing the leader failed: %s", corr.number, exc)
        finally:
            self.daemon.leader_claim.give(_TAKEOVER)
        with self._corr_lock:
            if self.correction is not corr:
                return
            if t.phase != "done":
                corr.phase, corr.error = "failed", t.error or t.phase
                log.error("correction %d: the take-over failed (%s); the arm holds", corr.number, corr.error)
                return
            try:
                loop.call(lambda: loop.set_intent("teleop"), timeout_s=3.0)
            except Exception as exc:
                corr.phase, corr.error = "failed", f"leader released, but it does not drive: {exc}"
                return
            corr.phase = "operator"
            corr.operator_since_s = time.monotonic()
            log.info("correction %d: the operator drives", corr.number)
            if self.cfg.corrections == "episodes" and self.recorder is not None and not self.episode_open:
                try:  # its own episode, from the first frame the leader drives (all interventions)
                    self._start_episode(self._task)
                except PolicyError as exc:
                    corr.error = str(exc)
                    log.error("correction %d: not recorded: %s", corr.number, exc)

    def _end_correction(self) -> Correction | None:
        """The correction is over (resume, stop, unload): its time counted, the policy unpaused,
        a take-over still running stopped (its thread releases the leader)."""
        with self._corr_lock:
            corr, self.correction = self.correction, None
        if corr is None:
            return None
        if corr.operator_since_s is not None:
            self.correction_s += time.monotonic() - corr.operator_since_s
        if self.source is not None:
            self.source.paused = False
        th = self._takeover_thread
        if th is not None and th is not threading.current_thread():
            th.join(3.0)
        return corr

    def resume(self) -> dict[str, Any]:
        """Back to the policy in the same episode: nothing queued before the correction is played;
        its first chunk is computed from the measured pose, and the arm aligns to it."""
        loop = self.daemon.loop
        src = self.source
        if src is None:
            raise PolicyError("no policy loaded: nothing to resume (so101d policy load DIR)")
        corr = self.correction
        if corr is None:
            raise PolicyError("not in a correction: nothing to resume (so101d policy correct takes the arm first)")
        if corr.phase == "taking_over":
            raise PolicyError(
                f"correction {corr.number}: the leader is still being brought to the arm "
                f"({corr.takeover.phase}); resume once it drives (so101d policy status)"
            )
        if src.state != "ready":
            raise PolicyError(f"policy not usable: {src.error or src.state} (so101d policy stop)")
        saved = None
        if self.cfg.corrections == "episodes" and self.episode_open:  # the correction's own episode
            saved = self._end_episode(notes=[f"correction {corr.number} of a policy run ([policy] corrections)"])

        def back() -> None:  # loop thread: forget the old queue and requests, then the policy drives
            src.reset()
            src.paused = False
            loop.set_intent("policy")

        try:
            loop.call(back, timeout_s=3.0)
        except Exception as exc:
            raise PolicyError(f"cannot hand the arm back to the policy: {exc}") from None
        self._end_correction()
        return {
            "message": f"correction {corr.number} over: the policy aligns from the measured pose, then drives",
            "mode": self._mode(),
            "episode": saved,
        }

    def unload(self) -> dict[str, Any]:
        if self.source is None:
            raise PolicyError("no policy loaded; nothing to unload")
        correcting = self._end_correction() is not None  # the run ends in its correction: hold there
        was_driving = self.daemon.loop.intent == "policy" or correcting
        stopped = self._hold(from_any=correcting) if was_driving or self.episode_open else None
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
        st["arms"] = list(self.arms) or [self.daemon.loop.primary.name]
        st["joints"] = src.width
        t = self.takeover_state
        st["takeover"] = None if t is None else {"phase": t.phase, "error": t.error, "max_error": t.max_error}
        st["episode_open"] = self.episode_open
        corr = self.correction
        st["correction"] = (
            None
            if corr is None
            else {
                "number": corr.number,
                "phase": corr.phase,
                "error": corr.error or None,
                "operator_s": None if corr.operator_since_s is None else time.monotonic() - corr.operator_since_s,
            }
        )
        st["corrections"] = self.corrections
        st["corrections_mode"] = self.cfg.corrections
        return st

    def close(self) -> None:
        src, self.source = self.source, None
        if src is not None:
            self.daemon.loop.policy_source = None
            src.stop()

    # -- evaluation episodes (recording helper's Recorder) ---------------------------------------
    def _start_episode(self, task: str, rotation: Rotation | None = None) -> Any:
        rec = self.recorder
        assert rec is not None  # start() opens an evaluation episode only with a recorder
        try:
            out = rec.start_episode(task, origin="policy", rotation=rotation)
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

    def _end_episode(self, discard: bool = False, success: bool | None = None, notes: list[str] | None = None) -> Any:
        rec = self.recorder
        self.episode_open = False
        if rec is None:
            return None
        try:
            if discard:
                return rec.discard_episode()
            return rec.save_episode(success, notes=self._episode_notes() + list(notes or []))
        except Exception as exc:  # the episode may have been saved/discarded by hand
            return {"error": str(exc)}


def _verb(fn):
    def handler(req: dict[str, Any]) -> Any:
        try:
            return fn(req)
        except PolicyError as exc:
            raise _request_error(str(exc)) from None

    return handler


def _rotation(ctx: DaemonContext, req: dict[str, Any]) -> Rotation | None:
    """policy.start's continuous recording fields, as episode.start reads them (a RequestError
    naming the field goes to the client as it is)."""
    return rotation_from_request(req, ctx.cfg.recording)


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
    reg("policy.start", _verb(lambda req: ctl.start(_opt_bool(req, "record"), req.get("task"), _rotation(ctx, req))))
    reg("policy.stop", _verb(lambda req: ctl.stop(_opt_bool(req, "success"), bool(req.get("discard", False)))))
    reg("policy.takeover", _verb(lambda req: ctl.takeover()))
    reg("policy.correct", _verb(lambda req: ctl.correct()))
    reg("policy.resume", _verb(lambda req: ctl.resume()))
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
