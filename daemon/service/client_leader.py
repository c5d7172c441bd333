"""The leader lent to a control-socket client to be driven: the verbs leader.acquire, leader.goal
and leader.release (declared in daemon/api/messages.py), over a ``LeaderDrive``.

This is LeRobot's smooth handover through the daemon (the so101d plugin's teleoperator:
``enable_torque``, ``send_feedback``, ``disable_torque``): the daemon owns the leader's port, so
the client hands it goals and the daemon moves the leader to them at the take-over's bounded
speed, within the leader's calibrated range (daemon/policy/leader_drive.py).

Refused while an arm follows the leader (the loop's intent teleop with an arm on the leader's
source: moving the leader would move that arm), while the policy's take-over drives it, while
another client holds it, and when there is no leader or it is not connected. The leader goes
limp again (torque off) at ``leader.release``, when the holder's process is gone (the kernel's
word, as for ``arm.acquire``), when an arm starts following the leader (the operator's
``so101d teleop start`` with the leader's source), or when the leader stops answering.

A bimanual daemon has a leader per arm (LeRobot's BiSOLeader is actuated arm by arm too):
``leader.acquire`` names the arm whose leader it wants (default: the primary arm's), and each
leader has its own lease; ``leader.goal`` / ``leader.release`` find the leader by the lease.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

import numpy as np

from calibration.conventions import JOINT_NAMES
from daemon.api.server import RequestError, request_peer_pid
from daemon.control.leader_source import LeaderSource
from daemon.control.loop import ControlLoop
from daemon.policy.leader_drive import DrivableLeader, LeaderClaim, LeaderDrive, LeaderDriveConfig
from daemon.service.context import DaemonContext
from daemon.service.leases import Lease
from daemon.system.processes import start_ticks

log = logging.getLogger("so101d.client_leader")

_STOP_WITHIN_S = 3.0


def _joints(values: np.ndarray | None) -> dict[str, float] | None:
    return None if values is None else dict(zip(JOINT_NAMES, np.asarray(values, dtype=np.float64).tolist()))


class ClientLeader:
    """The leader's lease and the three verbs' handlers (see the module docstring)."""

    def __init__(
        self,
        loop: ControlLoop,
        leader: DrivableLeader | None,
        claim: LeaderClaim,
        config: LeaderDriveConfig | None = None,
        *,
        source: LeaderSource | None = None,
        source_name: str = "leader",
    ) -> None:
        self.loop = loop
        self.leader = leader
        self.claim = claim
        self.source_name = source_name  # the loop's name of this leader's source
        self._source = source if source is not None else loop.leaders.get(source_name)
        self.config = config or LeaderDriveConfig()
        self._lock = threading.Lock()
        self._lease: Lease | None = None
        self._drive: LeaderDrive | None = None

    def _followed(self) -> str:
        """Which arm follows the leader now ("" when none does). An arm a client released holds,
        on its leader's source, until the operator's resume (``DrivenArm.released_hold``): it follows nothing."""
        if self.loop.intent != "teleop":
            return ""
        return next((a.name for a in self.loop.arms if a.source_name == self.source_name and not a.released_hold), "")

    def _keep(self, lease: Lease) -> str:
        """Why the client's drive must end now ("" while it may go on); on the drive's thread."""
        if not lease.alive():
            return f"its holder {lease.words()} is gone"
        followed = self._followed()
        if followed:
            return f"{followed} follows the leader now (teleop): the leader is the operator's hand again"
        link = self._source.link if self._source is not None else None
        if link is not None and not link.connected:
            return "the leader is not connected"
        return ""

    def holds(self, token: str | None) -> bool:
        with self._lock:
            return token is not None and self._lease is not None and self._lease.token == token

    def acquire(self, req: dict[str, Any]) -> dict[str, Any]:
        leader = self.leader
        if leader is None:
            raise RequestError("this daemon has no leader arm that can be driven (a simulated leader cannot)")
        link = self._source.link if self._source is not None else None
        if link is not None and not link.connected:
            raise RequestError("the leader is not connected (see `so101d status`)")
        followed = self._followed()
        if followed:
            raise RequestError(
                f"{followed} follows the leader now (teleop): driving the leader would move it; "
                "acquire the arm first (arm.acquire), or `so101d teleop stop`"
            )
        client = req.get("client") or "a control-socket client"
        peer = request_peer_pid()
        pid = peer if peer is not None else req.get("pid")
        with self._lock:
            held = self._lease
            if held is not None and held.alive() and self._drive is not None and not self._drive.finished:
                raise RequestError(f"the leader is held by {held.words()}: it must release it first", "leader")
            old, self._drive = self._drive, None
        if old is not None:
            old.stop("taken over by the next client")
            old.join(_STOP_WITHIN_S)
        lease = Lease("leader", secrets.token_hex(16), client, pid, time.time(), start_ticks(pid) if pid else None)
        who = f"{client} (pid {pid})" if pid is not None else client
        holder = self.claim.take(who)
        if holder is not None:
            raise RequestError(f"the leader is driven by {holder} now", "leader")
        drive = LeaderDrive(leader, lambda: self._keep(lease), self.config)
        try:
            drive.start()
        except RuntimeError as exc:
            self.claim.give(who)
            raise RequestError(str(exc)) from None
        threading.Thread(target=self._give_back_when_done, args=(drive, who), daemon=True).start()
        with self._lock:
            self._lease, self._drive = lease, drive
        log.info("leader: torque on, driven for %s", lease.words())
        return {
            "message": f"the leader holds where it is, torque on, for {client}: leader.goal moves it",
            "lease": lease.token,
            "phase": drive.phase,
            "goal": _joints(drive.command),
        }

    def _give_back_when_done(self, drive: LeaderDrive, who: str) -> None:
        """The claim goes with the drive, however it ended (released, the client gone, a failure)."""
        while not drive.finished:
            drive.join(1.0)
        self.claim.give(who)
        if drive.why:
            log.info("leader: torque off (%s)", drive.why)

    def _current(self, token: str | None) -> LeaderDrive:
        if not token:
            raise RequestError("no lease given: leader.acquire first and pass its lease", "lease")
        with self._lock:
            lease, drive = self._lease, self._drive
        if lease is None or lease.token != token or drive is None:
            raise RequestError("this lease is not current: the leader was released or taken over", "lease")
        if drive.finished:
            raise RequestError(f"the leader was let go: {drive.why}; leader.acquire again", "lease")
        return drive

    def goal(self, req: dict[str, Any]) -> dict[str, Any]:
        drive = self._current(req.get("lease"))
        given = np.array([np.nan if req.get(j) is None else float(req[j]) for j in JOINT_NAMES])
        try:
            goal = drive.goal(given)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        return {
            "message": "",
            "goal": _joints(goal),
            "command": _joints(drive.command),
            "leader": _joints(self._source.units if self._source is not None else None),
            "phase": drive.phase,
        }

    def release(self, req: dict[str, Any]) -> dict[str, Any]:
        drive = self._current(req.get("lease"))
        with self._lock:
            self._lease = None
        drive.stop("released by its client")
        drive.join(_STOP_WITHIN_S)
        if drive.phase == "failed":
            raise RequestError(f"released, but {drive.why}")
        return {"message": "leader released: torque off", "phase": drive.phase, "goal": _joints(drive.command)}

    def close(self) -> None:
        with self._lock:
            drive, self._drive, self._lease = self._drive, None, None
        if drive is not None:
            drive.stop("the daemon stops")
            drive.join(_STOP_WITHIN_S)


class ClientLeaders:
    """The leader.* verbs over every leader of the loop: ``leader.acquire`` picks one by the arm
    that follows it (``arm``; default the primary arm), the other two by their lease."""

    def __init__(self, loop: ControlLoop, by_arm: dict[str, ClientLeader]) -> None:
        self.loop = loop
        self.by_arm = by_arm

    def _of_arm(self, req: dict[str, Any]) -> ClientLeader:
        name = req.get("arm") or self.loop.primary.name
        ctl = self.by_arm.get(name)
        if ctl is None:
            known = ", ".join(self.by_arm) or "none"
            raise RequestError(f"no arm {name!r} with a leader here (arms with a leader: {known})", "arm")
        return ctl

    def _of_lease(self, req: dict[str, Any]) -> ClientLeader:
        token = req.get("lease")
        held = next((c for c in self.by_arm.values() if c.holds(token)), None)
        # no holder: the primary's answers why (no lease given, not current, let go)
        return held if held is not None else next(iter(self.by_arm.values()))

    def acquire(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._of_arm(req).acquire(req)

    def goal(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._of_lease(req).goal(req)

    def release(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._of_lease(req).release(req)

    def close(self) -> None:
        for ctl in self.by_arm.values():
            ctl.close()


def attach_client_leaders(context: DaemonContext) -> ClientLeaders:
    """Register the leader.* verbs on the daemon's socket: one ClientLeader per arm that follows a
    leader of its own (the primary's shares its claim with the policy's take-over)."""
    loop = context.loop
    by_arm: dict[str, ClientLeader] = {}
    for arm in loop.arms:
        source = loop.leaders.get(arm.teleop_source)
        if source is None:
            continue
        primary = arm is loop.primary
        driver = context.leader if primary else source.link.arm
        by_arm[arm.name] = ClientLeader(
            loop,
            driver if isinstance(driver, DrivableLeader) else None,
            context.leader_claim if primary else LeaderClaim(),
            source=source,
            source_name=arm.teleop_source,
        )
    if not by_arm:  # no leader at all: acquire says so
        by_arm[loop.primary.name] = ClientLeader(loop, None, context.leader_claim)
    ctl = ClientLeaders(loop, by_arm)
    reg = context.server.register
    reg("leader.acquire", ctl.acquire)
    reg("leader.goal", ctl.goal, inline=True)  # swaps the drive's goal: microseconds, never waits
    reg("leader.release", ctl.release)
    context.on_stop.append(ctl.close)  # before the loop stops: the leader limp, not held
    return ctl
