"""`so101d policy load|start|stop|unload|status|check|serve`: local inference next to the servos.

load DIR      check the checkpoint against the daemon's configuration and start its worker
start         the policy drives the follower (through the safety layer; evaluation episode recorded)
stop          hold the pose (the evaluation episode is saved; --success/--failure/--discard)
status        inference latency p50/p99, chunk age, queue depth, dropped stale actions
check DIR     offline: does this checkpoint fit this configuration? (lists every mismatch)
check --server HOST:PORT [PATH]
              a checkpoint on LeRobot's policy server: set it up there, send one observation of
              this configuration, report the chunk that came back (also with [policy] backend =
              "lerobot-server"; PATH defaults to [policy] path)
serve DIR     serve the policy to other local programs over ZeroMQ (see daemon/policy/serve.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from daemon.api.client import (
    CommandFailed,
    ControlClient,
    DaemonUnavailable,
    add_socket_arguments,
    socket_path_from_args,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("load", help="load a checkpoint folder into the daemon's policy worker")
    # optional: the daemon falls back to [policy] path (with backend "lerobot-server", a path on the server)
    p.add_argument(
        "path", metavar="DIR", nargs="?", default=None, help="checkpoint folder (default: the daemon's [policy] path)"
    )
    p.add_argument(
        "--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the worker to be ready"
    )
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
    p.add_argument(
        "--takeover",
        action="store_true",
        help="hand over to teleop without a jump: the leader is moved to the follower's pose, then released",
    )
    add_socket_arguments(p)
    p = sub.add_parser("unload", help="stop the policy worker")
    add_socket_arguments(p)
    p = sub.add_parser("status", help="inference latency, chunk age, queue depth")
    p.add_argument("--json", action="store_true")
    add_socket_arguments(p)
    p = sub.add_parser(
        "check",
        help="check a checkpoint against a configuration (and time its inference); with --server (or "
        '[policy] backend = "lerobot-server"), a checkpoint on LeRobot\'s policy server',
    )
    p.add_argument(
        "path",
        metavar="DIR",
        nargs="?",
        default=None,
        help="checkpoint folder (with a server: its path or hub id on the server); default: [policy] path",
    )
    p.add_argument(
        "--server",
        metavar="HOST:PORT",
        help="check on LeRobot's policy server at HOST:PORT (default: [policy] server when backend is lerobot-server)",
    )
    p.add_argument(
        "--policy-type", help="with a server: the policy type it loads (default: [policy] server_policy_type)"
    )
    p.add_argument("--config", metavar="FILE", help="daemon configuration (cameras, [policy]) to check against")
    p.add_argument(
        "--no-timing", action="store_true", help="skip timing the inference (which loads the policy; a few seconds)"
    )
    p.add_argument("--repeats", type=int, default=5, metavar="N", help="forward passes to time (default 5)")
    p = sub.add_parser("serve", help="serve a checkpoint over ZeroMQ to local clients")
    p.add_argument("path", metavar="DIR")
    p.add_argument(
        "--endpoint", default=None, help="ipc://PATH or tcp://127.0.0.1:PORT (default: ipc in the runtime dir)"
    )
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


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.0f}"


def _ms(d: dict[str, float] | None) -> str:
    if not d:
        return "-"
    tail = f", p99.9 {d['p99.9']:.1f}" if "p99.9" in d else ""
    return f"p50 {d['p50']:.1f} ms, p99 {d['p99']:.1f}{tail} ms (n={d['n']})"


STAGES = (  # (key, what it covers), in the order a request goes through them
    ("ask", "cycle start -> the loop asks (its bus reads come first; before the request, not overhead)"),
    ("handoff", "request -> worker has it (publisher thread, frame copy into shared memory, pipe)"),
    ("publish", "  of which the frame copy"),
    ("worker", "the worker's time beyond the forward pass, of which:"),
    ("read", "  the copy out of shared memory"),
    ("preprocess", "  image to float, normalisation, to device"),
    ("postprocess", "  unnormalisation, to cpu"),
    ("gc", "  garbage-collection pauses"),
    ("forward", "the forward pass (not overhead)"),
    ("reply", "chunk ready -> in the daemon (pipe, receiver thread, msgpack)"),
    ("prepare", "-> decoded and checked: usable (the overhead ends here)"),
    ("pickup", "-> the loop's next cycle takes it (its sampling period; not overhead)"),
)


def format_gc(gc: dict[str, Any]) -> str:
    """Garbage-collection pauses: the daemon's (they stop the loop too) and the worker's per chunk."""
    w = gc.get("worker_ms")
    worker = f"p99 {w['p99']:.1f} ms, max {w['max']:.1f} ms" if w else "-"
    f = gc.get("worker_page_faults")
    faults = f"; worker page faults per chunk p50 {f['p50']}, max {f['max']}" if f else ""
    return (
        f"gc         daemon {gc.get('daemon_collections', 0)} collections ({gc.get('daemon_full_collections', 0)} full), "
        f"longest {gc.get('daemon_max_pause_ms', 0.0):.1f} ms, {gc.get('daemon_frozen_objects', 0)} objects frozen; "
        f"worker pauses per chunk {worker}{faults}"
    )


def format_server(srv: dict[str, Any]) -> list[str]:
    """The lerobot-server backend's lines: link state, then round trip / network / server kept apart."""
    state = "connected" if srv.get("connected") else "NOT connected (the follower holds; reconnecting)"
    lines = [
        f"server     {srv.get('address')} {state}, {srv.get('connects')} set-ups, {srv.get('failures')} failures; "
        f"checkpoint on the server: {srv.get('checkpoint')}"
    ]
    if srv.get("error"):
        lines.append(f"  why      {srv['error']}")
    lines.append(f"  round trip     {_ms(srv.get('round_trip_ms'))}  (send observation -> chunk decoded)")
    lines.append(f"  network        {_ms(srv.get('network_ms'))}  (SendObservations: upload + server enqueue)")
    lines.append(f"  GetActions     {_ms(srv.get('get_actions_ms'))}  (server compute + reply transfer)")
    compute = srv.get("server_compute_ms")
    lines.append(
        f"  server compute {_ms(compute) if isinstance(compute, dict) else srv.get('server_compute_note') or 'unknown'}"
    )
    return lines


