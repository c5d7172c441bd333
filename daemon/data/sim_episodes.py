"""Episodes on a simulated follower: the sim's scene follows the recorder's episodes.

``SimEpisodeHook`` is a Recorder episode hook (see ``Recorder.add_episode_hook``), so every way of
starting an episode (the ``episode.*`` verbs, ``so101d record``, a policy evaluation, the demo)
drives the sim the same way:

- start: the sim resets its scene (waits for its ``reset_done``) and starts its episode; the
  recorder starts only once the sim confirmed the reset, so frame 0 is the reset scene;
- save / discard / shutdown: the sim stops its episode; its verdict (``success`` event -> True,
  ``terminated`` -> False) becomes the episode's success unless the operator gave one, and the
  event's detail goes into the tag's notes;
- while recording, a watcher notes every time the sim goes stale ("sim went stale at frame N")
  and comes back. The control loop holds the follower by itself meanwhile (a stale sim is a lost
  link); the note is what tells a training script which episodes to look at or drop.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from daemon.data.recorder import RecordingError

log = logging.getLogger("so101d.recording.sim")


class SimEpisodeHook:
    """Recorder episode hook for a ``SimFollower`` (anything with reset/start/stop_episode, events)."""

    def __init__(self, follower: Any, reset_timeout_s: float = 5.0, poll_s: float = 0.05) -> None:
        self.follower = follower
        self.reset_timeout_s = float(reset_timeout_s)
        self.poll_s = float(poll_s)
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._episode_seq: int | None = None
        self._stale_notes = 0

    # -- Recorder episode hook ---------------------------------------------------------------------
    def episode_starting(self, recorder: Any) -> None:
        if not self._fresh():
            raise RecordingError("the simulator is not answering (stale); episode not started")
        try:
            self.follower.reset_episode(timeout_s=self.reset_timeout_s)
        except TimeoutError as exc:
            raise RecordingError(f"the simulator did not confirm its reset: {exc}") from None
        self.follower.events()  # drop the reset's own events and anything from an older episode
        self._episode_seq = seq = self.follower.start_episode()
        try:  # both sims confirm within a tick; frame 0 is then inside the sim's episode
            self.follower.wait_event("started", seq, self.reset_timeout_s)
        except TimeoutError as exc:
            self.follower.stop_episode()
            raise RecordingError(f"the simulator did not start its episode: {exc}") from None
        self._start_watch(recorder)

    def episode_ending(self, recorder: Any, saved: bool) -> tuple[bool | None, list[str]]:
        self._stop_watch()
        notes: list[str] = []
        try:
            self.follower.stop_episode()
        except Exception as exc:
            notes.append(f"sim episode stop not sent: {exc}")
        verdict: bool | None = None
        for ev in self.follower.events():
            if self._episode_seq is not None and ev.seq != self._episode_seq:
                continue  # "started" is still in the queue; events of older episodes are not ours
            if ev.event in ("success", "terminated"):
                notes.append(f"sim {ev.event}" + (f": {ev.detail}" if ev.detail else ""))
                if verdict is None:  # the first signal decides (a cube lifted, then dropped: success)
                    verdict = ev.event == "success"
        self._episode_seq = None
        seed_error = self._seed_error()
        if seed_error:
            notes.append(f"sim seed recording failed: {seed_error}")
        mapping = self.follower.sim_mapping
        if mapping is not None:  # which leader -> sim mapping drove this episode
            notes.append(f"sim_mapping: {mapping}")
        return verdict, notes

    def _seed_error(self) -> str | None:
        try:
            return self.follower.stats().get("seed_error")
        except Exception:
            return None

    # -- staleness watch ---------------------------------------------------------------------------
    def _fresh(self) -> bool:
        try:
            return bool(self.follower.stats().get("connected"))
        except Exception:
            return False

    def _start_watch(self, recorder: Any) -> None:
        self._stop_watch()
        self._watch_stop = threading.Event()
        self._watcher = threading.Thread(
            target=self._watch, args=(recorder, self._watch_stop), name="sim-episode-watch", daemon=True
        )
        self._watcher.start()

    def _stop_watch(self) -> None:
        t = self._watcher
        self._watch_stop.set()
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
        self._watcher = None

    def _watch(self, recorder: Any, stop: threading.Event) -> None:
        was_fresh = True
        while not stop.wait(self.poll_s):
            fresh = self._fresh()
            if fresh == was_fresh:
                continue
            frame = recorder.frames_recorded
            if not fresh:
                note = f"sim went stale at frame {frame} (follower held)"
                log.warning("episode: %s", note)
            else:
                note = f"sim back at frame {frame}"
                log.info("episode: %s", note)
            recorder.add_note(note)
            was_fresh = fresh
