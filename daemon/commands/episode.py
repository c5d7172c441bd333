"""`so101d episode start|save|discard|status`: episode control of the running daemon."""

from __future__ import annotations

import argparse
import json

from daemon.control_client import add_socket_arguments, run_simple


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
        return f"episode {reply.get('episode')} saved ({reply.get('frames')} frames, {tag}); writing in the background"
    if action == "discard":
        return f"episode {reply.get('episode')} discarded ({reply.get('discarded_frames')} frames)"
    return format_status(reply)


def format_status(st: dict) -> str:
    line = f"recording: {st.get('phase')}  episode {st.get('episode')}"
    if st.get("phase") == "recording":
        line += f"  {st.get('elapsed_s', 0):.1f} s  {st.get('frames')} frames  task {st.get('task')!r}"
    line += f"\n  dataset {st.get('dataset')} ({st.get('episodes_in_dataset')} episodes, {st.get('saves_pending')} being written)"
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
    for lost in st.get("lost_episodes") or []:
        line += f"\n  LOST: {lost}"
    return line


def run(args: argparse.Namespace) -> int:
    fields: dict = {}
    if args.action == "start" and args.task:
        fields["task"] = args.task
    if args.action == "save":
        fields["success"] = args.success
    as_json = getattr(args, "json", False)
    return run_simple(
        args,
        f"episode.{args.action}",
        label=f"episode {args.action}",
        render=(json.dumps) if as_json else (lambda reply: describe(args.action, reply)),
        **fields,
    )
