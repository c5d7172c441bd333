"""The daemon object: configuration -> arms -> control loop -> control socket (-> recorder, policy,
notifier), with start/stop. `so101d run` and `so101d demo` use it; tests run it in-process.

Others plug in through ``Daemon.context`` (daemon/service/context.py: configuration, arms, loop,
control socket registry, cameras, shutdown lists), by declared seams only:
- ``make_follower(cfg)``: the follower factory; the sim bridge adds kind "sim".
- ``context.server.register(verb, handler)``: recording and policy add their socket verbs.
- ``context.loop.add_hook(obj)``: a ``CycleHook`` (recorder) or ``LeaderHook`` (remote-leader
  publisher), daemon/control/seams.py.
- ``context.loop.policy_source``: the policy's ``TargetSource`` for mode ``policy``.
- ``context.cameras``: the daemon's cameras, shared by the recorder and the policy.
- ``context.on_stop``: callables run on shutdown before the follower is released (episode save).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from calibration.calibration_file import ArmCalibration, CalibrationError, load_calibration
from daemon.api.server import ControlServer, RequestError
from daemon.config.settings import ARM_SIDES, Config
from daemon.control.loop import ControlLoop
from daemon.service.attach_replay import SOURCE_NAME as REPLAY_SOURCE
from daemon.service.cameras import DaemonCameras, cameras_status
from daemon.service.client_arm import attach_client_arms
from daemon.service.console_verbs import attach_console_api
from daemon.service.context import DaemonContext, EpisodeRecorder, PolicyHandle, StatusExtra
from daemon.service.leisaac_remote_leader import LeisaacRemoteLeaderPublisher, RemoteLeaderHook
from daemon.service.rerun_child import RerunChild
from daemon.system.realtime import lock_memory
from daemon.system.sd_notify import Notifier, ServiceStatus, StatusReporter, WatchdogGate
from daemon.system.terminal import TerminalWatch, helpers_shielded
from drivers.arm_interface import FollowerArm, LeaderArm
from drivers.feetech_arm import FollowerBusConfig
from drivers.signal_wake import SignalWake

log = logging.getLogger("so101d.daemon")


EXIT_DATA_LOST = 3  # run_forever's exit code when data was lost (see Daemon.data_lost)
RECORDING_DISABLED = (
    "recording is disabled in this daemon; enable it with [recording] enabled = true "
    "in the configuration (or so101d demo --record N) and restart it"
)


class StartupError(RuntimeError):
    """The daemon cannot start with this configuration (missing calibration, socket in use...)."""


# What a bimanual daemon does not do yet, refused before any port opens rather than done for one
# arm of the two (the verbs are answered with BIMANUAL_NOT_YET, see _attach_optional).
BIMANUAL_NOT_YET = (
    "not built for two arms yet: a bimanual daemon teleoperates and records both pairs and runs a "
    "policy trained on both; replay and the LeIsaac remote leader run on a single pair for now"
)


def _refuse_unbuilt_bimanual(cfg: Config) -> None:
    if cfg.leisaac_remote_leader.enabled:
        raise StartupError(
            f"[leisaac_remote_leader] enabled with [arms.left] / [arms.right]: the remote leader is {BIMANUAL_NOT_YET}"
        )


# -------------------------------------------------------------------------------------------------
# factories
# -------------------------------------------------------------------------------------------------
def load_arm_calibration(cfg: Config, role: str, arm_id: str = "", key: str = "") -> ArmCalibration:
    """The calibration of the ``role`` arm ``arm_id`` (default: [leader] / [follower] id); ``key``
    names the arm in the error (default: the role)."""
    arm_id = arm_id or (cfg.leader.id if role == "leader" else cfg.follower.id)
    try:
        return load_calibration(role, arm_id, cfg.calibration_root())  # type: ignore[arg-type]
    except CalibrationError as exc:
        raise StartupError(f"{key or role}: {exc}") from exc


def make_leader(cfg: Config, side: str = "") -> LeaderArm:
    """The leader arm (a FeetechLeader on ``leader.port``, or on ``arms.<side>.leader_port`` of a
    bimanual configuration), not yet connected."""
    from drivers.feetech_arm import (
        FeetechLeader,
        LeaderBusConfig,
    )

    port, arm_id = (cfg.arms[side].leader_port, cfg.arms[side].leader_id) if side else (cfg.leader.port, "")
    cal = load_arm_calibration(cfg, "leader", arm_id, f"arms.{side}.leader" if side else "")
    return FeetechLeader(port, cal, LeaderBusConfig(baudrate=cfg.leader.baudrate))


def follower_bus_config(cfg: Config) -> FollowerBusConfig:
    """The driver's FollowerBusConfig from [follower] (gripper protection limits)."""
    return FollowerBusConfig(
        baudrate=cfg.follower.baudrate,
        gripper_max_torque_limit=cfg.follower.gripper_max_torque_limit,
        gripper_protection_current=cfg.follower.gripper_protection_current,
        gripper_overload_torque=cfg.follower.gripper_overload_torque,
    )


