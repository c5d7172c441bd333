"""`so101d policy load|start|stop|unload|status|check|serve`: local inference next to the servos.

load DIR      check the checkpoint against the daemon's configuration and start its worker
start         the policy drives the follower (through the safety layer; evaluation episode recorded)
stop          hold the pose (the evaluation episode is saved; --success/--failure/--discard)
status        inference latency p50/p99, chunk age, queue depth, dropped stale actions
check DIR     offline: does this checkpoint fit this configuration? (lists every mismatch)
serve DIR     serve the policy to other local programs over ZeroMQ (see daemon/policy/serve.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from daemon.control_client import CommandFailed, ControlClient, DaemonUnavailable, add_socket_arguments, socket_path_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("load", help="load a checkpoint folder into the daemon's policy worker")
    p.add_argument("path", metavar="DIR")
    p.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the worker to be ready")
    add_socket_arguments(p)
    p = sub.add_parser("start", help="let the policy drive the follower")
    p.add_argument("--no-record", action="store_true", help="do not record an evaluation episode")
    p.add_argument("--task", help="task text of the evaluation episode (and VLA instruction)")
    add_socket_arguments(p)
    p = sub.add_parser("stop", help="stop the policy: the follower holds its pose")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--success", dest="success", action="store_const", const=True)
    g.add_argument("--failure", dest="success", action="store_const", const=False)
    g.add_argument("--discard", action="store_true", help="discard the evaluation episode")
    p.add_argument("--takeover", action="store_true",
                   help="hand over to teleop without a jump: the leader is moved to the follower's pose, then released")
    add_socket_arguments(p)
    p = sub.add_parser("unload", help="stop the policy worker")
    add_socket_arguments(p)
    p = sub.add_parser("status", help="inference latency, chunk age, queue depth")
    p.add_argument("--json", action="store_true")
    add_socket_arguments(p)
    p = sub.add_parser("check", help="offline: check a checkpoint against a configuration")
    p.add_argument("path", metavar="DIR")
    p.add_argument("--config", metavar="FILE", help="daemon configuration (cameras) to check against")
    p = sub.add_parser("serve", help="serve a checkpoint over ZeroMQ to local clients")
    p.add_argument("path", metavar="DIR")
    p.add_argument("--endpoint", default=None, help="ipc://PATH or tcp://127.0.0.1:PORT (default: ipc in the runtime dir)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--task", default="")


def _call(args: argparse.Namespace, cmd: str, **fields: Any) -> dict[str, Any] | int:
    try:
        with ControlClient(socket_path_from_args(args), timeout_s=max(5.0, float(fields.get("wait_s") or 0) + 5)) as c:
            return c.request(cmd, **fields)
    except DaemonUnavailable as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"so101d: {cmd}: {exc}", file=sys.stderr)
        return 1


def _ms(d: dict[str, float] | None) -> str:
    return "-" if not d else f"p50 {d['p50']:.1f} ms, p99 {d['p99']:.1f} ms (n={d['n']})"


def format_status(st: dict[str, Any]) -> str:
    if st.get("state") == "none":
        return "no policy loaded"
    age = st.get("chunk_age_ms")
    lines = [
        f"policy     {st.get('policy_type')} from {st.get('checkpoint')}",
        f"state      {st.get('state')}{' (driving the follower)' if st.get('driving') else ''}"
        + (f"  error: {st['error']}" if st.get("error") else ""),
        f"latency    {_ms(st.get('inference_latency_ms'))}  (observation -> chunk in the loop)",
        f"overhead   {_ms(st.get('overhead_ms'))}  (beyond the forward pass)",
        f"queue      {st.get('queue_depth')} actions ahead, chunk age {'-' if age is None else f'{age:.0f} ms'}, merge {st.get('merge')}",
        f"dropped    {st.get('actions_dropped_stale')} stale actions, {st.get('chunks_rejected')} chunks too old, "
        f"{st.get('timeouts')} timeouts",
    ]
    if st.get("takeover"):
        t = st["takeover"]
        lines.append(f"take-over  {t['phase']}" + (f"  error: {t['error']}" if t.get("error") else ""))
    if st.get("last_error"):
        lines.append(f"last error {st['last_error']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    action = args.action
    if action == "check":
        return _check(args)
    if action == "serve":
        from daemon.policy.serve import serve_main  # noqa: PLC0415

        return serve_main(args.path, args.endpoint, device=args.device, task=args.task)
    if action == "load":
        reply = _call(args, "policy.load", path=os.path.abspath(args.path), wait_s=args.wait)
    elif action == "start":
        reply = _call(args, "policy.start", record=not args.no_record, **({"task": args.task} if args.task else {}))
    elif action == "stop" and args.takeover:
        reply = _call(args, "policy.takeover")
    elif action == "stop":
        reply = _call(args, "policy.stop", success=args.success, discard=args.discard)
    elif action == "unload":
        reply = _call(args, "policy.unload")
    else:
        reply = _call(args, "policy.status")
    if isinstance(reply, int):
        return reply
    if action == "status":
        body = {k: v for k, v in reply.items() if k != "ok"}
        print(json.dumps(body, indent=2) if args.json else format_status(body))
        return 0
    print(reply.get("message", f"policy {action}: ok"))
    if reply.get("error"):
        print(f"error: {reply['error']}", file=sys.stderr)
        return 1
    return 0


def _check(args: argparse.Namespace) -> int:
    from daemon.config import ConfigError, load_config  # noqa: PLC0415
    from daemon.policy.checkpoint import CheckpointError, ExpectedIO, check_checkpoint  # noqa: PLC0415

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"so101d: configuration error: {exc}", file=sys.stderr)
        return 2
    cams = {n: (c.height, c.width) for n, c in cfg.cameras.items()}
    try:
        info = check_checkpoint(args.path, ExpectedIO(cameras=cams))
    except CheckpointError as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 1
    cam_text = ", ".join(f"{n} {w}x{h}" for n, (c, h, w) in sorted(info.cameras.items())) or "none"
    print(f"ok: {info.policy_type} policy, state {info.state_shape}, cameras {cam_text}, "
          f"chunk {info.chunk_size} (uses {info.n_action_steps})")
    return 0
