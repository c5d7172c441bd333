"""`so101d policy load|start|stop|correct|resume|unload|status|check|serve`: local inference next to the servos.

load DIR      check the checkpoint against the daemon's configuration and start its worker
start         the policy drives the follower (through the safety layer; evaluation episode recorded);
              --keys stays on the terminal: space/tab correct / resume, enter/→ stop (success),
              f stop (failure), backspace stop and discard, esc or Ctrl-C stop
stop          hold the pose (the evaluation episode is saved; --success/--failure/--discard)
correct       the operator takes the arm inside the policy episode (leader brought to the follower
              first); its frames are the dataset's `intervention` frames
resume        back to the policy in the same episode, from the measured pose
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
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from daemon.api.client import (
    CommandFailed,
    ControlClient,
    DaemonUnavailable,
    add_socket_arguments,
    socket_path_from_args,
)
from daemon.api.input_actions import Action, Driver, verb_for
from daemon.api.messages import (
    ErrorReply,
    LatencyStats,
    PolicyGcStatus,
    PolicyReply,
    PolicyServerStatus,
    PolicyStatus,
    PolicyStatusReply,
    decode_reply,
)
from daemon.apps.terminal_keys import (
    KEY_CORRECT,
    KEY_FAILURE,
    KEY_REDO,
    KEY_STOP,
    KEY_SUCCESS,
    POLICY_KEYS,
    Keys,
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
    p.add_argument(
        "--continuous",
        action="store_true",
        help="record the policy's driving continuously, a new episode at each rotation (LeRobot's sentry)",
    )
    p.add_argument("--rotate-s", type=float, help="--continuous: seconds per episode (default [recording] rotate_s)")
    p.add_argument("--rotate-mb", type=float, help="--continuous: video MB per episode (default [recording] rotate_mb)")
    p.add_argument(
        "--keys",
        action="store_true",
        help="stay on the terminal: space/tab correct / resume, enter stop (success), f (failure), esc stop",
    )
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
    p = sub.add_parser(
        "correct",
        help="take the arm inside the running policy episode: the leader is brought to the follower, then drives",
    )
    add_socket_arguments(p)
    p = sub.add_parser("resume", help="hand the arm back to the policy after a correction (same episode)")
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


def _call[T: msgspec.Struct](args: argparse.Namespace, kind: type[T], cmd: str, **fields: Any) -> T | int:
    try:
        with ControlClient(socket_path_from_args(args), timeout_s=max(5.0, float(fields.get("wait_s") or 0) + 5)) as c:
            return c.request_as(kind, cmd, **fields)
    except DaemonUnavailable as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"so101d: {cmd}: {exc}", file=sys.stderr)
        return 1


def _call_raw(args: argparse.Namespace, cmd: str) -> dict[str, Any] | int:
    """--json: the daemon's own reply, every field as sent."""
    try:
        with ControlClient(socket_path_from_args(args)) as c:
            return c.request(cmd)
    except DaemonUnavailable as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"so101d: {cmd}: {exc}", file=sys.stderr)
        return 1


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _ms(d: LatencyStats | None) -> str:
    if d is None or d.p50 is None or d.p99 is None:
        return "-"
    tail = f", p99.9 {d.p99_9:.1f}" if d.p99_9 is not None else ""
    return f"p50 {d.p50:.1f} ms, p99 {d.p99:.1f}{tail} ms (n={d.n})"


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


def format_gc(gc: PolicyGcStatus) -> str:
    """Garbage-collection pauses: the daemon's (they stop the loop too) and the worker's per chunk."""
    w = gc.worker_ms
    worker = f"p99 {w.p99:.1f} ms, max {w.max:.1f} ms" if w and w.p99 is not None and w.max is not None else "-"
    f = gc.worker_page_faults
    faults = f"; worker page faults per chunk p50 {_int(f.p50)}, max {_int(f.max)}" if f else ""
    return (
        f"gc         daemon {gc.daemon_collections} collections ({gc.daemon_full_collections} full), "
        f"longest {gc.daemon_max_pause_ms or 0.0:.1f} ms, {gc.daemon_frozen_objects or 0} objects frozen; "
        f"worker pauses per chunk {worker}{faults}"
    )


