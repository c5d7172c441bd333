"""`so101d episode start|keep|save|stop|discard|status`: episode control of the running daemon.

``start --continuous`` records until ``stop`` (or ``save``/``discard``), the daemon saving an
episode and starting the next at each rotation (``--rotate-s``, ``--rotate-mb``; LeRobot's sentry
strategy). ``stop`` is ``save`` by another name: it saves the episode in progress, the last
(partial) one of a continuous recording. ``keep --last S`` starts an episode with the last S seconds
the daemon kept between episodes (``[recording] ring_s``), which then records on live until saved
(LeRobot's highlight strategy)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from daemon.api.client import add_socket_arguments, run_simple
from daemon.api.messages import EpisodeReply, EpisodeStatusReply, ErrorReply, RecordingStatus, decode_reply


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "keep", "save", "stop", "discard", "status"))
    parser.add_argument("--task", help="start, keep: the task text of this episode (default: the last one)")
    parser.add_argument(
        "--last",
        type=float,
        metavar="S",
        help="keep: the seconds before now that begin the episode (at most [recording] ring_s)",
    )
    parser.add_argument(
        "--continuous", action="store_true", help="start: record until stop, a new episode at each rotation"
    )
    parser.add_argument("--rotate-s", type=float, help="start --continuous: seconds per episode")
    parser.add_argument("--rotate-mb", type=float, help="start --continuous: video MB per episode")
    g = parser.add_mutually_exclusive_group()
    g.add_argument(
        "--success",
        dest="success",
        action="store_const",
        const=True,
        default=None,
        help="save: tag the episode successful",
    )
    g.add_argument(
        "--failure",
        dest="success",
        action="store_const",
        const=False,
        help="save: tag the episode failed (kept, tagged)",
    )
    add_socket_arguments(parser)


def describe(action: str, reply: dict[str, Any]) -> str:
    if action == "status":
        return format_status(decode_reply(reply, EpisodeStatusReply))
    ep = decode_reply(reply, EpisodeReply)
    if action == "start":
        if ep.continuous is not None:
            c = ep.continuous
            return (
                f"episode {ep.episode} recording: {ep.task!r}, continuous: a new episode every "
                f"{c.frames_per_episode} frames ({c.limit})"
            )
        return f"episode {ep.episode} recording: {ep.task!r}"
    if action == "keep":
        return (
            f"episode {ep.episode} recording: {ep.task!r}, its first {ep.kept_s or 0:.2f} s "
            f"({ep.kept_frames} frames) from before the keep; save or discard it as usual"
        )
    if action in ("save", "stop"):
        tag = {True: "success", False: "failure", None: "untagged"}[ep.success]
        if ep.durable is False:
            return f"episode {ep.episode} saving… ({ep.frames} frames, {tag}; not on the disk yet)"
        return f"episode {ep.episode} saved ({ep.frames} frames, {tag}, on disk); committing in the background"
    return f"episode {ep.episode} discarded ({ep.discarded_frames} frames)"


def format_status(status: RecordingStatus | dict[str, Any]) -> str:
    """What `so101d episode status` prints; a dict is the recorder's own section, decoded here."""
    st = status if isinstance(status, RecordingStatus) else decode_reply(status, RecordingStatus)
    line = f"recording: {st.phase}  episode {st.episode}"
    if st.phase == "recording":
        line += f"  {st.elapsed_s or 0:.1f} s  {st.frames} frames  task {st.task!r}"
    if st.kept is not None:
        line += f"\n  kept: its first {st.kept.frames} frames from before the keep"
        if st.kept.flush_left:
            line += f" ({st.kept.flush_left} still going to the writer)"
    p = st.preroll
    if p is not None:
        held = "paused while an episode records" if p.paused else f"{p.buffered_s or 0:.1f} s buffered"
        line += (
            f"\n  pre-roll: {held} of {p.ring_s or 0:g} s ({p.frames} of {p.max_frames} frames, "
            f"at most {p.bound_mb or 0:.1f} MiB of images)"
        )
    line += f"\n  dataset {st.dataset} ({st.episodes_in_dataset} episodes, {st.saves_pending} being written)"
    if st.last_committed:
        line += f"\n  last committed: {st.last_committed}"
    t = st.last_staged.tag
    if t is not None:
        line += (
            f"\n  last episode: {t.frames} frames, {t.late_frames} late, "
            f"{t.missing_frames} missing, worst camera skew {t.worst_camera_skew_ms} ms"
        )
    for cam in st.cameras:
        line += (
            f"\n  camera {cam.name}: {'?' if cam.fps_measured is None else cam.fps_measured} fps"
            + ("  STALLED" if cam.stalled else "")
            + (f"  {cam.error}" if cam.error else "")
        )
    for name, r in sorted(st.frames_refused.items()):
        line += f"\n  camera {name}: {r.count} frames refused ({r.last})"
    if st.waiting_for:
        line += f"\n  waiting: {st.waiting_for}"
    if st.error:
        line += f"\n  ERROR: {st.error}"
    for number in st.saving:
        line += f"\n  saving… episode {number} (not on the disk yet)"
    if st.disk_free_mb is not None:
        line += f"\n  disk: {st.disk_free_mb:.0f} MB free (an episode starts with {st.min_free_mb or 0:.0f} MB)"
    for lost in st.lost_episodes:
        line += f"\n  LOST: {lost}"
    for dropped in st.dropped_episodes:
        line += f"\n  DROPPED: {dropped}"
    return line


