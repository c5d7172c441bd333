"""The console's peer lookup (who owns this loopback connection), sock_diag beside /proc/net/tcp.

The loopback console asks, for each request, which user owns the client's end of the TCP
connection (daemon/apps/console/access.py). Any local user can open thousands of loopback
connections; reading /proc/net/tcp costs a line per socket, the sock_diag lookup of one 4-tuple
does not. This opens ``--connections`` extra loopback connection pairs (two table rows each),
then times both lookups of one live connection, interleaved, and prints p50 / max and the ratio.

    .venv/bin/python bench/bench_console_peer.py [--connections 0 1000 4000] [--lookups 200]
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from daemon.apps.console import access


def _time_ms(fn: Callable[[access._Conn], object], key: access._Conn) -> float:
    t0 = time.perf_counter()
    fn(key)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, nargs="+", default=[0, 1000, 4000])
    ap.add_argument("--lookups", type=int, default=200)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * max(args.connections) + 100)), hard))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4096)
    client = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    peer, local = client.getsockname(), conn.getsockname()
    key = access._client_conn(peer, local)
    held: list[socket.socket] = []
    print(f"{'extra conns':>11}{'sock_diag p50':>15}{'max':>8}{'/proc p50':>11}{'max':>8}{'/proc / diag':>14}")
    for n in args.connections:
        while len(held) < 2 * n:
            c = socket.create_connection(srv.getsockname())
            a, _ = srv.accept()
            held += [c, a]
        diag, proc = [], []
        for _ in range(args.lookups):
            diag.append(_time_ms(access._diag_uid, key))
            proc.append(_time_ms(access._proc_uid, key))
        d50, p50 = statistics.median(diag), statistics.median(proc)
        print(f"{n:>11}{d50:>15.3f}{max(diag):>8.2f}{p50:>11.3f}{max(proc):>8.2f}{p50 / d50:>13.1f}x")
    for s in (*held, client, conn, srv):
        s.close()


if __name__ == "__main__":
    main()
