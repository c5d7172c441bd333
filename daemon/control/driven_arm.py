"""One arm the control loop drives: its link, its own safety state and parameters, its measured
pose, its faults, and the name of the target source assigned to it.

The loop holds a list of these (today one, "follower"; two for a bimanual bench) and runs the same
steps on each: ``read`` -> ``select`` (the assigned source's target) -> ``update`` (the pure
``safety.update``) -> ``write``. What a failed read or write, or a health reading, *means* is
decided by the pure functions of ``daemon/control/faults.py``. Everything here runs on the loop
thread, except what the link's (re)connect thread calls (``on_connect``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np

from calibration.conventions import NUM_JOINTS
from daemon.config.settings import Config
from daemon.control.arm_link import ArmLink
from daemon.control.bus_worker import BusWorker
from daemon.control.faults import (
    MISSING_FAULT_CYCLES,
    classify_read_failure,
    classify_write_failure,
    judge_health,
    read_failure_lost,
)
from daemon.control.safety import ControllerState, CycleInputs, CycleOutput, SafetyParams, disconnected, update
from daemon.control.seams import ArmRecord, TargetSource
from daemon.control.timing_stats import RollingStats, WorstCalls
from daemon.system.logs import RateLimitedLogger
from drivers.arm_interface import ArmError, ArmHealth, FollowerArm, OverloadLatchedError

log = logging.getLogger("so101d.loop")
_rl = RateLimitedLogger(log, period_s=5.0, burst=3)


def _no_reading() -> np.ndarray | None:
    return None


@dataclass(frozen=True)
class SourceEntry:
    """A named target source. ``last_reading`` is what the recorder's teleop.action shows while
    the source offers nothing fresh (the leader: its last reading, even too old to follow).

    ``per_arm``: one source that drives several arms at once (a bimanual policy's 12-wide action)
    offers each arm its own view under the one name, so the record still says "policy" for both;
    an arm without a view of its own gets ``source``."""

    name: str
    source: TargetSource
    last_reading: Callable[[], np.ndarray | None] = _no_reading
    per_arm: Mapping[str, TargetSource] | None = None

    def source_for(self, arm: str) -> TargetSource:
        per_arm = self.per_arm
        return self.source if per_arm is None else per_arm.get(arm, self.source)

    @property
    def timing_name(self) -> str:
        return f"source.{self.name}"


@runtime_checkable
class Configurable(Protocol):
    """A follower whose servos need their SRAM settings written again after a power cycle."""

    def configure(self) -> None: ...


@dataclass(frozen=True)
class Selection:
    """The select step's answer: the target for ``safety.update`` and what the hooks record as
    the raw one."""

    target: np.ndarray | None  # None: nothing fresh (hold)
    name: str  # the source's name ("leader", "policy", ...), for the reason text and the record
    raw: np.ndarray | None  # the source's latest reading, fresh or not (the recorder's teleop action)


_NO_SELECTION = Selection(None, "", None)


def joint_target(value: object) -> np.ndarray | None:
    """A source's answer as the cycle takes it: None, or an array of the joints' floats (a
    list or tuple of numbers is taken too); anything else raises, naming what came, so a client's
    careless answer holds the arm instead of reaching the safety layer or the recorder."""
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        arr = value  # the usual answer: no copy on the loop's path
    else:
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"a target must be {NUM_JOINTS} joint values, got {type(value).__name__}") from None
    if arr.shape != (NUM_JOINTS,):
        raise ValueError(f"a target must be {NUM_JOINTS} joint values, got shape {arr.shape}")
    return arr


class DrivenArm:
    """One follower-like arm and everything the loop keeps about it (see the module docstring)."""

    def __init__(
        self,
        name: str,
        link: ArmLink[FollowerArm],
        source_name: str,
        cfg: Config,
        period_s: float,
        read_stats: RollingStats,
        write_stats: RollingStats,
    ) -> None:
        self.name = name
        self.link = link
        self.source_name = source_name  # which entry of the loop's sources drives this arm
        # the leader that drives it in teleop (a bimanual pair: each follower its own leader)
        self.teleop_source = source_name
        # this arm's bus thread (an arm beside the primary, with control.overlap_io): its reads and
        # writes overlap the primary arm's; None: they run on the loop thread
        self.worker: BusWorker | None = None
        self.cfg = cfg
        self.period_s = period_s
        self.read_stats = read_stats
        self.write_stats = write_stats
        self.kind = link.arm.kind
        self.params: SafetyParams | None = None
        self.state = ControllerState()
        self.clear_fault = False
        # A fault that only a failed connect raised (some servos did not answer the handshake,
        # e.g. still powering up, or one unplugged): once a connect succeeds every servo has
        # answered and the arm has never moved since, so that latch clears by itself (alignment
        # still comes first). A fault seen while the arm was running stays for the operator.
        self.connect_fault = ""
        self.measured: np.ndarray | None = None
        self.measured_at_s = -math.inf
        self.target: np.ndarray | None = None
        self.command: np.ndarray | None = None
        self.health: ArmHealth | None = None
        self.fault_now = ""
        # A latched overload the re-arm could not clear: the operator must cycle the arm's power.
        # Cleared when the health read shows the latch gone (power cycled); the next re-arm then
        # configures the servos again (a power cycle reset their SRAM).
        self.power_cycle_required = ""
        self.scene_resets_seen = -1  # the arm's scene-reset count at the last read (-1: none yet)
        self.realign_pending = False  # a scene reset moved the arm: re-align next update
        # why this arm alone holds under a tracking intent (a client released it on a rig of several
        # arms: the others go on), until the operator's resume (ControlLoop.set_intent); "" if not
        self.released_hold = ""
        self.reconfigure = False
        self.ok = False  # this cycle's pose is the connected arm's and recent (update -> hooks)
        self.selection = _NO_SELECTION
        self.source_error = ""  # why the assigned source gave no target this cycle ("": it did not fail)
        self.next_health_s = 0.0
        self.health_cost_s = 0.005
        self.errors = 0
        self.limited_cycles = 0
        self.limit_hits = np.zeros(NUM_JOINTS, dtype=np.int64)  # cycles whose target lay outside a joint's limits
        self._fail_since: float | None = None
        self._missing_streak = 0
        self._prev_cycle_s: float | None = None

    # ------------------------------------------------------------------ the link's thread
    def on_connect(self, arm: FollowerArm) -> None:
        """Called by the (re)connect thread once the arm answered: its limits, and health soon."""
        lower, upper = arm.joint_limits()
        self.params = SafetyParams.from_config(self.cfg.safety, lower, upper, self.period_s)
        self.kind = arm.kind
        self._fail_since = None
        self.next_health_s = 0.0

    # ------------------------------------------------------------------ 1. read
    def read(self, now: float, monotonic: Callable[[], float]) -> None:
        if not self.link.connected:
            return
        arm = self.link.arm
        t0 = monotonic()
        try:
            resets = arm.scene_resets()  # before the pose: see FollowerArm.scene_resets
            pose = arm.read_joints()
            if resets != self.scene_resets_seen:
                if self.scene_resets_seen >= 0:
                    self.realign_pending = True
                    log.info("%s scene reset: re-aligning from the reset pose", self.name)
                self.scene_resets_seen = resets
        except Exception as exc:
            self._read_failed(exc, now)
            return
        self.read_stats.add(monotonic() - t0)
        self._fail_since = None
        self._missing_streak = 0
        self.measured = pose
        self.measured_at_s = now

    def _read_failed(self, exc: Exception, now: float) -> None:
        self.errors += 1
        failure = classify_read_failure(exc)
        if failure.silent_joints:
            # a servo that stays silent over several cycles is a fault (hold or torque off per
            # safety.on_fault), not just a bus hiccup the retries already covered
            self._missing_streak += 1
            if self._missing_streak >= MISSING_FAULT_CYCLES:
                fault = failure.missing_fault()
                if fault != self.fault_now:
                    log.error("%s FAULT: %s (reaction: %s)", self.name.upper(), fault, self.cfg.safety.on_fault)
                self.fault_now = fault
        if self._fail_since is None:
            self._fail_since = now
        failing_s = now - self._fail_since
        _rl.warning(f"{self.name}.read", "%s read failed: %s", self.name, exc)
        if read_failure_lost(failure, failing_s, self.cfg.safety.leader_stale_s):
            reason = f"{type(exc).__name__}: {exc}" if failure.gone else f"no valid reply for {failing_s:.1f} s: {exc}"
            self.link.lost(reason)
            self._fail_since = None

    def read_health(self, now: float, monotonic: Callable[[], float]) -> None:
        t0 = monotonic()
        try:
            self.health = health = self.link.arm.read_health()
        except ArmError as exc:
            self.errors += 1
            _rl.warning(f"{self.name}.health", "%s health read failed: %s", self.name, exc)
            return
        finally:
            self.next_health_s = now + self.cfg.control.health_period_s
        self.health_cost_s = 0.8 * self.health_cost_s + 0.2 * (monotonic() - t0)
        safety = self.cfg.safety
        verdict = judge_health(health, safety.fault_bits, safety.max_temperature_c, self.power_cycle_required)
        if verdict.power_cycled:
            log.warning("%s power cycle seen (%s cleared): resume when ready", self.name, self.power_cycle_required)
            self.power_cycle_required = ""
            self.reconfigure = True
        fault = verdict.fault
        if fault and fault != self.fault_now:
            log.error("%s FAULT: %s (reaction: %s)", self.name.upper(), fault, safety.on_fault)
        elif not fault and self.fault_now:
            log.warning("%s fault gone: %s", self.name, self.fault_now)
        self.fault_now = fault

    # ------------------------------------------------------------------ 2. select
    def select(
        self,
        now: float,
        sources: Mapping[str, SourceEntry],
        on_error: Callable[[], None],
        calls: WorstCalls,
        monotonic: Callable[[], float],
    ) -> Selection:
        """The assigned source's target. A source that raises counts as a hook error and gives no
        target (hold): it never takes the loop down. An assigned source that is gone (a policy
        unloaded) gives none either."""
        entry = sources.get(self.source_name)
        target = None
        self.source_error = ""
        if entry is None:
            sel = Selection(None, self.source_name, None)
        else:
            if self.measured is not None:
                t0 = monotonic()
                try:
                    target = joint_target(entry.source_for(self.name).target(now, self.measured))
                except Exception as exc:
                    target = None
                    on_error()
                    self.source_error = f"{type(exc).__name__}: {exc}"[:200]
                    _rl.error(f"{entry.name}.target", "%s target failed (holding): %r", entry.name, exc)
                calls.note(entry.timing_name, monotonic() - t0)
            sel = Selection(target, entry.name, target if target is not None else entry.last_reading())
        self.target = target
        self.selection = sel
        return sel

    # ------------------------------------------------------------------ 3. update
    def blocking(self, now: float) -> str:
        """Why this arm cannot take part in a task now ("" when it can): a fault latched or seen,
        its follower not connected, or no current pose of it (a bus call stuck on its worker).
        With ``safety.fault_holds = "all"`` the other arms hold."""
        fault = self.state.fault or self.fault_now or self.power_cycle_required
        if fault:
            return f"{self.name} fault: {fault}"
        if not self.link.connected:
            missing = f" ({', '.join(self.link.missing)} missing)" if self.link.missing else ""
            return f"{self.name} not connected{missing}"
        if not self.pose_current(now):
            return f"no current {self.name} pose"
        return ""

    def pose_current(self, now: float) -> bool:
        """A pose measured since the link's last (re)connect, and recently."""
        link = self.link
        return (
            link.connected
            and self.measured is not None
            and self.measured_at_s >= link.since_s
            and (now - self.measured_at_s) <= max(0.5, self.cfg.safety.leader_stale_s * 5)
        )

    def update(self, now: float, intent: str, torque_wanted: bool, hold_reason: str = "") -> CycleOutput:
        """``hold_reason``: another arm of the task blocks it, so a tracking intent holds instead."""
        sel = self.selection
        asked = intent  # the operator's: a hold they did not ask for is logged as a warning
        if hold_reason and intent in ("teleop", "policy"):
            intent = "hold"
        else:
            hold_reason = ""
        link = self.link
        # a pose measured before the link's last (re)connect is not this arm's pose any more (the
        # connect thread may flip ``connected`` after this cycle's read was skipped)
        self.ok = ok = self.pose_current(now)
        params = self.params
        if params is None or not ok:
            # a fault seen just before the link went (a servo dropping off the bus) stays latched
            fault = self.state.fault or self.fault_now or link.handshake_fault
            if link.handshake_fault and not self.state.fault and not self.fault_now:
                self.connect_fault = link.handshake_fault  # the latch comes from the handshake alone
            out = disconnected(fault, f"{self.name} not connected" if not link.connected else f"no {self.name} pose")
        else:
            if self.connect_fault and self.state.fault == self.connect_fault and not self.fault_now:
                log.info("%s: every servo answered the handshake now; cleared: %s", self.name, self.connect_fault)
                self.clear_fault = True
            self.connect_fault = ""
            inputs = CycleInputs(
                intent=intent,
                torque_wanted=torque_wanted,
                follower_ok=True,
                measured=self.measured,
                target=sel.target,
                target_age_s=0.0 if sel.target is not None else math.inf,  # the source judged freshness
                fault_now=self.fault_now,
                clear_fault=self.clear_fault,
                target_name=sel.name,
                target_error=self.source_error,
                dt_s=(now - self._prev_cycle_s) if self._prev_cycle_s is not None else None,
                realign=self.realign_pending,
                hold_reason=f"holding: {hold_reason}" if hold_reason else "",
            )
            out = update(self.state, inputs, params)
            self.realign_pending = False
        self.clear_fault = False
        self._prev_cycle_s = now
        prev_mode = self.state.mode
        self.state = out.state
        if out.limited:
            self.limited_cycles += 1
            if sel.target is not None and params is not None and np.shape(sel.target) == (NUM_JOINTS,):
                # which joints the limits clamped (a few microseconds, only on limited cycles)
                self.limit_hits += (sel.target < params.lower) | (sel.target > params.upper)
        if out.state.mode != prev_mode:
            self._log_mode_change(prev_mode, out.state, asked)
        return out

    def _log_mode_change(self, prev_mode: str, st: ControllerState, intent: str) -> None:
        new = st.mode
        if new == "fault":
            lvl = logging.ERROR
        elif new in ("disconnected", "hold") and intent != "hold":
            lvl = logging.WARNING  # the operator did not ask for this
        else:
            lvl = logging.INFO
        prefix = "" if self.name == "follower" else f"{self.name}: "
        log.log(lvl, "%smode %s -> %s (%s)", prefix, prev_mode, new, st.reason)

    # ------------------------------------------------------------------ 4. write
    def write(self, out: CycleOutput, monotonic: Callable[[], float]) -> None:
        if self.link.connected and (out.torque is not None or out.command is not None):
            t_w = monotonic()
            self._write(out)
            if out.torque is None:  # torque switches (rare, several transactions) would skew the goal-write figures
                self.write_stats.add(monotonic() - t_w)
        self.command = out.command

    def _write(self, out: CycleOutput) -> None:
        arm = self.link.arm
        try:
            if out.torque is True:
                if self.power_cycle_required:
                    # torque writes cannot clear a latched overload: do not hammer the bus
                    raise OverloadLatchedError(self.power_cycle_required)
                self.reconfigure_if_needed()
                # the goal register first, so enabling torque holds the pose instead of jumping
                if self.measured is not None and self.params is not None:
                    arm.write_goals(np.clip(self.measured, self.params.lower, self.params.upper))
                arm.set_torque(True)
                log.info("%s torque on", self.name)
            elif out.torque is False:
                arm.set_torque(False)
                log.warning("%s torque off (%s)", self.name, out.state.reason)
            if out.command is not None:
                arm.write_goals(out.command)
        except Exception as exc:
            self.errors += 1
            if out.torque is not None:
                self.state = replace(self.state, torque_on=None)  # unknown: ask again next cycle
            kind = classify_write_failure(exc)
            if kind == "latched":
                if self.power_cycle_required != str(exc):
                    log.error("%s FAULT: %s (waiting for the power cycle)", self.name.upper(), exc)
                self.power_cycle_required = self.fault_now = str(exc)
            elif kind == "gone":
                self.link.lost(f"{type(exc).__name__}: {exc}")
            else:
                _rl.warning(f"{self.name}.write", "%s write failed: %s", self.name, exc)

    def reconfigure_if_needed(self) -> None:
        """After a power cycle the servos' SRAM (Acceleration, Torque_Limit, Lock) is at its
        power-on values: configure again before torque goes on."""
        arm = self.link.arm
        if self.reconfigure and isinstance(arm, Configurable):
            arm.configure()
            self.reconfigure = False
            log.info("%s configured again after its power cycle", self.name)

    # ------------------------------------------------------------------ 5. the record
    def record(self, out: CycleOutput) -> ArmRecord | None:
        """This cycle's part of the hooks' record, or None when the pose is not this arm's now."""
        measured = self.measured
        if measured is None or not self.ok:
            return None
        action = out.command if out.command is not None else measured
        sel = self.selection
        raw = sel.raw if sel.raw is not None else action
        return ArmRecord(self.name, sel.name, measured, action, raw)
