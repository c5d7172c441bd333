"""The control socket's reply time: the typed API (msgspec) beside the path it replaced and beside
plain json, in one run.

Three ``ControlServer``s run in this process on their own UNIX sockets, serving the same verbs:

- ``typed``: the server as shipped: each line through ``bounded_json.loads_bounded`` (size, depth
  scan, number hooks, duplicate keys), then ``msgspec.convert`` into the verb's request type
  (daemon/api/messages.py); replies encoded by msgspec;
- ``legacy``: the path before the typed API, kept here as the reference: the same bounded decode,
  the fields checked one by one in Python (``requests.Field.check``, as the hand-typed
  declarations did), replies encoded by ``json.dumps`` with a ``default`` for numpy and paths;
- ``plain``: ``json.loads`` and ``json.dumps``, no bounds and no field check (what the socket did
  before it was hardened).

For each of four requests (``status.live``, its reply the daemon's own handler's shape: mode,
reason and three 6-joint vectors; ``status``, its reply rendered by daemon/control/snapshot.py from
a snapshot like a running daemon's; ``hold``; ``camera.preview`` with four typed fields) it times
the round trip on one open connection, interleaving the servers in rounds so machine load hits
them alike, then separately the decode step alone and the encode step alone (no socket), and the
memory one ``status.live`` reply allocates (tracemalloc, the daemon's side: handler + encode). It
prints p50 / p99 per row and the typed / legacy ratio.

    .venv/bin/python bench/bench_socket_reply.py [--requests 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from daemon.api.bounded_json import JsonRefused, loads_bounded
from daemon.api.requests import FIELDS, BadField, Request, json_type, parse_request
from daemon.api.server import ControlServer, _enc_hook, _encode
from daemon.control.snapshot import LinkSnapshot, LoopSnapshot, render_status

JOINTS_DEG = np.array([12.345, -45.678, 90.123, 3.21, -0.5, 33.3])


def _live_reply() -> dict[str, Any]:
    """What ConsoleApi.status_live returns (daemon/service/console_verbs.py)."""
    vectors = {"leader": JOINTS_DEG, "command": JOINTS_DEG, "follower": JOINTS_DEG}
    return {
        "mode": "teleop",
        "reason": "following the leader",
        "fault": "",
        "cycles": 123456,
        "joints": {k: [round(float(x), 3) for x in v] for k, v in vectors.items()},
    }


def _snapshot() -> LoopSnapshot:
    stage = {"count": 5000, "window": 1000, "p50": 0.31, "p99": 0.71, "max": 2.5, "max_all_time": 6.0, "mean": 0.35}
    link = LinkSnapshot(
        True, "/dev/ttyACM0", 12.5, 1, 0, "", (), {"transactions": 9, "retries": 0, "failures": 0, "reconnects": 0}
    )
    return LoopSnapshot(
        mode="teleop", intent="teleop", reason="following leader", fault="", fault_latched="", fault_now="",
        torque_wanted=True, follower_kind="feetech", uptime_s=100.0, rate_hz_target=100.0, rate_hz=99.9,
        cycles=10000, overruns=3, missed_cycles=0, limited_cycles=2, limit_hits=(0, 1, 0, 0, 0, 0),
        leader_errors=0, follower_errors=0, hook_errors=0, overlap_io=True, rate_warning="", scheduling="fifo:50",
        power_cycle_required="",
        safety_config={"align_speed_deg_s": 30.0, "max_step_deg": 10.0, "leader_stale_s": 0.1, "on_fault": "hold"},
        timing_ms={k: dict(stage) for k in ("period", "jitter", "leader_read", "follower_read", "update", "follower_write", "hooks", "cycle")},
        leader=link, follower=link, leader_age_s=0.004, leader_units=JOINTS_DEG, follower_units=JOINTS_DEG,
        command_units=JOINTS_DEG, health=None, health_age_s=None,
    )  # fmt: skip


SNAPSHOT = _snapshot()
REQUESTS: dict[str, bytes] = {
    "status.live": b'{"cmd":"status.live"}\n',
    "status": b'{"cmd":"status"}\n',
    "hold": b'{"cmd":"hold"}\n',
    "camera.preview": b'{"cmd":"camera.preview","camera":"front","max_width":320,"max_height":240,'
    b'"quality":70,"after_seq":41}\n',
}


def legacy_parse(obj: Any) -> Request:
    """The request check before the typed API: each field through its rule in Python."""
    if not isinstance(obj, dict):
        raise BadField(f"a request must be a JSON object, got {json_type(obj)}")
    cmd = obj.get("cmd")
    if not isinstance(cmd, str):
        raise BadField('missing "cmd" (a string naming the verb)')
    fields = {k: v for k, v in obj.items() if k != "cmd"}
    rules = FIELDS.get(cmd)
    if rules is None:
        return Request(cmd, fields)
    unknown = sorted(set(fields) - set(rules))
    if unknown:
        raise BadField(f"{cmd}: unknown field(s) {', '.join(unknown)}")
    return Request(cmd, {k: rules[k].check(cmd, k, v) for k, v in fields.items()})


def legacy_encode(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), default=_enc_hook) + "\n").encode("utf-8")


class LegacyServer(ControlServer):
    """The server as it was before the typed API (the reference)."""

    def _parse(self, line: bytes) -> tuple[Request | None, dict[str, Any] | None]:
        try:
            return legacy_parse(loads_bounded(line, self.bounds)), None
        except (JsonRefused, BadField) as exc:
            return None, {"ok": False, "error": str(exc)}

    def encode_reply(self, reply: dict[str, Any]) -> bytes:
        return legacy_encode(reply)


class PlainServer(LegacyServer):
    """The decode step before hardening: json.loads, the verb's name taken as it comes."""

    def _parse(self, line: bytes) -> tuple[Request | None, dict[str, Any] | None]:
        try:
            obj = json.loads(line)
        except ValueError as exc:
            return None, {"ok": False, "error": f"malformed request: {exc}"}
        if not isinstance(obj, dict) or not isinstance(obj.get("cmd"), str):
            return None, {"ok": False, "error": "malformed request"}
        return Request(obj["cmd"], {k: v for k, v in obj.items() if k != "cmd"}), None


