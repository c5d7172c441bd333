"""The control loop: one thread that owns the period and the cycle over every driven arm.

The loop drives a list of named arms (``DrivenArm``, daemon/control/driven_arm.py: today one,
"follower"; ``add_arm`` adds more, e.g. "left" and "right"), each with its own safety state,
parameters and measured pose, and each driven by the target source assigned to it by name
(``add_source``: "leader", "policy", and whatever else is given; ``assign(arm, source)`` switches
one at a cycle boundary). ``cycle()`` is five named steps (ros2_control's read -> update -> write,
plus target choice and hooks), the same for every arm:

1. **read** (``_read``): start the leader read (on the leader's worker thread with ``overlap_io``:
   two serial ports, and pyserial releases the GIL while it waits on the wire) and meanwhile read
   each arm's measured pose on this thread: that pose is the cycle's observation (LeRobot's order:
   observation, then action). The leader is waited for at most until the middle of the period: a
   slow or dead leader never stalls the arms. A fresh leader reading goes to the leader hooks.
2. **select target** (``DrivenArm.select``): the arm's assigned ``TargetSource``
   (daemon/control/seams.py) gives the target. None means nothing fresh: the arm holds.
3. **update** (``DrivenArm.update``): ``safety.update`` (pure) decides the mode and the command.
4. **write** (``DrivenArm.write``): torque changes first (with the measured pose as goal, so
   enabling torque never jumps), then the goals.
5. **hooks** (``_call_hooks``): the cycle hooks (camera feeds, the policy's observation) get the
   primary arm's state, command and raw target; record hooks (the recorder) get the whole
   ``CycleRecord``: every arm, and the name of the source that drove it.

In the slack before the next deadline each arm's health registers are read every
``health_period_s``. Connect, reconnect, fault recovery, reload, shutdown and the rate diagnosis
belong to the ``Supervisor`` beside the loop (daemon/control/supervisor.py): a lost port hands
the arm to its link's reconnect thread and the loop keeps running (that arm holds, or reports
``disconnected``); when it is back, alignment starts again from the measured pose.

Timing: deadlines on the monotonic clock (``next += period``: no drift); sleep until ~0.3 ms
before the deadline, then spin. A cycle that ends after its deadline is an overrun, counted and
logged (rate-limited); if it ran more than a whole period late, the missed periods are skipped and
counted too (never silently absorbed). Per-stage times go to ``daemon.control.timing_stats.LoopStats``.

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
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any

import numpy as np

from daemon.config.settings import Config
from daemon.control.arm_link import ArmLink
from daemon.control.driven_arm import DrivenArm, SourceEntry
from daemon.control.faults import fault_text
from daemon.control.leader_source import LeaderSource
from daemon.control.safety import ControllerState, CycleOutput, SafetyParams
from daemon.control.seams import (
    ArmRecord,
    CycleHook,
    CycleRecord,
    LeaderHook,
    PerArmSource,
    RecordHook,
    TargetSource,
    Watchdog,
)
from daemon.control.snapshot import (
    BUS_COUNTER_KEYS,
    SAFETY_CONFIG_KEYS,
    ArmSnapshot,
    LinkSnapshot,
    LoopSnapshot,
    render_status,
)
from daemon.control.supervisor import Supervisor
from daemon.control.timing_stats import LoopStats, RollingStats, WorstCalls
from daemon.system.logs import RateLimitedLogger
from daemon.system.realtime import current_policy, make_current_thread_realtime
from drivers.arm_interface import ArmHealth, FollowerArm, LeaderArm

log = logging.getLogger("so101d.loop")
_rl = RateLimitedLogger(log, period_s=5.0, burst=3)

_SPIN_S = 0.0003  # sleep until this long before a deadline, then spin (sleep overshoots ~0.1 ms)
_CYCLE_POLL_S = 0.001  # wait_cycles polls the count: nothing for the loop to signal, nothing it pays
_MONO = time.monotonic
PRIMARY_ARM = "follower"
_WORKER_WAIT_S = 1.0  # longer than any serial transaction's timeout: a worker this late is stuck

__all__ = ["ArmLink", "ControlLoop", "CycleHook", "LeaderHook", "RecordHook", "TargetSource"]


class ControlLoop:
    """Runs the cycle described in the module docstring on its own thread (``start``/``stop``).

    ``leader`` may be None (policy-only or sim-only setups); ``follower`` is required: it is the
    primary arm, named ``primary_name`` ("follower"; "left" on a bimanual bench), driven by the
    leader source named ``leader_name``. A second pair is ``add_leader`` + ``add_arm``.
    """

    def __init__(
        self,
        leader: LeaderArm | None,
        follower: FollowerArm,
        cfg: Config,
        *,
        free_run: bool = False,
        spin_s: float = _SPIN_S,
        primary_name: str = PRIMARY_ARM,
        leader_name: str = "leader",
    ) -> None:
        """``free_run`` drops the sleep (benchmarks)."""
        self.cfg = cfg
        self.period_s = 1.0 / cfg.control.rate_hz
        self.free_run = free_run
        self.spin_s = spin_s
        self.overlap_io = cfg.control.overlap_io
        self.stats = LoopStats()
        self.worst_calls = WorstCalls()  # per source and hook: its longest single call
        # the target sources by name; an arm names the one that drives it
        self.sources: dict[str, SourceEntry] = {}
        # every leader, read each cycle (each on its own worker with overlap_io); the first is the
        # primary arm's (status's "leader", the leader hooks)
        self.leaders: dict[str, LeaderSource] = {}
        self.leader_link: ArmLink[LeaderArm] | None = None
        self.leader_source: LeaderSource | None = None
        if leader is not None:
            self.leader_source = self._make_leader(leader_name, leader, self.stats.leader_read)
            self.leader_link = self.leader_source.link
        self.leader_name = leader_name
        self.arms: list[DrivenArm] = []
        self.primary = self._make_arm(
            primary_name, follower, leader_name, self.stats.follower_read, self.stats.follower_write
        )
        self.arms.append(self.primary)
        # a fault (or a lost follower) on one arm holds the others too: one task (safety.fault_holds)
        self.hold_together = cfg.safety.fault_holds == "all"
        self.supervisor = Supervisor(cfg, self.period_s, self.stats, self.arms, self.leaders)
        # operator intent, changed only on the loop thread (through submit)
        self.intent: str = cfg.control.start_mode
        self.torque_wanted = True
        self.scheduling = "not started"  # the loop thread's own policy, read by that thread
        # counters
        self.cycles = 0
        self.overruns = 0
        self.missed_cycles = 0
        self.hook_errors = 0
        self.started_at_s = _MONO()
        # plumbing
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._hooks: list[CycleHook] = []
        self._record_hooks: list[RecordHook] = []
        # "hook.<class>" per hook, for worst_calls (kept beside the lists: no name built per cycle)
        self._hook_names: list[str] = []
        self._record_hook_names: list[str] = []
        self._leader_hooks: list[LeaderHook] = []
        self.watchdog: Watchdog | None = None  # daemon.system.sd_notify.WatchdogGate when systemd watches us
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stopped = threading.Event()

    def _make_leader(self, name: str, leader: LeaderArm, read_stats: RollingStats) -> LeaderSource:
        c = self.cfg.control
        link: ArmLink[LeaderArm] = ArmLink(name, leader, c.reconnect_backoff_min_s, c.reconnect_backoff_max_s)
        src = LeaderSource(link, read_stats, self.cfg.safety.leader_stale_s)
        self.leaders[name] = src
        self.sources = {**self.sources, name: SourceEntry(name, src, lambda: src.units)}
        return src

    def _make_arm(
        self, name: str, arm: FollowerArm, source: str, read_stats: RollingStats, write_stats: RollingStats
    ) -> DrivenArm:
        c = self.cfg.control
        link: ArmLink[FollowerArm] = ArmLink(name, arm, c.reconnect_backoff_min_s, c.reconnect_backoff_max_s)
        driven = DrivenArm(name, link, source, self.cfg, self.period_s, read_stats, write_stats)
        if source not in self.leaders:
            driven.teleop_source = self.leader_name  # teleop: the primary leader, as before a source was given
        link.on_connect = driven.on_connect
        return driven

    # ------------------------------------------------------------------ the primary arm (status, the service, tests)
    @property
    def follower_link(self) -> ArmLink[FollowerArm]:
        return self.primary.link

    @property
    def state(self) -> ControllerState:
        return self.primary.state

    @property
    def params(self) -> SafetyParams | None:
        return self.primary.params

    @property
    def measured(self) -> np.ndarray | None:
        return self.primary.measured

    @property
    def target(self) -> np.ndarray | None:
        return self.primary.target

    @property
    def command(self) -> np.ndarray | None:
        return self.primary.command

    @property
    def health(self) -> ArmHealth | None:
        return self.primary.health

    @property
    def fault_now(self) -> str:
        return self.primary.fault_now

    @property
    def power_cycle_required(self) -> str:
        return self.primary.power_cycle_required

    @property
    def follower_errors(self) -> int:
        return self.primary.errors

    @property
    def follower_kind(self) -> str:
        return self.primary.kind

    @property
    def limited_cycles(self) -> int:
        return self.primary.limited_cycles

    @property
    def rate_warning(self) -> str:
        return self.supervisor.rate_warning

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

    # ------------------------------------------------------------------ arms and sources
    def add_leader(self, name: str, leader: LeaderArm) -> None:
        """Read another leader every cycle, offered as the source ``name`` (a bimanual pair's
        second leader: ``add_leader("right_leader", ...)`` then ``add_arm("right", ...,
        source="right_leader")``). Only before ``start``: its link and worker start with the others."""
        if self._thread is not None:
            raise RuntimeError("add_leader: the loop is running; leaders are added before start")
        if name in self.sources:
            raise ValueError(f"a source named {name!r} is offered already")
        self._make_leader(name, leader, RollingStats())

    def add_arm(self, name: str, arm: FollowerArm, source: str = "leader") -> DrivenArm:
        """Drive another arm, named ``name``, from the source named ``source`` (a leader's: that
        arm's teleop source). Before ``start`` it is connected with the others (its bus on its own
        thread with ``control.overlap_io``); on a running loop it joins at a cycle boundary and
        connects on its own link's thread."""
        if any(a.name == name for a in self.arms):
            raise ValueError(f"an arm named {name!r} is driven already")
        driven = self._make_arm(name, arm, source, RollingStats(), RollingStats())
        if self._thread is None:
            self.arms.append(driven)
            return driven
        self.call(lambda: self.arms.append(driven))
        driven.link.start()
        return driven

    def add_source(
        self,
        name: str,
        source: TargetSource,
        last_reading: Callable[[], np.ndarray | None] | None = None,
        per_arm: Mapping[str, TargetSource] | None = None,
    ) -> None:
        """Offer a target source under ``name`` (replacing one of that name); an arm follows it
        once assigned (``assign``). ``last_reading``: what the recorder's teleop.action shows
        while the source offers nothing fresh (default: the command sent). ``per_arm``: a source
        driving several arms gives each arm named there its own view (SourceEntry)."""
        for given in (source, *(per_arm or {}).values()):
            if not isinstance(given, TargetSource):
                raise TypeError(f"{given!r} is not a TargetSource (target(now, state) -> target or None)")
        unknown = sorted(set(per_arm or {}) - {a.name for a in self.arms})
        if unknown:
            raise ValueError(
                f"source {name!r}: no arm named {', '.join(map(repr, unknown))} (arms: {', '.join(a.name for a in self.arms)})"
            )
        views = None if per_arm is None else dict(per_arm)
        entry = (
            SourceEntry(name, source, per_arm=views)
            if last_reading is None
            else SourceEntry(name, source, last_reading, views)
        )
        self.sources = {**self.sources, name: entry}  # one reference swap: the loop never sees it half-made

    def remove_source(self, name: str) -> None:
        """Withdraw a source: arms assigned to it hold until assigned another."""
        self.sources = {k: v for k, v in self.sources.items() if k != name}

    def assign(self, arm: str, source: str) -> Future[None]:
        """Switch ``arm`` to the source named ``source`` at the next cycle boundary (the only way
        an arm changes source); the Future completes once applied. ValueError for an unknown arm
        or source."""
        driven = next((a for a in self.arms if a.name == arm), None)
        if driven is None:
            raise ValueError(f"no arm named {arm!r} (arms: {', '.join(a.name for a in self.arms)})")
        if source not in self.sources:
            raise ValueError(f"no source named {source!r} (sources: {', '.join(self.sources) or 'none'})")

        def apply() -> None:
            if driven.source_name != source:
                log.info("%s: now driven by %s (was %s)", driven.name, source, driven.source_name)
            driven.source_name = source

        fut: Future[None] = Future()
        self._commands.put((apply, fut))  # also on a loop stepped by hand: applied at its next cycle
        return fut

    def links(self) -> list[ArmLink[Any]]:
        """Every arm's link: the leaders' first, then the driven arms', in the loop's order."""
        leaders: list[ArmLink[Any]] = [src.link for src in self.leaders.values()]
        return leaders + [a.link for a in self.arms]

    def assignments(self) -> dict[str, str]:
        """Which source drives which arm, now."""
        return {a.name: a.source_name for a in self.arms}

    @property
    def policy_source(self) -> TargetSource | None:
        entry = self.sources.get("policy")
        return entry.source if entry is not None else None

    @policy_source.setter
    def policy_source(self, source: TargetSource | None) -> None:
        """The policy's source for mode ``policy`` (None: no policy loaded; arms it drove hold).
        A source that drives several arms (``PerArmSource``: a bimanual policy) gives each its view."""
        if source is None:
            self.remove_source("policy")
        elif isinstance(source, PerArmSource):
            self.add_source("policy", source, per_arm=source.views)
        else:
            self.add_source("policy", source)

    # ------------------------------------------------------------------ plumbing for others
    def add_hook(self, hook: CycleHook | LeaderHook | RecordHook) -> None:
        """Register a ``RecordHook`` (``on_record``), else a ``CycleHook`` (``on_cycle``), and/or a
        ``LeaderHook`` (``on_leader``) (daemon/control/seams.py)."""
        is_record, is_cycle, is_leader = (
            isinstance(hook, RecordHook),
            isinstance(hook, CycleHook),
            isinstance(hook, LeaderHook),
        )
        if not (is_record or is_cycle or is_leader):
            raise TypeError(
                f"{hook!r} is neither a CycleHook (on_cycle), a LeaderHook (on_leader) nor a RecordHook (on_record)"
            )
        name = f"hook.{type(hook).__name__}"
        if is_record:
            self._record_hooks.append(hook)  # type: ignore[arg-type]  # narrowed by the isinstance above
            self._record_hook_names.append(name)
        elif is_cycle:
            self._hooks.append(hook)  # type: ignore[arg-type]  # narrowed by the isinstance above
            self._hook_names.append(name)
        if is_leader:
            self._leader_hooks.append(hook)  # type: ignore[arg-type]  # narrowed by the isinstance above

    def remove_hook(self, hook: CycleHook | LeaderHook | RecordHook) -> None:
        for hooks, names in ((self._hooks, self._hook_names), (self._record_hooks, self._record_hook_names)):
            if hook in hooks:
                i = hooks.index(hook)  # type: ignore[arg-type]  # equality only: any list may hold it
                del hooks[i], names[i]
        if hook in self._leader_hooks:
            self._leader_hooks.remove(hook)

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
    def set_intent(self, intent: str, keep_sources: bool = False) -> None:
        """idle, hold, teleop or policy. Tracking intents clear a latched fault if it is gone.
        The arms driven by the leader or the policy follow the intent's source (the policy in
        ``policy``, else the leader); an arm assigned another source keeps it.

        ``keep_sources`` (a hold only): every arm keeps its source, so the cycle record goes on
        naming the policy while a paused policy's arm holds (a correction's take-over: those
        frames are not the operator's, daemon/data/interventions.py)."""
        if intent not in ("idle", "hold", "teleop", "policy"):
            raise ValueError(f"unknown mode {intent!r}")
        if keep_sources and intent != "hold":
            raise ValueError("keep_sources is for a hold")
        if intent == "policy" and self.policy_source is None:
            raise ValueError("no policy loaded")
        if intent in ("teleop", "policy"):
            self.torque_wanted = True
            self._recover_faults()
            for arm in self.arms:
                arm.released_hold = ""  # the operator's resume moves an arm a client released, too
        for arm in self.arms:
            if not keep_sources and arm.source_name in (arm.teleop_source, "policy"):
                arm.source_name = "policy" if intent == "policy" else arm.teleop_source
        self.intent = intent

    def set_torque_wanted(self, on: bool) -> None:
        if not on:
            self.intent = "idle"
        else:
            self._recover_faults()
        self.torque_wanted = on

    def _recover_faults(self) -> None:
        for arm in self.arms:
            if arm.state.fault:
                self.supervisor.recover_fault(arm)

    def apply_config(self, cfg: Config) -> None:
        """Swap in a reloaded configuration (loop thread, between cycles): see Supervisor.apply_config."""
        self.cfg = cfg
        self.hold_together = cfg.safety.fault_holds == "all"  # safety.* is live (daemon/config/reload.py)
        self.supervisor.apply_config(cfg)

    # ------------------------------------------------------------------ lifecycle
    def start_links(self) -> None:
        """Start connecting the arms (each on its link's thread), and the leader's read worker."""
        self.supervisor.start_links(self.overlap_io, on_worker_start=self._set_realtime)

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
        """Stop the loop; the arms' torque goes off or holds per ``follower.torque_off_on_shutdown``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        self.supervisor.shutdown()
        self.stopped.set()

    # ------------------------------------------------------------------ one cycle
    def cycle(self, now: float) -> None:
        """One control cycle: the five steps of the module docstring (public so tests and the
        benchmark can step it)."""
        self._drain_commands()
        self._read(now)
        t_u = _MONO()
        sources, intent, torque, arms = self.sources, self.intent, self.torque_wanted, self.arms
        blocks = self._blocks(now) if len(arms) > 1 and self.hold_together else None
        outs = []
        for arm in arms:
            arm.select(now, sources, self._count_hook_error, self.worst_calls, _MONO)
            why = "" if blocks is None else next((r for a, r in blocks if a is not arm), "")
            why = why or arm.released_hold
            outs.append(arm.update(now, intent, torque, why))
        self.stats.update.add(_MONO() - t_u)
        self._write(outs)
        self._call_hooks(now, outs)
        self.cycles += 1

    def _blocks(self, now: float) -> list[tuple[DrivenArm, str]] | None:
        """The arms that block the task now (a fault, a lost follower) and why; None: none does."""
        found = [(a, why) for a in self.arms if (why := a.blocking(now))]
        return found or None

    def _count_hook_error(self) -> None:
        self.hook_errors += 1

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
        """The leaders (overlapped) and the arms (each beside the primary on its bus worker); a
        fresh primary-leader reading to the leader hooks."""
        leaders = self.leaders
        started = [src for src in leaders.values() if src.begin_read()] if leaders else ()
        arms = self.arms
        on_workers = [a for a in arms if a.worker is not None and a.worker.run(partial(a.read, now, _MONO))]
        for arm in arms:
            if arm.worker is None:
                arm.read(now, _MONO)
        self._wait_workers(on_workers)
        for src in started:
            src.finish_read(max(0.0, now + self.period_s * 0.5 - _MONO()) if not self.free_run else 0.05)
        leader = self.leader_source
        if leader is None:
            return
        fresh = leader.take_fresh()
        if fresh is not None:
            for hook in self._leader_hooks:
                try:
                    hook.on_leader(now, fresh)
                except Exception as exc:
                    self.hook_errors += 1
                    _rl.error("hook.leader", "leader hook failed: %r", exc)

    # ---- 4. write
    def _write(self, outs: list[CycleOutput]) -> None:
        """Each arm's torque change and goals: the arms with a bus worker on it, meanwhile the
        others here; returns once every bus is done (hooks read what the writes left)."""
        arms = self.arms
        on_workers = [
            a for a, out in zip(arms, outs) if a.worker is not None and a.worker.run(partial(a.write, out, _MONO))
        ]
        for arm, out in zip(arms, outs):
            if arm.worker is None:
                arm.write(out, _MONO)
        self._wait_workers(on_workers)

    def _wait_workers(self, arms: list[DrivenArm]) -> None:
        for arm in arms:
            worker = arm.worker
            if worker is not None and not worker.wait(_WORKER_WAIT_S):
                # a bus stuck past every serial timeout: this arm's pose ages (it reads as not
                # current, so nothing is written to it and its partners hold) until the call returns
                _rl.error(f"{arm.name}.worker", "%s: its bus call has not returned in %.1f s", arm.name, _WORKER_WAIT_S)

    # ---- 5. hooks
    def _call_hooks(self, now: float, outs: list[CycleOutput]) -> None:
        if not (self._hooks or self._record_hooks):
            return
        first = self.primary.record(outs[0])
        others: tuple[ArmRecord, ...] = ()
        if self._record_hooks:
            others = tuple(r for r in (a.record(o) for a, o in zip(self.arms[1:], outs[1:])) if r is not None)
        if first is None and not others:
            return  # no arm's pose is current (a single arm's: its follower lost): nothing to record or feed
        t_h = t0 = _MONO()
        worst = self.worst_calls
        # the primary arm's pose not current (its follower lost): the cycle hooks, fed its state,
        # have nothing; the recorder still gets the other arms (a bimanual one repeats the primary's
        # newest values and its tag says so, as for any other arm lost, instead of a gap it later
        # filled with the values read after the follower came back)
        if first is not None:
            for hook, name in zip(self._hooks, self._hook_names):
                try:
                    hook.on_cycle(now, first.state_units, first.action_units, first.teleop_action_units)
                except Exception as exc:
                    self.hook_errors += 1
                    _rl.error("hook.cycle", "cycle hook failed: %r", exc)
                t1 = _MONO()
                worst.note(name, t1 - t0)
                t0 = t1
        if self._record_hooks:
            record = CycleRecord(
                now, ((first,) if first is not None else ()) + others, primary_current=first is not None
            )
            t0 = _MONO()
            for rhook, name in zip(self._record_hooks, self._record_hook_names):
                try:
                    rhook.on_record(record)
                except Exception as exc:
                    self.hook_errors += 1
                    _rl.error("hook.record", "record hook failed: %r", exc)
                t1 = _MONO()
                worst.note(name, t1 - t0)
                t0 = t1
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

    def _read_health_in_slack(self, end: float, deadline: float) -> float:
        """Each arm's health in the slack, if it fits (else try again next cycle); once it is a
        whole period overdue it is read anyway: a fault must never go unseen because the cycles
        are tight (or because one slow read inflated the cost estimate). Returns the time now."""
        period = self.cfg.control.health_period_s
        for arm in self.arms:
            due = arm.link.connected and end >= arm.next_health_s
            if not due:
                continue
            overdue = end >= arm.next_health_s + period
            if self.free_run or deadline - end > 1.5 * arm.health_cost_s or overdue:
                arm.read_health(end, _MONO)
                end = _MONO()
        return end

    def _run(self) -> None:
        self._set_realtime()
        self._note_scheduling()
        period = self.period_s
        deadline = _MONO()
        last_start: float | None = None
        supervisor = self.supervisor
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
                    self._read_health_in_slack(end, end)
                    continue
                deadline += period
                if end >= supervisor.next_rate_check_s:
                    supervisor.check_rate(end)
                end = self._read_health_in_slack(end, deadline)
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
    @staticmethod
    def _link_snapshot(link: ArmLink[Any], now: float) -> LinkSnapshot:
        diag = link.arm.diagnostics()
        counters = diag.counters
        nxt = link.next_try_s
        return LinkSnapshot(
            connected=link.connected,
            port=link.port,
            connected_for_s=max(0.0, now - link.since_s),
            connects=link.connects,
            losses=link.losses,
            last_error=link.last_error,
            configure_warnings=diag.configure_warnings,
            bus_counters=None if counters is None else {k: getattr(counters, k) for k in BUS_COUNTER_KEYS},
            missing_servos=link.missing,
            next_try_in_s=None if link.connected or nxt is None else max(0.0, nxt - now),
            waiting=link.waiting_text(now),
        )

    def snapshot(self) -> LoopSnapshot:
        """Everything ``status`` shows, copied now (plain attributes: lock-free, from any thread)."""
        primary = self.primary
        st = primary.state
        now = _MONO()
        stages = self.stats.summaries_ms()
        period = stages["period"]
        health = primary.health
        return LoopSnapshot(
            mode=st.mode,
            intent=self.intent,
            reason=st.reason,
            fault=fault_text(st.fault or primary.fault_now, primary.power_cycle_required),
            fault_latched=st.fault,
            fault_now=primary.fault_now,
            torque_wanted=self.torque_wanted,
            follower_kind=primary.kind,
            uptime_s=now - self.started_at_s,
            rate_hz_target=self.cfg.control.rate_hz,
            rate_hz=(1000.0 / period["mean"]) if period["mean"] else 0.0,
            cycles=self.cycles,
            overruns=self.overruns,
            missed_cycles=self.missed_cycles,
            limited_cycles=primary.limited_cycles,
            limit_hits=tuple(int(c) for c in primary.limit_hits),
            leader_errors=sum(src.errors for src in self.leaders.values()),
            follower_errors=primary.errors,
            hook_errors=self.hook_errors,
            overlap_io=any(src.overlapped for src in self.leaders.values()),
            rate_warning=self.supervisor.rate_warning,
            scheduling=self.scheduling,
            power_cycle_required=primary.power_cycle_required,
            safety_config={k: getattr(self.cfg.safety, k) for k in SAFETY_CONFIG_KEYS},
            timing_ms=stages,
            leader=self._link_snapshot(self.leader_link, now) if self.leader_link is not None else None,
            follower=self._link_snapshot(primary.link, now),
            # the loop thread may read the leader after `now` was taken: a reading that new is 0 s old
            leader_age_s=max(0.0, now - self.leader_read_at_s),
            leader_units=self.leader_units,
            follower_units=primary.measured,
            command_units=primary.command,
            health=health,
            health_age_s=None if health is None or not health.read_at_s else now - health.read_at_s,
            worst_calls_ms=self.worst_calls.as_ms(),
            arms=tuple(self._arm_snapshot(a, now) for a in self.arms),
        )

    def _arm_snapshot(self, arm: DrivenArm, now: float) -> ArmSnapshot:
        st = arm.state
        leader = self.leaders.get(arm.teleop_source)
        return ArmSnapshot(
            name=arm.name,
            source=arm.source_name,
            mode=st.mode,
            reason=st.reason,
            kind=arm.kind,
            connected=arm.link.connected,
            teleop_source=arm.teleop_source,
            fault=fault_text(st.fault or arm.fault_now, arm.power_cycle_required),
            follower=self._link_snapshot(arm.link, now),
            leader=self._link_snapshot(leader.link, now) if leader is not None else None,
            follower_units=arm.measured,
            command_units=arm.command,
            leader_units=leader.units if leader is not None else None,
            errors=arm.errors,
            limited_cycles=arm.limited_cycles,
            health=arm.health,
        )

    def status(self) -> dict[str, Any]:
        """The ``status`` verb's loop part (daemon/control/snapshot.py renders the snapshot)."""
        return render_status(self.snapshot())
