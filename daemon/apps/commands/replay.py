"""`so101d replay DATASET --episode N [--speed S] [--json]`: play an episode on the arm through
the running daemon (safety aligns to its first action, then shapes every command), and print the
tracking report at the end. Ctrl-C stops it at once: the arm holds."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import msgspec

from daemon.api.client import ControlClient, DaemonUnavailable, add_socket_arguments, socket_path_from_args
from daemon.api.messages import ErrorReply, ReplayReply, ReplayReport
from daemon.control.replay_source import MIN_SPEED

_POLL_S = 0.1  # progress polling of the daemon (the CLI's own pace; the loop does not wait on it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", type=Path, help="the LeRobot v3.0 dataset's folder")
    parser.add_argument("--episode", type=int, required=True, help="episode index")
    parser.add_argument(
        "--speed", type=float, default=1.0, help=f"fraction of the episode's fps, [{MIN_SPEED}, 1] (default 1)"
    )
    rec = parser.add_mutually_exclusive_group()
    rec.add_argument(
        "--record",
        dest="record",
        action="store_const",
        const=True,
        default=None,
        help="record it (fail if not possible)",
    )
    rec.add_argument("--no-record", dest="record", action="store_const", const=False, help="do not record it")
    parser.add_argument("--json", action="store_true", help="print the final reply (with the report) as JSON")
    add_socket_arguments(parser)


def format_report(rep: ReplayReport) -> str:
    lines = [f"replay {rep.outcome}: {rep.frames_played}/{rep.frames} frames in {rep.cycles} cycles"]
    lines.append(f"{'joint':<18} {'p50':>7} {'p99':>7} {'max':>7}   (commanded - measured, deg; gripper %)")
    for e in rep.error:
        lines.append(f"{e.joint:<18} {e.p50:>7.2f} {e.p99:>7.2f} {e.max:>7.2f}")
    lines.append(f"lag: {'-' if rep.lag_ms is None else f'{rep.lag_ms:.0f} ms'}")
    lines.append(
        f"shaped by safety: {rep.shaped_cycles} cycles (step limit {rep.step_limited_cycles}, "
        f"joint limits {rep.joint_limited_cycles})"
        + (f"; first at frames {', '.join(map(str, rep.shaped_frames))}" if rep.shaped_frames else "")
    )
    if rep.sim_gap:
        lines.append("sim-to-real gap (recorded sim state - measured real state):")
        for e in rep.sim_gap:
            lines.append(f"{e.joint:<18} {e.p50:>7.2f} {e.p99:>7.2f} {e.max:>7.2f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if not MIN_SPEED <= args.speed <= 1:
        print(f"so101d: replay: --speed {args.speed} must be in [{MIN_SPEED}, 1]", file=sys.stderr)
        return 1
    # the ticket lets a Ctrl-C's stop cancel this start even if it reaches the daemon first
    ticket = uuid.uuid4().hex
    fields = {
        "dataset": str(args.dataset.expanduser().resolve()),
        "episode": args.episode,
        "speed": args.speed,
        "ticket": ticket,
    }
    if args.record is not None:
        fields["record"] = args.record
    path = socket_path_from_args(args)
    try:
        try:
            with ControlClient(path) as c:
                first = c.call_as(ReplayReply, "replay.start", **fields)
            if isinstance(first, ErrorReply):
                print(f"so101d: replay: {first.error}", file=sys.stderr)
                return 1
            if not args.json:
                print(first.message, flush=True)
        except KeyboardInterrupt:
            # the start may still be on its way or being read: the stop names it, so it ends either way
            _stop(path, ticket)
            return 130
        final = _follow(path, args.json)
    except DaemonUnavailable as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(msgspec.to_builtins(final)))
    elif final.report is not None:
        print(format_report(final.report))
    return 0 if final.phase == "done" else 1


def _follow(path: str, quiet: bool) -> ReplayReply:
    """Poll until the replay ended; Ctrl-C asks the daemon to stop it (the arm holds). The stop
    goes on a fresh connection: the interrupted one may hold half a reply."""
    shown = ""
    c = ControlClient(path).connect()
    try:
        while True:
            try:
                st = c.request_as(ReplayReply, "replay.status")
                if st.report is not None and st.phase in ("done", "stopped"):
                    return st
                line = f"{st.phase}: frame {st.frame}/{st.frames}"
                if not quiet and line != shown and st.phase == "playing" and (st.frame or 0) % 30 == 0:
                    print(line, flush=True)
                    shown = line
                time.sleep(_POLL_S)
            except KeyboardInterrupt:
                c.close()
                _stop(path, None)
                c = ControlClient(path).connect()
    finally:
        c.close()


def _stop(path: str, ticket: str | None) -> None:
    """replay.stop on a fresh connection (the interrupted one may hold half a reply). Another
    Ctrl-C while it is on its way sends it again: stopping is what the operator asked for."""
    for _ in range(3):
        try:
            with ControlClient(path) as c:
                reply = c.call_as(ReplayReply, "replay.stop", ticket=ticket)
            said = reply.error if isinstance(reply, ErrorReply) else reply.message
            print(f"so101d: replay (Ctrl-C): {said}", file=sys.stderr, flush=True)
            return
        except KeyboardInterrupt:
            continue
    print(
        "so101d: replay: Ctrl-C kept interrupting the stop; run `so101d teleop stop` (hold)",
        file=sys.stderr,
        flush=True,
    )