def format_status(st: dict[str, Any]) -> str:
    if st.get("state") == "none":
        return "no policy loaded"
    age = st.get("chunk_age_ms")
    lines = [
        f"policy     {st.get('policy_type')} from {st.get('checkpoint')}",
        f"state      {st.get('state')}{' (driving the follower)' if st.get('driving') else ''}"
        + (f"  error: {st['error']}" if st.get("error") else ""),
        f"latency    {_ms(st.get('inference_latency_ms'))}  (observation -> chunk in the loop's queue)",
        f"overhead   {_ms(st.get('overhead_ms'))}  (request -> chunk usable, minus the forward pass)",
        f"queue      {st.get('queue_depth')} actions ahead, chunk age {'-' if age is None else f'{age:.0f} ms'}, merge {st.get('merge')}",
        f"horizon    {_num(st.get('usable_horizon_ms'))} ms left of {_num(st.get('chunk_horizon_ms'))} ms per chunk; "
        f"next chunk asked {_num(st.get('refill_lead_ms'))} ms before the end (latency p99 + margin)",
        f"dropped    {st.get('actions_dropped_stale')} stale actions, {st.get('chunks_rejected')} chunks too old, "
        f"{st.get('chunks_expired')} ran out (arm held), {st.get('timeouts')} timeouts",
    ]
    srv = st.get("server")
    if st.get("backend") == "lerobot-server" and isinstance(srv, dict):
        lines[3] = (
            f"overhead   {_ms(st.get('overhead_ms'))}  (request -> chunk usable, minus GetActions: upload, decode, hand-offs)"
        )
        lines.extend(format_server(srv))
    stages = st.get("stages_ms") or {}
    lines.append(
        f"stages     {'p50':>7} {'p99':>7} {'p99.9':>7} ms  where the latency goes"
        + (
            "  (remote: preprocess = upload, forward = GetActions, postprocess = decode)"
            if st.get("backend") == "lerobot-server"
            else ""
        )
    )
    for key, what in STAGES:
        d = stages.get(key)
        nums = (
            f"{d['p50']:7.2f} {d['p99']:7.2f} {d.get('p99.9', d['max']):7.2f}" if d else f"{'-':>7} {'-':>7} {'-':>7}"
        )
        lines.append(f"  {key:<11}{nums}     {what}")
    over = st.get("overhead_stages")
    if over:
        lines.append(f"  overhead = {' + '.join(over)}, chunk by chunk (percentiles do not add up)")
    if isinstance(st.get("gc"), dict):
        lines.append(format_gc(st["gc"]))
    worker = st.get("worker") or {}
    if worker.get("io"):  # the local worker: how it runs (engine.py, heap.py, worker.torch_threads)
        lines.append(
            f"worker     {worker.get('torch_threads')} torch thread(s), OpenMP wait {worker.get('omp_wait_policy')}; "
            f"{worker['io']}; {worker.get('heap')}"
        )
    if st.get("warning"):
        lines.append(f"WARNING    {st['warning']}")
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
        from daemon.policy.serve import serve_main

        return serve_main(args.path, args.endpoint, device=args.device, task=args.task)
    if action == "load":
        # a local folder is made absolute (the daemon's working directory is not ours); none: [policy] path
        reply = _call(args, "policy.load", path=os.path.abspath(args.path) if args.path else None, wait_s=args.wait)
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
    from daemon.config.settings import ConfigError, load_config
    from daemon.policy.checkpoint import CheckpointError, ExpectedIO, check_checkpoint

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"so101d: configuration error: {exc}", file=sys.stderr)
        return 2
    cams = {n: (c.height, c.width) for n, c in cfg.cameras.items()}
    path = args.path or cfg.policy.path
    if not path:
        print("so101d: policy check: give the checkpoint (DIR) or set [policy] path", file=sys.stderr)
        return 2
    if args.server or cfg.policy.backend == "lerobot-server":
        return _check_on_server(args, cfg, path, cams)
    try:
        info = check_checkpoint(path, ExpectedIO(cameras=cams))
    except CheckpointError as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 1
    cam_text = ", ".join(f"{n} {w}x{h}" for n, (c, h, w) in sorted(info.cameras.items())) or "none"
    print(
        f"ok: {info.policy_type} policy, state {info.state_shape}, cameras {cam_text}, "
        f"chunk {info.chunk_size} (uses {info.n_action_steps})"
    )
    if args.no_timing:
        return 0
    return _check_timing(args, cfg, path, cams, info)


