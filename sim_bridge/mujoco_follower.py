"""The MuJoCo follower: a simulated SO-101 served over ``drivers.sim_protocol`` (runs on a CPU).

``MujocoFollower`` steps the scene of ``sim_bridge.mujoco_scene`` in real time, applies the
daemon's joint targets to position actuators, renders the front and wrist cameras offscreen and
publishes joint state, frames and episode events (reset done, success = the cube lifted,
terminated = the cube fell off the table). ``so101d sim-follower --backend mujoco --bind ENDPOINT``
runs it (see ``sim_bridge.cli``).

Rendering uses MuJoCo's low-level API on one EGL context: both cameras are drawn into side-by-side
viewports of one offscreen buffer and read back with a single ``mjr_readPixels``; shadows,
reflections and the skybox are off. On a software renderer (llvmpipe) that is about 2 ms for two
320x240 images, against ~20 ms per image through ``mujoco.Renderer``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

# Before mujoco is imported: headless EGL unless the user chose another backend (osmesa, glfw);
# a backend whose library is missing is one clear GLBackendUnavailable (sim_bridge/gl_backend.py).
from sim_bridge.gl_backend import import_mujoco

mujoco = import_mujoco()

if TYPE_CHECKING:  # types only: the module itself is imported above, after the GL backend is chosen
    from mujoco import MjData, MjModel

from calibration.conventions import JOINT_NAMES, sim_rad_to_units, units_to_sim_rad  # noqa: E402
from sim_bridge import mujoco_scene as scene  # noqa: E402
from sim_bridge.server import ServerInbox, SimServerEndpoint, StepClock  # noqa: E402

log = logging.getLogger("so101d.sim.mujoco")

NJ = len(JOINT_NAMES)


@dataclass
class MujocoFollowerConfig:
    bind: str = "tcp://127.0.0.1:5555"
    rate_hz: float = 30.0  # state publication and camera rate
    cameras: tuple[str, ...] = ("front", "wrist")
    camera_width: int = 320
    camera_height: int = 240
    jpeg_quality: int | None = None  # None: raw RGB frames (loopback); 1..100: JPEG (remote sims)
    daemon_staleness_s: float = 0.1  # daemon silent this long -> hold the measured pose
    lift_success_m: float = 0.05  # cube bottom this high above the table = success
    seed: int | None = None
    max_catch_up_s: float = 0.25  # if the host stalls longer, skip sim time instead of racing
    # (): one arm; ("left", "right"): the two-arm scene, each arm addressed by its name on the one
    # endpoint (drivers.sim_protocol, "Arms"); cameras then "left_wrist", "right_wrist", "top"
    arms: tuple[str, ...] = ()


@dataclass
class SimArm:
    """One arm of the scene: its joints' and actuators' indices in the model (by name, prefixed
    ``<arm>_`` in the two-arm scene) and what the daemon driving it last asked."""

    name: str  # "" for the single arm
    qadr: np.ndarray  # qpos addresses of the six joints, JOINT_NAMES order
    vadr: np.ndarray  # qvel addresses
    act: np.ndarray  # actuator ids, the same order
    kp: np.ndarray  # the position actuators' gains (restored at torque on)
    bias: np.ndarray
    ctrl_lo: np.ndarray
    ctrl_hi: np.ndarray
    force_max: np.ndarray
    pads: tuple[int, int]  # fixed and moving jaw pad geoms
    torque: bool = True
    ack_seq: int = -1
    ack_sent_s: float = 0.0
    daemon_was_stale: bool = True

    @classmethod
    def of(cls, model: MjModel, name: str) -> SimArm:
        pre = scene.arm_prefix(name)
        act = np.array([model.actuator(pre + n).id for n in JOINT_NAMES])
        joints = [model.joint(pre + n).id for n in JOINT_NAMES]
        return cls(
            name=name,
            qadr=np.array([model.jnt_qposadr[j] for j in joints]),
            vadr=np.array([model.jnt_dofadr[j] for j in joints]),
            act=act,
            kp=model.actuator_gainprm[act, 0].copy(),
            bias=model.actuator_biasprm[act, :3].copy(),
            ctrl_lo=model.actuator_ctrlrange[act, 0].copy(),
            ctrl_hi=model.actuator_ctrlrange[act, 1].copy(),
            force_max=np.abs(model.actuator_forcerange[act]).max(axis=1),
            pads=(model.geom(pre + "fixed_jaw_pad").id, model.geom(pre + "moving_jaw_pad").id),
        )


# ---------------------------------------------------------------------------------------------
# joint mapping: LeRobot units <-> MuJoCo joint radians (explicit, see mujoco_scene)
# ---------------------------------------------------------------------------------------------
def units_to_mj_rad(units: np.ndarray) -> np.ndarray:
    return scene.MJ_JOINT_SIGN * units_to_sim_rad(units) + scene.MJ_JOINT_OFFSET_RAD


def mj_rad_to_units(rad: np.ndarray) -> np.ndarray:
    return sim_rad_to_units((np.asarray(rad, dtype=np.float64) - scene.MJ_JOINT_OFFSET_RAD) * scene.MJ_JOINT_SIGN)


def _gl_context_class():
    """The GL backend named by MUJOCO_GL (egl by default), chosen here rather than by whichever
    module imported mujoco first (mujoco binds its default context at import time)."""
    backend = os.environ.get("MUJOCO_GL", "egl").lower()
    try:
        if backend == "egl":
            from mujoco.egl import GLContext
        elif backend == "osmesa":
            from mujoco.osmesa import GLContext
        elif backend == "glfw":
            from mujoco.glfw import GLContext
        else:
            raise RuntimeError(f"MUJOCO_GL={backend!r}: use egl, osmesa or glfw")
    except ImportError as exc:
        raise RuntimeError(
            f"offscreen rendering with MUJOCO_GL={backend} is unavailable ({exc}); try MUJOCO_GL=osmesa "
            "(libosmesa6) or run without cameras (--cameras '')"
        ) from exc
    return GLContext


class MultiCameraRenderer:
    """Renders N cameras of equal size side by side in one offscreen buffer, one read-back."""

    def __init__(self, model: MjModel, names: tuple[str, ...], width: int, height: int) -> None:
        self.names = names
        self.width, self.height = width, height
        self._ctx = _gl_context_class()(width * len(names), height)
        self._ctx.make_current()
        self._con = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._con)
        self._scn = mujoco.MjvScene(model, maxgeom=2000)
        for flag in (
            mujoco.mjtRndFlag.mjRND_SHADOW,
            mujoco.mjtRndFlag.mjRND_REFLECTION,
            mujoco.mjtRndFlag.mjRND_SKYBOX,
        ):
            self._scn.flags[flag] = 0
        self._opt = mujoco.MjvOption()
        self._pert = mujoco.MjvPerturb()
        self._cams = []
        for name in names:
            cam = mujoco.MjvCamera()
            cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
            cam.fixedcamid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, name)
            if cam.fixedcamid < 0:
                raise ValueError(f"no camera named {name!r} in the scene")
            self._cams.append(cam)
        self._buf = np.empty((height, width * len(names), 3), dtype=np.uint8)
        self._model = model

    def render(self, data: MjData) -> dict[str, np.ndarray]:
        self._ctx.make_current()
        for i, cam in enumerate(self._cams):
            mujoco.mjv_updateScene(self._model, data, self._opt, self._pert, cam, mujoco.mjtCatBit.mjCAT_ALL, self._scn)
            mujoco.mjr_render(mujoco.MjrRect(i * self.width, 0, self.width, self.height), self._scn, self._con)
        mujoco.mjr_readPixels(
            self._buf, None, mujoco.MjrRect(0, 0, self.width * len(self._cams), self.height), self._con
        )
        flipped = self._buf[::-1]  # OpenGL rows run bottom-up
        return {
            name: np.ascontiguousarray(flipped[:, i * self.width : (i + 1) * self.width])
            for i, name in enumerate(self.names)
        }

    def close(self) -> None:
        # Free explicitly on the owning thread: garbage-collected EGL contexts fail at exit.
        if self._con is not None:
            self._con.free()
            self._con = None
        if self._ctx is not None:
            self._ctx.free()
            self._ctx = None


class MujocoFollower:
    """The simulated follower; ``run()`` serves it until ``stop()``; pieces are usable directly."""

    def __init__(self, config: MujocoFollowerConfig | None = None) -> None:
        self.cfg = config or MujocoFollowerConfig()
        if self.cfg.rate_hz <= 0:
            raise ValueError(f"rate_hz must be positive, got {self.cfg.rate_hz}")
        cams = tuple(scene.CameraSpec(n, self.cfg.camera_width, self.cfg.camera_height) for n in self.cfg.cameras)
        self.model = scene.build_model(cams, arms=self.cfg.arms)
        self.data = mujoco.MjData(self.model)
        self._rng = np.random.default_rng(self.cfg.seed)
        self.arms = {name: SimArm.of(self.model, name) for name in (self.cfg.arms or ("",))}
        self._cube_body = self.model.body("cube").id
        self._cube_qadr = self.model.jnt_qposadr[self.model.joint("cube_free").id]
        self.episode_seq = 0
        self.episode_active = False
        self._success_sent = False
        self._terminated_sent = False
        self._renderer: MultiCameraRenderer | None = None
        self._frame_seq = 0
        self._stop = threading.Event()
        # Work handed to the serving thread (call_in_sim_thread): MjData is not thread-safe.
        self._calls: queue.SimpleQueue[tuple[Callable[[MujocoFollower], object], Future[object]]] = queue.SimpleQueue()
        self._serving = False
        self.endpoint: SimServerEndpoint | None = None
        self.ticks = 0
        self.overruns = 0
        self.skipped_sim_s = 0.0
        self.reset_scene()

    # -- simulation pieces --------------------------------------------------------------------
    def arm(self, name: str = "") -> SimArm:
        """The arm ``name`` ("" or omitted: the first; KeyError naming the scene's arms)."""
        if not name:
            return next(iter(self.arms.values()))
        try:
            return self.arms[name]
        except KeyError:
            raise KeyError(f"no arm {name!r} in this scene (arms: {', '.join(self.arms) or 'one, unnamed'})") from None

    @property
    def _daemon_was_stale(self) -> bool:
        """No arm's daemon link is live (nobody is listening: frames are not rendered)."""
        return all(a.daemon_was_stale for a in self.arms.values())

    def reset_scene(self, seed: int | None = None) -> None:
        """Every arm at LeIsaac's rest pose, holding it; cube at a random spot near its home."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        mujoco.mj_resetData(self.model, self.data)
        rest = (np.deg2rad(scene.REST_POSE_DEG) - scene.MJ_JOINT_OFFSET_RAD) * scene.MJ_JOINT_SIGN
        for a in self.arms.values():
            self.data.qpos[a.qadr] = rest
            self.data.ctrl[a.act] = rest
        dx, dy = self._rng.uniform(-scene.CUBE_RANDOM_XY_M, scene.CUBE_RANDOM_XY_M, size=2)
        q = self._cube_qadr
        self.data.qpos[q : q + 3] = [scene.CUBE_HOME_XY_M[0] + dx, scene.CUBE_HOME_XY_M[1] + dy, scene.CUBE_HALF_M]
        self.data.qpos[q + 3 : q + 7] = [1.0, 0.0, 0.0, 0.0]
        mujoco.mj_forward(self.model, self.data)
        self._success_sent = False
        self._terminated_sent = False

    def set_target_units(self, units: np.ndarray, arm: str = "") -> None:
        a = self.arm(arm)
        rad = units_to_mj_rad(np.asarray(units, dtype=np.float64))
        self.data.ctrl[a.act] = np.clip(rad, a.ctrl_lo, a.ctrl_hi)

    def set_torque(self, enabled: bool, arm: str = "") -> None:
        """Torque off = limp: zero the position actuators' gains (the joints keep their damping)."""
        a = self.arm(arm)
        if enabled == a.torque:
            return
        if enabled:
            self.data.ctrl[a.act] = self.data.qpos[a.qadr]  # like a servo: hold where it is
            self.model.actuator_gainprm[a.act, 0] = a.kp
            self.model.actuator_biasprm[a.act, :3] = a.bias
        else:
            self.model.actuator_gainprm[a.act, 0] = 0.0
            self.model.actuator_biasprm[a.act, :3] = 0.0
        a.torque = enabled

    def hold(self, arm: str = "") -> None:
        a = self.arm(arm)
        self.data.ctrl[a.act] = np.clip(self.data.qpos[a.qadr], a.ctrl_lo, a.ctrl_hi)

    def joint_units(self, arm: str = "") -> np.ndarray:
        return mj_rad_to_units(self.data.qpos[self.arm(arm).qadr])

    def joint_velocity_units(self, arm: str = "") -> np.ndarray:
        a = self.arm(arm)
        q = self.data.qpos[a.qadr]
        v = self.data.qvel[a.vadr]
        return mj_rad_to_units(q + v) - mj_rad_to_units(q)  # the map is affine: this is the exact rate

    def effort_pct(self, arm: str = "") -> np.ndarray:
        a = self.arm(arm)
        return self.data.actuator_force[a.act] / a.force_max * 100.0

    def jaw_gap_m(self, arm: str = "") -> float:
        """Distance between the fixed and moving jaw pads' centres (shrinks as the gripper closes)."""
        a, b = self.arm(arm).pads
        return float(np.linalg.norm(self.data.geom_xpos[a] - self.data.geom_xpos[b]))

    def cube_height_m(self) -> float:
        return float(self.data.xpos[self._cube_body][2] - scene.CUBE_HALF_M)

    def cube_lifted(self) -> bool:
        return self.cube_height_m() > self.cfg.lift_success_m

    def cube_lost(self) -> bool:
        x, y, z = self.data.xpos[self._cube_body]
        return z < -0.05 or abs(x - 0.2) > 0.6 or abs(y) > 0.6

    def step_for(self, sim_s: float) -> int:
        n = max(1, round(sim_s / self.model.opt.timestep))
        mujoco.mj_step(self.model, self.data, nstep=n)
        return n

    def render(self) -> dict[str, np.ndarray]:
        if not self.cfg.cameras:
            return {}
        if self._renderer is None:
            self._renderer = MultiCameraRenderer(
                self.model, self.cfg.cameras, self.cfg.camera_width, self.cfg.camera_height
            )
        return self._renderer.render(self.data)

    def close_renderer(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # -- serving --------------------------------------------------------------------------------
    def open(self) -> str:
        cams = [
            {"name": n, "width": self.cfg.camera_width, "height": self.cfg.camera_height, "fps": self.cfg.rate_hz}
            for n in self.cfg.cameras
        ]
        self.endpoint = SimServerEndpoint(
            self.cfg.bind,
            backend="mujoco",
            cameras=cams,
            rate_hz=self.cfg.rate_hz,
            daemon_staleness_s=self.cfg.daemon_staleness_s,
            arms=self.cfg.arms,
        )
        self.endpoint.open()
        return self.endpoint.endpoint

    def stop(self) -> None:
        self._stop.set()

    def call_in_sim_thread[T](self, fn: Callable[[MujocoFollower], T], timeout_s: float = 5.0) -> T:
        """``fn(self)`` between two physics steps, on the thread that serves the sim; its result.

        MuJoCo's MjData is not thread-safe: an mj_forward from another thread while run() steps
        shares the data's scratch stack and corrupts memory (a segfault later, elsewhere). Anything
        that moves the scene while the sim serves (a cube placed by hand, a scripted push) goes
        through here. Not serving: ``fn`` runs on the caller's thread."""
        if not self._serving:
            return fn(self)
        done: Future[object] = Future()
        self._calls.put((fn, done))
        if not self._serving:  # it stopped in between: nobody else will answer
            self._fail_calls()
        return done.result(timeout_s)  # type: ignore[return-value]

    def _take_calls(self) -> Iterator[tuple[Callable[[MujocoFollower], object], Future[object]]]:
        """The queued calls, each marked running; one its caller cancelled meanwhile is skipped."""
        while True:
            try:
                fn, done = self._calls.get_nowait()
            except queue.Empty:
                return
            if done.set_running_or_notify_cancel():
                yield fn, done

    def _run_calls(self) -> None:
        for fn, done in self._take_calls():
            try:
                done.set_result(fn(self))
            except BaseException as exc:  # handed back to the caller, the sim serves on
                done.set_exception(exc)

    def _fail_calls(self) -> None:
        for _fn, done in self._take_calls():
            done.set_exception(RuntimeError("the MuJoCo follower stopped before running the call"))

    def run(self, ready: threading.Event | None = None) -> None:
        """Serve until ``stop()``. Binds (unless ``open()`` was called) on the calling thread."""
        if self.endpoint is None:
            self.open()
        ep = self.endpoint
        assert ep is not None
        period = 1.0 / self.cfg.rate_hz
        if ready is not None:
            ready.set()
        t0 = time.monotonic()
        sim_t0 = self.data.time
        clock = StepClock(period, max_behind_s=period, next_s=t0)
        self._serving = True
        try:
            while not self._stop.is_set():
                # Between ticks, pick up commands as they arrive (targets apply immediately).
                ep.serve_until(clock.next_s, self._apply, self._stop.is_set)
                self._run_calls()
                now = time.monotonic()
                # Advance physics to wall-clock time (real time); never race after a long host stall.
                behind = (now - t0) - (self.data.time - sim_t0)
                if behind > self.cfg.max_catch_up_s:
                    self.skipped_sim_s += behind - period
                    t0 += behind - period
                    behind = period
                if behind > 0:
                    self.step_for(behind)
                self._check_daemon(ep, now)
                self._check_task(ep)
                frames = self.render() if not self._daemon_was_stale else {}  # nobody listening: save the CPU
                capture_s = time.monotonic()
                self._send_states(ep)
                for name, pixels in frames.items():
                    ep.send_frame(name, self._frame_seq, capture_s, pixels, self.cfg.jpeg_quality)
                self._frame_seq += 1
                self.ticks += 1
                clock.advance()
                self.overruns = clock.overruns
        finally:
            self._serving = False
            self._fail_calls()
            self.close_renderer()
            ep.close()
            self.endpoint = None

    def _send_states(self, ep: SimServerEndpoint) -> None:
        """Each arm's state to the daemon link driving it (one arm: the one daemon)."""
        for a in self.arms.values():
            ep.send_state(
                self.joint_units(a.name),
                sim_time_s=self.data.time,
                torque=a.torque,
                ack_seq=a.ack_seq,
                ack_sent_s=a.ack_sent_s,
                vel_units=self.joint_velocity_units(a.name),
                effort=self.effort_pct(a.name),
                arm=a.name,
            )

    def _apply(self, inbox: ServerInbox) -> None:
        """What one arm's daemon link sent. Its targets and torque move that arm only; an episode
        command (whichever arm's link sends it) acts on the one scene, and its events reach every
        arm's link (``SimServerEndpoint.send_event``), so each link sees the scene reset."""
        a = self.arm(inbox.arm)
        if inbox.torque is not None:
            self.set_torque(inbox.torque, a.name)
        if inbox.target_units is not None and inbox.target_seq != a.ack_seq:
            if a.torque:
                self.set_target_units(inbox.target_units, a.name)
            a.ack_seq = inbox.target_seq
            a.ack_sent_s = inbox.target_sent_s
        ep = self.endpoint
        for cmd in inbox.episode_cmds:
            self.episode_seq = cmd["seq"]
            if cmd["cmd"] == "reset":
                self.reset_scene(cmd.get("seed"))
                self.episode_active = False
                if ep is not None:
                    self._send_states(ep)  # the reset pose reaches the daemon before reset_done does
                    ep.send_event("reset_done", seq=self.episode_seq)
            elif cmd["cmd"] == "start":
                self.episode_active = True
                self._success_sent = self._terminated_sent = False
                if ep is not None:
                    ep.send_event("started", seq=self.episode_seq)
            elif cmd["cmd"] == "stop":
                self.episode_active = False
                if ep is not None:
                    ep.send_event("stopped", seq=self.episode_seq)

    def _check_daemon(self, ep: SimServerEndpoint, now: float) -> None:
        """An arm whose daemon link went silent holds its measured pose (the other keeps its targets)."""
        for a in self.arms.values():
            stale = ep.daemon_stale(now, a.name)
            who = f"daemon link of arm {a.name!r}" if a.name else "daemon"
            if stale and not a.daemon_was_stale:
                log.warning(
                    "%s silent for more than %.0f ms: holding the current pose", who, self.cfg.daemon_staleness_s * 1000
                )
                self.hold(a.name)
            elif not stale and a.daemon_was_stale:
                log.info("%s connected", who)
            a.daemon_was_stale = stale

    def _check_task(self, ep: SimServerEndpoint) -> None:
        if not self._success_sent and self.cube_lifted():
            self._success_sent = True
            ep.send_event("success", f"cube lifted {self.cube_height_m() * 100:.1f} cm", seq=self.episode_seq)
        if not self._terminated_sent and self.cube_lost():
            self._terminated_sent = True
            ep.send_event("terminated", "cube fell off the table", seq=self.episode_seq)

    # -- benchmark helper -----------------------------------------------------------------------
    def measure_real_time_factor(self, frames: int = 90) -> dict[str, float]:
        """Run ``frames`` ticks (physics + cameras) as fast as possible: simulated s / wall s."""
        period = 1.0 / self.cfg.rate_hz
        self.render()
        sim0, t0, c0 = self.data.time, time.perf_counter(), time.process_time()
        render_s = 0.0
        for _ in range(frames):
            self.step_for(period)
            r0 = time.perf_counter()
            self.render()
            render_s += time.perf_counter() - r0
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0  # all threads of this process (llvmpipe's included)
        return {
            "real_time_factor": (self.data.time - sim0) / wall,
            "ms_per_frame": wall / frames * 1000,
            "render_ms_per_frame": render_s / frames * 1000,
            # what the work costs in CPU time: the real-time factor on an otherwise idle machine
            "cpu_ms_per_frame": cpu / frames * 1000,
            "real_time_factor_cpu": (self.data.time - sim0) / max(cpu, 1e-9),
        }
