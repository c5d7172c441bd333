"""The control socket's reply time with its bounded decoder and typed checks, beside plain json.loads.

Two ``ControlServer``s run in this process on their own UNIX sockets, serving the same verbs:

- ``checked``: the server as shipped: each line through ``bounded_json.loads_bounded`` (size,
  depth scan, number hooks, duplicate keys) and ``control_requests.parse_request`` (declared
  fields and types);
- ``plain``: the same server with that step replaced by ``json.loads`` and no field check (what
  the socket did before it was hardened).

For each of three requests (``status.live``, its reply shaped like the daemon's: mode, reason and
three 6-joint vectors; ``hold``; ``camera.preview`` with four typed fields and a small reply) it
times the round trip on one open connection, interleaving the two servers in rounds so machine
load hits both alike, and separately the decode step alone (no socket). It prints p50 / p99 per
row and the checked / plain ratio.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from daemon.api.bounded_json import loads_bounded
from daemon.api.requests import Request, parse_request
from daemon.api.server import ControlServer

LIVE_REPLY: dict[str, Any] = {
    "mode": "teleop",
    "reason": "following the leader",
    "fault": None,
    "cycles": 123456,
    "joints": {k: [12.345, -45.678, 90.123, 3.21, -0.5, 33.3] for k in ("leader", "command", "follower")},
}
REQUESTS: dict[str, bytes] = {
    "status.live": b'{"cmd":"status.live"}\n',
    "hold": b'{"cmd":"hold"}\n',
    "camera.preview": b'{"cmd":"camera.preview","camera":"front","max_width":320,"max_height":240,'
    b'"quality":70,"after_seq":41}\n',
}


class PlainServer(ControlServer):
    """The decode step as it was: json.loads, the verb's name taken as it comes."""

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
    srv.register("status.live", lambda req: dict(LIVE_REPLY))
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


def _decode_times(fn: Callable[[bytes], object], line: bytes, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(line)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 100 else max(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="per verb, server and round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    per = args.requests // args.rounds
    with tempfile.TemporaryDirectory(prefix="so101d-bench-") as d:
        servers = {
            "checked": _serve(ControlServer, Path(d) / "c.sock"),
            "plain": _serve(PlainServer, Path(d) / "p.sock"),
        }
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

    decoders: dict[str, Callable[[bytes], object]] = {
        "checked": lambda b: parse_request(loads_bounded(b)),
        "plain": json.loads,
    }
    dec: dict[tuple[str, str], list[float]] = {(v, n): [] for v in REQUESTS for n in decoders}
    for _ in range(args.rounds):
        for verb, line in REQUESTS.items():
            for name, fn in decoders.items():
                dec[(verb, name)] += _decode_times(fn, line.rstrip(b"\n"), per)

    print(f"round trip on one open connection, ms ({per * args.rounds} requests per row, {args.rounds} rounds)")
    print(f"{'verb':<16}{'checked p50':>12}{'p99':>8}{'plain p50':>12}{'p99':>8}{'ratio p50':>11}")
    for verb in REQUESTS:
        c, p = rtt[(verb, "checked")], rtt[(verb, "plain")]
        print(
            f"{verb:<16}{statistics.median(c):>12.3f}{_p(c, 99):>8.3f}{statistics.median(p):>12.3f}"
            f"{_p(p, 99):>8.3f}{statistics.median(c) / statistics.median(p):>10.2f}x"
        )
    print("\ndecode step alone, microseconds")
    print(f"{'verb':<16}{'checked p50':>12}{'plain p50':>12}{'ratio':>9}")
    for verb in REQUESTS:
        c50, p50 = statistics.median(dec[(verb, "checked")]), statistics.median(dec[(verb, "plain")])
        print(f"{verb:<16}{c50:>12.1f}{p50:>12.1f}{c50 / p50:>8.2f}x")


if __name__ == "__main__":
    main()