def make_follower(cfg: Config, side: str = "") -> FollowerArm:
    """The follower arm for ``follower.kind`` (on ``arms.<side>.follower_port`` of a bimanual
    configuration; with kind "sim", the arm ``side`` of the two-arm sim at ``follower.endpoint``),
    not yet connected."""
    kind = cfg.follower.kind
    if kind == "feetech":
        from drivers.feetech_arm import FeetechFollower

        port, arm_id = (cfg.arms[side].follower_port, cfg.arms[side].follower_id) if side else (cfg.follower.port, "")
        cal = load_arm_calibration(cfg, "follower", arm_id, f"arms.{side}.follower" if side else "")
        return FeetechFollower(port, cal, follower_bus_config(cfg))
    if kind == "sim":
        from drivers.sim_follower import SimFollower

        # the mapping is named in every sim episode's tag notes (daemon/data/sim_episodes.py)
        return SimFollower(
            cfg.follower.endpoint,
            staleness_s=cfg.follower.stale_timeout_s,
            sim_mapping=cfg.follower.sim_mapping,
            arm=side,
        )
    raise StartupError(f"follower.kind: {kind!r} is not available in this build")


def mapped_leader(leader: LeaderArm, cfg: Config) -> LeaderArm:
    """The leader as the sim follower sees it under ``[follower] sim_mapping`` (see
    ``drivers.leader_mapping``); its calibration is the leader's own."""
    from drivers.leader_mapping import LeisaacMappedLeader

    cal = leader.calibration or load_arm_calibration(cfg, "leader")
    return LeisaacMappedLeader(leader, cal, cfg.follower.sim_mapping)


def build_loop(
    cfg: Config, leader: LeaderArm | None = None, follower: FollowerArm | None = None, *, free_run: bool = False
) -> ControlLoop:
    """The control loop over the configured arms (not started): one pair, or a bimanual rig's two
    ([arms.left] the primary, then [arms.right], LeRobot's order; each follower driven by its own
    leader). ``leader`` / ``follower``: the (primary) pair's arms instead of the configured ones."""
    first = ARM_SIDES[0] if cfg.bimanual else ""
    the_leader = leader if leader is not None else make_leader(cfg, first)
    mapped = cfg.follower.kind == "sim" and cfg.follower.sim_mapping != "degrees"
    if mapped and the_leader is not None:
        the_leader = mapped_leader(the_leader, cfg)
    the_follower = follower if follower is not None else make_follower(cfg, first)
    if not first:
        return ControlLoop(the_leader, the_follower, cfg, free_run=free_run)
    loop = ControlLoop(
        the_leader, the_follower, cfg, free_run=free_run, primary_name=first, leader_name=f"{first}_leader"
    )
    for side in ARM_SIDES[1:]:
        side_leader = make_leader(cfg, side)
        loop.add_leader(f"{side}_leader", mapped_leader(side_leader, cfg) if mapped else side_leader)
        loop.add_arm(side, make_follower(cfg, side), source=f"{side}_leader")
    return loop