def _int(v: float | None) -> str:
    """A count the daemon sends as a whole number (decoded as a number)."""
    return "-" if v is None else str(int(v))


def format_server(srv: PolicyServerStatus) -> list[str]:
    """The lerobot-server backend's lines: link state, then round trip / network / server kept apart."""
    state = "connected" if srv.connected else "NOT connected (the follower holds; reconnecting)"
    lines = [
        f"server     {srv.address} {state}, {srv.connects} set-ups, {srv.failures} failures; "
        f"checkpoint on the server: {srv.checkpoint}"
    ]
    if srv.error:
        lines.append(f"  why      {srv.error}")
    lines.append(f"  round trip     {_ms(srv.round_trip_ms)}  (send observation -> chunk decoded)")
    lines.append(f"  network        {_ms(srv.network_ms)}  (SendObservations: upload + server enqueue)")
    lines.append(f"  GetActions     {_ms(srv.get_actions_ms)}  (server compute + reply transfer)")
    lines.append(f"  server compute {srv.server_compute_note or 'unknown'}")  # LeRobot's server sends none
    return lines


def _driven(st: PolicyStatus) -> str:
    """What the policy drives, in words: "the follower", or a rig's arms and its vector's width."""
    if len(st.arms) > 1:
        return f"the {' and '.join(st.arms)} arms, {st.joints} joints"
    return "the follower"


