"""The LeIsaac follower: a LeIsaac SO-101 task (Isaac Lab) served over ``drivers.sim_protocol``.

Run it on a GPU workstation inside a LeIsaac 0.4 **source** install (Isaac Sim 5.1, Isaac Lab 2.3,
Python 3.11) with this repository on PYTHONPATH (it needs only numpy, pyzmq and msgpack from us):

    python -m sim_bridge.leisaac_follower --task LeIsaac-SO101-PickOrange-v0 \\
        --bind tcp://127.0.0.1:5555 --enable_cameras --device cuda --headless

LeIsaac finds its assets (robot and scene USDs) from the git repository of the current directory
(``leisaac/utils/constant.py``), which is our clone when started from it; the follower looks for
them first (``LEISAAC_ASSETS_ROOT``, that repository's ``assets``, the LeIsaac checkout's
``assets``), hands LeIsaac the folder that has them through ``LEISAAC_ASSETS_ROOT``, and names
every place it looked when none has.

The environment is created the way LeIsaac's own scripts do (AppLauncher first, then
``parse_env_cfg`` + ``env_cfg.use_teleop_device("so101leader")`` for absolute joint-position
actions in the order pan, lift, elbow, wrist_flex, wrist_roll, gripper, then ``gym.make``). Our
LeRobot-unit targets become LeIsaac joint radians with ``conventions.units_to_sim_rad`` (LeIsaac's
own limit table); ``obs["policy"]["joint_pos"]`` goes back with ``sim_rad_to_units``; the
task's camera terms (``front`` and ``wrist``; LiftCube has no wrist camera) are announced with
their sizes and published as frames. The bridge steps on its own clock at the env's step rate
(``env.step_dt``), whatever rate the daemon's messages arrive at.

The task is configured as LeIsaac's ``teleop_se3_agent.py`` does (``prepare_env_cfg``): no
termination term resets a manager-based scene, and a Direct task gets ``never_time_out`` and
``manual_terminate``; success is evaluated by us after every step (the success term, or a Direct
task's ``_check_success``). Should a task still reset itself inside ``step``, the ``terminated``
flag it returns (computed before that reset) is the success. After any scene reset the arm holds
the reset pose and re-aligns to the daemon's target at ``realign_speed_deg_s`` (never a jump).
With ``--seed_hdf5 FILE`` every daemon episode is also written as a Mimic seed demo
(``sim_bridge.seed_recorder``), carrying the seed its episode was reset with: the daemon's reset
seed, else the env's ``cfg.seed`` (what LeIsaac's recorder writes).

A bi-arm task (``...-BiArm-...``, LeIsaac's ``tasks/template/bi_arm_env_cfg.py``) is driven
with ``use_teleop_device("bi-so101leader")``: one 12-wide action, the left arm's six joints then
the right's (``utils/constant.py`` ``BI_ARM_JOINT_NAMES``), each arm's joints read from its policy
term ``left_joint_pos`` / ``right_joint_pos`` and mapped as the single arm's; the endpoint serves
the arms ``left`` and ``right``, one daemon link each (``drivers.sim_protocol``, "Arms"), and the
cameras ``left_wrist``, ``right_wrist``, ``top``. Each arm holds, re-aligns and acknowledges on its
own; the scene, its resets and its success are shared.

Everything except ``main()`` is plain Python over a gym-style env (``reset(seed=)`` and
``step(action)`` returning ``obs, reward, terminated, truncated, info``), tested with fakes built
from Isaac Lab's and LeIsaac's step/reset source (``tests/fixtures/leisaac_env.py``); Isaac
imports live only inside ``main()``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibration.conventions import sim_rad_to_units, units_to_sim_rad
from drivers import sim_protocol as P
from sim_bridge.seed_recorder import to_numpy
from sim_bridge.server import ServerInbox, SimServerEndpoint, StepClock

log = logging.getLogger("so101d.sim.leisaac")

DEFAULT_TASK = "LeIsaac-SO101-PickOrange-v0"


@dataclass
class LeisaacBridgeConfig:
    step_hz: float = 60.0  # LeIsaac steps at 1/60 s, decimation 1 (main() takes it from env.step_dt)
    publish_hz: float = 30.0  # camera frames (LeIsaac's cameras update at 30 Hz); state goes every step
    cameras: tuple[str, ...] = ("front", "wrist")
    jpeg_quality: int | None = None  # JPEG frames across a network link (e.g. an SSH tunnel)
    daemon_staleness_s: float = 0.1
    # After any scene reset (the daemon's or one the env did inside step) the arm sits at the reset
    # pose while the daemon's target is wherever the leader is: move the target there at this speed
    # instead of letting the sim's PD drive jump (the daemon's own alignment does not see a reset).
    realign_speed_deg_s: float = 45.0
    realign_tolerance_deg: float = 1.0
    # A daemon silent this long mid-episode is gone (its own episode with it): the seed demo ends
    # there (success=False) instead of recording a still arm until the disk fills.
    seed_demo_silence_s: float = 3.0
    # After the daemon's episode stop, acknowledge it once the demo is on disk, or after this long.
    seed_stop_wait_s: float = 10.0
    # (): a single-arm task; BI_ARM_SIDES: a bi-arm task (tasks/template/bi_arm_env_cfg.py), each
    # arm driven by its own daemon link (drivers.sim_protocol, "Arms"), one 12-wide action
    arms: tuple[str, ...] = ()


# LeIsaac's bi-arm tasks (tasks/template/bi_arm_env_cfg.py): articulations left_arm / right_arm, the
# policy terms <side>_joint_pos, actions 12 wide in utils/constant.py BI_ARM_JOINT_NAMES order
# (left first; devices/action_process.py, bi-so101leader), cameras left_wrist, right_wrist, top.
BI_ARM_SIDES = ("left", "right")
BI_ARM_CAMERAS = ("left_wrist", "right_wrist", "top")


def is_bi_arm_task(task: str) -> bool:
    """LeIsaac's own test (scripts/environments/teleoperation/replay.py ``get_task_type``): a task
    named ``...BiArm...`` is driven by ``bi-so101leader``."""
    return "BiArm" in task


@dataclass
class ArmDrive:
    """What one arm's daemon link asked of the bridge, and the target the arm is given."""

    name: str  # "" for a single-arm task
    target_rad: np.ndarray | None = None  # the target stepped, LeIsaac joint radians
    daemon_target_rad: np.ndarray | None = None  # the daemon's last target, sim radians
    torque: bool = True
    ack_seq: int = -1
    ack_sent_s: float = 0.0
    daemon_was_stale: bool = True
    realigning: bool = False

    @property
    def obs_key(self) -> str:
        """Its joint positions' policy term: ``joint_pos``, or ``left_joint_pos`` / ``right_joint_pos``."""
        return f"{self.name}_joint_pos" if self.name else "joint_pos"


