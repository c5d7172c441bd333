"""`so101d status [--json] [--watch]`: the running daemon's mode, loop timing, bus and servo health.

The reply is read as the API declares it (``StatusReply``, daemon/api/messages.py): every field
this renderer shows is a declared one, and a section missing from an older daemon's reply shows
as "-" or not at all.

Sections shown when the status JSON has them: safety (latched / present fault, step-limited
cycles, joints whose limits clamped the target), policy (driving, inference latency p50/p99,
chunk age, queue depth, take-over) and recording (episode, phase, elapsed, frames, writer backlog).

``--watch`` redraws a compact table in place (rich Live, fixed-width fields, redrawn only when
the data arrives: no flicker) until Ctrl-C. Into a pipe or a file, or with ``--json``, it prints
one line (one JSON object) per refresh instead, flushed at once. Output that is not a terminal
is never cut to a width.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from daemon.api.client import (
    CommandFailed,
    ControlClient,
    DaemonUnavailable,
    add_socket_arguments,
    socket_path_from_args,
)
from daemon.api.messages import (
    JointsStatus,
    LatencyStats,
    LinkStatus,
    ServoStatus,
    SocketHealth,
    StageTiming,
    StatusReply,
    decode_reply,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the raw status JSON")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="refresh in place until Ctrl-C (piped, or with --json: one line / one JSON object per refresh)",
    )
    parser.add_argument(
        "--interval", type=float, default=0.5, metavar="S", help="--watch refresh period (default 0.5 s)"
    )
    add_socket_arguments(parser)


def _fmt(v: Any, spec: str = ".2f", none: str = "-") -> str:
    if v is None:
        return none
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def _reason(st: StatusReply) -> str:
    """The mode's reason; a hold for a stale leader whose arm is not connected says why: which
    port, and that it does not exist (a wrong leader.port, an unplugged adapter)."""
    reason = st.reason or ""
    leader = st.leader
    if not reason.endswith("leader stale") or leader is None or leader.connected:
        return reason
    port = leader.port or ""
    if port and not os.path.exists(port):
        return f"{reason}: leader port {port} does not exist (leader.port; see `so101d find-ports`)"
    return f"{reason}: leader not connected on {port or '?'}" + (f" ({leader.last_error})" if leader.last_error else "")


def as_status(st: StatusReply | dict[str, Any]) -> StatusReply:
    """A status reply as the API declares it (a dict: the daemon's JSON, decoded and checked)."""
    return st if isinstance(st, StatusReply) else decode_reply(st, StatusReply)


def _stage(st: StatusReply, name: str) -> StageTiming:
    return st.timing_ms.get(name) or StageTiming()


def _bimanual(st: StatusReply) -> bool:
    """Several driven arms (a bimanual pair): each arm's links and joints are shown as its own."""
    return len(st.arms) > 1


def _arms(st: StatusReply) -> list[tuple[str, LinkStatus]]:
    """Every serial link, named for the operator: "leader", "follower"; on a bimanual pair
    "left leader", "left follower", "right leader", "right follower"."""
    if _bimanual(st):
        return [
            (f"{name} {role}", link)
            for name, arm in st.arms.items()
            for role, link in (("leader", arm.leader), ("follower", arm.follower))
            if link is not None
        ]
    return [(name, a) for name, a in (("leader", st.leader), ("follower", st.follower)) if a is not None]


def _joint_rows(table: Any, joints: JointsStatus, servos: dict[str, ServoStatus], arm: str | None = None) -> None:
    """One row per joint; with ``arm`` (a bimanual pair's) a first column naming it on its first row."""
    leader, command, follower = joints.leader or {}, joints.command or {}, joints.follower or {}
    for i, n in enumerate(list(follower or leader or servos)):
        h = servos.get(n) or ServoStatus()
        lead = [] if arm is None else [arm if i == 0 else ""]
        table.add_row(
            *lead,
            n,
            _fmt(leader.get(n), ".1f"),
            _fmt(command.get(n), ".1f"),
            _fmt(follower.get(n), ".1f"),
            _fmt(h.temperature_c, ".0f"),
            _fmt(h.voltage_v, ".1f"),
            _fmt(h.load_pct, ".0f"),
            "-" if h.status is None else f"0x{h.status:02x}",
        )


def render(status: StatusReply | dict[str, Any], full: bool = False) -> Any:
    """A rich renderable of a status reply (also used by `so101d demo`).

    The live views shorten long error texts to keep the table on screen; ``full`` (output that
    is not a terminal: a pipe, a file, a bug report) keeps every character."""
    st = as_status(status)
    cut = _Cut(full)
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    mode = st.mode
    colour_of = {
        "teleop": "green",
        "policy": "green",
        "aligning": "yellow",
        "hold": "yellow",
        "idle": "cyan",
        "fault": "bold red",
        "disconnected": "red",
    }
    colour = colour_of.get(mode, "white")
    head = Text()
    head.append("mode ", style="dim")
    head.append(f"{mode:<12}", style=colour)
    head.append(f" {_reason(st)}\n")
    if _bimanual(st):  # each arm's own safety state and source
        for name, arm in st.arms.items():
            head.append(f"  {name:<6} ", style="dim")
            head.append(f"{arm.mode:<12}", style=colour_of.get(arm.mode, "white"))
            head.append(f" {arm.reason or arm.source}\n")
    jitter, cycle = _stage(st, "jitter"), _stage(st, "cycle")
    head.append(
        f"loop {_fmt(st.rate_hz, '.1f')}/{_fmt(st.rate_hz_target, '.0f')} Hz  "
        f"overruns {st.overruns} (skipped {st.missed_cycles})  "
        f"sched {st.scheduling}\n"
        f"period jitter p50/p99/max {_fmt(jitter.p50, '.3f')}/{_fmt(jitter.p99, '.3f')}/{_fmt(jitter.max, '.3f')} ms  "
        f"cycle p50/p99 {_fmt(cycle.p50, '.3f')}/{_fmt(cycle.p99, '.3f')} ms\n"
    )
    head.append(
        f"follower {st.follower_kind}  uptime {_fmt(st.uptime_s, '.0f')} s  cycles {st.cycles}  "
        f"step-limited {st.limited_cycles}"
    )
    if st.fault:
        head.append(f"\nFAULT: {st.fault}", style="bold red")
    for warning in _warnings(st):
        head.append(f"\nWARNING: {cut(warning, 160)}", style="yellow")

    lines = (
        _safety_line(st),
        _policy_line(st, cut),
        _recording_line(st, cut),
        _cameras_line(st, cut),
        _pedal_line(st, cut),
    )
    extra = [x for x in lines if x is not None]

    stages = Table(box=None, pad_edge=False, show_edge=False)
    stages.add_column("stage ms", style="dim")
    for col in ("p50", "p99", "max"):
        stages.add_column(col, justify="right")
    for name in ("leader_read", "follower_read", "update", "follower_write", "hooks", "cycle"):
        t = _stage(st, name)
        stages.add_row(name, _fmt(t.p50, ".3f"), _fmt(t.p99, ".3f"), _fmt(t.max, ".3f"))

    arms = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("arm", "conn", "tx", "retries", "fails", "reconn", "port / last error"):
        arms.add_column(col, justify="left" if col in ("arm", "conn", "port / last error") else "right")
    for name, a in _arms(st):
        bus = a.bus
        where = a.port or "-"
        if a.missing_servos:
            where += "  missing: " + ", ".join(a.missing_servos)
        if a.last_error:
            where += "  " + cut(a.last_error, 80)
        if not a.connected and a.next_try_in_s is not None:
            where += f"  next try in {a.next_try_in_s:.1f} s"
        arms.add_row(
            name,
            "yes" if a.connected else "NO",
            "-" if bus is None else str(bus.transactions),
            "-" if bus is None else str(bus.retries),
            "-" if bus is None else str(bus.failures),
            str(a.losses) if bus is None else str(bus.reconnects),
            where,
        )

    joints = Table(box=None, pad_edge=False, show_edge=False)
    columns = ("joint", "leader", "command", "follower", "temp C", "volt V", "load %", "status")
    if _bimanual(st):
        joints.add_column("arm", justify="left")
    for col in columns:
        joints.add_column(col, justify="right" if col != "joint" else "left")
    if _bimanual(st):
        for name, arm in st.arms.items():
            _joint_rows(joints, arm.joints or JointsStatus(), arm.servos or {}, arm=name)
    else:
        _joint_rows(joints, st.joints, st.servos or {})
    parts: list[Any] = [head, Text("")]
    if extra:
        parts += [Text("\n").join(extra), Text("")]
    return Group(*parts, stages, Text(""), arms, Text(""), joints)


def _label(text: Any, name: str) -> Any:
    text.append(f"{name:<10}", style="dim")
    return text


class _Cut:
    """Shortens a text for the live view (with an ellipsis that says so); keeps it whole when full."""

    def __init__(self, full: bool) -> None:
        self.full = full

    def __call__(self, text: Any, limit: int) -> str:
        text = str(text)
        return text if self.full or len(text) <= limit else text[: limit - 1] + "…"


def _failed_extra(name: str, error: str | None, cut: _Cut) -> Any:
    """A status extra that raised: the daemon put {"error": ...} in its place."""
    from rich.text import Text

    return _label(Text(), name).append(cut(error or "?", 100), style="red")


def _safety_line(st: StatusReply) -> Any | None:
    """Fault latch (until the operator clears it) vs what the servos say now, and limit hits."""
    from rich.text import Text

    sf = st.safety
    if sf is None:
        return None
    line = _label(Text(), "safety")
    latched, now = sf.fault_latched or "", sf.fault_now or ""
    if latched or now:
        line.append(f"fault latched: {latched or '-'}  now: {now or '-'}", style="bold red")
    else:
        line.append("no fault", style="green")
    line.append(f"  step-limited {sf.limited_cycles}")
    hits = {k: v for k, v in sf.limit_hits.items() if v}
    if hits:
        line.append("  limits hit: " + ", ".join(f"{k} {v}" for k, v in hits.items()), style="yellow")
    else:
        line.append("  limits hit: none")
    return line


def _policy_line(st: StatusReply, cut: _Cut) -> Any | None:
    from rich.text import Text

    pol = st.policy
    if pol is None:
        return None
    if pol.state is None:
        return _failed_extra("policy", pol.error, cut)
    if pol.state == "none":
        return None
    line = _label(Text(), "policy")
    line.append(f"{pol.state:<8}")
    line.append(" DRIVING " if pol.driving else " standby ", style="bold green" if pol.driving else "dim")
    lat = pol.inference_latency_ms or LatencyStats()
    line.append(
        f" infer p50/p99 {_fmt(lat.p50, '6.1f')}/{_fmt(lat.p99, '6.1f')} ms"
        f"  chunk age {_fmt(pol.chunk_age_ms, '6.0f')} ms  queue {_fmt(pol.queue_depth, '3d')}"
    )
    t = pol.takeover
    if t is not None and t.phase:
        line.append(f"  take-over {t.phase}", style="red" if t.phase == "failed" else "")
    srv = pol.server
    if pol.backend == "lerobot-server" and srv is not None:
        # the remote backend: where the time goes, kept apart (LeRobot's server reports no compute time)
        def p50(stats: LatencyStats | None) -> str:
            return _fmt(None if stats is None else stats.p50, ".1f")

        state = "connected" if srv.connected else "NOT connected"
        line.append(f"\n  server {srv.address} {state}", style="" if srv.connected else "bold red")
        line.append(
            f"  round trip p50 {p50(srv.round_trip_ms)} ms  network p50 {p50(srv.network_ms)} ms"
            f"  GetActions p50 {p50(srv.get_actions_ms)} ms  server compute unknown"
        )
        if srv.error:
            line.append(f"  {cut(srv.error, 100)}", style="red")
    if pol.warning:  # inference slower than a chunk can drive: said, not silent
        line.append(f"  {pol.warning}", style="bold yellow")
    if pol.last_error or pol.error:
        line.append(f"  {cut(pol.error or pol.last_error, 80)}", style="red")
    return line


def _recording_line(st: StatusReply, cut: _Cut) -> Any | None:
    from rich.text import Text

    rec = st.recording
    if rec is None:
        return None
    if rec.phase is None:
        return _failed_extra("recording", rec.error, cut)
    line = _label(Text(), "recording")
    line.append(f"{rec.phase:<10}", style="bold red" if rec.phase == "recording" else "")
    line.append(
        f" episode {_fmt(rec.episode, '>4')}  elapsed {_fmt(rec.elapsed_s, '6.1f')} s"
        f"  frames {_fmt(rec.frames, '>5')}  saved {_fmt(rec.episodes_in_dataset, '>4')}"
        f"  backlog {_fmt(rec.writer_backlog_frames, '>3')}"
    )
    if "dataset episode" in (rec.last_committed or ""):  # numbers and dataset index differ
        line.append(f"  last {rec.last_committed}")
    if rec.error:
        line.append(f"  {cut(rec.error, 80)}", style="red")
    if rec.waiting_for:
        line.append(f"\n  waiting: {cut(rec.waiting_for, 120)}", style="yellow")
    for camera, refused in rec.frames_refused.items():
        line.append(
            f"\n  camera {camera}: {refused.count} frames refused ({cut(refused.last, 100)})",
            style="yellow",
        )
    for number in rec.saving:
        line.append(f"\n  saving… episode {number} (not on the disk yet)", style="yellow")
    for lost in rec.lost_episodes:
        line.append(f"\n  LOST: {lost}", style="bold red")
    for dropped in rec.dropped_episodes:
        line.append(f"\n  DROPPED: {dropped}", style="bold red")
    return line


def _pedal_line(st: StatusReply, cut: _Cut) -> Any | None:
    from rich.text import Text

    pedal = st.pedal
    if pedal is None:
        return None
    line = _label(Text(), "pedal")
    line.append(f"{pedal.state:<10}", style="" if pedal.state == "connected" else "yellow")
    line.append(f" {pedal.device}  presses {pedal.presses}")
    if pedal.problem:
        line.append(f"  {cut(pedal.problem, 100)}", style="yellow")
    if pedal.last_key:
        line.append(f"\n  last {pedal.last_key} -> {pedal.last_verb}: {cut(pedal.last_reply or '', 100)}")
    return line


def _cameras_line(st: StatusReply, cut: _Cut) -> Any | None:
    """One line per camera in use: its state and format, configured vs delivered fps, dropped
    frames and the newest frame's age; a camera that is gone or refused in red, with why."""
    from rich.text import Text

    if not st.cameras:
        return None
    line = _label(Text(), "cameras")
    for i, (name, cam) in enumerate(sorted(st.cameras.items())):
        if i:
            line.append("\n" + " " * 10)
        bad = cam.state in ("gone", "refused") or bool(cam.error) or cam.stalled
        state = cam.state or ("stalled" if cam.stalled else "streaming")
        line.append(f"{name} {state}", style="bold red" if bad else "")
        delivered = cam.fps_recent if cam.fps_recent is not None else cam.fps_measured
        line.append(
            f"  {cam.format or f'{cam.width}x{cam.height}'}  {_fmt(delivered, '.1f')}/{_fmt(cam.fps_configured, '.0f')} fps"
            f"  dropped {cam.frames_dropped}  newest {_fmt(cam.last_frame_age_s, '.2f')} s"
        )
        if cam.device:
            line.append(f"  {cam.device}", style="dim")
        if cam.depth is not None:
            line.append(f"  + depth {cam.depth.stream} ({cam.depth.unit}, {cam.depth.frames} frames)")
        if cam.state == "gone" and cam.gone_for_s is not None:
            line.append(f"  gone for {cam.gone_for_s:.1f} s", style="bold red")
        if cam.error:
            line.append(f"  {cut(cam.error, 100)}", style="red")
    return line


def _warnings(st: StatusReply) -> list[str]:
    """What the operator should act on besides a fault: a rate the adapters cannot reach, a
    latched overload that needs a power cycle (when the fault text does not already say it), and
    registers a servo refused at connect (timing only; safety registers fail the connect)."""
    out = []
    if st.rate_warning:
        out.append(st.rate_warning)
    pcr = st.power_cycle_required
    if pcr and pcr not in (st.fault or ""):
        out.append(pcr)
    for name, arm in _arms(st):
        out += [f"{name}: {w}" for w in arm.configure_warnings]
    out += _control_socket_warnings(st.control_socket)
    return out


def _control_socket_warnings(cs: SocketHealth | None) -> list[str]:
    """The control socket's serving thread had to be restarted (or is down): a bug worth a report,
    shown where the operator looks, with the reason it gave."""
    if cs is None:
        return []
    restarts = cs.thread_restarts
    if restarts == 0 and cs.serving:
        return []
    text = f"control socket: serving thread restarted {restarts}x" if restarts else "control socket: not serving"
    if cs.last_thread_failure:
        text += f" (last failure: {cs.last_thread_failure})"
    return [text]


def one_line(status: StatusReply | dict[str, Any]) -> str:
    """One line per status: what `--watch` prints into a pipe or a file (and `so101d demo` when
    its output is not a terminal). Faults and errors are given whole."""
    st = as_status(status)
    parts = [f"{time.strftime('%H:%M:%S')} mode {st.mode}"]
    if st.reason:
        parts[0] += f" ({_reason(st)})"
    parts.append(
        f"loop {_fmt(st.rate_hz, '.1f')}/{_fmt(st.rate_hz_target, '.0f')} Hz"
        f" jitter p99 {_fmt(_stage(st, 'jitter').p99, '.3f')} ms"
        f" cycle p50 {_fmt(_stage(st, 'cycle').p50, '.3f')} ms overruns {st.overruns}"
    )
    if _bimanual(st):
        for name, arm in st.arms.items():
            parts.append(f"{name} {arm.mode} ({arm.source}{': ' + arm.reason if arm.reason else ''})")
    each = [(f"{n} ", a.joints) for n, a in st.arms.items() if a.joints] if _bimanual(st) else [("", st.joints)]
    for name, joints in each:
        leader, follower = joints.leader, joints.follower
        if leader and follower:
            gap = max(abs(leader[k] - follower[k]) for k in leader)
            parts.append(f"{name}max|leader-follower| {gap:.1f}")
    if st.fault:
        parts.append(f"FAULT: {st.fault}")
    parts += [f"WARNING: {w}" for w in _warnings(st)]
    for name, a in _arms(st):
        if not a.connected or a.last_error:
            missing = ", ".join(a.missing_servos)
            parts.append(
                f"{name} {'connected' if a.connected else 'NOT connected'}"
                + (f" on {a.port}" if not a.connected and a.port else "")
                + (f": servo{'s' if len(a.missing_servos) > 1 else ''} {missing} not answering" if missing else "")
                + (f": {a.last_error}" if a.last_error and not missing else "")
                + (f"; next try in {a.next_try_in_s:.1f} s" if not a.connected and a.next_try_in_s is not None else "")
            )
    rec = st.recording
    if rec is not None:
        if rec.phase is not None:
            parts.append(
                f"recording {rec.phase} episode {rec.episode} frames {rec.frames}"
                f" saved {rec.episodes_in_dataset}"
                + (f" last {rec.last_committed}" if "dataset episode" in (rec.last_committed or "") else "")
                + (f" error: {rec.error}" if rec.error else "")
            )
            if rec.waiting_for:
                parts.append(f"recording waiting: {rec.waiting_for}")
            parts += [f"camera {c}: {r.count} frames refused ({r.last})" for c, r in rec.frames_refused.items()]
            parts += [f"LOST: {lost}" for lost in rec.lost_episodes]
            parts += [f"DROPPED: {dropped}" for dropped in rec.dropped_episodes]
        else:
            parts.append(f"recording: {rec.error or '?'}")
    for name, cam in sorted(st.cameras.items()):
        if cam.state in ("gone", "refused") or cam.error:
            parts.append(f"camera {name} {(cam.state or 'error').upper()}" + (f": {cam.error}" if cam.error else ""))
    pol = st.policy
    if pol is not None and pol.state != "none":
        err = pol.error or pol.last_error
        parts.append(
            f"policy {pol.state or '?'}{' driving' if pol.driving else ''}" + (f" error: {err}" if err else "")
        )
        srv = pol.server
        if pol.backend == "lerobot-server" and srv is not None:
            parts.append(
                f"policy server {srv.address} {'connected' if srv.connected else 'NOT connected'}"
                + (f": {srv.error}" if srv.error else "")
            )
    return "  |  ".join(parts)


def _print_lines(client: ControlClient, as_json: bool, interval_s: float) -> int:
    """--watch into a pipe or file (or with --json): one line, or one JSON object, per refresh,
    flushed at once, so `| head -n 3`, `| grep`, `timeout 5 ...` see each as it comes."""
    while True:
        try:
            print(json.dumps(_raw_status(client), sort_keys=True) if as_json else one_line(_status(client)), flush=True)
        except BrokenPipeError:  # the reader is done (head -n 3): so are we
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())  # so the exit-time flush does not complain again
            os.close(null)
            return 0
        time.sleep(interval_s)


