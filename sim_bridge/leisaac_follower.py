"""The LeIsaac follower: a LeIsaac SO-101 task (Isaac Lab) served over ``drivers.sim_protocol``.

Run it on a GPU workstation inside a LeIsaac 0.4 **source** install (Isaac Sim 5.1, Isaac Lab 2.3,
Python 3.11) with this repository on PYTHONPATH (it needs only numpy, pyzmq and msgpack from us):

    python -m sim_bridge.leisaac_follower --task LeIsaac-SO101-PickOrange-v0 \\
        --bind tcp://127.0.0.1:5555 --enable_cameras --device cuda

The environment is created the way LeIsaac's own scripts do (AppLauncher first, then
``parse_env_cfg`` + ``env_cfg.use_teleop_device("so101leader")`` for absolute joint-position
actions in the order pan, lift, elbow, wrist_flex, wrist_roll, gripper, then ``gym.make``). Our
LeRobot-unit targets become LeIsaac joint radians with ``conventions.units_to_sim_rad`` (LeIsaac's
own limit table); ``obs["policy"]["joint_pos"]`` goes back with ``sim_rad_to_units``; the
``front`` and ``wrist`` camera terms are published as frames.

The task is configured as LeIsaac's ``teleop_se3_agent.py`` does (``prepare_env_cfg``): no
termination term resets a manager-based scene, and a Direct task gets ``never_time_out`` and
``manual_terminate``; success is evaluated by us after every step (the success term, or a Direct
task's ``_check_success``). Should a task still reset itself inside ``step``, the ``terminated``
flag it returns (computed before that reset) is the success. After any scene reset the arm holds
the reset pose and re-aligns to the daemon's target at ``realign_speed_deg_s`` (never a jump).
With ``--seed_hdf5 FILE`` every daemon episode is also written as a Mimic seed demo
(``sim_bridge.seed_recorder``).

Everything except ``main()`` is plain Python over a gym-style env (``reset(seed=)`` and
``step(action)`` returning ``obs, reward, terminated, truncated, info``), tested with fakes built
from Isaac Lab's and LeIsaac's step/reset source (``tests/fixtures/leisaac_env.py``); Isaac
imports live only inside ``main()``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration.conventions import sim_rad_to_units, units_to_sim_rad
from drivers import sim_protocol as P
from sim_bridge.seed_recorder import to_numpy
from sim_bridge.server import ServerInbox, SimServerEndpoint

log = logging.getLogger("so101d.sim.leisaac")

DEFAULT_TASK = "LeIsaac-SO101-PickOrange-v0"


@dataclass
class LeisaacBridgeConfig:
    step_hz: float = 60.0  # LeIsaac steps at 1/60 s, decimation 1
    publish_hz: float = 30.0  # camera frames (LeIsaac's cameras update at 30 Hz); state goes every step
    cameras: tuple[str, ...] = ("front", "wrist")
    jpeg_quality: int | None = None  # JPEG frames across a network link (e.g. an SSH tunnel)
    daemon_staleness_s: float = 0.1
    # After any scene reset (the daemon's or one the env did inside step) the arm sits at the reset
    # pose while the daemon's target is wherever the leader is: move the target there at this speed
    # instead of letting the sim's PD drive jump (the daemon's own alignment does not see a reset).
    realign_speed_deg_s: float = 45.0
    realign_tolerance_deg: float = 1.0


def image_to_uint8(img: Any) -> np.ndarray:
    """The first env's camera image as HxWx3 uint8 RGB (Isaac Lab gives (N, H, W, C))."""
    a = to_numpy(img)
    if a.ndim == 4:
        a = a[0]
    a = a[..., :3]
    if a.dtype != np.uint8:
        a = np.clip(a * 255.0 if a.max() <= 1.0 else a, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(a)


class LeisaacBridge:
    """Steps a LeIsaac-style env and serves it to the daemon."""

    def __init__(
        self,
        env: Any,
        endpoint: SimServerEndpoint,
        *,
        config: LeisaacBridgeConfig | None = None,
        to_action: Callable[[np.ndarray], Any] = lambda rad: rad[None, :].astype(np.float32),
        success_fn: Callable[[], bool] | None = None,
        step_context: Callable[[], Any] = contextlib.nullcontext,
        pre_step: Callable[[], None] | None = None,
        seed_recorder: Any = None,
    ) -> None:
        self.env = env
        self.ep = endpoint
        self.cfg = config or LeisaacBridgeConfig()
        self.to_action = to_action
        self.success_fn = success_fn
        self.step_context = step_context
        self.pre_step = pre_step
        self.obs: Any = None
        self.target_rad: np.ndarray | None = None
        self.torque = True
        self.ack_seq = -1
        self.ack_sent_s = 0.0
        self.episode_seq = 0
        self.steps = 0
        self._frame_seq = 0
        self._next_frame_s = 0.0
        self._success_sent = False
        self._ended_sent = False
        self._daemon_was_stale = True
        self._stop = threading.Event()
        self.daemon_target_rad: np.ndarray | None = None  # the daemon's last target, sim radians
        self.realigning = False
        self.auto_resets = 0
        self.seed_recorder = seed_recorder  # sim_bridge.seed_recorder.SeedDemoRecorder (--seed_hdf5)
        self._last_seed: int | None = None

    # -- observation access ----------------------------------------------------------------------
    def _policy_obs(self) -> dict[str, Any]:
        obs = self.obs
        return obs["policy"] if isinstance(obs, dict) and "policy" in obs else obs

    def joint_rad(self) -> np.ndarray:
        q = to_numpy(self._policy_obs()["joint_pos"]).astype(np.float64)
        return q[0] if q.ndim == 2 else q

    def joint_units(self) -> np.ndarray:
        return sim_rad_to_units(self.joint_rad())

    # -- episode ---------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        self._end_seed_demo()
        self._last_seed = seed
        with self.step_context():
            self.obs, _ = self.env.reset(seed=seed) if seed is not None else self.env.reset()
        self._after_reset()
        self._success_sent = self._ended_sent = False

    def _after_reset(self) -> None:
        """Hold the reset pose, then re-align slowly to the daemon's target (never a jump)."""
        self.target_rad = self.joint_rad().copy()
        self.realigning = True

    def _apply(self, inbox: ServerInbox) -> None:
        if inbox.torque is not None:
            self.torque = inbox.torque
            if not self.torque:
                log.info("torque off: LeIsaac's action interface cannot go limp; holding the measured pose")
        if inbox.target_units is not None and inbox.target_seq != self.ack_seq:
            if self.torque:
                self.daemon_target_rad = units_to_sim_rad(inbox.target_units)
                if not self.realigning:
                    self.target_rad = self.daemon_target_rad
            self.ack_seq, self.ack_sent_s = inbox.target_seq, inbox.target_sent_s
        for cmd in inbox.episode_cmds:
            self.episode_seq = cmd["seq"]
            if cmd["cmd"] == "reset":
                self.reset(cmd.get("seed"))
                self._send_state()
                self.ep.send_event("reset_done", seq=self.episode_seq)
            elif cmd["cmd"] == "start":
                self._success_sent = self._ended_sent = False
                if self.seed_recorder is not None:
                    self.seed_recorder.begin(self.scene_state(), seed=self._last_seed)
                self.ep.send_event("started", seq=self.episode_seq)
            elif cmd["cmd"] == "stop":
                self._end_seed_demo()
                self.ep.send_event("stopped", seq=self.episode_seq)

    # -- seed demos (Isaac Lab's ActionStateRecorderManagerCfg terms) --------------------------
    def scene_state(self) -> Any:
        """``InteractiveScene.get_state(is_relative=True)``: every articulation and rigid object."""
        return self.env.scene.get_state(is_relative=True)

    def processed_actions(self, action: Any) -> Any:
        """``PostStepProcessedActionsRecorder``: the action terms' processed actions, concatenated
        (a Direct env has no action manager: its processed action is the action it applied)."""
        manager = getattr(self.env, "action_manager", None)
        if manager is None:
            return action
        parts = [to_numpy(manager.get_term(name).processed_actions) for name in manager.active_terms]
        return np.concatenate(parts, axis=-1)

    def _end_seed_demo(self) -> None:
        if self.seed_recorder is not None and self.seed_recorder.recording:
            self.seed_recorder.end(success=self._success_sent)

    def _send_state(self) -> None:
        self.ep.send_state(
            self.joint_units(),
            sim_time_s=self.steps / self.cfg.step_hz,
            torque=self.torque,
            ack_seq=self.ack_seq,
            ack_sent_s=self.ack_sent_s,
        )

    # -- one step --------------------------------------------------------------------------------
    def tick(self, poll_timeout_s: float = 0.0) -> None:
        self._apply(self.ep.poll(poll_timeout_s))
        now = time.monotonic()
        stale = self.ep.daemon_stale(now)
        if (stale and not self._daemon_was_stale) or not self.torque or self.target_rad is None:
            self.target_rad = self.joint_rad().copy()  # hold where it is
            if stale and not self._daemon_was_stale:
                log.warning("daemon silent: holding the current pose")
            self.daemon_target_rad = None  # a stale target must not be re-aligned to later
        self._daemon_was_stale = stale
        if self.realigning and self.torque and not stale:
            self._realign_step()
        if self.pre_step is not None:
            self.pre_step()
        recording = self.seed_recorder is not None and self.seed_recorder.recording
        obs_before = self._policy_obs() if recording else None  # PreStepFlatPolicyObservationsRecorder
        action = self.to_action(self.target_rad)
        with self.step_context():
            self.obs, _rew, terminated, truncated, _info = self.env.step(action)
        self.steps += 1
        terminated_now = bool(to_numpy(terminated).reshape(-1)[0])
        truncated_now = bool(to_numpy(truncated).reshape(-1)[0])
        if recording and not (terminated_now or truncated_now):
            self.seed_recorder.step(action, obs_before, self.scene_state(), self.processed_actions(action))
        if terminated_now or truncated_now:
            if recording:
                # Isaac Lab records this step's post-step state before its in-step reset; we only
                # see the reset scene now, so the demo ends with the step before (it replays truly).
                self.seed_recorder.end(success=self._success_sent or terminated_now)
            # Isaac Lab reset the scene inside step (a Direct task without manual_terminate, or a
            # manager-based task with a live termination term): ``terminated`` was computed
            # *before* that reset and is the success verdict; the scene we see now is the reset one.
            success = terminated_now
            self.auto_resets += 1
            self._after_reset()
            log.warning(
                "the env reset its scene inside step (%s): holding the reset pose, re-aligning slowly",
                "success" if terminated_now else "time out",
            )
        else:
            success = bool(self.success_fn()) if self.success_fn is not None else False
        self._send_state()
        if success and not self._success_sent:
            self._success_sent = True
            self.ep.send_event("success", "task success term", seq=self.episode_seq)
        if truncated_now and not self._ended_sent:
            self._ended_sent = True
            self.ep.send_event("terminated", "episode time out", seq=self.episode_seq)
        if now >= self._next_frame_s and self.ep.has_peer:
            self._next_frame_s = max(self._next_frame_s + 1.0 / self.cfg.publish_hz, now)
            pobs = self._policy_obs()
            for name in self.cfg.cameras:
                if name in pobs:
                    self.ep.send_frame(name, self._frame_seq, now, image_to_uint8(pobs[name]), self.cfg.jpeg_quality)
            self._frame_seq += 1

    def _realign_step(self) -> None:
        """Move the sim target toward the daemon's target by at most one step's worth of
        ``realign_speed_deg_s``; done (1:1 again) once every joint is within tolerance."""
        goal = self.daemon_target_rad
        if goal is None or self.target_rad is None:
            return  # no daemon target yet: keep holding
        lim = np.deg2rad(self.cfg.realign_speed_deg_s) / self.cfg.step_hz
        delta = goal - self.target_rad
        self.target_rad = self.target_rad + np.clip(delta, -lim, lim)
        if np.all(np.abs(goal - self.target_rad) <= np.deg2rad(self.cfg.realign_tolerance_deg)):
            self.target_rad = goal.copy()
            self.realigning = False

    def stop(self) -> None:
        self._stop.set()

    def run(self, is_running: Callable[[], bool] = lambda: True) -> None:
        """Step at ``step_hz`` (waiting for daemon messages between steps) until stopped."""
        period = 1.0 / self.cfg.step_hz
        if self.obs is None:
            self.reset()
        next_t = time.monotonic()
        while not self._stop.is_set() and is_running():
            self.tick(poll_timeout_s=max(0.0, next_t - time.monotonic()))
            next_t += period
            if time.monotonic() - next_t > 0.25:  # the GPU fell behind: do not try to catch up
                next_t = time.monotonic()


# ---------------------------------------------------------------------------------------------
# entry point (GPU workstation only)
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Serve a LeIsaac SO-101 task to the so101d daemon (sim follower).")
    p.add_argument("--task", default=DEFAULT_TASK, help="any single-arm SO-101 LeIsaac task (default %(default)s)")
    p.add_argument(
        "--bind",
        default="tcp://127.0.0.1:5555",
        help="endpoint to bind (loopback or ipc; reach it from another host through an SSH tunnel)",
    )
    p.add_argument("--step_hz", type=float, default=60.0)
    p.add_argument("--publish_hz", type=float, default=30.0, help="camera frame rate sent to the daemon")
    p.add_argument("--jpeg_quality", type=int, default=None)
    p.add_argument("--daemon_staleness_ms", type=float, default=100.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--realign_speed_deg_s",
        type=float,
        default=45.0,
        help="after a scene reset, move to the daemon's target at this speed (default %(default)s)",
    )
    p.add_argument(
        "--seed_hdf5",
        default=None,
        metavar="FILE",
        help="also write every daemon episode as an Isaac Lab Mimic seed demo to FILE "
        "(initial_state, states, obs incl. ee_frame_state, actions, processed_actions; appended)",
    )
    return p


def prepare_env_cfg(env_cfg: Any) -> Any:
    """Configure a task as LeIsaac's teleop script does (teleop_se3_agent.py), so nothing resets
    the scene inside ``step``; returns the success term to evaluate ourselves (manager-based).

    Manager-based: ``terminations.time_out`` and ``terminations.success`` set to None.
    Direct (``single_arm_env._get_dones``): ``never_time_out = True`` and ``manual_terminate =
    True`` -- without the latter ``_get_dones`` returns ``_check_success()`` as ``done`` and the
    env resets itself on success, inside step, before we could read the success.
    """
    success_term = None
    if hasattr(env_cfg, "terminations"):
        success_term = getattr(env_cfg.terminations, "success", None)
        for name in ("time_out", "success"):
            if hasattr(env_cfg.terminations, name):
                setattr(env_cfg.terminations, name, None)
    if hasattr(env_cfg, "never_time_out"):
        env_cfg.never_time_out = True
    if hasattr(env_cfg, "manual_terminate"):
        env_cfg.manual_terminate = True
        if hasattr(env_cfg, "return_success_status"):
            env_cfg.return_success_status = False  # done stays False: the daemon ends episodes
    return success_term


def success_fn_for(env: Any, success_term: Any) -> Callable[[], bool] | None:
    """Evaluate the task's success term ourselves (ManagerBased) or ``_check_success`` (Direct)."""
    if success_term is not None and getattr(success_term, "func", None) is not None:
        params = dict(getattr(success_term, "params", None) or {})
        return lambda: bool(to_numpy(success_term.func(env, **params)).reshape(-1)[0])
    if hasattr(env, "_check_success"):
        return lambda: bool(to_numpy(env._check_success()).reshape(-1)[0])
    return None


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs Isaac Sim and a GPU
    parser = build_parser()
    from isaaclab.app import AppLauncher

    AppLauncher.add_app_launcher_args(parser)
    args = parser.parse_args(argv)
    app_launcher = AppLauncher(vars(args))
    simulation_app = app_launcher.app

    import gymnasium as gym
    import leisaac  # noqa: F401  (registers the LeIsaac tasks)
    import torch
    from isaaclab_tasks.utils import parse_env_cfg

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    env_cfg = parse_env_cfg(args.task, device=args.device, num_envs=1)
    env_cfg.use_teleop_device("so101leader")  # absolute joint positions, pan..gripper
    env_cfg.seed = args.seed if args.seed is not None else int(time.time())
    env_cfg.recorders = None
    success_term = prepare_env_cfg(env_cfg)
    # Isaac Lab's ManagerBasedRLEnv (cfg, device, scene): typed Any, Isaac Lab is not installed here
    env: Any = gym.make(args.task, cfg=env_cfg).unwrapped

    pre_step = None
    if getattr(env.cfg, "dynamic_reset_gripper_effort_limit", False):
        from leisaac.utils.env_utils import dynamic_reset_gripper_effort_limit_sim

        pre_step = lambda: dynamic_reset_gripper_effort_limit_sim(env, "so101leader")  # noqa: E731

    ep = SimServerEndpoint(
        args.bind,
        backend=f"leisaac:{args.task}",
        cameras=[{"name": n, "width": 0, "height": 0, "fps": args.publish_hz} for n in ("front", "wrist")],
        rate_hz=args.step_hz,
        daemon_staleness_s=args.daemon_staleness_ms / 1000.0,
    )
    ep.open()
    seed_recorder = None
    if args.seed_hdf5:
        from sim_bridge.seed_recorder import SeedDemoRecorder

        seed_recorder = SeedDemoRecorder(args.seed_hdf5, env_name=args.task)
    bridge = LeisaacBridge(
        env,
        ep,
        config=LeisaacBridgeConfig(
            step_hz=args.step_hz,
            publish_hz=args.publish_hz,
            jpeg_quality=args.jpeg_quality,
            daemon_staleness_s=args.daemon_staleness_ms / 1000.0,
            realign_speed_deg_s=args.realign_speed_deg_s,
        ),
        to_action=lambda rad: torch.tensor(rad, dtype=torch.float32, device=env.device).unsqueeze(0),
        success_fn=success_fn_for(env, success_term),
        step_context=torch.inference_mode,
        pre_step=pre_step,
        seed_recorder=seed_recorder,
    )
    if hasattr(env, "initialize"):
        env.initialize()
    bridge.reset(args.seed)
    log.info("LeIsaac follower %s serving at %s (protocol v%d)", args.task, ep.endpoint, P.PROTOCOL_VERSION)
    try:
        bridge.run(is_running=simulation_app.is_running)
    except KeyboardInterrupt:
        pass
    finally:
        if seed_recorder is not None:
            seed_recorder.close()
        ep.close()
        env.close()
        simulation_app.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