def image_to_uint8(img: Any) -> np.ndarray:
    """The first env's camera image as HxWx3 uint8 RGB (Isaac Lab gives (N, H, W, C))."""
    a = to_numpy(img)
    if a.ndim == 4:
        a = a[0]
    a = a[..., :3]
    if a.dtype != np.uint8:
        a = np.clip(a * 255.0 if a.max() <= 1.0 else a, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(a)


def task_cameras(policy_obs: Mapping[str, Any], names: tuple[str, ...], fps: float) -> list[dict[str, Any]]:
    """The cameras among ``names`` that the task's policy observations really hold, with their
    size: LiftCube deletes its ``wrist`` camera (``lift_cube_env_cfg.py``), PickOrange has both."""
    cams = []
    for name in names:
        if name in policy_obs:
            img = to_numpy(policy_obs[name])
            h, w = img.shape[-3], img.shape[-2]
            cams.append({"name": name, "width": int(w), "height": int(h), "fps": float(fps)})
    return cams


def check_step_hz(requested_hz: float | None, step_dt_s: float) -> float:
    """The bridge's step rate: the env's (``1 / env.step_dt``, sim dt x decimation). A
    ``--step_hz`` that differs by more than 1 % is refused: every step is ``step_dt`` of physics,
    so another rate would run the recorded motion faster or slower than the leader moved."""
    env_hz = 1.0 / step_dt_s
    if requested_hz is None:
        return env_hz
    if requested_hz <= 0 or abs(requested_hz / env_hz - 1.0) > 0.01:
        raise ValueError(
            f"--step_hz {requested_hz:g} does not match the task: each env step is {step_dt_s:.6g} s of physics "
            f"({env_hz:.6g} Hz), so the sim would run {requested_hz / env_hz:.3g}x real time; "
            f"leave --step_hz out (it follows the task) or pass {env_hz:.6g}"
        )
    return requested_hz


# ---------------------------------------------------------------------------------------------
# LeIsaac's assets (robot and scene USDs)
# ---------------------------------------------------------------------------------------------
# Every SO-101 task loads this robot (leisaac/assets/robots/lerobot.py: ASSETS_ROOT/robots/...).
ASSET_PROBE = Path("robots") / "so101_follower.usd"


class LeisaacAssetsMissing(RuntimeError):
    """No folder with LeIsaac's assets; the message names every place looked at."""


@dataclass(frozen=True)
class AssetsRoot:
    path: Path
    found_by: str  # how it was found, for the log line


def git_toplevel(cwd: Path) -> Path | None:
    """The top of the git repository holding ``cwd`` (what LeIsaac asks GitPython), or None."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out.stdout.strip())


def leisaac_checkout(package_init: Path) -> Path:
    """``<checkout>/source/leisaac/leisaac/__init__.py`` -> ``<checkout>`` (constant.py's fallback)."""
    return package_init.resolve().parents[3]


def locate_leisaac_assets(environ: Mapping[str, str], cwd: Path, leisaac_init: Path | None) -> AssetsRoot:
    """The folder LeIsaac should load its assets from, looking where LeIsaac itself would.

    ``LEISAAC_ASSETS_ROOT`` when set (LeIsaac's override; it must hold the assets), else the
    ``assets`` folder of the git repository holding ``cwd`` (LeIsaac's first choice), else the
    LeIsaac checkout's ``assets`` (its fallback, and where its README puts them).
    """
    override = environ.get("LEISAAC_ASSETS_ROOT")
    if override:
        root = Path(override).expanduser().resolve()
        if (root / ASSET_PROBE).is_file():
            return AssetsRoot(root, "LEISAAC_ASSETS_ROOT")
        raise LeisaacAssetsMissing(
            f"LEISAAC_ASSETS_ROOT={override} has no {ASSET_PROBE}: point it at the assets folder of LeIsaac "
            "(the one holding robots/ and scenes/)"
        )
    candidates: list[tuple[Path, str]] = []
    top = git_toplevel(cwd)
    if top is not None:
        candidates.append((top / "assets", f"the git repository of the current directory ({top})"))
    if leisaac_init is not None:
        candidates.append((leisaac_checkout(leisaac_init) / "assets", "the LeIsaac checkout"))
    for root, why in candidates:
        if (root / ASSET_PROBE).is_file():
            return AssetsRoot(root.resolve(), why)
    looked = "; ".join(f"{root / ASSET_PROBE} ({why})" for root, why in candidates) or "nowhere (LeIsaac not found)"
    raise LeisaacAssetsMissing(
        f"LeIsaac's assets are not where LeIsaac looks: no {looked}. Download them into the LeIsaac "
        "checkout's assets/ folder (LeIsaac's README), or set LEISAAC_ASSETS_ROOT=/path/to/assets"
    )


def use_leisaac_assets(environ: os._Environ[str] = os.environ, cwd: Path | None = None) -> AssetsRoot:
    """Find the assets before ``import leisaac`` and hand them to it through LEISAAC_ASSETS_ROOT
    (LeIsaac reads it once, at import): started from our clone, LeIsaac would otherwise look for
    ``<our clone>/assets``."""
    import importlib.util

    spec = importlib.util.find_spec("leisaac")  # locates the package without importing it
    init = Path(spec.origin) if spec is not None and spec.origin else None
    root = locate_leisaac_assets(environ, cwd or Path.cwd(), init)
    environ["LEISAAC_ASSETS_ROOT"] = str(root.path)
    log.info("LeIsaac assets: %s (%s)", root.path, root.found_by)
    return root


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
        if tuple(endpoint.arms) != tuple(self.cfg.arms):
            raise ValueError(f"the endpoint serves arms {endpoint.arms!r}, the task {self.cfg.arms!r}")
        self.drives = {name: ArmDrive(name) for name in (self.cfg.arms or ("",))}
        self.episode_seq = 0
        self.steps = 0
        self._frame_seq = 0
        self._next_frame_s = 0.0
        self._success_sent = False
        self._ended_sent = False
        self._stop = threading.Event()
        self.auto_resets = 0
        self.seed_recorder = seed_recorder  # sim_bridge.seed_recorder.SeedDemoRecorder (--seed_hdf5)
        self._last_seed: int | None = None
        self._pending_stop: tuple[int, int, float] | None = None  # (episode seq, writes mark, deadline)
        self.clock = StepClock(1.0 / self.cfg.step_hz)
        self.run_started_s = 0.0

    # -- observation access ----------------------------------------------------------------------
    def _policy_obs(self) -> dict[str, Any]:
        obs = self.obs
        return obs["policy"] if isinstance(obs, dict) and "policy" in obs else obs

    def drive(self, arm: str = "") -> ArmDrive:
        """The arm ``arm`` ("": the first, the one of a single-arm task)."""
        return self.drives[arm] if arm else next(iter(self.drives.values()))

    @property
    def realigning(self) -> bool:
        """Any arm still re-aligning to its daemon target after a scene reset."""
        return any(d.realigning for d in self.drives.values())

    @property
    def _daemon_was_stale(self) -> bool:
        """Every arm's daemon link silent."""
        return all(d.daemon_was_stale for d in self.drives.values())

    def joint_rad(self, arm: str = "") -> np.ndarray:
        q = to_numpy(self._policy_obs()[self.drive(arm).obs_key]).astype(np.float64)
        return q[0] if q.ndim == 2 else q

    def joint_units(self, arm: str = "") -> np.ndarray:
        return sim_rad_to_units(self.joint_rad(arm))

    # -- episode ---------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        """Reset the scene; ``seed`` (the daemon's) reseeds it. Without one the env goes on from its
        own seed (``cfg.seed``, which is then the episode's seed, as LeIsaac's recorder writes); an
        env created without a seed gets a fresh one here, so every episode has a seed to replay."""
        self._end_seed_demo()
        if seed is None and self.env.cfg.seed is None:
            seed = int.from_bytes(os.urandom(4), "little") >> 1
        with self.step_context():
            self.obs, _ = self.env.reset(seed=seed) if seed is not None else self.env.reset()
        self._last_seed = int(seed) if seed is not None else int(self.env.cfg.seed)
        self._after_reset()
        self._success_sent = self._ended_sent = False

    def _after_reset(self) -> None:
        """Every arm holds the reset pose, then re-aligns slowly to its daemon target (never a jump)."""
        for d in self.drives.values():
            d.target_rad = self.joint_rad(d.name).copy()
            d.realigning = True

    def _apply(self, inbox: ServerInbox) -> None:
        """What one arm's daemon link sent: its torque and target are that arm's; an episode
        command acts on the one scene (its events reach every arm's link)."""
        d = self.drives[inbox.arm]
        if inbox.torque is not None:
            d.torque = inbox.torque
            if not d.torque:
                log.info("torque off: LeIsaac's action interface cannot go limp; holding the measured pose")
        if inbox.target_units is not None and inbox.target_seq != d.ack_seq:
            if d.torque:
                d.daemon_target_rad = units_to_sim_rad(inbox.target_units)
                if not d.realigning:
                    d.target_rad = d.daemon_target_rad
            d.ack_seq, d.ack_sent_s = inbox.target_seq, inbox.target_sent_s
        for cmd in inbox.episode_cmds:
            self.episode_seq = cmd["seq"]
            if cmd["cmd"] == "reset":
                self.reset(cmd.get("seed"))
                self._send_state()
                self.ep.send_event("reset_done", seq=self.episode_seq)
            elif cmd["cmd"] == "start":
                self._success_sent = self._ended_sent = False
                if self.seed_recorder is not None:
                    assert self._last_seed is not None  # run() and main() reset the scene before serving
                    self.seed_recorder.begin(self.scene_state(), seed=self._last_seed)
                self.ep.send_event("started", seq=self.episode_seq)
            elif cmd["cmd"] == "stop":
                self._end_seed_demo()
                if self.seed_recorder is None:
                    self.ep.send_event("stopped", seq=self.episode_seq)
                else:  # acknowledged once the demo is on disk; the sim steps on meanwhile
                    deadline_s = time.monotonic() + self.cfg.seed_stop_wait_s
                    self._pending_stop = (self.episode_seq, self.seed_recorder.writes_submitted, deadline_s)

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

    def _send_pending_stop(self, now_s: float) -> None:
        """The daemon's episode stop, acknowledged once the demo's writes are done (a power cut
        after ``stopped`` keeps the demo), or after ``seed_stop_wait_s`` with a note saying so."""
        if self._pending_stop is None or self.seed_recorder is None:
            return
        seq, mark, deadline_s = self._pending_stop
        rec = self.seed_recorder
        written = rec.written_through(mark)
        if not written and now_s < deadline_s:
            return
        self._pending_stop = None
        detail = ""
        if rec.error is not None:
            detail = f"seed recording failed: {rec.error}"
        elif not written:
            log.warning(
                "seed writer still %d writes behind after %.0f s: the stop is acknowledged before the demo is on disk",
                rec.jobs_behind,
                self.cfg.seed_stop_wait_s,
            )
            detail = "seed demo not yet on disk"
        self.ep.send_event("stopped", detail, seq=seq)

    def _send_state(self) -> None:
        """Each arm's state to its daemon link."""
        for d in self.drives.values():
            self.ep.send_state(
                self.joint_units(d.name),
                sim_time_s=self.steps / self.cfg.step_hz,
                torque=d.torque,
                ack_seq=d.ack_seq,
                ack_sent_s=d.ack_sent_s,
                seed_error=self.seed_recorder.error if self.seed_recorder is not None else None,
                arm=d.name,
            )

    # -- one step --------------------------------------------------------------------------------
    def tick(self, poll_timeout_s: float = 0.0) -> None:
        """Apply what arrived (waiting up to ``poll_timeout_s`` for a first message), then step."""
        for inbox in self.ep.poll_arms(poll_timeout_s).values():
            self._apply(inbox)
        self.step()

    def step(self) -> None:
        """One env step with the current target; state, events and frames to the daemon."""
        now = time.monotonic()
        for d in self.drives.values():
            self._hold_or_realign(d, self.ep.daemon_stale(now, d.name))
        stale = self.ep.daemon_stale(now)  # every arm's link silent
        if self.pre_step is not None:
            self.pre_step()
        recording = self.seed_recorder is not None and self.seed_recorder.recording
        if recording and stale and self.ep.daemon_silent_s(now) > self.cfg.seed_demo_silence_s:
            log.warning(
                "daemon silent for %.1f s mid-episode: seed demo %s ends here (success=False)",
                self.ep.daemon_silent_s(now),
                self.seed_recorder.demo_name,
            )
            self.seed_recorder.end(success=False)
            recording = False
        obs_before = self._policy_obs() if recording else None  # PreStepFlatPolicyObservationsRecorder
        # one action for the scene: a bi-arm task's is the left arm's six joints, then the right's
        action = self.to_action(np.concatenate([d.target_rad for d in self.drives.values()]))
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
        self._send_pending_stop(now)
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

    def _hold_or_realign(self, d: ArmDrive, stale: bool) -> None:
        """One arm before a step: its link just went silent, torque off or no target yet: hold
        where it is; re-aligning after a reset: one step toward its daemon target."""
        if (stale and not d.daemon_was_stale) or not d.torque or d.target_rad is None:
            d.target_rad = self.joint_rad(d.name).copy()  # hold where it is
            if stale and not d.daemon_was_stale:
                log.warning("daemon%s silent: holding the current pose", f" link of arm {d.name!r}" if d.name else "")
            d.daemon_target_rad = None  # a stale target must not be re-aligned to later
        d.daemon_was_stale = stale
        if d.realigning and d.torque and not stale:
            self._realign_step(d)

    def _realign_step(self, d: ArmDrive) -> None:
        """Move the arm's sim target toward its daemon target by at most one step's worth of
        ``realign_speed_deg_s``; done (1:1 again) once every joint is within tolerance."""
        goal = d.daemon_target_rad
        if goal is None or d.target_rad is None:
            return  # no daemon target yet: keep holding
        lim = np.deg2rad(self.cfg.realign_speed_deg_s) / self.cfg.step_hz
        delta = goal - d.target_rad
        d.target_rad = d.target_rad + np.clip(delta, -lim, lim)
        if np.all(np.abs(goal - d.target_rad) <= np.deg2rad(self.cfg.realign_tolerance_deg)):
            d.target_rad = goal.copy()
            d.realigning = False

    def stop(self) -> None:
        self._stop.set()

    def run(self, is_running: Callable[[], bool] = lambda: True) -> None:
        """Step at ``step_hz`` on the bridge's own clock until stopped. Daemon messages are applied
        as they arrive between steps; however many arrive, the next step waits for its deadline
        (a GPU that falls behind restarts the schedule rather than racing to catch up)."""
        if self.obs is None:
            self.reset()
        self.clock = StepClock(1.0 / self.cfg.step_hz)
        self.run_started_s, steps0 = time.monotonic(), self.steps
        try:
            while not self._stop.is_set() and is_running():
                self.ep.serve_until(self.clock.next_s, self._apply, self._stop.is_set)
                if self._stop.is_set():
                    break
                self.step()
                self.clock.advance()
        finally:
            self._log_served(steps0)

    def _log_served(self, steps0: int) -> None:
        served_s = time.monotonic() - self.run_started_s
        log.info(
            "served %d steps in %.1f s: %.2f steps/s (step rate %.2f Hz), %d overruns",
            self.steps - steps0,
            served_s,
            (self.steps - steps0) / served_s if served_s > 0 else 0.0,
            self.cfg.step_hz,
            self.clock.overruns,
        )


# ---------------------------------------------------------------------------------------------
# entry point (GPU workstation only)
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Serve a LeIsaac SO-101 task to the so101d daemon (sim follower).")
    p.add_argument(
        "--task",
        default=DEFAULT_TASK,
        help="any SO-101 LeIsaac task, single-arm or bi-arm (...-BiArm-...: both arms, one daemon link each) (default %(default)s)",
    )
    p.add_argument(
        "--bind",
        default="tcp://127.0.0.1:5555",
        help="endpoint to bind (loopback or ipc; reach it from another host through an SSH tunnel)",
    )
    p.add_argument(
        "--step_hz",
        type=float,
        default=None,
        help="steps per second; default and only accepted value: the task's (1 / env.step_dt, 60 for LeIsaac)",
    )
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


def shut_down(steps: list[tuple[str, Callable[[], None]]]) -> int:
    """Run every close in order even when one raises (a Kit app that is not closed hangs on
    exit); each failure is logged; returns the exit code (1 when any failed)."""
    rc = 0
    for what, close in steps:
        try:
            close()
        except Exception as exc:
            log.error("closing the %s failed: %s", what, exc)
            rc = 1
    return rc


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs Isaac Sim and a GPU
    parser = build_parser()
    from isaaclab.app import AppLauncher

    AppLauncher.add_app_launcher_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        use_leisaac_assets()  # before Isaac Sim starts (minutes) and before leisaac is imported
    except LeisaacAssetsMissing as exc:
        log.error("%s", exc)
        return 2
    app_launcher = AppLauncher(vars(args))
    simulation_app = app_launcher.app

    import gymnasium as gym
    import leisaac  # noqa: F401  (registers the LeIsaac tasks)
    import torch
    from isaaclab_tasks.utils import parse_env_cfg

    env_cfg = parse_env_cfg(args.task, device=args.device, num_envs=1)
    # absolute joint positions, pan..gripper (a bi-arm task: the left arm's six, then the right's)
    arms = BI_ARM_SIDES if is_bi_arm_task(args.task) else ()
    device = "bi-so101leader" if arms else "so101leader"
    env_cfg.use_teleop_device(device)
    env_cfg.seed = args.seed if args.seed is not None else int(time.time())
    env_cfg.recorders = None
    success_term = prepare_env_cfg(env_cfg)
    # Isaac Lab's ManagerBasedRLEnv (cfg, device, scene): typed Any, Isaac Lab is not installed here
    env: Any = gym.make(args.task, cfg=env_cfg).unwrapped
    try:
        step_hz = check_step_hz(args.step_hz, float(env.step_dt))
    except ValueError as exc:
        log.error("%s", exc)
        env.close()
        simulation_app.close()
        return 2

    pre_step = None
    if getattr(env.cfg, "dynamic_reset_gripper_effort_limit", False):
        from leisaac.utils.env_utils import dynamic_reset_gripper_effort_limit_sim

        pre_step = lambda: dynamic_reset_gripper_effort_limit_sim(env, device)  # noqa: E731

    ep = SimServerEndpoint(
        args.bind,
        backend=f"leisaac:{args.task}",
        rate_hz=step_hz,
        daemon_staleness_s=args.daemon_staleness_ms / 1000.0,
        arms=arms,
    )
    seed_recorder = None
    if args.seed_hdf5:
        from sim_bridge.seed_recorder import SeedDemoRecorder

        seed_recorder = SeedDemoRecorder(args.seed_hdf5, env_name=args.task)
    bridge = LeisaacBridge(
        env,
        ep,
        config=LeisaacBridgeConfig(
            step_hz=step_hz,
            publish_hz=args.publish_hz,
            jpeg_quality=args.jpeg_quality,
            daemon_staleness_s=args.daemon_staleness_ms / 1000.0,
            realign_speed_deg_s=args.realign_speed_deg_s,
            arms=arms,
            cameras=BI_ARM_CAMERAS if arms else LeisaacBridgeConfig.cameras,
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
    # announce the cameras the task has (the hello goes out when the daemon connects, after open)
    ep.cameras = task_cameras(bridge._policy_obs(), bridge.cfg.cameras, args.publish_hz)
    bridge.cfg.cameras = tuple(c["name"] for c in ep.cameras)
    ep.open()
    log.info("cameras: %s", ", ".join(f"{c['name']} {c['width']}x{c['height']}" for c in ep.cameras) or "none")
    log.info("LeIsaac follower %s serving at %s (protocol v%d)", args.task, ep.endpoint, P.PROTOCOL_VERSION)
    # Ctrl-C / SIGTERM end the run between steps, so the seed file is closed with its last demo
    signal.signal(signal.SIGINT, lambda _s, _f: bridge.stop())
    signal.signal(signal.SIGTERM, lambda _s, _f: bridge.stop())
    try:
        bridge.run(is_running=simulation_app.is_running)
    finally:
        rc = shut_down(
            [
                ("seed file", seed_recorder.close if seed_recorder is not None else lambda: None),
                ("endpoint", ep.close),
                ("env", env.close),
                ("Isaac Sim", simulation_app.close),
            ]
        )
    return rc


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