def _status(client: ControlClient) -> StatusReply:
    return client.request_as(StatusReply, "status")


def _raw_status(client: ControlClient) -> dict[str, Any]:
    """--json: the daemon's own JSON, every field as sent (``ok`` dropped)."""
    reply = client.call("status")
    if not reply.get("ok"):
        raise CommandFailed(str(reply.get("error")))
    reply.pop("ok", None)
    return reply


def run(args: argparse.Namespace) -> int:
    path = socket_path_from_args(args)
    try:
        client = ControlClient(path).connect()
    except DaemonUnavailable as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    terminal = sys.stdout.isatty()
    try:
        if not args.watch:
            if args.json:
                print(json.dumps(_raw_status(client), indent=2, sort_keys=True))
            else:
                from rich.console import Console

                status = _status(client)
                # not a terminal: nothing is cut to fit 80 columns (rich's default width there)
                console = Console() if terminal else Console(width=_UNLIMITED_WIDTH)
                console.print(render(status, full=not terminal))
            return 0
        if args.json or not terminal:
            return _print_lines(client, args.json, args.interval)
        from rich.live import Live

        with Live(
            refresh_per_second=max(1, int(1 / max(args.interval, 0.05))), screen=False, auto_refresh=False
        ) as live:
            while True:
                live.update(render(_status(client)), refresh=True)
                time.sleep(args.interval)
    except DaemonUnavailable as exc:  # the daemon went away under a status or a --watch
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"so101d: status: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()


# wide enough that no line of the status is wrapped or cropped when it is not shown on a screen
_UNLIMITED_WIDTH = 10_000
