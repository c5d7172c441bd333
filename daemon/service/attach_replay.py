"""Wires episode replay into the running daemon: the ``replay.*`` socket verbs.

``replay.start`` reads the episode at rest (``daemon.data.replay_episode``: refused before
anything moves when it does not fit this arm), offers a ``ReplaySource`` to the loop and assigns
it to the follower with a forced re-alignment, so safety brings the arm to the first action at
the safe speed whatever it was doing; then the intent is ``teleop`` (tracking) with the follower
driven by the replay. Hold (the verb, the console, SIGUSR1) or ``replay.stop`` ends it at once:
the arm holds. A client may name its start with a ``ticket``: a ``replay.stop`` with that ticket
ends that replay, or, when the stop overtook its start (the two arrive on different connections
and run on different workers), the start is refused when it comes. At its end the arm holds
too, the follower is handed back to the leader (still holding), and the tracking report is kept for ``replay.status``. With recording on, the replay
is an episode of origin ``replay`` whose tag names the source episode and carries the report.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from calibration.conventions import FEATURE_NAMES
from daemon.api.server import RequestError
from daemon.control.driven_arm import DrivenArm
from daemon.control.replay_source import ReplaySource
from daemon.control.tracking_report import TrackingReport, tracking_report
from daemon.data.replay_episode import ReplayEpisode, ReplayRefused, load_replay_episode
from daemon.service.context import DaemonContext, HasContext, context_of

log = logging.getLogger("so101d.replay")
SOURCE_NAME = "replay"
_WATCH_PERIOD_S = 0.02  # how often the watcher looks for the replay's end (not on the loop thread)
_CLOSE_WAIT_S = 10.0  # at shutdown, how long the replay's end (hold, report, its episode's save) may take
_TICKETS_KEPT = 64  # started and canceled tickets remembered (a client's stop rarely lags its start by more)


@dataclasses.dataclass
class _Running:
    episode: ReplayEpisode
    source: ReplaySource
    speed: float
    recording: int | None
    ticket: str | None


class ReplayController:
    """One replay at a time on the primary arm (see the module docstring)."""

    def __init__(self, ctx: DaemonContext) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._running: _Running | None = None
        self._last: dict[str, Any] = {"phase": "idle", "message": "no replay yet"}
        self._started: OrderedDict[str, None] = OrderedDict()  # tickets whose start arrived
        self._canceled: OrderedDict[str, None] = OrderedDict()  # tickets stopped before their start came
        self._watcher: threading.Thread | None = None

    # ------------------------------------------------------------------ verbs
    def start(
        self,
        dataset: str | None,
        episode: int | None,
        speed: float | None,
        record: bool | None,
        ticket: str | None = None,
    ) -> dict:
        if not dataset:
            raise RequestError("replay.start needs the dataset's folder", field="dataset")
        if episode is None:
            raise RequestError("replay.start needs the episode index", field="episode")
        speed = 1.0 if speed is None else float(speed)
        loop = self.ctx.loop
        arm: DrivenArm = loop.primary
        with self._lock:
            if ticket is not None:
                if ticket in self._canceled:
                    del self._canceled[ticket]
                    raise RequestError("replay canceled: its replay.stop came first; the arm was not moved")
                _remember(self._started, ticket)
            if self._running is not None:
                raise RequestError("a replay is running already (replay.stop ends it)")
            if len(loop.arms) > 1:
                raise RequestError("replay drives one arm; this daemon drives " + ", ".join(a.name for a in loop.arms))
            self._refuse_if_driven_or_recording(arm.source_name)
            try:
                ep = load_replay_episode(Path(dataset).expanduser(), int(episode), arm.name)
            except ReplayRefused as exc:
                field = "episode" if "out of range" in str(exc) else "dataset"
                raise RequestError(f"replay refused: {exc}", field=field) from None
            st = arm.state
            if st.mode in ("disconnected", "fault") or arm.params is None:
                raise RequestError(f"replay refused: the follower is {st.mode} ({st.reason})")
            if not loop.torque_wanted:
                raise RequestError("replay refused: torque is off (torque.on first)")
            try:
                src = ReplaySource(ep.actions_units, ep.fps, speed, arm, loop.period_s)
            except ValueError as exc:
                raise RequestError(f"replay refused: {exc}", field="speed") from None
            number = self._start_recording(ep, record)
            loop.add_source(SOURCE_NAME, src, src.last_target)
            loop.assign(arm.name, SOURCE_NAME)

            def begin() -> None:
                arm.realign_pending = True  # align from the measured pose, whatever drove it before
                loop.set_intent("teleop")

            try:
                loop.call(begin, timeout_s=3.0)
            except (RuntimeError, TimeoutError, ValueError) as exc:
                loop.remove_source(SOURCE_NAME)
                if number is not None and self.ctx.recorder is not None:
                    self.ctx.recorder.discard_episode()  # nothing was replayed into it
                raise RequestError(f"replay: the control loop did not take it: {exc}") from None
            self._running = _Running(ep, src, speed, number, ticket)
        self._watcher = threading.Thread(target=self._watch, name="so101d-replay", daemon=True)
        self._watcher.start()
        log.info(
            "replay of %s episode %d (%d frames at %g fps x %g)", ep.root, ep.episode_index, src.frames, ep.fps, speed
        )
        recorded = f"; recorded as episode {number}" if number is not None else "; not recorded"
        return self._progress(
            self._running, f"aligning to episode {ep.episode_index}'s first action, then playing it{recorded}"
        )

    def stop(self, ticket: str | None = None) -> dict:
        with self._lock:  # a start still reading its episode finishes first, and is then stopped
            run = self._running
            if ticket is not None and ticket not in self._started:
                _remember(self._canceled, ticket)
                return {**self._last, "message": "replay canceled before it started: the arm was not moved"}
        if run is None:
            return {**self._last, "message": "no replay is running"}
        if ticket is not None and run.ticket != ticket:
            return self._progress(run, "that replay has ended; another is running (replay.stop with no ticket ends it)")
        run.source.stop("stopped by the operator")
        try:
            self.ctx.loop.call(lambda: self.ctx.loop.set_intent("hold"), timeout_s=3.0)
        except (RuntimeError, TimeoutError) as exc:
            log.error("replay.stop: the loop did not take the hold: %s", exc)
        return self._progress(run, "replay stopped: holding")

    def status(self) -> dict:
        run = self._running
        return self._progress(run, "replaying") if run is not None else dict(self._last)

    def close(self) -> None:
        """The daemon is stopping: a running replay ends and the watcher saves its episode, with
        its tag (replay_of, the report), before the recorder closes (else the recorder saves it
        at shutdown as a bare ``replay`` episode naming nothing)."""
        run, watcher = self._running, self._watcher
        if run is not None:
            run.source.stop("the daemon is stopping")
        if watcher is not None:
            watcher.join(_CLOSE_WAIT_S)
            if watcher.is_alive():
                log.error("replay: its end was not written within %.0f s of the daemon stopping", _CLOSE_WAIT_S)

    # ------------------------------------------------------------------ internals
    def _progress(self, run: _Running | None, message: str) -> dict:
        if run is None:
            return dict(self._last)
        return {
            "message": message,
            "phase": run.source.phase,
            "dataset": str(run.episode.root),
            "episode": run.episode.episode_index,
            "frame": run.source.frame,
            "frames": run.source.frames,
            "fps": run.episode.fps,
            "speed": run.speed,
            "kind": run.episode.kind,
            "recording": run.recording,
        }

    def _refuse_if_driven_or_recording(self, source_name: str) -> None:
        """A replay does not take the arm from a policy or a client that holds it (they would be
        cut off mid-motion and not given it back), nor play into an episode the operator is
        recording (its frames would be a replay under another origin, even with --no-record)."""
        loop = self.ctx.loop
        if loop.intent == "policy":
            raise RequestError("replay refused: a policy is driving the follower (policy.stop first)")
        if source_name not in ("leader", "policy"):
            raise RequestError(f"replay refused: the follower is driven by {source_name!r} (release it first)")
        rec = self.ctx.recorder
        if rec is not None and rec.phase == "recording":
            raise RequestError(
                "replay refused: an episode is being recorded (episode save or discard first; the replay "
                "records its own)"
            )

    def _start_recording(self, ep: ReplayEpisode, record: bool | None) -> int | None:
        rec = self.ctx.recorder
        if rec is None or record is False:
            if record:
                raise RequestError("replay refused: recording is not enabled ([recording] enabled = true)")
            return None
        if rec.phase != "idle":
            if record:
                raise RequestError(f"replay refused: the recorder is {rec.phase}, not idle")
            return None
        try:
            r = rec.start_episode(ep.task or f"replay of episode {ep.episode_index}", origin="replay")
        except Exception as exc:
            raise RequestError(f"replay refused: the replay's episode did not start: {exc}") from None
        return int(r["episode"]) if r.get("episode") is not None else None

    def _watch(self) -> None:
        run = self._running
        assert run is not None
        src, loop = run.source, self.ctx.loop
        arm = loop.primary
        while src.phase in ("aligning", "playing") and loop.is_running() and arm.source_name == SOURCE_NAME:
            time.sleep(_WATCH_PERIOD_S)
        taken_by = arm.source_name if arm.source_name != SOURCE_NAME else None
        if src.phase in ("aligning", "playing"):
            # the loop no longer asks a source it does not drive: without this stop the replay
            # would stay "playing" for ever (refusing every later one) once a client took the arm
            src.stop("the daemon is stopping" if taken_by is None else f"the follower was taken by {taken_by!r}")
        if taken_by is None:
            try:
                loop.call(lambda: loop.set_intent("hold"), timeout_s=3.0)
                if "leader" in loop.sources:
                    loop.assign(arm.name, "leader").result(timeout=3.0)
            except Exception as exc:
                log.error("replay end: the loop did not take the hold: %s", exc)
        # else: whoever took the follower (arm.acquire) keeps it; a hold here would cut it off
        loop.remove_source(SOURCE_NAME)
        outcome = "done" if src.phase == "done" else f"stopped: {src.why}"
        report = tracking_report(
            src.log(), list(FEATURE_NAMES), src.frames, outcome, loop.period_s, run.episode.state_units
        )
        self._save_recording(run, report)
        log.info("%s", report.summary())
        with self._lock:
            self._last = {
                **self._progress(run, report.summary()),
                "phase": src.phase,
                "report": dataclasses.asdict(report),
            }
            self._running = None

    def _save_recording(self, run: _Running, report: TrackingReport) -> None:
        rec = self.ctx.recorder
        if run.recording is None or rec is None:
            return
        ep = run.episode
        of = f"replay_of={ep.uid}" if ep.uid else "replay_of=untagged"
        notes = [f"{of} episode {ep.episode_index} of {ep.root.name}", report.summary()[:200]]
        worst = {e.joint: e.p99 for e in report.error}
        notes.append("tracking_p99=" + ",".join(f"{v:.2f}" for v in worst.values()))
        try:
            rec.save_episode(None, notes=notes)
        except Exception as exc:
            log.error("replay: its episode was not saved: %s", exc)


def _remember(tickets: OrderedDict[str, None], ticket: str) -> None:
    tickets[ticket] = None
    while len(tickets) > _TICKETS_KEPT:
        tickets.popitem(last=False)


def attach_replay(daemon: DaemonContext | HasContext) -> ReplayController:
    """Register replay.start / stop / status on the daemon's control socket."""
    ctx = context_of(daemon)
    ctl = ReplayController(ctx)
    reg = ctx.server.register

    def _int(req: dict[str, Any], key: str) -> int | None:
        v = req.get(key)
        return None if v is None else int(v)

    reg(
        "replay.start",
        lambda req: ctl.start(
            req.get("dataset"),
            _int(req, "episode"),
            req.get("speed"),
            req.get("record"),
            req.get("ticket"),
        ),
    )
    reg("replay.stop", lambda req: ctl.stop(req.get("ticket")))
    reg("replay.status", lambda req: ctl.status())
    ctx.on_stop.insert(0, ctl.close)  # before the recorder's close: the replay saves its own episode
    return ctl
