"""`so101d episode start|save|discard|status`: episode control of the running daemon."""

from __future__ import annotations

import argparse
import json

from daemon.api.client import add_socket_arguments, run_simple


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "save", "discard", "status"))
    parser.add_argument("--task", help="start: the task text of this episode (default: the last one)")
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


def describe(action: str, reply: dict) -> str:
    if action == "start":
        return f"episode {reply.get('episode')} recording: {reply.get('task')!r}"
    if action == "save":
        tag = {True: "success", False: "failure", None: "untagged"}[reply.get("success")]
        if reply.get("durable") is False:
            return f"episode {reply.get('episode')} saving… ({reply.get('frames')} frames, {tag}; not on the disk yet)"
        return f"episode {reply.get('episode')} saved ({reply.get('frames')} frames, {tag}, on disk); committing in the background"
    if action == "discard":
        return f"episode {reply.get('episode')} discarded ({reply.get('discarded_frames')} frames)"
    return format_status(reply)


def format_status(st: dict) -> str:
    line = f"recording: {st.get('phase')}  episode {st.get('episode')}"
    if st.get("phase") == "recording":
        line += f"  {st.get('elapsed_s', 0):.1f} s  {st.get('frames')} frames  task {st.get('task')!r}"
    line += f"\n  dataset {st.get('dataset')} ({st.get('episodes_in_dataset')} episodes, {st.get('saves_pending')} being written)"
    if st.get("last_committed"):
        line += f"\n  last committed: {st['last_committed']}"
    last = st.get("last_staged") or {}
    if last.get("tag"):
        t = last["tag"]
        line += (
            f"\n  last episode: {t.get('frames')} frames, {t.get('late_frames')} late, "
            f"{t.get('missing_frames')} missing, worst camera skew {t.get('worst_camera_skew_ms')} ms"
        )
    for cam in st.get("cameras", []):
        line += (
            f"\n  camera {cam.get('name')}: {cam.get('fps_measured', '?')} fps"
            + ("  STALLED" if cam.get("stalled") else "")
            + (f"  {cam['error']}" if cam.get("error") else "")
        )
    for name, r in sorted((st.get("frames_refused") or {}).items()):
        line += f"\n  camera {name}: {r.get('count')} frames refused ({r.get('last')})"
    if st.get("waiting_for"):
        line += f"\n  waiting: {st['waiting_for']}"
    if st.get("error"):
        line += f"\n  ERROR: {st['error']}"
    for number in st.get("saving") or []:
        line += f"\n  saving… episode {number} (not on the disk yet)"
    if st.get("disk_free_mb") is not None:
        line += f"\n  disk: {st['disk_free_mb']:.0f} MB free (an episode starts with {st.get('min_free_mb', 0):.0f} MB)"
    for lost in st.get("lost_episodes") or []:
        line += f"\n  LOST: {lost}"
    for dropped in st.get("dropped_episodes") or []:
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
                st = c.call("episode.status")
                if not st.get("ok"):
                    break
                if episode not in (st.get("saving") or []):
                    if any(x.startswith(f"episode {episode} ") for x in st.get("lost_episodes") or []):
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
    fields: dict = {}
    if args.action == "start" and args.task:
        fields["task"] = args.task
    if args.action == "save":
        fields["success"] = args.success
    as_json = getattr(args, "json", False)
    answered: dict = {}

    def render(reply: dict) -> str:
        answered.update(reply)
        return json.dumps(reply) if as_json else describe(args.action, reply)

    rc = run_simple(args, f"episode.{args.action}", label=f"episode {args.action}", render=render, **fields)
    if rc == 0 and args.action == "save" and answered.get("durable") is False and not as_json:
        return follow_saving(args, int(answered["episode"]))
    return rc
