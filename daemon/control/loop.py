"""The control loop: one thread that owns the period and the follower's bus.

``cycle()`` is five named steps (ros2_control's read -> update -> write, plus target choice and
hooks):

1. **read** (``_read``): start the leader read (on the leader's worker thread with ``overlap_io``:
   two serial ports, and pyserial releases the GIL while it waits on the wire) and meanwhile read
   the follower's measured pose on this thread: that pose is the cycle's observation (LeRobot's
   order: observation, then action). The leader is waited for at most until the middle of the
   period: a slow or dead leader never stalls the follower. A fresh leader reading goes to the
   leader hooks (the LeIsaac remote-leader publisher).
2. **select target** (``_select_target``): the active ``TargetSource`` (daemon/control/seams.py)
   gives the target: the leader (``daemon.control.leader_source.LeaderSource``) in teleop, the policy in
   policy mode. None means nothing fresh: the follower holds.
3. **update** (``_update``): ``safety.update`` (pure) decides the mode and the command.
4. **write** (``_write``): torque changes first (with the measured pose as goal, so enabling torque
   never jumps), then the goals.
5. **hooks** (``_call_hooks``): the cycle hooks (recorder, camera feeds: microseconds each).

In the slack before the next deadline the follower's health registers are read every
``health_period_s``. What a failed read or write or a health reading *means* is decided by the
pure functions of ``daemon/control/faults.py``.

Timing: deadlines on the monotonic clock (``next += period``: no drift); sleep until ~0.3 ms
before the deadline, then spin. A cycle that ends after its deadline is an overrun, counted and
logged (rate-limited); if it ran more than a whole period late, the missed periods are skipped and
counted too (never silently absorbed). Per-stage times go to ``daemon.control.timing_stats.LoopStats``.

Arms come and go: each arm sits in an ``ArmLink`` (daemon/control/arm_link.py); a lost port hands the arm
to a reconnect thread with exponential backoff, and the loop keeps running (the follower holds, or
the loop reports ``disconnected``). When the arm is back, alignment starts again, because the
safety state restarts from the measured pose.

Other threads talk to the loop through ``submit(fn)`` (a queue drained at the start of each
cycle; the function runs on the loop thread), read ``snapshot()``/``status()`` (plain attributes
and copies, lock-free), and wait for progress with ``wait_cycles(n)``. A loop that was not started
can be stepped by hand with ``step(n)`` (tests, benchmarks).
"""

from __future__ import annotations

import logging
import math
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from calibration.conventions import NUM_JOINTS
from daemon.config.settings import Config
from daemon.control.arm_link import ArmLink
from daemon.control.faults import (
    MISSING_FAULT_CYCLES,
    classify_read_failure,
    classify_write_failure,
    fault_text,
    judge_health,
    read_failure_lost,
)
from daemon.control.leader_source import LeaderSource
from daemon.control.safety import ControllerState, CycleInputs, CycleOutput, SafetyParams, disconnected, update
from daemon.control.seams import CycleHook, LeaderHook, TargetSource, Watchdog
from daemon.control.snapshot import BUS_COUNTER_KEYS, SAFETY_CONFIG_KEYS, LinkSnapshot, LoopSnapshot, render_status
from daemon.control.timing_stats import LoopStats
from daemon.system.logs import RateLimitedLogger
from daemon.system.realtime import current_policy, make_current_thread_realtime
from drivers.arm_interface import (
    ArmError,
    ArmHealth,
    FollowerArm,
    LeaderArm,
    OverloadLatchedError,
    PortGoneError,
)
from drivers.feetech_arm import FollowerBusConfig

log = logging.getLogger("so101d.loop")
_rl = RateLimitedLogger(log, period_s=5.0, burst=3)

_SPIN_S = 0.0003  # sleep until this long before a deadline, then spin (sleep overshoots ~0.1 ms)
_RATE_CHECK_S = 2.0  # how often the loop asks whether its configured rate is achievable at all
_RATE_IMPOSSIBLE = 0.9  # median cycle work above this share of the period: the rate cannot be held
_CYCLE_POLL_S = 0.001  # wait_cycles polls the count: nothing for the loop to signal, nothing it pays
_MONO = time.monotonic

