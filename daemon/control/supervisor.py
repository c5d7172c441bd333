"""Beside the control loop: everything about the arms that is not the cycle.

- connect / reconnect with backoff: each arm's ``ArmLink`` thread (daemon/control/arm_link.py);
  started and stopped here, never on the loop thread's time;
- fault recovery (``recover_fault``): re-arm an arm whose servos cut torque, on the operator's
  request (``teleop start``, ``torque on``), with a refusal that says what is missing;
- reload (``apply_config``): the keys read live, handed to every arm;
- shutdown policy (``shutdown``): hold or torque off per ``follower.torque_off_on_shutdown``, then
  close each arm saying which (``close(torque_off=...)``);
- rate diagnosis (``check_rate``): say when the adapters make the configured rate impossible.

The loop calls ``recover_fault``, ``apply_config`` and ``check_rate`` on its own thread between
cycles (they cost a few bus transactions at most, on operator actions only, or microseconds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from daemon.config.settings import Config
from daemon.control.arm_link import ArmLink
from daemon.control.bus_worker import BusWorker
from daemon.control.driven_arm import DrivenArm
from daemon.control.leader_source import LeaderSource
from daemon.control.safety import SafetyParams
from daemon.control.timing_stats import LoopStats, RollingStats
from drivers.arm_interface import ArmError, OverloadLatchedError, PortGoneError

log = logging.getLogger("so101d.loop")
_MONO = time.monotonic

RATE_CHECK_S = 2.0  # how often the loop asks whether its configured rate is achievable at all
_RATE_IMPOSSIBLE = 0.9  # median cycle work above this share of the period: the rate cannot be held


class Supervisor:
    """Owns the arms' connections, recovery, reload, shutdown and the rate diagnosis."""

    def __init__(
        self,
        cfg: Config,
        period_s: float,
        stats: LoopStats,
        arms: list[DrivenArm],
        leaders: dict[str, LeaderSource],
    ) -> None:
        self.cfg = cfg
        self.period_s = period_s
        self.stats = stats
        self.arms = arms  # the loop's own list: an arm added to the loop is supervised too
        self.leaders = leaders  # the loop's own leaders, by source name
        self.rate_warning = ""  # set when the adapters make the configured rate impossible
        self.next_rate_check_s = 0.0

    # ------------------------------------------------------------------ connect
    def start_links(self, overlap_io: bool, on_worker_start: Callable[[], None] | None = None) -> None:
        """Start connecting the arms (each on its link's thread), each leader's read worker, and
        with ``overlap_io`` a bus worker for every arm beside the primary (its own serial port:
        its reads and writes overlap the primary's on the loop thread)."""
        for src in self.leaders.values():
            src.link.start()
            if overlap_io:
                src.start_worker(on_start=on_worker_start)
        for i, arm in enumerate(self.arms):
            if overlap_io and i > 0 and arm.worker is None:
                arm.worker = BusWorker(arm.name, on_start=on_worker_start)
            arm.link.start()

    # ------------------------------------------------------------------ fault recovery (loop thread)
    def recover_fault(self, arm: DrivenArm) -> None:
        """Re-arm an arm after a fault (servos that cut torque need Torque_Enable again), re-read
        its health, and let the next update clear the latch if the fault is gone. Raises
        RuntimeError with the reason when it cannot (the refused verb's answer)."""
        link = arm.link
        if not link.connected:
            raise RuntimeError(
                f"{link.waiting_text(_MONO())}. Refused rather than carried out later: the arm would "
                "start moving by itself the moment the servo answers; ask again once status shows it connected"
            )
        dev = link.arm
        try:
            arm.reconfigure_if_needed()
        except ArmError as exc:
            raise RuntimeError(f"cannot configure the {arm.name} after its power cycle: {exc}") from exc
        for attempt in range(3):  # a noisy bus may drop one of these few transactions: try again
            try:
                pose = dev.read_joints()
                if arm.params is not None:
                    pose = np.clip(pose, arm.params.lower, arm.params.upper)
                dev.write_goals(pose)
                dev.set_torque(True)
                # torque is back at the present pose: a fault that persists must hold *this* pose,
                # not the one captured when it began (a joint may have moved while limp)
                arm.state = replace(arm.state, torque_on=True, hold_pose=pose, command=pose)
                arm.read_health(_MONO(), _MONO)
                break
            except PortGoneError as exc:
                raise RuntimeError(f"cannot re-arm the {arm.name}: {exc}") from exc
            except OverloadLatchedError as exc:
                # Not a bus hiccup and not cleared by another torque write: say exactly what helps.
                arm.power_cycle_required = str(exc)
                arm.fault_now = str(exc)
                log.error("%s FAULT: %s (waiting for the power cycle)", arm.name.upper(), exc)
                raise RuntimeError(str(exc)) from exc
            except ArmError as exc:
                if attempt == 2:
                    raise RuntimeError(f"cannot re-arm the {arm.name}: {exc}") from exc
        if arm.fault_now:
            raise RuntimeError(f"fault still present: {arm.fault_now}")
        arm.clear_fault = True

    # ------------------------------------------------------------------ reload (loop thread)
    def apply_config(self, cfg: Config) -> None:
        """Swap in a reloaded configuration. Only keys that are read live take effect
        (daemon/config/reload.py decides which; the rest kept their running values)."""
        self.cfg = cfg
        for arm in self.arms:
            arm.cfg = cfg
            if arm.params is not None:
                arm.params = SafetyParams.from_config(cfg.safety, arm.params.lower, arm.params.upper, self.period_s)
            arm.next_health_s = 0.0
        for src in self.leaders.values():
            src.stale_s = cfg.safety.leader_stale_s
        for link in self._links():
            link.backoff_min_s = cfg.control.reconnect_backoff_min_s
            link.backoff_max_s = cfg.control.reconnect_backoff_max_s

    def _links(self) -> list[ArmLink[Any]]:
        leader_links: list[ArmLink[Any]] = [src.link for src in self.leaders.values()]
        return leader_links + [a.link for a in self.arms]

    # ------------------------------------------------------------------ rate diagnosis (loop thread)
    def check_rate(self, now: float) -> None:
        """Say clearly (status + log) when the arms' round trips make the configured rate
        impossible (an FTDI adapter on its default 16 ms latency timer), and when that passes."""
        self.next_rate_check_s = now + RATE_CHECK_S
        cycle = self.stats.cycle.summary()
        if cycle.window < 50:
            return
        period_ms = self.period_s * 1000.0
        if cycle.p50 * 1000.0 <= _RATE_IMPOSSIBLE * period_ms:
            if self.rate_warning:
                log.info("control rate achievable again (cycle p50 %.1f ms)", cycle.p50 * 1000.0)
            self.rate_warning = ""
            return
        reads: list[tuple[ArmLink[Any], RollingStats]] = [(a.link, a.read_stats) for a in self.arms]
        reads += [(src.link, src.read_stats) for src in self.leaders.values()]
        parts = []
        for link, stage in reads:
            p50 = stage.summary().p50 * 1000.0
            timer = link.arm.diagnostics().latency_timer_ms
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

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """After the loop thread stopped: stop the links, then hold or torque off each arm per
        ``follower.torque_off_on_shutdown``, and close every arm saying which."""
        for link in self._links():
            link.stop()
        for src in self.leaders.values():
            src.stop()
        stuck: set[str] = set()
        for arm in self.arms:
            if arm.worker is not None:
                if not arm.worker.stop():
                    # its bus call never returned: a call from here would share the port with it
                    log.error("%s: its bus call is still running; left as it is, not closed", arm.name)
                    stuck.add(arm.name)
                arm.worker = None  # the shutdown's own bus calls below run here
        torque_off = self.cfg.follower.torque_off_on_shutdown
        for arm in self.arms:
            if arm.name not in stuck:
                self._shutdown_arm(arm, torque_off)
        # a leader never keeps torque
        closing: list[tuple[ArmLink[Any], bool]] = [(src.link, True) for src in self.leaders.values()]
        closing += [(a.link, torque_off) for a in self.arms if a.name not in stuck]
        for link, off in closing:
            try:
                link.arm.close(torque_off=off)
            except Exception as exc:
                log.warning("%s: close failed: %s", link.name, exc)

    @staticmethod
    def _shutdown_arm(arm: DrivenArm, torque_off: bool) -> None:
        link = arm.link
        if not link.connected:
            return
        try:
            if torque_off:
                link.arm.set_torque(False)
                log.info("%s torque off (shutdown)", arm.name)
            else:
                pose = link.arm.read_joints()
                if arm.params is not None and np.all(np.isfinite(pose)):
                    link.arm.write_goals(np.clip(pose, arm.params.lower, arm.params.upper))
                log.info("%s holding its pose (shutdown)", arm.name)
        except Exception as exc:
            log.error("%s shutdown action failed: %s", arm.name, exc)
