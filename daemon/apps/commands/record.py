"""`so101d record`: a recording session against the running daemon.

For each of N episodes: start, record ``--episode-time`` seconds, save, then ``--reset-time``
seconds to reset the scene. With a terminal attached (a USB foot pedal that types a key works
the same way): right arrow or enter = save now as success, ``f`` = save now as failure,
backspace = discard and redo this episode, esc = stop the session (the episode in progress is
discarded), during the reset any of these skips the rest of the reset.

``--continuous`` records without a pause, as LeRobot's ``lerobot-rollout --strategy.type=sentry``
does: the daemon saves an episode and starts the next one every ``--rotate-s`` seconds or once its
video holds about ``--rotate-mb`` MB ([recording] rotate_s / rotate_mb by default), with no frame
lost or repeated between them. Enter, ``f``, esc or Ctrl-C stop it: the last, partial episode is
saved (``f``: tagged failed).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from daemon.api.client import (
    CommandFailed,
    ControlClient,
    DaemonUnavailable,
    add_socket_arguments,
    socket_path_from_args,
)
from daemon.api.messages import EpisodeReply, EpisodeStatusReply, decode_reply
from daemon.apps.terminal_keys import KEY_FAILURE, KEY_REDO, KEY_STOP, KEY_SUCCESS, Keys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=10, help="number of episodes to record (default 10)")
    parser.add_argument("--episode-time", type=float, default=30.0, help="seconds per episode (default 30)")
    parser.add_argument("--reset-time", type=float, default=10.0, help="seconds between episodes (default 10)")
    parser.add_argument("--task", help="task text of every episode (default: the daemon's [recording] task)")
    parser.add_argument("--no-keys", action="store_true", help="ignore the keyboard even on a terminal")
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="record until stopped, a new episode at each rotation (LeRobot's sentry); --episodes etc. unused",
    )
    parser.add_argument(
        "--rotate-s", type=float, help="--continuous: seconds per episode (default [recording] rotate_s)"
    )
    parser.add_argument(
        "--rotate-mb", type=float, help="--continuous: video MB per episode (default [recording] rotate_mb)"
    )
    add_socket_arguments(parser)


def session(
    client: Any,
    episodes: int,
    episode_time_s: float,
    reset_time_s: float,
    task: str | None,
    keys: Keys,
    say: Any = print,
) -> int:
    """The session loop (testable with any client exposing ``request``; its replies are read as
    ``EpisodeReply``). Returns episodes saved."""
    saved = 0
    while saved < episodes:
        fields = {"task": task} if task else {}
        r = decode_reply(client.request("episode.start", **fields), EpisodeReply)
        say(
            f"episode {r.episode} ({saved + 1}/{episodes}) recording {episode_time_s:.0f} s: {r.task!r}"
            + ("   [enter/→ save  f failure  ⌫ redo  esc stop]" if keys.enabled else "")
        )
        key = keys.wait(episode_time_s)
        if key == KEY_STOP:
            client.request("episode.discard")
            say("stopped; the episode in progress was discarded")
            return saved
        if key == KEY_REDO:
            client.request("episode.discard")
            say("discarded; recording it again")
            continue
        r = decode_reply(client.request("episode.save", success=(key != KEY_FAILURE) if key else None), EpisodeReply)
        saved += 1
        tag = "failure" if key == KEY_FAILURE else ("success" if key == KEY_SUCCESS else "untagged")
        say(f"episode {r.episode} saved: {r.frames} frames, {tag}")
        if saved < episodes and reset_time_s > 0:
            say(f"reset the scene: {reset_time_s:.0f} s")
            if keys.wait(reset_time_s) == KEY_STOP:
                return saved
    return saved


def continuous_session(
    client: Any,
    task: str | None,
    rotate_s: float | None,
    rotate_mb: float | None,
    keys: Keys,
    stop: threading.Event,
    say: Any = print,
) -> int:
    """One continuous recording until a key or ``stop`` (Ctrl-C) ends it; the daemon rotates the
    episodes, this only reports them and saves the last one at the end. Returns episodes saved."""
    fields: dict[str, Any] = {"continuous": True}
    if task:
        fields["task"] = task
    if rotate_s is not None:
        fields["rotate_s"] = rotate_s
    if rotate_mb is not None:
        fields["rotate_mb"] = rotate_mb
    r = decode_reply(client.request("episode.start", **fields), EpisodeReply)
    cont = r.continuous
    every = f"{cont.frames_per_episode} frames ({cont.limit})" if cont is not None else "rotation"
    say(
        f"continuous recording from episode {r.episode}: {r.task!r}, a new episode every {every}"
        + ("   [enter/→ stop  f stop as failure  esc/Ctrl-C stop]" if keys.enabled else "   [Ctrl-C stop]")
    )
    rotated = 0
    key: str | None = None
    while not stop.is_set():
        key = keys.wait(0.5)
        if key in (KEY_SUCCESS, KEY_FAILURE, KEY_STOP):
            break
        st = decode_reply(client.request("episode.status"), EpisodeStatusReply)
        if st.phase != "recording" or st.continuous is None:
            say(f"the continuous recording ended in the daemon ({st.phase}{': ' + st.error if st.error else ''})")
            return rotated
        if st.continuous.rotated > rotated:
            rotated = st.continuous.rotated
            say(f"{rotated} episodes rotated; episode {st.episode} recording")
    success = {KEY_SUCCESS: True, KEY_FAILURE: False}.get(key or "")
    r = decode_reply(client.request("episode.save", success=success), EpisodeReply)
    say(f"episode {r.episode} saved: {r.frames} frames (the last, partial one)")
    return rotated + 1


def _with_daemon(args: argparse.Namespace, body: Callable[[ControlClient, Keys], int]) -> int:
    """``body`` on a connection to the daemon and the terminal's keys; the daemon gone is exit 2,
    a refused verb exit 1, both said on stderr."""
    try:
        with ControlClient(socket_path_from_args(args), timeout_s=10.0) as c, Keys(not args.no_keys) as keys:
            return body(c, keys)
    except DaemonUnavailable as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"so101d record: {exc}", file=sys.stderr)
        return 1


def _run_continuous(args: argparse.Namespace) -> int:
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())  # Ctrl-C: save, then exit
    try:
        return _with_daemon(
            args,
            lambda c, keys: _report_end(c, continuous_session(c, args.task, args.rotate_s, args.rotate_mb, keys, stop)),
        )
    finally:
        signal.signal(signal.SIGINT, previous)


def _report_end(c: Any, n: int) -> int:
    st = c.request_as(EpisodeStatusReply, "episode.status")
    print(
        f"{n} episodes saved; dataset {st.dataset} "
        f"({st.episodes_in_dataset} episodes, {st.saves_pending} still being written)"
    )
    # A session is not "done" when recording failed under it: say what was lost, fail.
    if st.phase == "error" or st.lost_episodes:
        print(f"so101d record: recording stopped: {st.error}", file=sys.stderr)
        for lost in st.lost_episodes:
            print(f"so101d record: LOST {lost}", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--rotate-s", args.rotate_s), ("--rotate-mb", args.rotate_mb)):
        if value is not None and not args.continuous:
            print(f"so101d record: {flag} is for --continuous", file=sys.stderr)
            return 1
        if value is not None and not value > 0:
            print(f"so101d record: {flag} must be above 0, got {value:g}", file=sys.stderr)
            return 1
    if args.continuous:
        return _run_continuous(args)
    if args.episodes < 1 or args.episode_time <= 0 or args.reset_time < 0:
        print("so101d record: --episodes >= 1, --episode-time > 0 and --reset-time >= 0 please", file=sys.stderr)
        return 1
    return _with_daemon(
        args,
        lambda c, keys: _report_end(c, session(c, args.episodes, args.episode_time, args.reset_time, args.task, keys)),
    )
