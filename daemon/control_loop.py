"""The control loop: one thread that owns the period and the follower's bus.

Per cycle (read -> update -> write, ros2_control style):

1. start the leader read on the leader's worker thread (``overlap_io``; two serial ports, and
   pyserial releases the GIL while it waits on the wire) and, meanwhile, read the follower's
   measured pose on this thread: that pose is the cycle's observation (LeRobot's order:
   observation, then action);
2. collect the leader's reading (waiting at most until the middle of the period: a slow or dead
   leader never stalls the follower; the previous reading ages instead and goes stale);
3. ``safety.update`` (pure) decides the mode and the command;
4. write the follower (torque changes first, with the measured pose as goal so enabling torque
   never jumps);
5. hooks (recorder, remote-leader publisher: microseconds each), and in the slack before the next
   deadline, the follower's health registers every ``health_period_s``.

Timing: deadlines on the monotonic clock (``next += period``: no drift); sleep until ~0.3 ms
before the deadline, then spin. A cycle that ends after its deadline is an overrun, counted and
logged (rate-limited); if it ran more than a whole period late, the missed periods are skipped and
counted too (never silently absorbed). Per-stage times go to ``daemon.stats.LoopStats``.

Arms come and go: each arm sits in an ``ArmLink``; a lost port (PortGoneError, or failures that
last) hands the arm to a reconnect thread with exponential backoff, and the loop keeps running
(the follower holds, or the loop reports ``disconnected``). When the arm is back, alignment starts
again, because the safety state restarts from the measured pose.

Other threads talk to the loop through ``submit(fn)`` (a queue drained at the start of each
cycle; the function runs on the loop thread) and read ``status()`` (a snapshot of plain
attributes and copies, lock-free).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from calibration.conventions import JOINT_NAMES, NUM_JOINTS
from daemon.logs import RateLimitedLogger
from daemon.safety import ControllerState, CycleInputs, CycleOutput, SafetyParams, update
from daemon.stats import LoopStats
from drivers.arm_interface import (
    ArmError,
    ArmHealth,
    FollowerArm,
    HandshakeError,
    LeaderArm,
    OverloadLatchedError,
    PortGoneError,
)
from drivers.sts3215_table import describe_error_bits

log = logging.getLogger("so101d.loop")
_rl = RateLimitedLogger(log, period_s=5.0, burst=3)

_MISSING_FAULT_CYCLES = 3  # consecutive reads with a silent servo before it is a fault
_JOINT_BY_ID = {i + 1: name for i, name in enumerate(JOINT_NAMES)}
_SPIN_S = 0.0003  # sleep until this long before a deadline, then spin (sleep overshoots ~0.1 ms)
_RATE_CHECK_S = 2.0  # how often the loop asks whether its configured rate is achievable at all
_RATE_IMPOSSIBLE = 0.9  # median cycle work above this share of the period: the rate cannot be held
_LATCHING_BITS = 0x20 | 0x08  # overload, over-current: real servos keep them until a power cycle
_MONO = time.monotonic


class TargetSource(Protocol):
    """Where the loop's target comes from in ``policy`` mode (the leader is built in).

    ``target`` must cost microseconds and never block; None means "nothing fresh": the loop holds.
    """

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None: ...


class CycleHook(Protocol):
    """Called every cycle with the follower's measured state, the command sent and the raw target.

    Must cost microseconds and never block; it may keep the arrays (they are not reused).
    """

    def on_cycle(
        self, now_monotonic_s: float, state_units: np.ndarray, action_units: np.ndarray, teleop_action_units: np.ndarray
    ) -> None: ...


# -------------------------------------------------------------------------------------------------
# arm links: connection state + reconnect with backoff
# -------------------------------------------------------------------------------------------------
class ArmLink:
    """One arm and whether the loop may use it.

    While ``connected`` is False the arm belongs to the (re)connect thread; the loop touches it only
    when ``connected`` is True. ``lost()`` is called by whoever saw it fail.
    """

    def __init__(
        self,
        name: str,
        arm: Any,
        backoff_min_s: float,
        backoff_max_s: float,
        on_connect: Callable[[Any], None] | None = None,
    ) -> None:
        self.name = name
        self.arm = arm
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self.on_connect = on_connect
        self.connected = False
        self.connects = 0  # successful connects (first one included)
        self.losses = 0
        self.last_error = ""
        self.handshake_fault = ""  # set while (re)connecting fails because servos are missing or wrong
        self.since_s = _MONO()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._spawn(first=True)

    def lost(self, reason: str) -> None:
        if not self.connected:
            return
        self.connected = False
        self.losses += 1
        self.last_error = reason
        self.since_s = _MONO()
        _rl.error(f"lost.{self.name}", "%s lost: %s; retrying with backoff", self.name, reason)
        self._spawn(first=False)

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)

    def _spawn(self, first: bool) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._connect_loop, args=(first,), name=f"so101d-connect-{self.name}", daemon=True
            )
            self._thread.start()

    def _connect_loop(self, first: bool) -> None:
        """First start: connect(); after a loss: reconnect() when the arm has one, else close + connect."""
        delay = self.backoff_min_s
        while not self._stop.is_set():
            try:
                if not first and hasattr(self.arm, "reconnect"):
                    # one attempt per try: the backoff lives here, not in the driver
                    if "timeout_s" in inspect.signature(self.arm.reconnect).parameters:
                        self.arm.reconnect(timeout_s=0.0)
                    else:
                        self.arm.reconnect()
                else:
                    if not first:
                        try:
                            self.arm.close()
                        except Exception:
                            pass
                    self.arm.connect()
                if self.on_connect is not None:
                    self.on_connect(self.arm)
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                # Some servos answer but not all (or a wrong model): that arm has a fault, not
                # just a missing cable. Nothing answering at all is a port/power matter.
                if isinstance(exc, HandshakeError) and "ids answering: none" not in str(exc):
                    self.handshake_fault = str(exc)
                _rl.warning(
                    f"connect.{self.name}",
                    "%s: cannot connect (%s); next try in %.1f s",
                    self.name,
                    self.last_error,
                    delay,
                )
                if first:
                    try:
                        self.arm.close()
                    except Exception:
                        pass
                if self._stop.wait(delay):
                    return
                delay = min(self.backoff_max_s, delay * 2)
                continue
            self.connects += 1
            self.last_error = ""
            self.handshake_fault = ""
            self.since_s = _MONO()
            self.connected = True
            log.info("%s connected%s", self.name, "" if self.connects == 1 else " again")
            return


class _LeaderWorker:
    """Reads the leader on its own thread when triggered, so its bus time overlaps the follower's."""

    def __init__(self, read: Callable[[], None], on_start: Callable[[], None] | None = None) -> None:
        self._read = read
        self._on_start = on_start
        self._go = threading.Event()
        self.done = threading.Event()
        self.done.set()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="so101d-leader-read", daemon=True)
        self._thread.start()

    def trigger(self) -> bool:
        """Start a read unless the previous one is still running; True if started."""
        if not self.done.is_set():
            return False
        self.done.clear()
        self._go.set()
        return True

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        while True:
            self._go.wait()
            self._go.clear()
            if self._stop:
                return
            try:
                self._read()
            finally:
                self.done.set()

    def stop(self) -> None:
        self._stop = True
        self._go.set()
        self._thread.join(timeout=2.0)