def _check_on_server(args: argparse.Namespace, cfg: Any, path: str, cams: dict[str, tuple[int, int]]) -> int:
    """The daemon's handshake with LeRobot's policy server and one observation (server_check.py)."""
    import dataclasses
    import statistics

    from daemon.policy.runner import keep_up_warning
    from daemon.policy.server_check import ServerCheckError, check_server_policy, describe_observation
    from daemon.service.attach_policy import PolicyError, queue_config_from, server_spec_from

    overrides: dict[str, Any] = {"backend": "lerobot-server"}
    if args.server:
        overrides["server"] = args.server
    if args.policy_type:
        overrides["server_policy_type"] = args.policy_type
    policy_cfg = dataclasses.replace(cfg.policy, **overrides)
    try:
        spec = server_spec_from(policy_cfg, path, cams)
        qcfg = queue_config_from(policy_cfg)
    except PolicyError as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    assert spec is not None  # backend is lerobot-server
    print(
        f"checking {spec.policy_type} from {spec.checkpoint} on the policy server {spec.server} "
        f"(device {spec.device}, {spec.actions_per_chunk} actions per chunk; observation: {describe_observation(spec)})"
    )
    try:
        r = check_server_policy(spec, repeats=0 if args.no_timing else max(1, args.repeats))
    except ServerCheckError as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 1
    print(f"ok: the server set the policy up in {r.setup_s:.1f} s (Ready + SendPolicyInstructions)")
    print(
        f"ok: one observation -> an action chunk of {r.n_actions} x {r.action_dim} "
        f"({r.first_round_trip_s * 1e3:.0f} ms round trip, the server's first forward pass)"
    )
    if r.round_trips_s:
        print(
            f"timing: round trip {statistics.median(r.round_trips_s) * 1e3:.0f} ms median, "
            f"{max(r.round_trips_s) * 1e3:.0f} ms max of {len(r.round_trips_s)}; the last: upload "
            f"{r.send_s * 1e3:.0f} ms, GetActions {r.get_s * 1e3:.0f} ms (server compute + reply), "
            f"decode {r.decode_s * 1e3:.1f} ms"
        )
    if r.n_actions < spec.actions_per_chunk:
        print(
            f"warning: asked for {spec.actions_per_chunk} actions per chunk, the server sent {r.n_actions} "
            "(the policy's chunk is shorter): lower [policy] actions_per_chunk",
            file=sys.stderr,
        )
    worst = max(r.round_trips_s) if r.round_trips_s else None
    warning = None if worst is None else keep_up_warning(worst, qcfg, r.n_actions)
    if warning:
        print(f"warning: {warning}; the arm would hold between chunks", file=sys.stderr)
    return 0