def format_status(status: PolicyStatus | dict[str, Any]) -> str:
    """`so101d policy status`'s text (a dict: the daemon's JSON, read as the API declares it)."""
    st = status if isinstance(status, PolicyStatus) else decode_reply(status, PolicyStatus)
    if st.state == "none":
        return "no policy loaded"
    age = st.chunk_age_ms
    lines = [
        f"policy     {st.policy_type} from {st.checkpoint}",
        f"state      {st.state}{' (driving ' + _driven(st) + ')' if st.driving else ''}"
        + (f"  error: {st.error}" if st.error else ""),
        f"latency    {_ms(st.inference_latency_ms)}  (observation -> chunk in the loop's queue)",
        f"overhead   {_ms(st.overhead_ms)}  (request -> chunk usable, minus the forward pass)",
        f"queue      {st.queue_depth} actions ahead, chunk age {'-' if age is None else f'{age:.0f} ms'}, merge {st.merge}",
        f"horizon    {_num(st.usable_horizon_ms)} ms left of {_num(st.chunk_horizon_ms)} ms per chunk; "
        f"next chunk asked {_num(st.refill_lead_ms)} ms before the end (latency p99 + margin)",
        f"dropped    {st.actions_dropped_stale} stale actions, {st.chunks_rejected} chunks too old, "
        f"{st.chunks_expired} ran out (arm held), {st.timeouts} timeouts",
    ]
    remote = st.backend == "lerobot-server"
    if remote and st.server is not None:
        lines[3] = (
            f"overhead   {_ms(st.overhead_ms)}  (request -> chunk usable, minus GetActions: upload, decode, hand-offs)"
        )
        lines.extend(format_server(st.server))
    lines.append(
        f"stages     {'p50':>7} {'p99':>7} {'p99.9':>7} ms  where the latency goes"
        + ("  (remote: preprocess = upload, forward = GetActions, postprocess = decode)" if remote else "")
    )
    for key, what in STAGES:
        d = st.stages_ms.get(key)
        if d is not None and d.p50 is not None and d.p99 is not None:
            tail = d.p99_9 if d.p99_9 is not None else d.max
            nums = f"{d.p50:7.2f} {d.p99:7.2f} {tail if tail is not None else float('nan'):7.2f}"
        else:
            nums = f"{'-':>7} {'-':>7} {'-':>7}"
        lines.append(f"  {key:<11}{nums}     {what}")
    if st.overhead_stages:
        lines.append(f"  overhead = {' + '.join(st.overhead_stages)}, chunk by chunk (percentiles do not add up)")
    if st.gc is not None:
        lines.append(format_gc(st.gc))
    worker = st.worker
    if worker.io:  # the local worker: how it runs (engine.py, heap.py, worker.torch_threads)
        lines.append(
            f"worker     {worker.torch_threads} torch thread(s), OpenMP wait {worker.omp_wait_policy}; "
            f"{worker.io}; {worker.heap}"
        )
    if st.warning:
        lines.append(f"WARNING    {st.warning}")
    if st.takeover is not None:
        t = st.takeover
        lines.append(f"take-over  {t.phase}" + (f"  error: {t.error}" if t.error else ""))
    if st.correction is not None:
        c = st.correction
        since = f", operator {c.operator_s:.1f} s" if c.operator_s is not None else ""
        lines.append(f"correction {c.number} {c.phase}{since}" + (f"  error: {c.error}" if c.error else ""))
    elif st.corrections:
        lines.append(f"corrections {st.corrections} this run ({st.corrections_mode})")
    if st.last_error:
        lines.append(f"last error {st.last_error}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    action = args.action
    if action == "check":
        return _check(args)
    if action == "serve":
        from daemon.policy.serve import serve_main

        return serve_main(args.path, args.endpoint, device=args.device, task=args.task)
    if action == "status":
        if args.json:  # the daemon's own JSON, every field as sent
            raw = _call_raw(args, "policy.status")
            if isinstance(raw, int):
                return raw
            print(json.dumps({k: v for k, v in raw.items() if k != "ok"}, indent=2))
            return 0
        st = _call(args, PolicyStatusReply, "policy.status")
        if isinstance(st, int):
            return st
        print(format_status(st))
        return 0
    if action == "load":
        # a local folder is made absolute (the daemon's working directory is not ours); none: [policy] path
        path = os.path.abspath(args.path) if args.path else None
        reply = _call(args, PolicyReply, "policy.load", path=path, wait_s=args.wait)
    elif action == "start":
        task: dict[str, Any] = {"task": args.task} if args.task else {}
        if args.continuous:
            task["continuous"] = True
            task.update(
                {k: v for k, v in (("rotate_s", args.rotate_s), ("rotate_mb", args.rotate_mb)) if v is not None}
            )
        if args.keys:
            return _start_with_keys(args, {"record": not args.no_record, **task})
        reply = _call(args, PolicyReply, "policy.start", record=not args.no_record, **task)
    elif action == "stop" and args.takeover:
        reply = _call(args, PolicyReply, "policy.takeover")
    elif action == "stop":
        reply = _call(args, PolicyReply, "policy.stop", success=args.success, discard=args.discard)
    elif action in ("correct", "resume"):
        reply = _call(args, PolicyReply, f"policy.{action}")
    else:
        reply = _call(args, PolicyReply, "policy.unload")
    if isinstance(reply, int):
        return reply
    print(reply.message or f"policy {action}: ok")
    if reply.error:
        print(f"error: {reply.error}", file=sys.stderr)
        return 1
    return 0


class SessionClient(Protocol):
    def call_as[T: msgspec.Struct](self, kind: type[T], cmd: str, **args: Any) -> T | ErrorReply: ...


class SessionKeys(Protocol):
    enabled: bool

    def wait(self, seconds: float) -> str | None: ...


SESSION_HELP = "[space/tab correct / resume   enter/→ stop (success)   f stop (failure)   ⌫ stop, discard   esc stop]"
_STOPS = {
    KEY_SUCCESS: {"success": True},
    KEY_FAILURE: {"success": False},
    KEY_REDO: {"discard": True},
    KEY_STOP: {},
}


def _driver(c: SessionClient) -> Driver | str:
    """Who drives now, or why the session is over (the policy stopped elsewhere, the daemon refused)."""
    st = c.call_as(PolicyStatusReply, "policy.status")
    if isinstance(st, ErrorReply):
        return st.error or "policy.status refused"
    correcting = st.correction is not None
    if not (st.driving or correcting):
        return f"the policy is not running ({st.state or '?'}): the session ends"
    return Driver(intent="policy" if st.driving else "teleop", correcting=correcting, policy_run=True)


def keys_session(c: SessionClient, keys: SessionKeys, say: Callable[[str], None] = print) -> int:
    """The terminal while the policy runs: each key is the verb daemon/api/input_actions.py maps it
    to; a stop key (or Ctrl-C) stops the policy and ends the session. The policy stopped from
    elsewhere (the console, a pedal) ends it too."""
    say("the policy drives   " + SESSION_HELP)
    ended = ""  # what the last poll said, if the run looked over: said and ended only when the next agrees
    try:
        while True:
            key = keys.wait(0.5)
            if key is None:
                # a correction being opened holds the arm a moment before it counts as one: one
                # poll that finds no run is not yet the end of it
                driver = _driver(c)
                if isinstance(driver, str):
                    if ended:
                        say(driver)
                        return 0
                    ended = driver
                else:
                    ended = ""
                continue
            if key == KEY_CORRECT:
                driver = _driver(c)
                if isinstance(driver, str):
                    say(driver)
                    return 0
                verb = verb_for(Action.CORRECTION, driver)
                r = c.call_as(PolicyReply, verb)
                say(f"{verb}: {r.error}" if isinstance(r, ErrorReply) else (r.message or f"{verb}: ok"))
                continue
            if key in _STOPS:
                return _stop(c, _STOPS[key], say)
    except KeyboardInterrupt:
        return _stop(c, {}, say)


def _stop(c: SessionClient, how: dict[str, bool], say: Callable[[str], None]) -> int:
    r = c.call_as(PolicyReply, "policy.stop", **how)
    if isinstance(r, ErrorReply):
        say(f"policy.stop: {r.error}")
        return 1
    say(r.message or "policy stopped")
    return 0


def _start_with_keys(args: argparse.Namespace, fields: dict[str, Any]) -> int:
    if not sys.stdin.isatty():
        print("so101d: policy start --keys: standard input is not a terminal (run it in one)", file=sys.stderr)
        return 2
    try:
        with ControlClient(socket_path_from_args(args), timeout_s=10.0) as c, Keys(True, POLICY_KEYS) as keys:
            started = c.call_as(PolicyReply, "policy.start", **fields)
            if isinstance(started, ErrorReply):
                print(f"error: {started.error}", file=sys.stderr)
                return 1
            print(started.message or "policy start: ok")
            return keys_session(c, keys)
    except DaemonUnavailable as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2


def _check(args: argparse.Namespace) -> int:
    from daemon.config.settings import ARM_SIDES, ConfigError, load_config
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
        info = check_checkpoint(path, ExpectedIO.for_arms(cams, ARM_SIDES if cfg.bimanual else ()))
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

    from daemon.config.settings import ARM_SIDES
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
        spec = server_spec_from(policy_cfg, path, cams, ARM_SIDES if cfg.bimanual else ())
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

    from daemon.config.settings import ARM_SIDES
    from daemon.policy.checkpoint import CheckpointError, ExpectedIO
    from daemon.policy.engine import PolicyEngine
    from daemon.policy.runner import MARGIN_FRACTION, MIN_MARGIN_S, keep_up_warning
    from daemon.service.attach_policy import PolicyError, queue_config_from

    try:
        qcfg = queue_config_from(cfg.policy)
        engine = PolicyEngine.from_checkpoint(
            path,
            ExpectedIO.for_arms(cams, ARM_SIDES if cfg.bimanual else ()),
            device=cfg.policy.device or None,
            task=cfg.policy.task,
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