# -------------------------------------------------------------------------------------------------
# the loop
# -------------------------------------------------------------------------------------------------
def describe_faults(health: ArmHealth, fault_bits: int, max_temperature_c: float) -> str:
    """A one-line fault description from a health reading, or "" when healthy."""
    parts: list[str] = []
    if health.missing:
        parts.append(f"servo(s) not answering: {', '.join(health.missing)}")
    for name, h in health.servos.items():
        bits = h.status_bits & fault_bits
        if bits:
            parts.append(f"{name}: {', '.join(describe_error_bits(bits))} (status 0x{h.status_bits:02x})")
        if h.temperature_c > max_temperature_c:
            parts.append(f"{name}: {h.temperature_c:.0f} C > {max_temperature_c:.0f} C")
    return "; ".join(parts)


class ControlLoop:
    """Runs the cycle described in the module docstring on its own thread (``start``/``stop``).

    ``leader`` may be None (policy-only or sim-only setups); ``follower`` is required.
    """

    def __init__(
        self,
        leader: LeaderArm | None,
        follower: FollowerArm,
        cfg: Any,
        *,
        free_run: bool = False,
        spin_s: float = _SPIN_S,
    ) -> None:
        """``cfg`` is a ``daemon.config.Config``; ``free_run`` drops the sleep (benchmarks)."""
        self.cfg = cfg
        self.period_s = 1.0 / cfg.control.rate_hz
        self.free_run = free_run
        self.spin_s = spin_s
        self.overlap_io = cfg.control.overlap_io
        self.stats = LoopStats()
        c = cfg.control
        self.leader_link = (
            ArmLink("leader", leader, c.reconnect_backoff_min_s, c.reconnect_backoff_max_s)
            if leader is not None
            else None
        )
        self.follower_link = ArmLink(
            "follower",
            follower,
            c.reconnect_backoff_min_s,
            c.reconnect_backoff_max_s,
            on_connect=self._follower_connected,
        )
        self.follower_kind = getattr(follower, "kind", "?")
        self.params: SafetyParams | None = None
        self.state = ControllerState()
        # operator intent, changed only on the loop thread (through submit)
        self.intent: str = cfg.control.start_mode
        self.torque_wanted = True
        self._clear_fault = False
        self.policy_source: TargetSource | None = None
        # latest readings
        self.leader_units: np.ndarray | None = None
        self.leader_read_at_s = -math.inf
        self._last_leader_seen_s = -math.inf
        self.measured: np.ndarray | None = None
        self.measured_at_s = -math.inf
        self.target: np.ndarray | None = None
        self.command: np.ndarray | None = None
        self.health: ArmHealth | None = None
        self.fault_now = ""
        # A latched overload the re-arm could not clear: the operator must cycle the arm's power.
        # Set by _recover_fault, cleared when the health read shows the latch gone (power cycled);
        # the next re-arm then configures the servos again (a power cycle reset their SRAM).
        self.power_cycle_required = ""
        self._scene_resets_seen = -1  # the follower's scene-reset count at the last read (-1: none yet)
        self._realign_pending = False  # a scene reset moved the follower: re-align next update
        self._reconfigure = False
        self.rate_warning = ""  # set when the adapters make the configured rate impossible
        self._next_rate_check_s = 0.0
        self._next_health_s = 0.0
        self._health_cost_s = 0.005
        # counters
        self.cycles = 0
        self.overruns = 0
        self.missed_cycles = 0
        self.limited_cycles = 0
        self.limit_hits = np.zeros(NUM_JOINTS, dtype=np.int64)  # cycles whose target lay outside a joint's limits
        self.leader_errors = 0
        self.follower_errors = 0
        self.hook_errors = 0
        self._follower_fail_since: float | None = None
        self._missing_streak = 0
        self._leader_fail_since: float | None = None
        self.started_at_s = _MONO()
        self._prev_cycle_s: float | None = None
        # plumbing
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._hooks: list[Callable[[float, np.ndarray, np.ndarray, np.ndarray], None]] = []
        self._leader_hooks: list[Callable[[float, np.ndarray], None]] = []
        self.watchdog: Any = None  # daemon.sd_notify.WatchdogGate (progress(now, healthy))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: _LeaderWorker | None = None
        self.stopped = threading.Event()

    # ------------------------------------------------------------------ plumbing for others
    def add_hook(self, hook: Any) -> None:
        """Register an object with ``on_cycle(now, state, action, teleop_action)`` and/or
        ``on_leader(now, leader_units)`` (called after each fresh leader reading)."""
        if hasattr(hook, "on_cycle"):
            self._hooks.append(hook.on_cycle)
        if hasattr(hook, "on_leader"):
            self._leader_hooks.append(hook.on_leader)
        if not hasattr(hook, "on_cycle") and not hasattr(hook, "on_leader"):
            raise TypeError(f"{hook!r} has neither on_cycle nor on_leader")

    def remove_hook(self, hook: Any) -> None:
        for lst, attr in ((self._hooks, "on_cycle"), (self._leader_hooks, "on_leader")):
            fn = getattr(hook, attr, None)
            if fn is not None and fn in lst:
                lst.remove(fn)

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the loop thread at the start of the next cycle; its result in the Future."""
        fut: Future = Future()
        if not self.is_running():
            fut.set_exception(RuntimeError("control loop is not running"))
            return fut
        self._commands.put((fn, fut))
        return fut

    def call(self, fn: Callable[[], Any], timeout_s: float = 2.0) -> Any:
        return self.submit(fn).result(timeout=timeout_s)

    # ------------------------------------------------------------------ operator actions (loop thread)
    def set_intent(self, intent: str) -> None:
        """idle, hold, teleop or policy. Tracking intents clear a latched fault if it is gone."""
        if intent not in ("idle", "hold", "teleop", "policy"):
            raise ValueError(f"unknown mode {intent!r}")
        if intent == "policy" and self.policy_source is None:
            raise ValueError("no policy loaded")
        if intent in ("teleop", "policy"):
            self.torque_wanted = True
            if self.state.fault:
                self._recover_fault()
        self.intent = intent

    def set_torque_wanted(self, on: bool) -> None:
        if not on:
            self.intent = "idle"
        elif self.state.fault:
            self._recover_fault()
        self.torque_wanted = on

    def _recover_fault(self) -> None:
        """Re-arm the follower after a fault (servos that cut torque need Torque_Enable again),
        re-read its health, and let the next update clear the latch if the fault is gone."""
        link = self.follower_link
        if not link.connected:
            raise RuntimeError("follower not connected")
        arm = link.arm
        try:
            self._reconfigure_if_needed(arm)
        except ArmError as exc:
            raise RuntimeError(f"cannot configure the follower after its power cycle: {exc}") from exc
        for attempt in range(3):  # a noisy bus may drop one of these few transactions: try again
            try:
                pose = arm.read_joints()
                if self.params is not None:
                    pose = np.clip(pose, self.params.lower, self.params.upper)
                arm.write_goals(pose)
                arm.set_torque(True)
                # torque is back at the present pose: a fault that persists must hold *this* pose,
                # not the one captured when it began (a joint may have moved while limp)
                from dataclasses import replace

                self.state = replace(self.state, torque_on=True, hold_pose=pose, command=pose)
                self._read_health(_MONO())
                break
            except PortGoneError as exc:
                raise RuntimeError(f"cannot re-arm the follower: {exc}") from exc
            except OverloadLatchedError as exc:
                # Not a bus hiccup and not cleared by another torque write: say exactly what helps.
                self.power_cycle_required = str(exc)
                self.fault_now = str(exc)
                log.error("FOLLOWER FAULT: %s (waiting for the power cycle)", exc)
                raise RuntimeError(str(exc)) from exc
            except ArmError as exc:
                if attempt == 2:
                    raise RuntimeError(f"cannot re-arm the follower: {exc}") from exc
        if self.fault_now:
            raise RuntimeError(f"fault still present: {self.fault_now}")
        self._clear_fault = True

    def _reconfigure_if_needed(self, arm: Any) -> None:
        """After a power cycle the servos' SRAM (Acceleration, Torque_Limit, Lock) is at its
        power-on values: configure again before torque goes on."""
        if self._reconfigure and hasattr(arm, "configure"):
            arm.configure()
            self._reconfigure = False
            log.info("follower configured again after its power cycle")

    def apply_config(self, cfg: Any) -> None:
        """Swap in a reloaded configuration (loop thread, between cycles). Only keys that are read
        live take effect (daemon/reload.py decides which; the rest kept their running values)."""
        self.cfg = cfg
        if self.params is not None:
            self.params = SafetyParams.from_config(cfg.safety, self.params.lower, self.params.upper, self.period_s)
        for link in (self.leader_link, self.follower_link):
            if link is not None:
                link.backoff_min_s = cfg.control.reconnect_backoff_min_s
                link.backoff_max_s = cfg.control.reconnect_backoff_max_s
        self._next_health_s = 0.0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("control loop already started")
        if self.leader_link is not None:
            self.leader_link.start()
            if self.overlap_io:
                self._worker = _LeaderWorker(self._read_leader, on_start=self._set_realtime)
        self.follower_link.start()
        # A thread that wants the GIL waits up to the switch interval (5 ms by default) for the
        # holder to let go: shorten it so a busy side thread (socket, policy, recorder) cannot
        # delay the loop's wake-up by more than a tenth of its period.
        sys.setswitchinterval(min(sys.getswitchinterval(), max(0.0005, self.period_s / 10)))
        self.started_at_s = _MONO()
        self._thread = threading.Thread(target=self._run, name="so101d-control-loop", daemon=True)
        self._thread.start()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop; the follower's torque goes off or holds per ``follower.torque_off_on_shutdown``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        for link in (self.leader_link, self.follower_link):
            if link is not None:
                link.stop()
        if self._worker is not None:
            self._worker.stop()
        self._shutdown_follower()
        bus_cfg = getattr(self.follower_link.arm, "config", None)
        if not self.cfg.follower.torque_off_on_shutdown and hasattr(bus_cfg, "disable_torque_on_close"):
            # hold on shutdown: the driver's close() must not switch the torque off after all
            bus_cfg.disable_torque_on_close = False
        for link in (self.leader_link, self.follower_link):
            if link is not None:
                try:
                    link.arm.close()
                except Exception as exc:
                    log.warning("%s: close failed: %s", link.name, exc)
        self.stopped.set()

    def _shutdown_follower(self) -> None:
        link = self.follower_link
        if not link.connected:
            return
        try:
            if self.cfg.follower.torque_off_on_shutdown:
                link.arm.set_torque(False)
                log.info("follower torque off (shutdown)")
            else:
                pose = link.arm.read_joints()
                if self.params is not None and np.all(np.isfinite(pose)):
                    link.arm.write_goals(np.clip(pose, self.params.lower, self.params.upper))
                log.info("follower holding its pose (shutdown)")
        except Exception as exc:
            log.error("follower shutdown action failed: %s", exc)

    # ------------------------------------------------------------------ connect callbacks
    def _follower_connected(self, arm: FollowerArm) -> None:
        lower, upper = arm.joint_limits()
        self.params = SafetyParams.from_config(self.cfg.safety, lower, upper, self.period_s)
        self.follower_kind = getattr(arm, "kind", self.follower_kind)
        self._follower_fail_since = None
        self._next_health_s = 0.0

    # ------------------------------------------------------------------ reads
    def _read_leader(self) -> None:
        """Runs on the worker thread (overlap) or the loop thread. Never raises."""
        link = self.leader_link
        assert link is not None
        t0 = _MONO()
        try:
            units = link.arm.read_joints()
        except PortGoneError as exc:
            self.leader_errors += 1
            link.lost(str(exc))
            return
        except ArmError as exc:
            self.leader_errors += 1
            now = _MONO()
            if self._leader_fail_since is None:
                self._leader_fail_since = now
            _rl.warning("leader.read", "leader read failed: %s", exc)
            if now - self._leader_fail_since > 2.0:
                link.lost(f"no valid reply for {now - self._leader_fail_since:.1f} s: {exc}")
                self._leader_fail_since = None
            return
        except Exception as exc:
            self.leader_errors += 1
            log.exception("leader read raised an unexpected error")
            link.lost(f"{type(exc).__name__}: {exc}")
            return
        t1 = _MONO()
        self.stats.leader_read.add(t1 - t0)
        self._leader_fail_since = None
        self.leader_units = units
        self.leader_read_at_s = t1

    def _read_follower(self, now: float) -> None:
        link = self.follower_link
        t0 = _MONO()
        try:
            resets = link.arm.scene_resets()  # before the pose: see FollowerArm.scene_resets
            pose = link.arm.read_joints()
            if resets != self._scene_resets_seen:
                if self._scene_resets_seen >= 0:
                    self._realign_pending = True
                    log.info("follower scene reset: re-aligning from the reset pose")
                self._scene_resets_seen = resets
        except Exception as exc:
            self.follower_errors += 1
            missing = getattr(exc, "missing_ids", None)
            # Some servos silent while others answer: a servo is off the bus. All of them silent is
            # the bus or the port (or a stalled host), handled as a lost link below.
            if missing and len(missing) < len(JOINT_NAMES) and not getattr(exc, "corrupt", False):
                # a servo that stays silent over several cycles is a follower fault (hold or torque
                # off per safety.on_fault), not just a bus hiccup the retries already covered
                self._missing_streak += 1
                if self._missing_streak >= _MISSING_FAULT_CYCLES:
                    names = ", ".join(_JOINT_BY_ID.get(int(i), f"id {i}") for i in missing)
                    fault = f"servo(s) not answering: {names}"
                    if fault != self.fault_now:
                        log.error("FOLLOWER FAULT: %s (reaction: %s)", fault, self.cfg.safety.on_fault)
                    self.fault_now = fault
            gone = isinstance(exc, PortGoneError) or not isinstance(exc, ArmError)
            if self._follower_fail_since is None:
                self._follower_fail_since = now
            failing_s = now - self._follower_fail_since
            _rl.warning("follower.read", "follower read failed: %s", exc)
            if gone or failing_s > max(0.5, self.cfg.safety.leader_stale_s * 5):
                link.lost(f"{type(exc).__name__}: {exc}" if gone else f"no valid reply for {failing_s:.1f} s: {exc}")
                self._follower_fail_since = None
            return
        self.stats.follower_read.add(_MONO() - t0)
        self._follower_fail_since = None
        self._missing_streak = 0
        self.measured = pose
        self.measured_at_s = now

    def _read_health(self, now: float) -> None:
        t0 = _MONO()
        try:
            self.health = self.follower_link.arm.read_health()
        except ArmError as exc:
            self.follower_errors += 1
            _rl.warning("follower.health", "follower health read failed: %s", exc)
            return
        finally:
            self._next_health_s = now + self.cfg.control.health_period_s
        self._health_cost_s = 0.8 * self._health_cost_s + 0.2 * (_MONO() - t0)
        fault = describe_faults(self.health, self.cfg.safety.fault_bits, self.cfg.safety.max_temperature_c)
        if self.power_cycle_required:
            latched = self.health.missing or any(h.status_bits & _LATCHING_BITS for h in self.health.servos.values())
            if latched:
                fault = f"{self.power_cycle_required} ({fault})" if fault else self.power_cycle_required
            else:
                log.warning("follower power cycle seen (%s cleared): resume when ready", self.power_cycle_required)
                self.power_cycle_required = ""
                self._reconfigure = True
        if fault and fault != self.fault_now:
            log.error("FOLLOWER FAULT: %s (reaction: %s)", fault, self.cfg.safety.on_fault)
        elif not fault and self.fault_now:
            log.warning("follower fault gone: %s", self.fault_now)
        self.fault_now = fault

    # ------------------------------------------------------------------ one cycle
    def _drain_commands(self) -> None:
        while True:
            try:
                fn, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

    def cycle(self, now: float) -> None:
        """One control cycle (public so tests and the benchmark can step it)."""
        self._drain_commands()
        stats = self.stats
        leader_link = self.leader_link
        follower_link = self.follower_link
        # 1. leader read (overlapped) + follower read
        worker = self._worker
        started = False
        if leader_link is not None and leader_link.connected:
            if worker is not None:
                started = worker.trigger()
            else:
                self._read_leader()
        if follower_link.connected:
            self._read_follower(now)
        if started and worker is not None:
            # wait for the leader at most until mid-period; if late it keeps running, its value
            # arrives for a later cycle and meanwhile the last reading ages toward stale.
            budget = max(0.0, now + self.period_s * 0.5 - _MONO()) if not self.free_run else 0.05
            worker.done.wait(budget)
        if self.leader_read_at_s > self._last_leader_seen_s:
            self._last_leader_seen_s = self.leader_read_at_s
            lu = self.leader_units
            if lu is not None:
                for fn in self._leader_hooks:
                    try:
                        fn(now, lu)
                    except Exception as exc:
                        self.hook_errors += 1
                        _rl.error("hook.leader", "leader hook failed: %r", exc)
        # 2. update (pure)
        t_u = _MONO()
        # a pose measured before the link's last (re)connect is not this arm's pose any more (the
        # connect thread may flip ``connected`` after this cycle's read was skipped)
        follower_ok = (
            follower_link.connected
            and self.measured is not None
            and self.measured_at_s >= follower_link.since_s
            and (now - self.measured_at_s) <= max(0.5, self.cfg.safety.leader_stale_s * 5)
        )
        if self.intent == "policy":
            src = self.policy_source
            tgt = None
            if src is not None and self.measured is not None:
                try:
                    tgt = src.target(now, self.measured)
                except Exception as exc:
                    self.hook_errors += 1
                    _rl.error("policy.target", "policy target failed (holding): %r", exc)
            target, age, name = tgt, (0.0 if tgt is not None else math.inf), "policy"
        else:
            target, age, name = self.leader_units, now - self.leader_read_at_s, "leader"
        self.target = target
        params = self.params
        if params is None or not follower_ok:
            # a fault seen just before the link went (a servo dropping off the bus) stays latched
            fault = self.state.fault or self.fault_now or follower_link.handshake_fault
            out = CycleOutput(
                ControllerState(
                    mode="disconnected",
                    fault=fault,
                    reason="follower not connected" if not follower_link.connected else "no follower pose",
                ),
                None,
                None,
            )
        else:
            inputs = CycleInputs(
                intent=self.intent,
                torque_wanted=self.torque_wanted,
                follower_ok=True,
                measured=self.measured,
                target=target,
                target_age_s=age,
                fault_now=self.fault_now,
                clear_fault=self._clear_fault,
                target_name=name,
                dt_s=(now - self._prev_cycle_s) if self._prev_cycle_s is not None else None,
                realign=self._realign_pending,
            )
            out = update(self.state, inputs, params)
            self._realign_pending = False
        self._clear_fault = False
        self._prev_cycle_s = now
        prev_mode = self.state.mode
        self.state = out.state
        if out.limited:
            self.limited_cycles += 1
            if target is not None and params is not None and np.shape(target) == (NUM_JOINTS,):
                # which joints the limits clamped (a few microseconds, only on limited cycles)
                self.limit_hits += (target < params.lower) | (target > params.upper)
        t_w = _MONO()
        stats.update.add(t_w - t_u)
        if out.state.mode != prev_mode:
            new = out.state.mode
            lvl = (
                logging.ERROR
                if new == "fault"
                else logging.WARNING
                if new in ("disconnected", "hold") and self.intent != "hold"
                else logging.INFO
            )
            log.log(lvl, "mode %s -> %s (%s)", prev_mode, new, out.state.reason)
        # 3. write
        if follower_link.connected and (out.torque is not None or out.command is not None):
            self._write_follower(out, now)
            if out.torque is None:  # torque switches (rare, several transactions) would skew the goal-write figures
                stats.follower_write.add(_MONO() - t_w)
        self.command = out.command
        # 4. hooks
        if self._hooks and self.measured is not None and follower_ok:
            t_h = _MONO()
            action = out.command if out.command is not None else self.measured
            raw = target if target is not None else action
            for fn in self._hooks:
                try:
                    fn(now, self.measured, action, raw)
                except Exception as exc:
                    self.hook_errors += 1
                    _rl.error("hook.cycle", "cycle hook failed: %r", exc)
            stats.hooks.add(_MONO() - t_h)
        self.cycles += 1

    def _write_follower(self, out: CycleOutput, now: float) -> None:
        arm = self.follower_link.arm
        try:
            if out.torque is True:
                if self.power_cycle_required:
                    # torque writes cannot clear a latched overload: do not hammer the bus
                    raise OverloadLatchedError(self.power_cycle_required)
                self._reconfigure_if_needed(arm)
                # the goal register first, so enabling torque holds the pose instead of jumping
                if self.measured is not None and self.params is not None:
                    arm.write_goals(np.clip(self.measured, self.params.lower, self.params.upper))
                arm.set_torque(True)
                log.info("follower torque on")
            elif out.torque is False:
                arm.set_torque(False)
                log.warning("follower torque off (%s)", out.state.reason)
            if out.command is not None:
                arm.write_goals(out.command)
        except Exception as exc:
            self.follower_errors += 1
            if out.torque is not None:
                self.state = _replace_torque(self.state, None)  # unknown: ask again next cycle
            if isinstance(exc, OverloadLatchedError):
                if self.power_cycle_required != str(exc):
                    log.error("FOLLOWER FAULT: %s (waiting for the power cycle)", exc)
                self.power_cycle_required = self.fault_now = str(exc)
            elif isinstance(exc, PortGoneError) or not isinstance(exc, ArmError):
                self.follower_link.lost(f"{type(exc).__name__}: {exc}")
            else:
                _rl.warning("follower.write", "follower write failed: %s", exc)

    # ------------------------------------------------------------------ thread body
    def _set_realtime(self) -> None:
        prio = self.cfg.control.realtime_priority
        if prio <= 0:
            return
        try:
            # pid 0 = the calling thread on Linux: only the loop thread becomes real-time
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
            log.info("control loop thread: SCHED_FIFO priority %d", prio)
        except (OSError, AttributeError) as exc:
            log.warning(
                "control.realtime_priority = %d: cannot switch to SCHED_FIFO (%s); running with normal priority",
                prio,
                exc,
            )

    def _run(self) -> None:
        self._set_realtime()
        period = self.period_s
        deadline = _MONO()
        last_start: float | None = None
        try:
            while not self._stop.is_set():
                now = self._wait_until(deadline)
                if last_start is not None:
                    self.stats.period.add(now - last_start)
                    self.stats.jitter.add(abs(now - deadline))
                last_start = now
                self.cycle(now)
                end = _MONO()
                self.stats.cycle.add(end - now)
                if self.watchdog is not None:
                    self.watchdog.progress(end, healthy=True)
                if self.free_run:
                    deadline = end
                    if self.follower_link.connected and end >= self._next_health_s:
                        self._read_health(end)
                    continue
                deadline += period
                if end >= self._next_rate_check_s:
                    self._check_rate(end)
                # health in the slack, if it fits (else try again next cycle); once it is a whole
                # period overdue it is read anyway: a fault must never go unseen because the
                # cycles are tight (or because one slow read inflated the cost estimate)
                due = self.follower_link.connected and end >= self._next_health_s
                overdue = end >= self._next_health_s + self.cfg.control.health_period_s
                if due and (deadline - end > 1.5 * self._health_cost_s or overdue):
                    self._read_health(end)
                    end = _MONO()
                if end > deadline:
                    self.overruns += 1
                    late = end - deadline
                    if late > period:
                        skipped = int(late // period)
                        self.missed_cycles += skipped
                        deadline += skipped * period
                    _rl.warning(
                        "overrun",
                        "control cycle overran its period by %.2f ms (%d overruns so far, %d periods skipped)",
                        late * 1000.0,
                        self.overruns,
                        self.missed_cycles,
                    )
        except BaseException:
            log.exception("control loop crashed; follower will be shut down")
            raise
        finally:
            self._stop.set()
            # fail pending commands so no caller waits for ever
            while True:
                try:
                    _, fut = self._commands.get_nowait()
                except queue.Empty:
                    break
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(RuntimeError("control loop stopped"))

    def _check_rate(self, now: float) -> None:
        """Say clearly (status + log) when the arms' round trips make the configured rate
        impossible (an FTDI adapter on its default 16 ms latency timer), and when that passes."""
        self._next_rate_check_s = now + _RATE_CHECK_S
        cycle = self.stats.cycle.summary()
        if cycle.window < 50:
            return
        period_ms = self.period_s * 1000.0
        if cycle.p50 * 1000.0 <= _RATE_IMPOSSIBLE * period_ms:
            if self.rate_warning:
                log.info("control rate achievable again (cycle p50 %.1f ms)", cycle.p50 * 1000.0)
            self.rate_warning = ""
            return
        parts = []
        for link, stage in ((self.follower_link, self.stats.follower_read), (self.leader_link, self.stats.leader_read)):
            if link is None:
                continue
            p50 = stage.summary().p50 * 1000.0
            bus = getattr(link.arm, "bus", None)
            timer = getattr(bus, "latency_timer_ms", None)
            hint = f", FTDI latency_timer {timer} ms" if timer else ""
            parts.append(f"{link.name} reads {p50:.1f} ms (p50{hint})")
        warning = (
            f"{self.cfg.control.rate_hz:g} Hz is impossible here: a cycle takes {cycle.p50 * 1000.0:.1f} ms (p50) of "
            f"its {period_ms:.1f} ms period ({'; '.join(parts)}). On an FTDI adapter set latency_timer to 1 "
            "(the udev rule of `so101d install-service`), or lower control.rate_hz"
        )
        if not self.rate_warning:
            log.warning("%s", warning)
        self.rate_warning = warning

    def _wait_until(self, deadline: float) -> float:
        if self.free_run:
            return _MONO()
        now = _MONO()
        remaining = deadline - now
        # wake early on stop so shutdown is prompt
        if remaining > self.spin_s and self._stop.wait(remaining - self.spin_s):
            return _MONO()
        now = _MONO()
        while now < deadline:
            now = _MONO()
        return now

    # ------------------------------------------------------------------ status (any thread)
    def _fault_text(self, fault: str) -> str:
        """The fault as the operator must read it: a needed power cycle first."""
        need = self.power_cycle_required
        if need and need not in fault:
            return f"{need} ({fault})" if fault else need
        return fault

    def status(self) -> dict[str, Any]:
        st = self.state
        now = _MONO()
        stages = self.stats.summaries_ms()
        period = stages["period"]
        rate = (1000.0 / period["mean"]) if period["mean"] else 0.0

        def joints(v: np.ndarray | None) -> dict[str, float] | None:
            return None if v is None else {n: round(float(x), 3) for n, x in zip(JOINT_NAMES, v)}

        def link_status(link: ArmLink | None) -> dict[str, Any] | None:
            if link is None:
                return None
            counters = getattr(link.arm, "counters", None)
            return {
                "connected": link.connected,
                "port": getattr(link.arm, "port", None),
                "since_s": round(now - link.since_s, 3),
                "connects": link.connects,
                "losses": link.losses,
                "last_error": link.last_error,
                "configure_warnings": list(getattr(link.arm, "configure_warnings", []) or []),
                "bus": None
                if counters is None
                else {k: getattr(counters, k) for k in ("transactions", "retries", "failures", "reconnects")},
            }

        health = self.health
        servos = None
        if health is not None:
            servos = {
                name: {
                    "temperature_c": h.temperature_c,
                    "voltage_v": h.voltage_v,
                    "load_pct": h.load_pct,
                    "current_ma": h.current_ma,
                    "status": h.status_bits,
                    "torque": h.torque_enabled,
                }
                for name, h in health.servos.items()
            }
        return {
            "mode": st.mode,
            "intent": self.intent,
            "reason": st.reason,
            "fault": self._fault_text(st.fault or self.fault_now),
            "torque_wanted": self.torque_wanted,
            "follower_kind": self.follower_kind,
            "uptime_s": round(now - self.started_at_s, 3),
            "rate_hz_target": self.cfg.control.rate_hz,
            "rate_hz": round(rate, 2),
            "cycles": self.cycles,
            "overruns": self.overruns,
            "missed_cycles": self.missed_cycles,
            "limited_cycles": self.limited_cycles,
            "leader_errors": self.leader_errors,
            "follower_errors": self.follower_errors,
            "hook_errors": self.hook_errors,
            "overlap_io": self._worker is not None,
            "rate_warning": self.rate_warning,
            "power_cycle_required": self.power_cycle_required,
            "safety": {
                **{
                    k: getattr(self.cfg.safety, k)
                    for k in ("align_speed_deg_s", "max_step_deg", "leader_stale_s", "on_fault")
                },
                "fault_latched": st.fault,  # stays until the operator clears it
                "fault_now": self.fault_now,  # what the servos report right now
                "limited_cycles": self.limited_cycles,
                "limit_hits": {n: int(c) for n, c in zip(JOINT_NAMES, self.limit_hits)},
            },
            "timing_ms": stages,
            "leader": link_status(self.leader_link),
            "follower": link_status(self.follower_link),
            "leader_age_s": None if math.isinf(self.leader_read_at_s) else round(now - self.leader_read_at_s, 4),
            "joints": {
                "leader": joints(self.leader_units),
                "follower": joints(self.measured),
                "command": joints(self.command),
            },
            "servos": servos,
            "missing_servos": list(health.missing) if health is not None else [],
            "health_age_s": None if health is None else round(now - health.read_at_s, 3) if health.read_at_s else None,
        }


def _replace_torque(state: ControllerState, torque: bool | None) -> ControllerState:
    from dataclasses import replace

    return replace(state, torque_on=torque)