def _check_timing(args: argparse.Namespace, cfg: Any, path: str, cams: dict[str, tuple[int, int]], info: Any) -> int:
    """Time the inference as the daemon's worker runs it; warn when a chunk cannot cover it."""
    import time

    import numpy as np

    from daemon.policy.checkpoint import CheckpointError, ExpectedIO
    from daemon.policy.engine import PolicyEngine
    from daemon.policy.runner import MARGIN_FRACTION, MIN_MARGIN_S, keep_up_warning
    from daemon.service.attach_policy import PolicyError, queue_config_from

    try:
        qcfg = queue_config_from(cfg.policy)
        engine = PolicyEngine.from_checkpoint(
            path, ExpectedIO(cameras=cams), device=cfg.policy.device or None, task=cfg.policy.task
        )
    except (PolicyError, CheckpointError, ValueError) as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 1
    engine.max_actions = info.n_action_steps
    state = np.zeros(tuple(info.state_shape or (6,)), dtype=np.float64)
    images = {n: np.zeros((h, w, c), dtype=np.uint8) for n, (c, h, w) in info.cameras.items()}
    engine.infer(state, images)  # warm-up (first pass allocates), as the worker does before "ready"
    took = []
    for _ in range(max(1, args.repeats)):
        t0 = time.perf_counter()
        engine.infer(state, images)
        took.append(time.perf_counter() - t0)
        engine.reset()
    worst = max(took)
    n = int(info.n_action_steps or 1)
    horizon = qcfg.chunk_horizon_s(n)
    print(
        f"timing: inference {float(np.median(took)) * 1e3:.0f} ms median, {worst * 1e3:.0f} ms max of {len(took)} "
        f"on {engine.loaded.device}; one chunk drives {horizon:.2f} s ({n} actions at {1 / qcfg.action_period_s:g} fps, "
        f"max_obs_age_s {qcfg.max_obs_age_s:g})"
    )
    warning = keep_up_warning(worst, qcfg, n)
    if warning:
        print(f"warning: {warning}; the arm would hold between chunks", file=sys.stderr)
    elif worst + max(MIN_MARGIN_S, MARGIN_FRACTION * worst) + qcfg.blend_s > horizon:
        print(
            f"warning: inference {worst:.2f} s leaves little margin within the usable horizon {horizon:.2f} s "
            "(the daemon adds the frame copy and the pipe); expect occasional holds on a busy machine",
            file=sys.stderr,
        )
    return 0
