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
    ) -> None:
        self.loop = loop
        self.leader = leader
        self.claim = claim
        self.config = config or LeaderDriveConfig()
        self._lock = threading.Lock()
        self._lease: Lease | None = None
        self._drive: LeaderDrive | None = None

    def _followed(self) -> str:
        """Which arm follows the leader now ("" when none does)."""
        if self.loop.intent != "teleop":
            return ""
        return next((a.name for a in self.loop.arms if a.source_name == "leader"), "")

    def _keep(self, lease: Lease) -> str:
        """Why the client's drive must end now ("" while it may go on); on the drive's thread."""
        if not lease.alive():
            return f"its holder {lease.words()} is gone"
        followed = self._followed()
        if followed:
            return f"{followed} follows the leader now (teleop): the leader is the operator's hand again"
        link = self.loop.leader_link
        if link is not None and not link.connected:
            return "the leader is not connected"
        return ""

    def acquire(self, req: dict[str, Any]) -> dict[str, Any]:
        leader = self.leader
        if leader is None:
            raise RequestError("this daemon has no leader arm that can be driven (a simulated leader cannot)")
        link = self.loop.leader_link
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
        loop = self.loop
        return {
            "message": "",
            "goal": _joints(goal),
            "command": _joints(drive.command),
            "leader": _joints(loop.leader_units),
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


def attach_client_leader(context: DaemonContext) -> ClientLeader:
    """Register the leader.* verbs on the daemon's socket."""
    leader = context.leader if isinstance(context.leader, DrivableLeader) else None
    ctl = ClientLeader(context.loop, leader, context.leader_claim)
    reg = context.server.register
    reg("leader.acquire", ctl.acquire)
    reg("leader.goal", ctl.goal, inline=True)  # swaps the drive's goal: microseconds, never waits
    reg("leader.release", ctl.release)
    context.on_stop.append(ctl.close)  # before the loop stops: the leader limp, not held
    return ctl
