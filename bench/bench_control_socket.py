"""Control socket under a connection leak (an operator locked out by a leaking dashboard), measured side by side.

`so101d run` serves the emulated bench (`so101d emulate`, wire time modelled), each in its own
process, as on a real machine. This process plays the operator and a leaking dashboard: for each
of 0, 300 and 1000 idle connections held open (1000 is beyond the daemon's limit of
``MAX_CONNECTIONS``: the longest-idle ones are evicted) it measures, in one run:

- `status` round trip on one open connection (p50 / p99 / max),
- `status` as the CLI does it: connect, ask, close (p50 / p99 / max),
- the daemon's loop rate (cycles counted by the daemon / wall time) over a window with only the
  idle connections held, and over the window of the requests; overruns,

rows interleaved over ``--rounds`` (the machine's load drifts), and prints the ratios to the
0-idle rows.

    .venv/bin/python bench/bench_control_socket.py [--requests 300] [--idle 0 300 1000]

Earlier measurements and what they showed: docs/design/control-socket.md.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calibration.calibration_file import save_calibration
from daemon.api.client import ControlClient, DaemonUnavailable
from daemon.api.server import MAX_CONNECTIONS
from drivers.emulator import reference_calibration
from drivers.emulator.process import EmulatorProcess


def start_daemon(d: Path) -> tuple[subprocess.Popen, Path]:
    cal = d / "cal"
    save_calibration(reference_calibration("leader"), "leader", "l1", cal)
    save_calibration(reference_calibration("follower"), "follower", "f1", cal)
    sock = d / "control.sock"
    cfg = d / "so101d.toml"
    cfg.write_text(
        f'[leader]\nport = "{d / "leader"}"\nid = "l1"\n[follower]\nport = "{d / "follower"}"\nid = "f1"\n'
        f'[calibration]\nroot = "{cal}"\n[socket]\npath = "{sock}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.apps.cli", "run", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"so101d run exited with {proc.returncode}")
        try:
            with ControlClient(sock, timeout_s=2) as c:
                st = c.request("status")
            if st["mode"] == "teleop" and st["cycles"] > 100:
                return proc, sock
        except DaemonUnavailable:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the daemon did not reach teleop in 60 s")


def leak(sock: Path, n: int) -> list[socket.socket]:
    held = []
    for _ in range(n):
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(sock))
                break
            except BlockingIOError:  # the backlog is momentarily full: as any client, try again
                s.close()
                time.sleep(0.005)
        held.append(s)
    return held


def ms(a: list[float]) -> tuple[float, float, float]:
    x = np.asarray(a) * 1e3
    return float(np.percentile(x, 50)), float(np.percentile(x, 99)), float(x.max())


def measure(sock: Path, requests: int, window_s: float) -> dict:
    with ControlClient(sock, timeout_s=5) as c:
        # the loop with only the idle connections held
        q0 = c.request("status")
        tq = time.monotonic()
        time.sleep(window_s)
        q1 = c.request("status")
        quiet_hz = (q1["cycles"] - q0["cycles"]) / (time.monotonic() - tq)
        st0 = c.request("status")
        t0 = time.monotonic()
        persistent = []
        for _ in range(requests):
            t = time.perf_counter()
            c.request("status")
            persistent.append(time.perf_counter() - t)
        fresh = []
        for _ in range(requests):
            t = time.perf_counter()
            with ControlClient(sock, timeout_s=5) as c2:
                c2.request("status")
            fresh.append(time.perf_counter() - t)
        st1 = c.request("status")
        elapsed = time.monotonic() - t0
    return {
        "persistent": ms(persistent),
        "fresh": ms(fresh),
        "quiet_hz": quiet_hz,
        "rate_hz": (st1["cycles"] - st0["cycles"]) / elapsed,
        "overruns": st1["overruns"] - q0["overruns"],
        "mode": st1["mode"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300, help="status requests per way of asking (default 300)")
    ap.add_argument("--idle", type=int, nargs="+", default=[0, 300, 1000], help="idle connections per row")
    ap.add_argument(
        "--window-s", type=float, default=3.0, help="loop rate window with only the idle connections held (default 3)"
    )
    ap.add_argument("--rounds", type=int, default=2, help="times the rows are measured, interleaved (default 2)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="so101d-bench-") as d:
        root = Path(d)
        with EmulatorProcess(root, wire_time=True, leader_motion="demo"):
            proc, sock = start_daemon(root)
            try:
                for n in [n for _ in range(args.rounds) for n in args.idle]:  # interleaved: load drifts
                    held = leak(sock, n)
                    time.sleep(0.5)  # all accepted, nothing else going on
                    r = measure(sock, args.requests, args.window_s)
                    r["held"] = sum(1 for s in held if _still_open(s))
                    rows.append((n, r))
                    for s in held:
                        s.close()
                    time.sleep(0.5)
            finally:
                proc.terminate()
                proc.wait(20)

    print(
        f"\nso101d control socket: status round trip and loop rate vs idle connections held "
        f"({args.requests} requests each way; daemon limit {MAX_CONNECTIONS} connections; loop target 100 Hz)\n"
    )
    print(
        f"{'idle':>6}{'kept':>6}  {'open conn p50/p99/max ms':>26}  {'connect+ask p50/p99/max ms':>28}"
        f"{'loop Hz idle-only':>19}{'loop Hz asking':>16}{'overruns':>9}"
    )
    for n, r in rows:
        p, f = r["persistent"], r["fresh"]
        print(
            f"{n:>6}{r['held']:>6}  {p[0]:>8.3f}/{p[1]:>7.3f}/{p[2]:>8.3f}  {f[0]:>9.3f}/{f[1]:>7.3f}/{f[2]:>8.3f}"
            f"{r['quiet_hz']:>19.1f}{r['rate_hz']:>16.1f}{r['overruns']:>9}"
        )
    base = [r for n, r in rows if n == args.idle[0]]

    def mean(key: str, rs: list[dict], i: int | None = None) -> float:
        return float(np.mean([r[key] if i is None else r[key][i] for r in rs]))

    for n in args.idle[1:]:
        rs = [r for m, r in rows if m == n]
        print(
            f"{n} idle / {args.idle[0]} idle (mean of {len(rs)} rounds): status p50 {mean('persistent', rs, 0) / mean('persistent', base, 0):.2f}x, "
            f"p99 {mean('persistent', rs, 1) / mean('persistent', base, 1):.2f}x; connect+ask p50 "
            f"{mean('fresh', rs, 0) / mean('fresh', base, 0):.2f}x, p99 {mean('fresh', rs, 1) / mean('fresh', base, 1):.2f}x; "
            f"loop rate idle-only {mean('quiet_hz', rs) / mean('quiet_hz', base):.3f}x, asking {mean('rate_hz', rs) / mean('rate_hz', base):.3f}x"
        )
    return 0


def _still_open(s: socket.socket) -> bool:
    """False once the daemon closed (evicted) this connection: it never asked anything, so any
    bytes are the eviction notice, and the end of the stream follows them."""
    s.setblocking(False)
    try:
        return not s.recv(65536)  # the notice, or the end: closed
    except BlockingIOError:
        return True  # nothing to read and not closed
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
