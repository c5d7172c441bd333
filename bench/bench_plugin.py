"""The LeRobot plugin's cost: one get_observation + send_action round trip of robot ``so101d``
(LeRobot -> the daemon's control socket -> the safety layer) beside LeRobot driving the same
emulated arm directly (SOFollower on the serial bus), without cameras, in one run.

The emulator runs in its own process (`so101d emulate`, wire time modelled at 1 Mbaud), the
daemon in its own (`so101d run` at 100 Hz), the client here: three processes, as on a bench.
Row 1 is LeRobot's SOFollower on the emulated follower (one sync read for the observation, one
sync write for the action); row 2 is the plugin against the daemon driving that follower.
Target: the plugin's round trip p99 <= 1 ms. Each round starts ``--every-ms`` after the previous
(default 12 ms, as a LeRobot control loop paces its steps, at 30 fps): the daemon's loop takes one
action per cycle (100 Hz here), so a client sending faster waits for the next cycle, and rounds
back to back would time the loop's period, not the socket.

``--flood S``: instead, the loop's rate while a client floods ``arm.action`` for S seconds, beside
the loop's rate with no client: one client waiting for each reply (ControlClient, as fast as it
can), then one pipelining (every action written without waiting, the replies read as they come).
The loop's rate must not depend on what a client sends (daemon/service/client_arm.py).

``--baseline DIR``: a third row, the same plugin against the daemon of another checkout (e.g. a
``git worktree add`` of the commit before a change), the two daemons taking turns in
``--blocks`` blocks of rounds (4 by default with a baseline), so that a change to the daemon is
measured beside what it changes, on a shared machine whose load drifts within a run.

    .venv/bin/python bench/bench_plugin.py [--rounds 2000] [--every-ms 12] [--flood 3] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "lerobot_plugin"))  # the plugin from this checkout (make setup installs it too)

from calibration.calibration_file import calibration_path, save_calibration
from daemon.api.client import ControlClient, DaemonUnavailable
from drivers.emulator import reference_calibration
from drivers.emulator.process import EmulatorProcess


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def round_trips(robot: object, rounds: int, every_s: float) -> np.ndarray:
    get_obs, send = robot.get_observation, robot.send_action  # type: ignore[attr-defined]
    for _ in range(50):  # warm up
        send(get_obs())
        time.sleep(every_s)
    times = np.empty(rounds)
    start_s = time.perf_counter()
    for i in range(rounds):
        time.sleep(max(0.0, start_s + i * every_s - time.perf_counter()))
        t0 = time.perf_counter()
        obs = get_obs()
        send(obs)  # hold where it is: the measured pose as the action
        times[i] = time.perf_counter() - t0
    return times


def run_lerobot(ports: Path, rounds: int, every_s: float) -> np.ndarray:
    from lerobot.robots.so_follower import SOFollower, SOFollowerRobotConfig

    root = ports / "lerobot_cal"
    save_calibration(reference_calibration("follower"), "follower", "bench", root)
    robot = SOFollower(
        SOFollowerRobotConfig(
            port=str(ports / "follower"), id="bench", calibration_dir=calibration_path("follower", "bench", root).parent
        )
    )
    robot.connect()
    try:
        return round_trips(robot, rounds, every_s)
    finally:
        robot.disconnect()


def start_daemon(ports: Path, checkout: Path = REPO) -> tuple[subprocess.Popen[bytes], Path]:
    """``so101d run`` from ``checkout`` (its own working directory: ``-m`` imports from there)."""
    cal = ports / "cal"
    for role in ("leader", "follower"):
        save_calibration(reference_calibration(role), role, role, cal)
    sock = ports / "c.sock"
    cfg = ports / "so101d.toml"
    cfg.write_text(
        f'[leader]\nport = "{ports / "leader"}"\n[follower]\nport = "{ports / "follower"}"\n'
        f'[calibration]\nroot = "{cal}"\n[socket]\npath = "{sock}"\n[control]\nrate_hz = 100.0\n'
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.apps.cli", "--log-level", "WARNING", "run", "--config", str(cfg)],
        env=env,
        cwd=checkout,
        start_new_session=True,
    )
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            with ControlClient(sock, timeout_s=2) as c:
                if c.request("status")["mode"] == "teleop":
                    return proc, sock
        except DaemonUnavailable:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the daemon did not reach teleop in 60 s")


def plugin_blocks(ports: Path, checkouts: list[Path], rounds: int, every_s: float, blocks: int) -> list[np.ndarray]:
    """Per checkout, its daemon's round trips: the daemons take turns, ``blocks`` each."""
    times: list[list[np.ndarray]] = [[] for _ in checkouts]
    per_block = [rounds // blocks + (1 if b < rounds % blocks else 0) for b in range(blocks)]
    for n in per_block:
        for i, checkout in enumerate(checkouts):
            daemon, sock = start_daemon(ports, checkout)
            try:
                times[i].append(run_plugin(sock, n, every_s))
            finally:
                os.killpg(daemon.pid, signal.SIGTERM)
                daemon.wait(60)
    return [np.concatenate(t) for t in times]


def run_plugin(sock: Path, rounds: int, every_s: float) -> np.ndarray:
    from lerobot_robot_so101d import SO101D, SO101DConfig

    robot = SO101D(SO101DConfig(socket=str(sock)))
    robot.connect()
    try:
        return round_trips(robot, rounds, every_s)
    finally:
        robot.disconnect()


def _cycles_over(c: ControlClient, run: Callable[[], int]) -> tuple[float, float]:
    """(loop cycles per second, actions answered per second) over the same window, while
    ``run()`` floods (it returns how many actions were answered)."""
    c0, t0 = c.request("status")["cycles"], time.monotonic()
    n = run()
    c1, t1 = c.request("status")["cycles"], time.monotonic()
    return (c1 - c0) / (t1 - t0), n / (t1 - t0)


def run_flood(sock: Path, seconds: float) -> list[tuple[str, float, float]]:
    """Rows (what, loop cycles/s, actions/s): no client, a waiting flood, a pipelined flood."""
    rows: list[tuple[str, float, float]] = []
    with ControlClient(sock) as c:
        rate, _ = _cycles_over(c, lambda: time.sleep(seconds) or 0)
        rows.append(("no client", rate, 0.0))
        lease = c.request("arm.acquire", client="bench flood")["lease"]
        pose = c.request("arm.observe")["follower"]
        try:
            with ControlClient(sock) as flooder:

                def waiting() -> int:
                    n, end = 0, time.monotonic() + seconds
                    while time.monotonic() < end:
                        flooder.request("arm.action", lease=lease, **pose)
                        n += 1
                    return n

                rows.append(("flood, waiting for each reply", *_cycles_over(c, waiting)))

            def pipelined() -> int:
                line = (json.dumps({"cmd": "arm.action", "lease": lease, **pose}) + "\n").encode()
                s = socket.socket(socket.AF_UNIX)
                s.connect(str(sock))
                end = time.monotonic() + seconds
                replies = [0]

                def read() -> None:
                    f = s.makefile("rb")
                    try:
                        while f.readline():
                            replies[0] += 1
                    except OSError:  # the connection shut below
                        pass

                reader = threading.Thread(target=read, daemon=True)
                reader.start()
                while time.monotonic() < end:
                    s.sendall(line)
                n = replies[0]
                s.shutdown(socket.SHUT_RDWR)  # the actions not yet answered are dropped with the connection
                s.close()
                return n

            rows.append(("flood, pipelined", *_cycles_over(c, pipelined)))
        finally:
            c.request("arm.release", lease=lease)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2000, help="round trips per row (default 2000)")
    ap.add_argument("--every-ms", type=float, default=12.0, help="one round every this many ms (default 12)")
    ap.add_argument(
        "--flood", type=float, default=0.0, metavar="S", help="the loop's rate under a flood of S s instead"
    )
    ap.add_argument(
        "--baseline", type=Path, metavar="DIR", help="also the plugin against this checkout's daemon, taking turns"
    )
    ap.add_argument("--blocks", type=int, default=0, help="turns of each daemon (default 1; 4 with --baseline)")
    args = ap.parse_args()
    blocks = args.blocks or (4 if args.baseline else 1)
    if args.baseline is not None and not (args.baseline / "daemon" / "apps" / "cli.py").is_file():
        ap.error(f"--baseline {args.baseline}: not a so101d checkout (no daemon/apps/cli.py)")
    if blocks < 1 or blocks > args.rounds:
        ap.error(f"--blocks must be from 1 to --rounds ({args.rounds}), got {blocks}")
    logging.basicConfig(level=logging.ERROR)
    if args.flood > 0:
        with tempfile.TemporaryDirectory(prefix="so101d-bench-") as d:
            ports = Path(d)
            with EmulatorProcess(ports, wire_time=True, leader_motion="still"):
                daemon, sock = start_daemon(ports)
                try:
                    rows = run_flood(sock, args.flood)
                finally:
                    os.killpg(daemon.pid, signal.SIGTERM)
                    daemon.wait(60)
        print(f"control loop at 100 Hz while a client floods arm.action, {args.flood:g} s each")
        print(f"{'':32s} {'cycles/s':>9s} {'actions/s':>10s}")
        for name, rate, actions in rows:
            print(f"{name:32s} {rate:9.1f} {actions:10.0f}")
        worst = min(rate for _, rate, _ in rows[1:])
        print(f"loop rate under a flood / without: {worst / rows[0][1]:.2f}")
        return 0
    with tempfile.TemporaryDirectory(prefix="so101d-bench-") as d:
        ports = Path(d)
        with EmulatorProcess(ports, wire_time=True, leader_motion="still"):
            direct = run_lerobot(ports, args.rounds, args.every_ms / 1000.0)
            checkouts = [REPO] + ([args.baseline.resolve()] if args.baseline is not None else [])
            plugins = plugin_blocks(ports, checkouts, args.rounds, args.every_ms / 1000.0, blocks)
    plugin = plugins[0]
    rows = [("LeRobot SOFollower, serial bus", direct), ("so101d plugin, control socket", plugin)]
    if args.baseline is not None:
        rows.append(("the same, baseline daemon", plugins[1]))
    print(f"get_observation + send_action round trip, {args.rounds} rounds {args.every_ms:g} ms apart, no cameras")
    if args.baseline is not None:
        print(f"baseline daemon: {args.baseline} (the two daemons in turns, {blocks} blocks each)")
    print(f"{'':34s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s}")
    for name, t in rows:
        print(f"{name:34s} {pct(t, 50) * 1e3:8.3f} {pct(t, 99) * 1e3:8.3f} {float(t.max()) * 1e3:8.3f}")
    print(
        f"plugin / direct: p50 {pct(plugin, 50) / pct(direct, 50):.2f}x, p99 {pct(plugin, 99) / pct(direct, 99):.2f}x"
    )
    if args.baseline is not None:
        base = plugins[1]
        print(
            f"plugin / baseline: p50 {pct(plugin, 50) / pct(base, 50):.2f}x, p99 {pct(plugin, 99) / pct(base, 99):.2f}x"
        )
    p99_ms = pct(plugin, 99) * 1e3
    print(f"target: plugin p99 <= 1 ms: {'met' if p99_ms <= 1.0 else 'NOT met'} ({p99_ms:.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