def _serve(cls: type[ControlServer], path: Path) -> ControlServer:
    srv = cls(path, max_request_bytes=65536)
    srv.register("status.live", lambda req: _live_reply())
    srv.register("status", lambda req: render_status(SNAPSHOT))
    srv.register("hold", lambda req: {"message": "holding", "mode": "hold"})
    srv.register("camera.preview", lambda req: {"camera": "front", "seq": 41, "unchanged": True})
    srv.start()
    return srv


def _round_trips(sock: socket.socket, line: bytes, n: int) -> list[float]:
    reader = sock.makefile("rb")
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        sock.sendall(line)
        reply = reader.readline()
        out.append((time.perf_counter() - t0) * 1e3)
        if b'"ok":true' not in reply:
            raise SystemExit(f"unexpected reply {reply[:200]!r}")
    return out


def _times_us(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _allocated_bytes(fn: Callable[[], object], n: int = 200) -> float:
    """Bytes allocated per call (tracemalloc: every allocation, freed or not, counted by its peak)."""
    fn()
    per = []
    for _ in range(n):
        tracemalloc.start()
        fn()
        per.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    return statistics.median(per)


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 100 else max(values)


SERVERS: dict[str, type[ControlServer]] = {"typed": ControlServer, "legacy": LegacyServer, "plain": PlainServer}
DECODERS: dict[str, Callable[[bytes], object]] = {
    "typed": lambda b: parse_request(loads_bounded(b)),
    "legacy": lambda b: legacy_parse(loads_bounded(b)),
    "plain": json.loads,
}
ENCODERS: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "typed": _encode,
    "legacy": legacy_encode,
    "plain": legacy_encode,
}
REPLIES: dict[str, Callable[[], dict[str, Any]]] = {
    "status.live": lambda: {"ok": True, **_live_reply()},
    "status": lambda: {"ok": True, **render_status(SNAPSHOT)},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="per verb, server and round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    per = args.requests // args.rounds
    with tempfile.TemporaryDirectory(prefix="so101d-bench-") as d:
        servers = {name: _serve(cls, Path(d) / f"{name}.sock") for name, cls in SERVERS.items()}
        try:
            conns = {}
            for name, srv in servers.items():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(srv.path))
                conns[name] = s
            rtt: dict[tuple[str, str], list[float]] = {(v, n): [] for v in REQUESTS for n in servers}
            for _ in range(args.rounds):
                for verb, line in REQUESTS.items():
                    for name, s in conns.items():
                        rtt[(verb, name)] += _round_trips(s, line, per)
            for s in conns.values():
                s.close()
        finally:
            for srv in servers.values():
                srv.stop()

    dec: dict[tuple[str, str], list[float]] = {(v, n): [] for v in REQUESTS for n in DECODERS}
    enc: dict[tuple[str, str], list[float]] = {(v, n): [] for v in REPLIES for n in ENCODERS}
    for _ in range(args.rounds):
        for verb, line in REQUESTS.items():
            for name, decode in DECODERS.items():
                dec[(verb, name)] += _times_us(lambda: decode(line.rstrip(b"\n")), per)
        for verb, make in REPLIES.items():
            reply = make()
            for name, encode in ENCODERS.items():
                enc[(verb, name)] += _times_us(lambda: encode(reply), per)

    names = list(SERVERS)
    print(f"round trip on one open connection, ms ({per * args.rounds} requests per row, {args.rounds} rounds)")
    print(f"{'verb':<16}" + "".join(f"{n + ' p50':>13}{'p99':>8}" for n in names) + f"{'typed/legacy p50':>18}")
    for verb in REQUESTS:
        row = "".join(f"{statistics.median(rtt[(verb, n)]):>13.3f}{_p(rtt[(verb, n)], 99):>8.3f}" for n in names)
        ratio = statistics.median(rtt[(verb, "typed")]) / statistics.median(rtt[(verb, "legacy")])
        print(f"{verb:<16}{row}{ratio:>17.2f}x")
    for title, table, rows in (("decode step alone", dec, REQUESTS), ("encode step alone", enc, REPLIES)):
        print(f"\n{title}, microseconds p50")
        print(f"{'verb':<16}" + "".join(f"{n:>10}" for n in names) + f"{'typed/legacy':>14}")
        for verb in rows:
            row = "".join(f"{statistics.median(table[(verb, n)]):>10.1f}" for n in names)
            ratio = statistics.median(table[(verb, "typed")]) / statistics.median(table[(verb, "legacy")])
            print(f"{verb:<16}{row}{ratio:>13.2f}x")
    print("\nstatus.live on the daemon's side (handler + encode), bytes allocated per reply (tracemalloc peak, median)")
    for name, encode in (("typed", _encode), ("legacy", legacy_encode)):
        print(f"{name:<16}{_allocated_bytes(lambda: encode({'ok': True, **_live_reply()})):>10.0f}")


if __name__ == "__main__":
    main()