__all__ = ["Daemon", "RemoteLeaderHook", "StartupError", "build_loop", "make_follower", "make_leader"]


# -------------------------------------------------------------------------------------------------
# the daemon
# -------------------------------------------------------------------------------------------------
class Daemon:
    def __init__(
        self,
        cfg: Config,
        leader: LeaderArm | None = None,
        follower: FollowerArm | None = None,
        *,
        notifier: Notifier | None = None,
        socket_path: str | None = None,
        config_path: str | None = None,
        rerun: str | None = None,
    ) -> None:
        if cfg.bimanual:
            _refuse_unbuilt_bimanual(cfg)
        self.config_path = config_path  # re-read on SIGHUP
        # a Rerun viewer's HOST:PORT from --rerun, kept apart from cfg so a reload of the file does
        # not report it as a change; else [display] rerun (daemon/service/rerun_child.py)
        self.rerun_address = rerun
        self.reloads = 0
        self._reload_requested = threading.Event()
        loop = build_loop(cfg, leader, follower)
        the_leader = loop.leader_link.arm if loop.leader_link is not None else None
        the_follower = loop.primary.link.arm
        self.socket_path = socket_path or cfg.socket.resolved_path()
        self.context = DaemonContext(
            cfg=cfg,
            leader=the_leader,
            follower=the_follower,
            loop=loop,
            server=ControlServer(self.socket_path, cfg.socket.mode, cfg.socket.max_request_bytes),
            cameras=DaemonCameras(cfg.cameras, the_follower),
        )
        # the daemon's cameras stop with it, after the recorder and the policy let go of them
        self.context.after_stop.append(self.context.cameras.stop)
        # per camera: device, format, configured vs measured fps, dropped frames, newest frame's age
        self.context.status_extras["cameras"] = lambda: cameras_status(self.context.cameras.built())
        self.notifier = notifier
        self.remote_leader: LeisaacRemoteLeaderPublisher | None = None  # when [leisaac_remote_leader] enabled
        self.rerun: RerunChild | None = None  # the Rerun streamer process, when one is asked for
        self._stop = threading.Event()
        self._wake: SignalWake | None = None  # while run_forever runs: wakes its wait at once
        # the terminal as it is now, before run_forever takes SIGHUP over (nohup's SIG_IGN is seen):
        # a later SIGHUP is a reload, or the terminal gone
        self._terminal: TerminalWatch | None = TerminalWatch.at_start()
        self._started = False
        self._ready_sent = False
        self._reporter: StatusReporter | None = None  # systemd STATUS= lines, made on the first tick
        self._register_verbs()

    # ---------------------------------------------------------------- the context's parts
    # (the daemon's own names for them: `so101d demo`, the tests and the benches use these)
    @property
    def cfg(self) -> Config:
        return self.context.cfg

    @cfg.setter
    def cfg(self, cfg: Config) -> None:
        self.context.cfg = cfg

    @property
    def leader(self) -> LeaderArm | None:
        return self.context.leader

    @property
    def follower(self) -> FollowerArm:
        return self.context.follower

    @property
    def loop(self) -> ControlLoop:
        return self.context.loop

    @property
    def server(self) -> ControlServer:
        return self.context.server

    @property
    def on_stop(self) -> list[Callable[[], None]]:
        """Run before the loop stops (save an episode...)."""
        return self.context.on_stop

    @property
    def after_stop(self) -> list[Callable[[], None]]:
        """Run after the loop stopped (close publishers...)."""
        return self.context.after_stop

    @property
    def status_extras(self) -> dict[str, StatusExtra]:
        return self.context.status_extras

    @property
    def data_lost(self) -> list[str]:
        """What a stop hook could not keep (e.g. recorded episodes never written): logged, and the
        exit code of run_forever becomes EXIT_DATA_LOST so systemd shows the unit failed."""
        return self.context.data_lost

    @property
    def recorder(self) -> EpisodeRecorder | None:
        return self.context.recorder

    @recorder.setter
    def recorder(self, rec: EpisodeRecorder | None) -> None:
        self.context.recorder = rec

    @property
    def policy(self) -> PolicyHandle | None:
        return self.context.policy

    @policy.setter
    def policy(self, ctl: PolicyHandle | None) -> None:
        self.context.policy = ctl

    # ---------------------------------------------------------------- verbs
    def _register_verbs(self) -> None:
        reg = self.server.register
        reg("status", lambda req: self.status())
        reg("config.reload", lambda req: {"message": self.reload()})
        reg("teleop.start", lambda req: self._teleop_start())
        reg("teleop.stop", lambda req: self._hold_call("teleop stopped: holding"))
        reg("hold", lambda req: self._hold_call("holding"))
        reg("idle", lambda req: self._loop_call(lambda: self.loop.set_intent("idle"), "idle"))
        reg("torque.on", lambda req: self._loop_call(lambda: self.loop.set_torque_wanted(True), "torque on"))
        reg("torque.off", lambda req: self._loop_call(lambda: self.loop.set_torque_wanted(False), "torque off (idle)"))
        # the browser console's verbs: camera.list, camera.preview, status.live
        attach_console_api(self.context)
        # arm.acquire / action / observe / release: an outside client (LeRobot's tools) drives an arm
        attach_client_arms(self.context)

    def _teleop_words(self) -> str:
        """What teleop.start resumes: each arm follows its assigned source (an arm lent to a LeRobot
        tool follows that client, not the leader)."""
        others = {a.name: a.source_name for a in self.loop.arms if a.source_name != a.teleop_source}
        if not others:
            return "teleop: aligning, then following the leader" + ("s" if len(self.loop.arms) > 1 else "")
        named = ", ".join(f"{arm} follows its source {src!r}" for arm, src in sorted(others.items()))
        return f"teleop: aligning, then tracking ({named})"

    def _loop_call(self, fn: Callable[[], Any], message: str) -> dict[str, Any]:
        try:
            self.loop.call(fn, timeout_s=3.0)
            # the mode the change led to: read at the start of the following cycle
            mode = self.loop.call(lambda: self.loop.state.mode, timeout_s=3.0)
        except (ValueError, RuntimeError) as exc:
            raise RequestError(str(exc)) from None
        except TimeoutError:
            raise RequestError("control loop did not answer within 3 s") from None
        waiting = self.loop.follower_link.waiting_text(time.monotonic())
        if mode == "disconnected" and waiting:
            # accepted with no fault latched (a lost port): the loop carries it out once the arm is back
            message = f"{message}, once the follower is back ({waiting})"
        return {"message": message, "mode": mode}

    def _teleop_start(self) -> dict[str, Any]:
        # a replay keeps the follower (set_intent leaves an arm on a source of its own): "following
        # the leader" would not be so until the episode ended, and then the arm holds
        replaying = [a.name for a in self.loop.arms if a.source_name == REPLAY_SOURCE]
        if replaying:
            raise RequestError(
                f"teleop.start refused: a replay drives the {', '.join(replaying)} (replay.stop or hold first)"
            )
        return self._loop_call(lambda: self.loop.set_intent("teleop"), self._teleop_words())

    def _hold_call(self, held: str) -> dict[str, Any]:
        """Ask for hold and say what came of it: ``held`` only when the arm is held."""
        reply = self._loop_call(lambda: self.loop.set_intent("hold"), held)
        reply["message"] = self._hold_outcome(str(reply["mode"]), held)
        return reply

    def _hold_outcome(self, mode: str, held: str) -> str:
        if mode == "hold":
            return held
        if not self.loop.torque_wanted:
            # torque.off stays off until asked for: hold does not stiffen a limp arm by itself
            return f"torque is off; {mode}: nothing holds the arm (torque.on holds it where it is)"
        return f"not holding: the arm is in {mode} ({self.loop.state.reason})"

    def status(self) -> dict[str, Any]:
        st = self.loop.status()
        st["socket"] = self.socket_path
        st["config"] = self.config_path
        st["reloads"] = self.reloads
        st["verbs"] = self.server.verbs()
        st["control_socket"] = self.server.health()
        for name, fn in list(self.status_extras.items()):
            try:
                st[name] = fn()
            except Exception as exc:
                st[name] = {"error": f"{type(exc).__name__}: {exc}"}
        return st

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.notifier is not None and self.cfg.service.watchdog:
            gate = WatchdogGate(self.notifier)
            if gate.enabled:
                self.loop.watchdog = gate
        if self.cfg.service.lock_memory:
            res = lock_memory()  # logs its own warning (with the fix) when it fails
            if res.locked:
                log.info("service.lock_memory: %s", res.detail)
        try:
            self._attach_optional()
            self.server.start()
            try:
                self.loop.start()
            except Exception:
                self.server.stop()
                raise
        except BaseException:
            # what started before the failure (recorder's writer and shared memory, policy worker)
            # is stopped here: nobody else would, and a live writer would keep the exit waiting
            self._run_hooks(self.on_stop + self.after_stop)
            raise
        self._started = True
        self._start_rerun()
        log.info(
            "daemon started: leader %s, follower %s (%s), %.0f Hz, socket %s",
            self.leader.port if self.leader is not None else "none",
            self.follower.port,
            self.cfg.follower.kind,
            self.cfg.control.rate_hz,
            self.socket_path,
        )

    def _start_rerun(self) -> None:
        """The Rerun streamer, once the socket it reads answers: its own process, stopped
        before the socket closes; whatever becomes of it, the daemon runs on."""
        address = self.rerun_address or self.cfg.display.rerun
        if not address:
            return
        self.rerun = RerunChild(address, self.socket_path)
        self.on_stop.append(self.rerun.stop)
        self.rerun.start()

    @staticmethod
    def _run_hooks(hooks: list[Callable[[], None]]) -> None:
        for fn in hooks:
            try:
                fn()
            except Exception:
                log.exception("shutdown hook failed")

    def request_stop(self) -> None:
        """Any thread: the running ``run_forever`` stops (never called from a signal handler)."""
        self._stop.set()
        if self._wake is not None:
            self._wake.wake()

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self.notifier is not None:
            self.notifier.stopping()
        for fn in self.on_stop:
            try:
                fn()
            except Exception:
                log.exception("shutdown hook failed")
        self.loop.stop()
        self.server.stop()
        for fn in self.after_stop:
            try:
                fn()
            except Exception:
                log.exception("shutdown hook failed")
        log.info("daemon stopped")

    def _attach_optional(self) -> None:
        """Recorder ([recording] enabled), the foot pedal, the policy, replay and the LeIsaac
        remote-leader publisher, when configured."""
        if self.cfg.recording.enabled and self.recorder is None:
            from daemon.service.attach_recording import attach_recorder

            try:
                self.recorder = attach_recorder(self.context)
            except Exception as exc:
                raise StartupError(f"recording: {exc}") from exc
        # No recorder: `so101d episode ...` / `record` get the reason, not "unknown command"
        # (a recorder attached later registers the real verbs, which take precedence).
        self.server.explain_missing("episode.", RECORDING_DISABLED)
        if self.cfg.pedal.device:
            from daemon.service.pedal import PedalError, attach_pedal

            try:
                attach_pedal(self.context)
            except PedalError as exc:
                raise StartupError(str(exc)) from None
        # the policy: policy.* verbs, `status.policy`, [policy] enabled loads at start (a bimanual
        # rig's: one policy over both arms, daemon/policy/arm_split.py)
        from daemon.service.attach_policy import attach_policy

        if self.policy is None:  # tests may attach their own first
            self.policy = attach_policy(self.context, recorder=self.recorder)
        # --- end of the policy hook
        if self.cfg.bimanual:
            self.server.explain_missing("replay.", f"replay: {BIMANUAL_NOT_YET}")
            return
        from daemon.service.attach_replay import attach_replay

        attach_replay(self.context)  # replay.start / stop / status
        rl = self.cfg.leisaac_remote_leader
        if rl.enabled:
            cal = self.leader.calibration if self.leader is not None else None
            if cal is None:
                raise StartupError("leisaac_remote_leader: the leader has no calibration to normalise with")
            pub = LeisaacRemoteLeaderPublisher(rl.bind)
            try:
                pub.open()
            except Exception as exc:
                raise StartupError(f"leisaac_remote_leader.bind: cannot bind {rl.bind}: {exc}") from exc
            self.remote_leader = pub
            self.loop.add_hook(RemoteLeaderHook(pub, cal, self.leader))
            self.after_stop.append(pub.close)

    def tick(self) -> None:
        """Housekeeping from the main thread (READY / STATUS for systemd): cheap, ~5 Hz."""
        if self.notifier is None:
            return
        links = self.loop.links()
        both = all(link.connected for link in links)
        st = self.loop.state
        # READY=1 once the service can do what it is configured for: arms connected and, with
        # [recording] enabled, the recorder accepting episode.start (its writer process takes
        # seconds to load); `systemctl start so101d && so101d episode start` then just works.
        # A recorder that failed does not hold READY back (teleop works; STATUS/status say why).
        rec = self.recorder
        rec_starting = rec is not None and rec.phase == "starting"
        if not self._ready_sent and both and not rec_starting:
            self.notifier.ready(f"{st.mode}: arms connected" + (", recording ready" if rec is not None else ""))
            self._ready_sent = True
        elif not self._ready_sent:
            missing = [link.name for link in links if not link.connected]
            waiting = [f"waiting for {' and '.join(missing)}"] if missing else []
            if rec_starting:
                waiting.append("recording: starting (dataset writer loading)")
            self.notifier.status("; ".join(waiting))
            return
        reporter = self._reporter
        if reporter is None:
            self._reporter = reporter = StatusReporter(self.notifier)
        period = self.loop.stats.period.summary()
        hz = 1.0 / period.mean if period.mean else None
        episodes, recording, detail = None, False, st.reason
        restarts = self.server.thread_restarts
        if restarts:
            said = f"control socket thread restarted {restarts}x ({self.server.last_thread_failure})"
            detail = f"{detail}; {said}" if detail else said
        if rec is not None:
            try:
                rs = rec.status()
                episodes, recording = int(rs["episodes_in_dataset"]), rs["phase"] == "recording"
                if rs["phase"] == "error":
                    detail = (
                        f"{detail}; recording stopped: {rs['error']}" if detail else f"recording stopped: {rs['error']}"
                    )
            except Exception:
                pass
        reporter.update(ServiceStatus(mode=st.mode, loop_hz=hz, episodes=episodes, recording=recording, detail=detail))

    def reload(self) -> str:
        """Re-read the configuration file; apply the keys that can change live (daemon/config/reload.py),
        keep the rest and say which need a restart. A bad file changes nothing. Returns the summary."""
        if not self.config_path:
            msg = "configuration reload: running on built-in defaults (no --config file); nothing to reload"
            log.warning(msg)
            return msg
        from daemon.config.reload import reload_config
        from daemon.config.settings import ConfigError

        if self.notifier is not None:
            self.notifier.reloading()
        try:
            try:
                applied, plan = reload_config(self.config_path, self.cfg)
            except ConfigError as exc:
                msg = f"configuration reload failed, keeping the running configuration: {exc}"
                log.error(msg)
                return msg
            if plan.live:
                self.loop.call(lambda: self.loop.apply_config(applied), timeout_s=3.0)
                self.cfg = applied
            self.reloads += 1
            msg = plan.summary()
            (log.warning if plan.restart_required else log.info)(msg)
            return msg
        finally:
            if self.notifier is not None:
                self.notifier.ready()

    def hold_from_signal(self) -> None:
        """SIGUSR1 (``systemctl kill --signal=SIGUSR1 so101d``): hold, whatever became of the
        control socket: the stop path that needs no API, only the right to signal the service."""
        try:
            self.loop.call(lambda: self.loop.set_intent("hold"), timeout_s=3.0)
            mode = self.loop.call(lambda: self.loop.state.mode, timeout_s=3.0)
        except (ValueError, RuntimeError, TimeoutError) as exc:
            log.error("SIGUSR1: the control loop did not take the hold: %s", exc)
            return
        log.warning("SIGUSR1: %s (the operator's stop without the control socket)", self._hold_outcome(mode, "holding"))

    def _on_hangup(self) -> None:
        """SIGHUP (main thread): a reload request, or the terminal of a foreground run closing
        (daemon/system/terminal.py: what the terminal looked like is noted when the daemon is made)."""
        term = self._terminal
        if term is None or not term.terminal_lost():
            self._reload_requested.set()
            return
        term.detach_output()  # first: a log line to the dead terminal would fail with EIO
        if term.survive_hangup:
            log.warning("terminal closed; SIGHUP was ignored at start (nohup): running on, output to /dev/null")
            return
        log.warning("terminal closed (SIGHUP, controlling terminal gone): stopping as for SIGTERM")
        self.request_stop()

    def run_forever(self, duration_s: float | None = None, on_tick: Callable[[], None] | None = None) -> int:
        """Start, wait for SIGTERM/SIGINT (or ``duration_s``), stop; SIGHUP reloads. Returns the exit
        code: 0, 1 when the control loop stopped unexpectedly, EXIT_DATA_LOST when data was lost."""
        rc = self._run_until_stopped(duration_s, on_tick)
        if self.data_lost:
            log.error("exiting with code %d: data was lost: %s", EXIT_DATA_LOST, "; ".join(self.data_lost))
            return EXIT_DATA_LOST
        return rc

    def _run_until_stopped(self, duration_s: float | None, on_tick: Callable[[], None] | None) -> int:
        # Signals reach this loop through a self-pipe (drivers/signal_wake.py): a handler that set
        # the stop Event itself could interrupt this very thread inside Event.wait(), holding the
        # Event's lock, and wait for it forever (a closed terminal once left the daemon hanging).
        wake = SignalWake()
        self._wake = wake
        if threading.current_thread() is threading.main_thread():
            wake.install((signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1))
        try:
            with helpers_shielded():  # writer, policy worker, resource tracker: not the terminal's to kill
                self.start()
            end = None if duration_s is None else time.monotonic() + duration_s
            while not self._stop.is_set():
                for sig in wake.wait(0.2):
                    if sig == signal.SIGHUP:
                        self._on_hangup()
                    elif sig == signal.SIGUSR1:
                        self.hold_from_signal()
                    else:
                        self.request_stop()
                if self._stop.is_set():
                    break
                if not self.loop.is_running():
                    log.error("control loop stopped unexpectedly")
                    return 1
                self.server.ensure_serving()  # a control socket that stopped answering answers again
                if self._reload_requested.is_set():
                    self._reload_requested.clear()
                    try:
                        self.reload()
                    except Exception:
                        log.exception("configuration reload failed")
                self.tick()
                if on_tick is not None:
                    on_tick()
                if end is not None and time.monotonic() >= end:
                    break
            return 0
        finally:
            self.stop()
            self._wake = None
            wake.close()