__all__ = ["ArmLink", "ControlLoop", "CycleHook", "LeaderHook", "TargetSource"]


@runtime_checkable
class Configurable(Protocol):
    """A follower whose servos need their SRAM settings written again after a power cycle."""

    def configure(self) -> None: ...


@dataclass(frozen=True)
class Selection:
    """Step 2's answer: the target for ``safety.update`` and what the hooks record as the raw one."""

    target: np.ndarray | None  # None: nothing fresh (hold)
    name: str  # "leader" or "policy", for the reason text
    raw: np.ndarray | None  # the source's latest reading, fresh or not (the recorder's teleop action)


class ControlLoop:
    """Runs the cycle described in the module docstring on its own thread (``start``/``stop``).

    ``leader`` may be None (policy-only or sim-only setups); ``follower`` is required.
    """

    def __init__(
        self,
        leader: LeaderArm | None,
        follower: FollowerArm,
        cfg: Config,
        *,
        free_run: bool = False,
        spin_s: float = _SPIN_S,
    ) -> None:
        """``free_run`` drops the sleep (benchmarks)."""
        self.cfg = cfg
        self.period_s = 1.0 / cfg.control.rate_hz
        self.free_run = free_run
        self.spin_s = spin_s
        self.overlap_io = cfg.control.overlap_io
        self.stats = LoopStats()
        c = cfg.control
        self.leader_link: ArmLink[LeaderArm] | None = (
            ArmLink("leader", leader, c.reconnect_backoff_min_s, c.reconnect_backoff_max_s)
            if leader is not None
            else None
        )
        self.leader_source: LeaderSource | None = (
            LeaderSource(self.leader_link, self.stats.leader_read, cfg.safety.leader_stale_s)
            if self.leader_link is not None
            else None
        )
        self.follower_link: ArmLink[FollowerArm] = ArmLink(
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
        # A fault that only a failed connect raised (some servos did not answer the handshake,
        # e.g. still powering up, or one unplugged): once a connect succeeds every servo has
        # answered and the arm has never moved since, so that latch clears by itself (alignment
        # still comes first). A fault seen while the arm was running stays for the operator.
        self._connect_fault = ""
        self.policy_source: TargetSource | None = None
        # latest readings
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
        self._follower_ok = False  # this cycle's pose is the connected arm's and recent (step 3 -> 5)
        self.rate_warning = ""  # set when the adapters make the configured rate impossible
        self.scheduling = "not started"  # the loop thread's own policy, read by that thread
        self._next_rate_check_s = 0.0
        self._next_health_s = 0.0
        self._health_cost_s = 0.005
        # counters
        self.cycles = 0
        self.overruns = 0
        self.missed_cycles = 0
        self.limited_cycles = 0
        self.limit_hits = np.zeros(NUM_JOINTS, dtype=np.int64)  # cycles whose target lay outside a joint's limits
        self.follower_errors = 0
        self.hook_errors = 0
        self._follower_fail_since: float | None = None
        self._missing_streak = 0
        self.started_at_s = _MONO()
        self._prev_cycle_s: float | None = None
        # plumbing
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._hooks: list[CycleHook] = []
        self._leader_hooks: list[LeaderHook] = []
        self.watchdog: Watchdog | None = None  # daemon.system.sd_notify.WatchdogGate when systemd watches us
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stopped = threading.Event()

    # ------------------------------------------------------------------ the leader's reading
    @property
    def leader_units(self) -> np.ndarray | None:
        return self.leader_source.units if self.leader_source is not None else None

    @property
    def leader_read_at_s(self) -> float:
        return self.leader_source.read_at_s if self.leader_source is not None else -math.inf

    @property
    def leader_errors(self) -> int:
        return self.leader_source.errors if self.leader_source is not None else 0

    # ------------------------------------------------------------------ plumbing for others
    def add_hook(self, hook: CycleHook | LeaderHook) -> None:
        """Register a ``CycleHook`` (``on_cycle``), a ``LeaderHook`` (``on_leader``), or an object
        that is both (daemon/control/seams.py)."""
        is_cycle, is_leader = isinstance(hook, CycleHook), isinstance(hook, LeaderHook)
        if not (is_cycle or is_leader):
            raise TypeError(f"{hook!r} is neither a CycleHook (on_cycle) nor a LeaderHook (on_leader)")
        if is_cycle:
            self._hooks.append(hook)  # type: ignore[arg-type]  # narrowed by the isinstance above
        if is_leader:
            self._leader_hooks.append(hook)  # type: ignore[arg-type]  # narrowed by the isinstance above

    def remove_hook(self, hook: CycleHook | LeaderHook) -> None:
        for hooks in (self._hooks, self._leader_hooks):
            if hook in hooks:
                hooks.remove(hook)  # type: ignore[arg-type]  # equality only: either list may hold it

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` on the loop thread at the start of the next cycle; its result in the Future."""
        fut: Future[Any] = Future()
        if not self.is_running():
            fut.set_exception(RuntimeError("control loop is not running"))
            return fut
        self._commands.put((fn, fut))
        return fut

    def call(self, fn: Callable[[], Any], timeout_s: float = 2.0) -> Any:
        return self.submit(fn).result(timeout=timeout_s)

    def wait_cycles(self, n: int, timeout_s: float = 10.0) -> int:
        """Block until ``n`` more cycles have run (any thread but the loop's); returns the count
        reached. TimeoutError when they did not run in ``timeout_s`` (the loop stopped or stalled)."""
        target = self.cycles + n
        end = _MONO() + timeout_s
        while self.cycles < target:
            if _MONO() > end:
                raise TimeoutError(
                    f"control loop ran {n - (target - self.cycles)} of {n} cycles in {timeout_s:g} s "
                    f"(running: {self.is_running()})"
                )
            time.sleep(_CYCLE_POLL_S)
        return self.cycles

    def step(self, n: int = 1) -> None:
        """Run ``n`` cycles on the calling thread, each at its deadline (one period apart), for a
        loop that was not started (tests, benchmarks). The arms' links must be started by the
        caller (``start_links``); ``submit`` refuses while no loop thread runs."""
        if self._thread is not None:
            raise RuntimeError("step() is for a loop that was not started: this one runs on its own thread")
        deadline = _MONO()
        for _ in range(n):
            now = self._wait_until(deadline)
            self.cycle(now)
            deadline += self.period_s
        self._wait_until(deadline)  # the next step() starts one period after this one's last cycle

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

    def _reconfigure_if_needed(self, arm: FollowerArm) -> None:
        """After a power cycle the servos' SRAM (Acceleration, Torque_Limit, Lock) is at its
        power-on values: configure again before torque goes on."""
        if self._reconfigure and isinstance(arm, Configurable):
            arm.configure()
            self._reconfigure = False
            log.info("follower configured again after its power cycle")

    def apply_config(self, cfg: Config) -> None:
        """Swap in a reloaded configuration (loop thread, between cycles). Only keys that are read
        live take effect (daemon/config/reload.py decides which; the rest kept their running values)."""
        self.cfg = cfg
        if self.params is not None:
            self.params = SafetyParams.from_config(cfg.safety, self.params.lower, self.params.upper, self.period_s)
        if self.leader_source is not None:
            self.leader_source.stale_s = cfg.safety.leader_stale_s
        for link in (self.leader_link, self.follower_link):
            if link is not None:
                link.backoff_min_s = cfg.control.reconnect_backoff_min_s
                link.backoff_max_s = cfg.control.reconnect_backoff_max_s
        self._next_health_s = 0.0

    # ------------------------------------------------------------------ lifecycle
    def start_links(self) -> None:
        """Start connecting the arms (each on its link's thread), and the leader's read worker."""
        if self.leader_link is not None and self.leader_source is not None:
            self.leader_link.start()
            if self.overlap_io:
                self.leader_source.start_worker(on_start=self._set_realtime)
        self.follower_link.start()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("control loop already started")
        self.start_links()
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
        if self.leader_source is not None:
            self.leader_source.stop()
        self._shutdown_follower()
        bus_cfg = getattr(self.follower_link.arm, "config", None)
        if not self.cfg.follower.torque_off_on_shutdown and isinstance(bus_cfg, FollowerBusConfig):
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

    def _follower_connected(self, arm: FollowerArm) -> None:
        lower, upper = arm.joint_limits()
        self.params = SafetyParams.from_config(self.cfg.safety, lower, upper, self.period_s)
        self.follower_kind = getattr(arm, "kind", self.follower_kind)
        self._follower_fail_since = None
        self._next_health_s = 0.0

    # ------------------------------------------------------------------ one cycle
    def cycle(self, now: float) -> None:
        """One control cycle: the five steps of the module docstring (public so tests and the
        benchmark can step it)."""
        self._drain_commands()
        self._read(now)
        t_u = _MONO()
        selection = self._select_target(now)
        out = self._update(now, selection)
        self.stats.update.add(_MONO() - t_u)
        self._write(out)
        self._call_hooks(now, selection, out)
        self.cycles += 1

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

    # ---- 1. read
    def _read(self, now: float) -> None:
        """The leader (overlapped) and the follower; a fresh leader reading to the leader hooks."""
        leader = self.leader_source
        started = leader.begin_read() if leader is not None else False
        if self.follower_link.connected:
            self._read_follower(now)
        if leader is None:
            return
        if started:
            leader.finish_read(max(0.0, now + self.period_s * 0.5 - _MONO()) if not self.free_run else 0.05)
        fresh = leader.take_fresh()
        if fresh is not None:
            for hook in self._leader_hooks:
                try:
                    hook.on_leader(now, fresh)
                except Exception as exc:
                    self.hook_errors += 1
                    _rl.error("hook.leader", "leader hook failed: %r", exc)

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
            self._follower_read_failed(exc, now)
            return
        self.stats.follower_read.add(_MONO() - t0)
        self._follower_fail_since = None
        self._missing_streak = 0
        self.measured = pose
        self.measured_at_s = now

    def _follower_read_failed(self, exc: Exception, now: float) -> None:
        self.follower_errors += 1
        failure = classify_read_failure(exc)
        if failure.silent_joints:
            # a servo that stays silent over several cycles is a follower fault (hold or torque
            # off per safety.on_fault), not just a bus hiccup the retries already covered
            self._missing_streak += 1
            if self._missing_streak >= MISSING_FAULT_CYCLES:
                fault = failure.missing_fault()
                if fault != self.fault_now:
                    log.error("FOLLOWER FAULT: %s (reaction: %s)", fault, self.cfg.safety.on_fault)
                self.fault_now = fault
        if self._follower_fail_since is None:
            self._follower_fail_since = now
        failing_s = now - self._follower_fail_since
        _rl.warning("follower.read", "follower read failed: %s", exc)
        if read_failure_lost(failure, failing_s, self.cfg.safety.leader_stale_s):
            reason = f"{type(exc).__name__}: {exc}" if failure.gone else f"no valid reply for {failing_s:.1f} s: {exc}"
            self.follower_link.lost(reason)
            self._follower_fail_since = None

    def _read_health(self, now: float) -> None:
        t0 = _MONO()
        try:
            self.health = health = self.follower_link.arm.read_health()
        except ArmError as exc:
            self.follower_errors += 1
            _rl.warning("follower.health", "follower health read failed: %s", exc)
            return
        finally:
            self._next_health_s = now + self.cfg.control.health_period_s
        self._health_cost_s = 0.8 * self._health_cost_s + 0.2 * (_MONO() - t0)
        safety = self.cfg.safety
        verdict = judge_health(health, safety.fault_bits, safety.max_temperature_c, self.power_cycle_required)
        if verdict.power_cycled:
            log.warning("follower power cycle seen (%s cleared): resume when ready", self.power_cycle_required)
            self.power_cycle_required = ""
            self._reconfigure = True
        fault = verdict.fault
        if fault and fault != self.fault_now:
            log.error("FOLLOWER FAULT: %s (reaction: %s)", fault, safety.on_fault)
        elif not fault and self.fault_now:
            log.warning("follower fault gone: %s", self.fault_now)
        self.fault_now = fault

    # ---- 2. select target
    def _select_target(self, now: float) -> Selection:
        """The policy in ``policy`` intent, else the leader. A source that raises counts as a hook
        error and gives no target (hold): it never takes the loop down."""
        policy = self.intent == "policy"
        source: TargetSource | None = self.policy_source if policy else self.leader_source
        name = "policy" if policy else "leader"
        target = None
        if source is not None and self.measured is not None:
            try:
                target = source.target(now, self.measured)
            except Exception as exc:
                self.hook_errors += 1
                _rl.error(f"{name}.target", "%s target failed (holding): %r", name, exc)
        # the recorder's teleop action is what the leader last said, even when too old to follow
        raw = target if policy or self.leader_source is None else self.leader_source.units
        self.target = target
        return Selection(target, name, raw)

    # ---- 3. update
    def _update(self, now: float, sel: Selection) -> CycleOutput:
        link = self.follower_link
        # a pose measured before the link's last (re)connect is not this arm's pose any more (the
        # connect thread may flip ``connected`` after this cycle's read was skipped)
        self._follower_ok = follower_ok = (
            link.connected
            and self.measured is not None
            and self.measured_at_s >= link.since_s
            and (now - self.measured_at_s) <= max(0.5, self.cfg.safety.leader_stale_s * 5)
        )
        params = self.params
        if params is None or not follower_ok:
            # a fault seen just before the link went (a servo dropping off the bus) stays latched
            fault = self.state.fault or self.fault_now or link.handshake_fault
            if link.handshake_fault and not self.state.fault and not self.fault_now:
                self._connect_fault = link.handshake_fault  # the latch comes from the handshake alone
            out = disconnected(fault, "follower not connected" if not link.connected else "no follower pose")
        else:
            if self._connect_fault and self.state.fault == self._connect_fault and not self.fault_now:
                log.info("follower: every servo answered the handshake now; cleared: %s", self._connect_fault)
                self._clear_fault = True
            self._connect_fault = ""
            inputs = CycleInputs(
                intent=self.intent,
                torque_wanted=self.torque_wanted,
                follower_ok=True,
                measured=self.measured,
                target=sel.target,
                target_age_s=0.0 if sel.target is not None else math.inf,  # the source judged freshness
                fault_now=self.fault_now,
                clear_fault=self._clear_fault,
                target_name=sel.name,
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
            if sel.target is not None and params is not None and np.shape(sel.target) == (NUM_JOINTS,):
                # which joints the limits clamped (a few microseconds, only on limited cycles)
                self.limit_hits += (sel.target < params.lower) | (sel.target > params.upper)
        if out.state.mode != prev_mode:
            self._log_mode_change(prev_mode, out.state)
        return out

    def _log_mode_change(self, prev_mode: str, st: ControllerState) -> None:
        new = st.mode
        if new == "fault":
            lvl = logging.ERROR
        elif new in ("disconnected", "hold") and self.intent != "hold":
            lvl = logging.WARNING  # the operator did not ask for this
        else:
            lvl = logging.INFO
        log.log(lvl, "mode %s -> %s (%s)", prev_mode, new, st.reason)

    # ---- 4. write
    def _write(self, out: CycleOutput) -> None:
        if self.follower_link.connected and (out.torque is not None or out.command is not None):
            t_w = _MONO()
            self._write_follower(out)
            if out.torque is None:  # torque switches (rare, several transactions) would skew the goal-write figures
                self.stats.follower_write.add(_MONO() - t_w)
        self.command = out.command

    def _write_follower(self, out: CycleOutput) -> None:
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
                self.state = replace(self.state, torque_on=None)  # unknown: ask again next cycle
            kind = classify_write_failure(exc)
            if kind == "latched":
                if self.power_cycle_required != str(exc):
                    log.error("FOLLOWER FAULT: %s (waiting for the power cycle)", exc)
                self.power_cycle_required = self.fault_now = str(exc)
            elif kind == "gone":
                self.follower_link.lost(f"{type(exc).__name__}: {exc}")
            else:
                _rl.warning("follower.write", "follower write failed: %s", exc)

    # ---- 5. hooks
    def _call_hooks(self, now: float, sel: Selection, out: CycleOutput) -> None:
        measured = self.measured
        if not self._hooks or measured is None or not self._follower_ok:
            return
        t_h = _MONO()
        action = out.command if out.command is not None else measured
        raw = sel.raw if sel.raw is not None else action
        for hook in self._hooks:
            try:
                hook.on_cycle(now, measured, action, raw)
            except Exception as exc:
                self.hook_errors += 1
                _rl.error("hook.cycle", "cycle hook failed: %r", exc)
        self.stats.hooks.add(_MONO() - t_h)

    # ------------------------------------------------------------------ thread body
    def _set_realtime(self) -> None:
        prio = self.cfg.control.realtime_priority
        if prio > 0 and make_current_thread_realtime(prio):
            log.info("control loop thread: SCHED_FIFO priority %d", prio)

    def _note_scheduling(self) -> None:
        """What the loop thread really runs under, for status: an asked-for priority that the
        system refused shows as refused, not as granted."""
        prio = self.cfg.control.realtime_priority
        now = current_policy()
        self.scheduling = now if prio <= 0 or now == f"fifo:{prio}" else f"{now} (fifo:{prio} refused)"

    def _run(self) -> None:
        self._set_realtime()
        self._note_scheduling()
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
    def _link_snapshot(self, link: ArmLink[Any], now: float) -> LinkSnapshot:
        counters = getattr(link.arm, "counters", None)  # bus arms keep BusCounters; a simulator none
        return LinkSnapshot(
            connected=link.connected,
            port=getattr(link.arm, "port", None),
            connected_for_s=now - link.since_s,
            connects=link.connects,
            losses=link.losses,
            last_error=link.last_error,
            configure_warnings=tuple(getattr(link.arm, "configure_warnings", ()) or ()),
            bus_counters=None if counters is None else {k: getattr(counters, k) for k in BUS_COUNTER_KEYS},
        )

    def snapshot(self) -> LoopSnapshot:
        """Everything ``status`` shows, copied now (plain attributes: lock-free, from any thread)."""
        st = self.state
        now = _MONO()
        stages = self.stats.summaries_ms()
        period = stages["period"]
        health = self.health
        leader = self.leader_source
        return LoopSnapshot(
            mode=st.mode,
            intent=self.intent,
            reason=st.reason,
            fault=fault_text(st.fault or self.fault_now, self.power_cycle_required),
            fault_latched=st.fault,
            fault_now=self.fault_now,
            torque_wanted=self.torque_wanted,
            follower_kind=self.follower_kind,
            uptime_s=now - self.started_at_s,
            rate_hz_target=self.cfg.control.rate_hz,
            rate_hz=(1000.0 / period["mean"]) if period["mean"] else 0.0,
            cycles=self.cycles,
            overruns=self.overruns,
            missed_cycles=self.missed_cycles,
            limited_cycles=self.limited_cycles,
            limit_hits=tuple(int(c) for c in self.limit_hits),
            leader_errors=self.leader_errors,
            follower_errors=self.follower_errors,
            hook_errors=self.hook_errors,
            overlap_io=leader is not None and leader.overlapped,
            rate_warning=self.rate_warning,
            scheduling=self.scheduling,
            power_cycle_required=self.power_cycle_required,
            safety_config={k: getattr(self.cfg.safety, k) for k in SAFETY_CONFIG_KEYS},
            timing_ms=stages,
            leader=self._link_snapshot(self.leader_link, now) if self.leader_link is not None else None,
            follower=self._link_snapshot(self.follower_link, now),
            leader_age_s=now - self.leader_read_at_s,
            leader_units=self.leader_units,
            follower_units=self.measured,
            command_units=self.command,
            health=health,
            health_age_s=None if health is None or not health.read_at_s else now - health.read_at_s,
        )

    def status(self) -> dict[str, Any]:
        """The ``status`` verb's loop part (daemon/control/snapshot.py renders the snapshot)."""
        return render_status(self.snapshot())
