"""Realism benchmark: the control loop behind emulated USB adapters, and how long a corrupt LEN
byte costs the driver today vs the driver before it resynchronised on a bad LEN. Measured side by
side in one run.

1. Loop at the configured rate (100 Hz) for each USB preset of the emulator (none, ch343,
   ftdi-1ms, ftdi = 16 ms latency timer): achieved rate, overruns, follower-read p50/p99, and
   the loop's own rate_warning. The emulator runs in its own process (`so101d emulate --realism`).
2. Corrupt-LEN recovery: a six-servo sync read of Present_Position whose first reply has a LEN
   byte that promises more than was sent (``corrupt`` control command, mode ``len``, the next
   reply only). The driver of this tree vs the driver as of ``--baseline`` (default: the commit
   before the LEN resynchronisation, docs/design/emulator-realism.md), loaded from git into its own module; both read the same emulator,
   interleaved in rounds. Prints p50/p99 of the damaged reads and of clean reads, and the ratio.

    .venv/bin/python bench/bench_realism.py [--seconds 3] [--reads 100] [--baseline REV]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from daemon.config.settings import config_from_dict
from daemon.control.loop import ControlLoop
from drivers.emulator import reference_calibration
from drivers.emulator.process import EmulatorProcess
from drivers.feetech_arm import FeetechFollower, FeetechLeader
from drivers.feetech_bus import FeetechBus

BASELINE_REV = "6584b0f"  # main before the driver resynchronised on a corrupt LEN
IDS = [1, 2, 3, 4, 5, 6]


def pct(a, q: float) -> float:
    a = np.asarray(a, dtype=float)
    return float(np.percentile(a, q)) if a.size else float("nan")


def loop_under(preset: str, seconds: float, rate_hz: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-realism-") as d:
        args = ["--realism", preset] if preset != "none" else []
        with EmulatorProcess(Path(d), leader_motion="demo", extra_args=args) as ep:
            cfg = config_from_dict(
                {
                    "control": {"rate_hz": rate_hz, "health_period_s": 0.5},
                    "socket": {"path": str(Path(d) / "unused.sock")},
                }
            )
            leader = FeetechLeader(str(ep.leader_path), reference_calibration("leader"))
            follower = FeetechFollower(str(ep.follower_path), reference_calibration("follower"))
            loop = ControlLoop(leader, follower, cfg)
            loop.start()
            try:
                end = time.monotonic() + 30
                while not (loop.follower_link.connected and loop.leader_link.connected and loop.state.mode == "teleop"):
                    if time.monotonic() > end:
                        raise RuntimeError(
                            f"{preset}: loop did not reach teleop: {loop.state.mode} {loop.state.reason}"
                        )
                    time.sleep(0.02)
                time.sleep(0.3)
                loop.call(loop.stats.reset)
                c0, o0 = loop.cycles, loop.overruns
                t0 = time.monotonic()
                time.sleep(seconds)
                elapsed = time.monotonic() - t0
                # counted now, over ``elapsed``: the wait below would add cycles but not time
                cycles, overruns = loop.cycles - c0, loop.overruns - o0
                fr = loop.stats.follower_read.values()
                time.sleep(max(0.0, 2.2 - seconds))  # let the loop's rate check run at least once
                return {
                    "rate_hz": cycles / elapsed,
                    "overruns": overruns,
                    "cycles": cycles,
                    "fread_p50_ms": pct(fr, 50) * 1e3,
                    "fread_p99_ms": pct(fr, 99) * 1e3,
                    "warning": loop.rate_warning,
                }
            finally:
                loop.stop()


def baseline_bus_module(rev: str) -> ModuleType:
    src = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:drivers/feetech_bus.py"], capture_output=True, text=True, check=True
    ).stdout
    # Since 2026-11 the broadcast and max ids live in the codec (drivers/protocol.py) alone; the
    # old driver imported them from the control table, so it gets a table module that has them.
    from drivers import protocol, sts3215_table

    table = ModuleType("sts3215_table_for_baseline")
    table.__dict__.update(vars(sts3215_table))
    table.__dict__.update(BROADCAST_ID=protocol.BROADCAST_ID, MAX_SERVO_ID=protocol.MAX_ID)
    sys.modules[table.__name__] = table
    src = src.replace("from drivers.sts3215_table import", f"from {table.__name__} import")
    path = Path(tempfile.mkdtemp(prefix="bench-baseline-")) / "feetech_bus_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("feetech_bus_baseline", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def len_recovery(reads: int, rounds: int, baseline: str) -> dict[str, dict[str, list[float]]]:
    old = baseline_bus_module(baseline)
    out: dict[str, dict[str, list[float]]] = {n: {"damaged": [], "clean": []} for n in ("today", baseline)}
    with tempfile.TemporaryDirectory(prefix="bench-len-") as d, EmulatorProcess(Path(d), leader=False) as ep:
        buses = {"today": FeetechBus(str(ep.follower_path)), baseline: old.FeetechBus(str(ep.follower_path))}
        per_round = max(1, reads // rounds)
        for _ in range(rounds):
            for name, bus in buses.items():
                bus.open()
                try:
                    for _ in range(per_round):
                        t0 = time.perf_counter()
                        bus.sync_read("Present_Position", IDS)
                        out[name]["clean"].append(time.perf_counter() - t0)
                        ep.control({"cmd": "corrupt", "rate": 0.0, "mode": "len", "next": 1})
                        t0 = time.perf_counter()
                        bus.sync_read("Present_Position", IDS)
                        out[name]["damaged"].append(time.perf_counter() - t0)
                finally:
                    bus.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="measurement time per USB preset (default 3)")
    ap.add_argument("--rate", type=float, default=100.0, help="control rate (default 100 Hz)")
    ap.add_argument("--reads", type=int, default=100, help="damaged reads per driver (default 100)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaving rounds (default 5)")
    ap.add_argument(
        "--baseline", default=BASELINE_REV, help=f"git revision of the driver to compare with (default {BASELINE_REV})"
    )
    ap.add_argument("--skip-loop", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)

    if not args.skip_loop:
        print(f"1. control loop at {args.rate:g} Hz behind emulated USB adapters ({args.seconds:g} s each)")
        print(
            f"   {'preset':<10} {'rate Hz':>8} {'overruns':>9} {'cycles':>7} {'fread p50':>10} {'fread p99':>10}  rate_warning"
        )
        for preset in ("none", "ch343", "ftdi-1ms", "ftdi"):
            r = loop_under(preset, args.seconds, args.rate)
            warn = (r["warning"][:70] + "...") if r["warning"] else "-"
            print(
                f"   {preset:<10} {r['rate_hz']:>8.1f} {r['overruns']:>9d} {r['cycles']:>7d} {r['fread_p50_ms']:>8.2f}ms {r['fread_p99_ms']:>8.2f}ms  {warn}"
            )
        print()

    print(
        f"2. six-servo sync read with servo 1's LEN byte corrupted: this tree vs {args.baseline} ({args.reads} reads each, interleaved)"
    )
    res = len_recovery(args.reads, args.rounds, args.baseline)
    print(f"   {'driver':<10} {'damaged p50':>12} {'damaged p99':>12} {'clean p50':>10}")
    for name, r in res.items():
        print(
            f"   {name:<10} {pct(r['damaged'], 50) * 1e3:>10.2f}ms {pct(r['damaged'], 99) * 1e3:>10.2f}ms {pct(r['clean'], 50) * 1e3:>8.2f}ms"
        )
    today, base = res["today"], res[args.baseline]
    print(
        f"   damaged-read p50 ratio today/{args.baseline}: {pct(today['damaged'], 50) / pct(base['damaged'], 50):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