SAVING_WAIT_S = 120.0  # how long `episode save` follows a "saving…" answer until "saved"


def follow_saving(args: argparse.Namespace, episode: int) -> int:
    """After a "durable": false answer: poll the status until the episode is on the disk."""
    import sys
    import time

    from daemon.api.client import ControlClient, DaemonUnavailable, socket_path_from_args

    deadline = time.monotonic() + SAVING_WAIT_S
    try:
        with ControlClient(socket_path_from_args(args)) as c:
            while time.monotonic() < deadline:
                st = c.call_as(EpisodeStatusReply, "episode.status")
                if isinstance(st, ErrorReply):
                    break
                if episode not in st.saving:
                    if any(x.startswith(f"episode {episode} ") for x in st.lost_episodes):
                        print(f"so101d: episode {episode} LOST: see `so101d episode status`", file=sys.stderr)
                        return 1
                    print(f"episode {episode} saved (on disk)")
                    return 0
                time.sleep(0.1)
    except DaemonUnavailable as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    print(f"so101d: episode {episode} still not on the disk after {SAVING_WAIT_S:.0f} s", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    import sys

    fields: dict = {}
    if args.action in ("start", "keep") and args.task:
        fields["task"] = args.task
    if (args.last is not None) != (args.action == "keep"):
        print("so101d episode: `episode keep` takes --last S (seconds), and only it does", file=sys.stderr)
        return 1
    if args.action == "keep":
        fields["last_s"] = args.last  # the daemon refuses one out of (0, ring_s], saying why
    for flag, value in (("--rotate-s", args.rotate_s), ("--rotate-mb", args.rotate_mb)):
        if value is not None and not (args.action == "start" and args.continuous):
            print(f"so101d episode: {flag} is for `episode start --continuous`", file=sys.stderr)
            return 1
    if args.action == "start" and args.continuous:
        fields["continuous"] = True
        for key, value in (("rotate_s", args.rotate_s), ("rotate_mb", args.rotate_mb)):
            if value is not None:
                fields[key] = value  # the socket refuses one not above 0, naming it
    if args.action in ("save", "stop"):
        fields["success"] = args.success
    as_json = getattr(args, "json", False)
    answered: list[EpisodeReply] = []

    def render(reply: dict[str, Any]) -> str:
        if args.action in ("save", "stop"):
            answered.append(decode_reply(reply, EpisodeReply))
        return json.dumps(reply) if as_json else describe(args.action, reply)

    verb = "save" if args.action == "stop" else args.action
    rc = run_simple(args, f"episode.{verb}", label=f"episode {args.action}", render=render, **fields)
    saved = answered[0] if answered else None
    if rc == 0 and saved is not None and saved.durable is False and saved.episode is not None and not as_json:
        return follow_saving(args, saved.episode)
    return rc
