"""An arm lent to a client of the control socket: the verbs arm.acquire, arm.action, arm.observe
and arm.release (declared in daemon/api/messages.py), over a ``ClientSource`` per arm.

This is how LeRobot's own tools drive the daemon's arms (the so101d plugin, lerobot_plugin/):
acquiring gives the client a lease and assigns the arm to its source (``loop.assign``), so the
cycle follows the client's actions through the same safety layer as the leader's; releasing
hands the arm back to the leader's source with the intent ``hold``, so it stays where it is (on a
rig of several arms that arm alone holds, ``DrivenArm.released_hold``: the others go on following
their own leader or client, until the operator's resume).

One client at a time per arm: a second is refused, naming the holder. A holder whose process is
gone (killed, crashed: it never released) loses the lease to the next client that asks; a holder
that stops sending is no target after the stale bound and the arm holds. An arm a policy or a
replay drives is not lent (stop it first).

The operator's hold belongs to the operator. Acquiring never changes the loop's intent: an arm
the operator holds (``so101d teleop stop``, the console's Hold, SIGUSR1), has made idle (torque
off), or that is in fault, is lent but keeps holding, and every action is refused with the
daemon's reason and what resumes it, instead of being queued for later. The operator's resume is
the one they already have, ``so101d teleop start``: tracking resumes for every arm, and an arm
lent to a client follows that client (the leader gets it back at ``arm.release``). So the arm
never moves on acquire: in teleop it holds where it is until the first action, which it then
aligns to at the safe speed; under a hold it stays held.

The loop's period does not depend on what a client sends. The loop takes one target per cycle,
so ``arm.action`` takes at most two actions per arm per period (the rest would only overwrite
each other). An action on time is served on the socket's selector thread (``inline``: no thread
hand-off, it reads the arm's state and swaps a reference), one that came early is handed to a
worker, where it waits its turn (asleep, the GIL free), and its connection sends nothing more
meanwhile (one request at a time). A client flooding actions (pipelined, as fast as it can) is
so served at twice the loop's rate, instead of keeping a socket thread busy: a busy Python thread
makes the loop thread wait up to the interpreter's switch interval for the GIL after each of its
serial reads and writes, which stretched a 100 Hz cycle to ~25 ms (bench/bench_plugin.py
--flood). A client at up to twice the loop's rate (LeRobot's 30 fps) never waits.

``arm.share`` answers where the arms' poses at the newest cycle are in shared memory
(daemon/api/pose_share.py, written by a cycle hook): the plugin's ``get_observation`` reads them
there instead of asking ``arm.observe``, so a LeRobot step costs the daemon one request, not two.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from calibration.conventions import JOINT_NAMES
from daemon.api.pose_share import ArmPoses, PoseShareWriter
from daemon.api.server import RequestError, RunOnWorker, request_peer_pid, serving_inline
from daemon.control.client_source import ClientSource
from daemon.control.driven_arm import DrivenArm
from daemon.control.loop import ControlLoop
from daemon.control.safety import ControllerState, CycleInputs, update
from daemon.data.shm_names import SHM_DIR, segment_name, sweep_stale
from daemon.service.client_leader import attach_client_leaders
from daemon.service.context import DaemonContext
from daemon.service.frame_shares import attach_frame_shares
from daemon.service.leases import Lease
from daemon.system.processes import start_ticks

__all__ = ["ClientArms", "Lease", "attach_client_arms"]

log = logging.getLogger("so101d.client_arm")

SOURCE_NAME = "client"  # the source's name in the loop (the dataset's so101d.source: follower=client)
_REFUSING_MODES = ("fault", "disconnected", "idle")
_OPERATOR_HOLDS = ("hold", "idle")  # the operator's intents under which a lent arm stays still
_CALL_TIMEOUT_S = 3.0
_TURN_PERIODS = 0.5  # an arm takes an action at most every half period (twice the loop's rate)
_LENDABLE_SOURCES = ("leader",)  # an arm driven by these may be lent (policy, replay: not), or by its own
_RESUME_HINT = "`so101d teleop start` hands it to this client"


def client_source_name(arm: DrivenArm) -> str:
    """The loop's name of ``arm``'s client source: "client", or "left_client" for the arm whose own
    leader is "left_leader" (a bimanual pair's)."""
    return f"{arm.teleop_source.removesuffix('leader')}{SOURCE_NAME}"


def _joints(values: np.ndarray | None) -> dict[str, float] | None:
    if values is None:
        return None
    return dict(zip(JOINT_NAMES, values.tolist()))


class ClientArms:
    """The lease table and the four verbs' handlers (see the module docstring)."""

    def __init__(
        self,
        loop: ControlLoop,
        stale_s: float,
        newest_frames: Callable[[], dict[str, int]] = dict,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loop = loop
        self.newest_frames = newest_frames  # shared camera -> newest frame's seq (FrameShares.newest)
        self.stale_s = stale_s
        self._monotonic = monotonic
        # a source per arm: each arm follows its own client's actions (a bimanual pair's left and
        # right differ), named as its leader is ("client"; "left_client" beside "left_leader")
        self.sources: dict[str, ClientSource] = {}
        self.source_names: dict[str, str] = {}
        for arm in loop.arms:
            source, source_name = ClientSource(stale_s, monotonic), client_source_name(arm)
            loop.add_source(source_name, source, source.last)
            self.sources[arm.name], self.source_names[arm.name] = source, source_name
        self._leases: dict[str, Lease] = {}
        self._next_turn_s: dict[str, float] = {}  # arm -> when its next action may be taken (monotonic)
        self._lock = threading.Lock()
        self.actions_waited = 0  # actions that came faster than twice the loop's rate and waited their turn
        self._poses: _PoseShareHook | None = None  # made at the first arm.share
        self._share_lock = threading.Lock()  # not self._lock: making the share waits for a cycle

    # ---------------------------------------------------------------- helpers
    def _arm(self, name: str) -> DrivenArm:
        for arm in self.loop.arms:
            if arm.name == name:
                return arm
        raise RequestError(f"no arm named {name!r} (arms: {', '.join(a.name for a in self.loop.arms)})", "arm")

    def _lease_of(self, token: str | None) -> Lease:
        if not token:
            raise RequestError("no lease given: arm.acquire first and pass its lease", "lease")
        with self._lock:
            lease = next((x for x in self._leases.values() if x.token == token), None)
            # worded only for the refusal: every arm.action comes through here
            holders = [x.words() for x in self._leases.values()] if lease is None else []
        if lease is None:
            held = f" (the arm is held by {holders[0]})" if holders else ""
            raise RequestError(f"this lease is not current: the arm was released or taken over{held}", "lease")
        return lease

    def holder(self, arm: str) -> Lease | None:
        with self._lock:
            return self._leases.get(arm)

    # ---------------------------------------------------------------- verbs
    def acquire(self, req: dict[str, Any]) -> dict[str, Any]:
        name = req.get("arm") or "follower"
        arm = self._arm(name)
        client = req.get("client") or "a control-socket client"
        # the kernel's word for who is on the socket, not the request's: a pid the client names
        # may be another process's (pid 1 lives for ever) or missing, and its lease never freed
        peer = request_peer_pid()
        pid = peer if peer is not None else req.get("pid")
        # its own leader is teleop's source ("leader"; "right_leader" for a bimanual pair's right arm)
        lendable = (*_LENDABLE_SOURCES, arm.teleop_source, self.source_names[name])
        if self.loop.intent == "policy" or arm.source_name not in lendable:
            driver = "a policy" if self.loop.intent == "policy" else repr(arm.source_name)
            raise RequestError(f"the arm {name!r} is driven by {driver} now: stop it first, then acquire", "arm")
        with self._lock:
            held = self._leases.get(name)
            if held is not None and held.alive():
                raise RequestError(f"the arm {name!r} is held by {held.words()}: it must release it first", "arm")
            if held is not None:
                log.warning("%s: its holder %s is gone without releasing; lease freed", name, held.words())
            started = start_ticks(pid) if pid is not None else None
            lease = Lease(name, secrets.token_hex(16), client, pid, time.time(), started)
            self._leases[name] = lease
        self.sources[name].clear()  # an old holder's last action must not drive the new one's arm
        try:
            # only the source changes; the operator's intent (a hold, torque off) stays theirs
            self.loop.assign(name, self.source_names[name]).result(timeout=_CALL_TIMEOUT_S)
            # and one whole cycle runs on the client's source, with no target yet, before the lease
            # is given: the arm leaves the leader's tracking for a hold, so the first action starts an
            # alignment at the safe speed. An action taken in the very cycle the source changed would
            # be stepped from the leader's tracking at max_step instead (10 degrees a cycle).
            self.loop.call(lambda: None, timeout_s=_CALL_TIMEOUT_S)
        except Exception as exc:
            with self._lock:
                self._leases.pop(name, None)
            raise RequestError(f"the control loop did not hand the arm over: {exc}") from None
        log.info("%s: lent to %s", name, lease.words())
        kept = self._operator_hold(arm)
        follows = (
            f"{name} is lent to {client} but stays still: {kept}"
            if kept
            else f"{name} follows {client}'s actions (the arm holds until the first arrives)"
        )
        return {
            "message": follows,
            "arm": name,
            "lease": lease.token,
            "stale_s": self.stale_s,
            "mode": arm.state.mode,
        }

    def release(self, req: dict[str, Any]) -> dict[str, Any]:
        lease = self._lease_of(req.get("lease"))
        with self._lock:
            self._leases.pop(lease.arm, None)
        self.sources[lease.arm].clear()
        teleop = self._arm(lease.arm).teleop_source  # the arm's own leader (a bimanual pair's)
        back = teleop if teleop in self.loop.sources else self.source_names[lease.arm]

        released = self._arm(lease.arm)

        def hand_back() -> None:
            if len(self.loop.arms) > 1:
                # this arm holds, alone: a release must not stop the other arm (its own client's,
                # or its leader's), as a hold of the whole loop did
                released.released_hold = f"{lease.arm} released by {lease.words()}"
            else:
                self.loop.set_intent("hold")

        try:
            self.loop.assign(lease.arm, back).result(timeout=_CALL_TIMEOUT_S)
            self.loop.call(hand_back, timeout_s=_CALL_TIMEOUT_S)
        except Exception as exc:
            raise RequestError(f"released, but the control loop did not answer: {exc}") from None
        log.info("%s: released by %s; holding", lease.arm, lease.words())
        return {"message": f"{lease.arm} released: holding", "arm": lease.arm, "mode": self._arm(lease.arm).state.mode}

    def _operator_hold(self, arm: DrivenArm) -> str:
        """Why the operator's side keeps ``arm`` still now, with what resumes it ("" when nothing does)."""
        intent, state = self.loop.intent, arm.state
        if state.mode == "fault" or state.fault:
            return f"fault ({state.reason or state.fault}); once it is gone, {_RESUME_HINT} and clears it"
        if not self.loop.torque_wanted:
            return f"torque is off ({state.mode}); the operator's `so101d torque on` then {_RESUME_HINT}"
        if intent in _OPERATOR_HOLDS:
            return f"the operator's {intent} ({state.mode}: {state.reason}); {_RESUME_HINT}"
        if arm.released_hold:
            return f"held since {arm.released_hold} ({state.mode}); {_RESUME_HINT}"
        if len(self.loop.arms) > 1 and self.loop.hold_together:
            # the loop holds every arm while another one cannot take part (safety.fault_holds =
            # "all"): an action answered with a command then would be one the loop never sends
            now = self._monotonic()
            why = next((w for other in self.loop.arms if other is not arm and (w := other.blocking(now))), "")
            if why:
                return f'held while {why} (safety.fault_holds = "all"); it follows again once that arm is back'
        if state.mode in _REFUSING_MODES:
            return f"{state.mode} ({state.reason})"
        return ""

    def _take_turn(self, arm: str) -> bool:
        """At most one action per arm every half period (twice the loop's rate: the loop takes one
        target per cycle, a faster one only overwrites its own): an earlier one sleeps here, on
        a worker, until its turn; on the selector thread it is handed to a worker instead
        (``RunOnWorker``, before its turn is counted). Time, not the loop's cycle count: a loop
        running late does not hold a client at a slower pace back. True if it waited."""
        gap_s = self.loop.period_s * _TURN_PERIODS
        with self._lock:
            now = self._monotonic()
            turn = max(now, self._next_turn_s.get(arm, -math.inf))
            if turn > now and serving_inline():
                raise RunOnWorker
            self._next_turn_s[arm] = turn + gap_s
            if turn > now:
                self.actions_waited += 1
        if turn > now:
            time.sleep(turn - now)
        return turn > now

    def action(self, req: dict[str, Any]) -> dict[str, Any]:
        lease = self._lease_of(req.get("lease"))
        missing = [j for j in JOINT_NAMES if req.get(j) is None]
        if missing:
            raise RequestError(f"arm.action needs every joint; missing {', '.join(missing)}", missing[0])
        arm = self._arm(lease.arm)
        if self._take_turn(lease.arm):
            lease = self._lease_of(req.get("lease"))  # still current after the wait (not released meanwhile)
        loop = self.loop
        st = arm.state
        held = self._operator_hold(arm)
        if held:
            raise RequestError(f"the daemon is not taking actions: {held}")
        source_name = self.source_names[arm.name]
        if arm.source_name != source_name:
            raise RequestError(f"the arm is driven by {arm.source_name} now (the operator took it back)")
        target = np.array([req[j] for j in JOINT_NAMES], dtype=np.float64)
        # predicted from the state read above, before the target is offered: a cycle running in
        # between still follows the previous target, so the loop's first step towards this one
        # starts where the prediction did (offered first, a worker that lost the CPU for a few
        # cycles answered a step the arm had already taken)
        commanded = self._commanded(arm, st, target, source_name)
        self.sources[arm.name].offer(target)
        return {
            "commanded": _joints(commanded),
            "mode": st.mode,
            "reason": st.reason,
            "cycle": loop.cycles,
        }

    def _commanded(
        self, arm: DrivenArm, state: ControllerState, target: np.ndarray, source_name: str
    ) -> np.ndarray | None:
        """The safety layer's command for ``target`` from the arm's state at its last cycle: the
        same pure function the loop runs next (alignment, step and joint limits)."""
        params, measured = arm.params, arm.measured
        if params is None or measured is None:
            return None
        inputs = CycleInputs(
            intent=self.loop.intent,
            torque_wanted=self.loop.torque_wanted,
            follower_ok=True,
            measured=measured,
            target=target,
            target_age_s=0.0,
            fault_now=arm.fault_now,
            target_name=source_name,
            dt_s=self.loop.period_s,
        )
        return update(state, inputs, params).command

    def share(self, req: dict[str, Any]) -> dict[str, Any]:
        """Where the arms' poses at the newest cycle are in shared memory (made at the first ask,
        then written every cycle until the daemon stops)."""
        with self._share_lock:
            hook = self._poses
            if hook is None:
                sweep_stale()  # a killed daemon's shares, as the camera shares and recording rings
                writer = PoseShareWriter(SHM_DIR / segment_name("poses"), len(self.loop.arms), self.loop.period_s)
                hook = _PoseShareHook(self.loop, writer, list(self.loop.arms), self._monotonic)
                try:
                    if self.loop.is_running():  # added between two cycles, on the loop thread
                        self.loop.call(lambda: self.loop.add_hook(hook), timeout_s=_CALL_TIMEOUT_S)
                    else:
                        self.loop.add_hook(hook)
                except Exception as exc:
                    writer.close()
                    raise RequestError(f"the control loop did not take the pose share: {exc}") from None
                self._poses = hook
                log.info("arm poses shared at %s", writer.path)
        return {"path": str(hook.writer.path), "arms": [a.name for a in hook.arms], "period_s": self.loop.period_s}

    def close(self) -> None:
        """After the loop stopped: the pose share's file goes."""
        with self._share_lock:
            hook, self._poses = self._poses, None
        if hook is not None:
            self.loop.remove_hook(hook)
            hook.writer.close()

    def observe(self, req: dict[str, Any]) -> dict[str, Any]:
        name = req.get("arm") or "follower"
        arm = self._arm(name)
        now = self._monotonic()
        loop = self.loop
        held = self.holder(name)
        leader = loop.leaders.get(arm.teleop_source)  # this arm's own leader (a bimanual pair: its side's)
        leader_units = leader.units if leader is not None else None
        leader_at = leader.read_at_s if leader is not None else 0.0
        return {
            "arm": name,
            "follower": _joints(arm.measured if arm.link.connected else None),
            "follower_age_ms": (now - arm.measured_at_s) * 1000.0 if arm.measured is not None else None,
            "leader": _joints(leader_units),
            "leader_age_ms": (now - leader_at) * 1000.0 if leader_units is not None else None,
            "command": _joints(arm.command),
            "mode": arm.state.mode,
            "reason": arm.state.reason,
            "source": arm.source_name,
            "holder": held.words() if held is not None else None,
            "cycle": loop.cycles,
            "frames": self.newest_frames(),
        }


class _PoseShareHook:
    """A cycle hook (on the loop thread, microseconds): every arm's measured pose and the
    leader's reading into the pose share, as ``arm.observe`` would answer them now."""

    def __init__(
        self, loop: ControlLoop, writer: PoseShareWriter, arms: list[DrivenArm], monotonic: Callable[[], float]
    ) -> None:
        self.loop, self.writer, self.arms, self._monotonic = loop, writer, arms, monotonic

    def on_cycle(
        self, now_monotonic_s: float, state_units: np.ndarray, action_units: np.ndarray, teleop_action_units: np.ndarray
    ) -> None:
        leaders = self.loop.leaders
        poses = []
        for arm in self.arms:
            leader = leaders.get(arm.teleop_source)  # the arm's own leader (a bimanual pair: its side's)
            poses.append(
                ArmPoses(
                    arm.measured if arm.link.connected else None,
                    arm.measured_at_s,
                    leader.units if leader is not None else None,
                    leader.read_at_s if leader is not None else -math.inf,
                )
            )
        self.writer.write(self.loop.cycles, self._monotonic(), poses)


def attach_client_arms(context: DaemonContext) -> ClientArms:
    """Register the arm.* verbs (and camera.share) on the daemon's socket, over one client source in its loop."""
    shares = attach_frame_shares(context)
    arms = ClientArms(context.loop, context.cfg.safety.leader_stale_s, shares.newest)
    reg = context.server.register
    reg("arm.acquire", arms.acquire)
    reg("arm.release", arms.release)
    # an action on time is served on the selector thread; one that must wait its turn (twice the
    # loop's rate per arm, see the module docstring) goes to a worker, never waiting there
    reg("arm.action", arms.action, inline=True)
    reg("arm.share", arms.share)
    context.after_stop.append(arms.close)
    attach_client_leaders(context)  # the leaders lent to be driven (LeRobot's smooth handover)
    # reads the arm's snapshot only: served on the socket's selector thread, without a worker hand-off
    reg("arm.observe", arms.observe, inline=True)
    return arms
