"""`so101d status [--json] [--watch]`: the running daemon's mode, loop timing, bus and servo health.

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

from daemon.api.client import ControlClient, DaemonUnavailable, add_socket_arguments, socket_path_from_args


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


def _reason(st: dict[str, Any]) -> str:
    """The mode's reason; a hold for a stale leader whose arm is not connected says why: which
    port, and that it does not exist (a wrong leader.port, an unplugged adapter)."""
    reason = str(st.get("reason") or "")
    leader = st.get("leader")
    if not reason.endswith("leader stale") or not isinstance(leader, dict) or leader.get("connected"):
        return reason
    port = str(leader.get("port") or "")
    if port and not os.path.exists(port):
        return f"{reason}: leader port {port} does not exist (leader.port; see `so101d find-ports`)"
    return f"{reason}: leader not connected on {port or '?'}" + (
        f" ({leader['last_error']})" if leader.get("last_error") else ""
    )


def render(st: dict[str, Any], full: bool = False) -> Any:
    """A rich renderable of a status dict (also used by `so101d demo`).

    The live views shorten long error texts to keep the table on screen; ``full`` (output that
    is not a terminal: a pipe, a file, a bug report) keeps every character."""
    cut = _Cut(full)
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    mode = st.get("mode", "?")
    colour = {
        "teleop": "green",
        "policy": "green",
        "aligning": "yellow",
        "hold": "yellow",
        "idle": "cyan",
        "fault": "bold red",
        "disconnected": "red",
    }.get(mode, "white")
    head = Text()
    head.append("mode ", style="dim")
    head.append(f"{mode:<12}", style=colour)
    head.append(f" {_reason(st)}\n")
    t = st.get("timing_ms", {})
    _period, jitter, cycle = t.get("period", {}), t.get("jitter", {}), t.get("cycle", {})
    head.append(
        f"loop {_fmt(st.get('rate_hz'), '.1f')}/{_fmt(st.get('rate_hz_target'), '.0f')} Hz  "
        f"overruns {st.get('overruns', 0)} (skipped {st.get('missed_cycles', 0)})  "
        f"sched {st.get('scheduling', '?')}\n"
        f"period jitter p50/p99/max {_fmt(jitter.get('p50'), '.3f')}/{_fmt(jitter.get('p99'), '.3f')}/{_fmt(jitter.get('max'), '.3f')} ms  "
        f"cycle p50/p99 {_fmt(cycle.get('p50'), '.3f')}/{_fmt(cycle.get('p99'), '.3f')} ms\n"
    )
    head.append(
        f"follower {st.get('follower_kind', '?')}  uptime {_fmt(st.get('uptime_s'), '.0f')} s  cycles {st.get('cycles', 0)}  "
        f"step-limited {st.get('limited_cycles', 0)}"
    )
    if st.get("fault"):
        head.append(f"\nFAULT: {st['fault']}", style="bold red")
    for warning in _warnings(st):
        head.append(f"\nWARNING: {cut(warning, 160)}", style="yellow")

    extra = [x for x in (_safety_line(st), _policy_line(st, cut), _recording_line(st, cut)) if x is not None]

    stages = Table(box=None, pad_edge=False, show_edge=False)
    stages.add_column("stage ms", style="dim")
    for col in ("p50", "p99", "max"):
        stages.add_column(col, justify="right")
    for name in ("leader_read", "follower_read", "update", "follower_write", "hooks", "cycle"):
        s = t.get(name, {})
        stages.add_row(name, _fmt(s.get("p50"), ".3f"), _fmt(s.get("p99"), ".3f"), _fmt(s.get("max"), ".3f"))

    arms = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("arm", "conn", "tx", "retries", "fails", "reconn", "port / last error"):
        arms.add_column(col, justify="left" if col in ("arm", "conn", "port / last error") else "right")
    for name in ("leader", "follower"):
        a = st.get(name)
        if not a:
            continue
        bus = a.get("bus") or {}
        where = str(a.get("port") or "-")
        if a.get("last_error"):
            where += "  " + cut(a["last_error"], 80)
        arms.add_row(
            name,
            "yes" if a.get("connected") else "NO",
            str(bus.get("transactions", "-")),
            str(bus.get("retries", "-")),
            str(bus.get("failures", "-")),
            str(bus.get("reconnects", a.get("losses", "-"))),
            where,
        )

    joints = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("joint", "leader", "command", "follower", "temp C", "volt V", "load %", "status"):
        joints.add_column(col, justify="right" if col != "joint" else "left")
    j = st.get("joints", {})
    servos = st.get("servos") or {}
    names = list((j.get("follower") or j.get("leader") or servos or {}).keys())
    for n in names:
        h = servos.get(n, {})
        joints.add_row(
            n,
            _fmt((j.get("leader") or {}).get(n), ".1f"),
            _fmt((j.get("command") or {}).get(n), ".1f"),
            _fmt((j.get("follower") or {}).get(n), ".1f"),
            _fmt(h.get("temperature_c"), ".0f"),
            _fmt(h.get("voltage_v"), ".1f"),
            _fmt(h.get("load_pct"), ".0f"),
            f"0x{h['status']:02x}" if "status" in h else "-",
        )
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


def _failed_extra(name: str, extra: dict[str, Any], cut: _Cut) -> Any:
    """A status extra that raised: the daemon put {"error": ...} in its place."""
    from rich.text import Text

    return _label(Text(), name).append(cut(extra.get("error", "?"), 100), style="red")


def _safety_line(st: dict[str, Any]) -> Any | None:
    """Fault latch (until the operator clears it) vs what the servos say now, and limit hits."""
    from rich.text import Text

    sf = st.get("safety")
    if not isinstance(sf, dict):
        return None
    line = _label(Text(), "safety")
    latched, now = sf.get("fault_latched") or "", sf.get("fault_now") or ""
    if latched or now:
        line.append(f"fault latched: {latched or '-'}  now: {now or '-'}", style="bold red")
    else:
        line.append("no fault", style="green")
    line.append(f"  step-limited {sf.get('limited_cycles', st.get('limited_cycles', 0))}")
    hits = {k: v for k, v in (sf.get("limit_hits") or {}).items() if v}
    if hits:
        line.append("  limits hit: " + ", ".join(f"{k} {v}" for k, v in hits.items()), style="yellow")
    else:
        line.append("  limits hit: none")
    return line


def _policy_line(st: dict[str, Any], cut: _Cut) -> Any | None:
    from rich.text import Text

    pol = st.get("policy")
    if not isinstance(pol, dict):
        return None
    if "state" not in pol:
        return _failed_extra("policy", pol, cut)
    if pol["state"] == "none":
        return None
    line = _label(Text(), "policy")
    driving = bool(pol.get("driving"))
    line.append(f"{pol.get('state', '?'):<8}")
    line.append(" DRIVING " if driving else " standby ", style="bold green" if driving else "dim")
    lat = pol.get("inference_latency_ms") or {}
    line.append(
        f" infer p50/p99 {_fmt(lat.get('p50'), '6.1f')}/{_fmt(lat.get('p99'), '6.1f')} ms"
        f"  chunk age {_fmt(pol.get('chunk_age_ms'), '6.0f')} ms  queue {_fmt(pol.get('queue_depth'), '3d')}"
    )
    t = pol.get("takeover")
    if isinstance(t, dict) and t.get("phase"):
        line.append(f"  take-over {t['phase']}", style="red" if t["phase"] == "failed" else "")
    srv = pol.get("server")
    if pol.get("backend") == "lerobot-server" and isinstance(srv, dict):
        # the remote backend: where the time goes, kept apart (LeRobot's server reports no compute time)
        p50 = lambda key: _fmt((srv.get(key) or {}).get("p50"), ".1f")  # noqa: E731
        state = "connected" if srv.get("connected") else "NOT connected"
        line.append(f"\n  server {srv.get('address')} {state}", style="" if srv.get("connected") else "bold red")
        line.append(
            f"  round trip p50 {p50('round_trip_ms')} ms  network p50 {p50('network_ms')} ms"
            f"  GetActions p50 {p50('get_actions_ms')} ms  server compute unknown"
        )
        if srv.get("error"):
            line.append(f"  {cut(srv['error'], 100)}", style="red")
    if pol.get("warning"):  # inference slower than a chunk can drive (issue 16): said, not silent
        line.append(f"  {pol['warning']}", style="bold yellow")
    if pol.get("last_error") or pol.get("error"):
        line.append(f"  {cut(pol.get('error') or pol.get('last_error'), 80)}", style="red")
    return line


def _recording_line(st: dict[str, Any], cut: _Cut) -> Any | None:
    from rich.text import Text

    rec = st.get("recording")
    if not isinstance(rec, dict):
        return None
    if "phase" not in rec:
        return _failed_extra("recording", rec, cut)
    line = _label(Text(), "recording")
    phase = str(rec.get("phase"))
    line.append(f"{phase:<10}", style="bold red" if phase == "recording" else "")
    line.append(
        f" episode {_fmt(rec.get('episode'), '>4')}  elapsed {_fmt(rec.get('elapsed_s'), '6.1f')} s"
        f"  frames {_fmt(rec.get('frames'), '>5')}  saved {_fmt(rec.get('episodes_in_dataset'), '>4')}"
        f"  backlog {_fmt(rec.get('writer_backlog_frames'), '>3')}"
    )
    if "dataset episode" in str(rec.get("last_committed") or ""):  # numbers and dataset index differ
        line.append(f"  last {rec['last_committed']}")
    if rec.get("error"):
        line.append(f"  {cut(rec['error'], 80)}", style="red")
    if rec.get("waiting_for"):
        line.append(f"\n  waiting: {cut(rec['waiting_for'], 120)}", style="yellow")
    for camera, refused in (rec.get("frames_refused") or {}).items():
        line.append(
            f"\n  camera {camera}: {refused.get('count')} frames refused ({cut(refused.get('last'), 100)})",
            style="yellow",
        )
    for number in rec.get("saving") or []:
        line.append(f"\n  saving… episode {number} (not on the disk yet)", style="yellow")
    for lost in rec.get("lost_episodes") or []:
        line.append(f"\n  LOST: {lost}", style="bold red")
    for dropped in rec.get("dropped_episodes") or []:
        line.append(f"\n  DROPPED: {dropped}", style="bold red")
    return line


def _warnings(st: dict[str, Any]) -> list[str]:
    """What the operator should act on besides a fault: a rate the adapters cannot reach, a
    latched overload that needs a power cycle (when the fault text does not already say it), and
    registers a servo refused at connect (timing only; safety registers fail the connect)."""
    out = []
    if st.get("rate_warning"):
        out.append(str(st["rate_warning"]))
    pcr = st.get("power_cycle_required")
    if pcr and pcr not in str(st.get("fault") or ""):
        out.append(str(pcr))
    for name in ("leader", "follower"):
        arm = st.get(name)
        if isinstance(arm, dict):
            out += [f"{name}: {w}" for w in arm.get("configure_warnings") or []]
    out += _control_socket_warnings(st.get("control_socket"))
    return out


def _control_socket_warnings(cs: Any) -> list[str]:
    """The control socket's serving thread had to be restarted (or is down): a bug worth a report,
    shown where the operator looks, with the reason it gave."""
    if not isinstance(cs, dict):
        return []
    restarts = int(cs.get("thread_restarts") or 0)
    if restarts == 0 and cs.get("serving", True):
        return []
    text = f"control socket: serving thread restarted {restarts}x" if restarts else "control socket: not serving"
    if cs.get("last_thread_failure"):
        text += f" (last failure: {cs['last_thread_failure']})"
    return [text]


def one_line(st: dict[str, Any]) -> str:
    """One line per status: what `--watch` prints into a pipe or a file (and `so101d demo` when
    its output is not a terminal). Faults and errors are given whole."""
    t = st.get("timing_ms", {})
    parts = [f"{time.strftime('%H:%M:%S')} mode {st.get('mode', '?')}"]
    if st.get("reason"):
        parts[0] += f" ({_reason(st)})"
    parts.append(
        f"loop {_fmt(st.get('rate_hz'), '.1f')}/{_fmt(st.get('rate_hz_target'), '.0f')} Hz"
        f" jitter p99 {_fmt(t.get('jitter', {}).get('p99'), '.3f')} ms"
        f" cycle p50 {_fmt(t.get('cycle', {}).get('p50'), '.3f')} ms overruns {st.get('overruns', 0)}"
    )
    j = st.get("joints", {})
    if j.get("leader") and j.get("follower"):
        parts.append(
            "max|leader-follower| {:.1f}".format(max(abs(j["leader"][k] - j["follower"][k]) for k in j["leader"]))
        )
    if st.get("fault"):
        parts.append(f"FAULT: {st['fault']}")
    parts += [f"WARNING: {w}" for w in _warnings(st)]
    for name in ("leader", "follower"):
        a = st.get(name)
        if isinstance(a, dict) and (not a.get("connected", True) or a.get("last_error")):
            parts.append(
                f"{name} {'connected' if a.get('connected') else 'NOT connected'}"
                + (f": {a['last_error']}" if a.get("last_error") else "")
            )
    rec = st.get("recording")
    if isinstance(rec, dict):
        if "phase" in rec:
            parts.append(
                f"recording {rec['phase']} episode {rec.get('episode')} frames {rec.get('frames')}"
                f" saved {rec.get('episodes_in_dataset')}"
                + (
                    f" last {rec['last_committed']}"
                    if "dataset episode" in str(rec.get("last_committed") or "")
                    else ""
                )
                + (f" error: {rec['error']}" if rec.get("error") else "")
            )
            if rec.get("waiting_for"):
                parts.append(f"recording waiting: {rec['waiting_for']}")
            parts += [
                f"camera {c}: {r.get('count')} frames refused ({r.get('last')})"
                for c, r in (rec.get("frames_refused") or {}).items()
            ]
            parts += [f"LOST: {lost}" for lost in rec.get("lost_episodes") or []]
            parts += [f"DROPPED: {dropped}" for dropped in rec.get("dropped_episodes") or []]
        else:
            parts.append(f"recording: {rec.get('error', '?')}")
    pol = st.get("policy")
    if isinstance(pol, dict) and pol.get("state") != "none":
        err = pol.get("error") or pol.get("last_error")
        parts.append(
            f"policy {pol.get('state', '?')}{' driving' if pol.get('driving') else ''}"
            + (f" error: {err}" if err else "")
        )
        srv = pol.get("server")
        if pol.get("backend") == "lerobot-server" and isinstance(srv, dict):
            parts.append(
                f"policy server {srv.get('address')} {'connected' if srv.get('connected') else 'NOT connected'}"
                + (f": {srv['error']}" if srv.get("error") else "")
            )
    return "  |  ".join(parts)


def _print_lines(client: ControlClient, as_json: bool, interval_s: float) -> int:
    """--watch into a pipe or file (or with --json): one line, or one JSON object, per refresh,
    flushed at once, so `| head -n 3`, `| grep`, `timeout 5 ...` see each as it comes."""
    while True:
        reply = client.call("status")
        reply.pop("ok", None)
        try:
            print(json.dumps(reply, sort_keys=True) if as_json else one_line(reply), flush=True)
        except BrokenPipeError:  # the reader is done (head -n 3): so are we
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())  # so the exit-time flush does not complain again
            os.close(null)
            return 0
        time.sleep(interval_s)


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
            reply = client.call("status")
            if not reply.get("ok"):
                print(f"so101d: status: {reply.get('error')}", file=sys.stderr)
                return 1
            reply.pop("ok", None)
            if args.json:
                print(json.dumps(reply, indent=2, sort_keys=True))
            else:
                from rich.console import Console

                # not a terminal: nothing is cut to fit 80 columns (rich's default width there)
                console = Console() if terminal else Console(width=_UNLIMITED_WIDTH)
                console.print(render(reply, full=not terminal))
            return 0
        if args.json or not terminal:
            return _print_lines(client, args.json, args.interval)
        from rich.live import Live

        with Live(
            refresh_per_second=max(1, int(1 / max(args.interval, 0.05))), screen=False, auto_refresh=False
        ) as live:
            while True:
                live.update(render(client.call("status")), refresh=True)
                time.sleep(args.interval)
    except DaemonUnavailable as exc:  # the daemon went away under a status or a --watch
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()


# wide enough that no line of the status is wrapped or cropped when it is not shown on a screen
_UNLIMITED_WIDTH = 10_000
