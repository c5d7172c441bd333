"""Noisy-bus benchmark: our control loop vs LeRobot 0.6.1's bus when the follower's
status packets are damaged, measured side by side in one run on one virtual bench.

The emulator runs in its own process (``so101d emulate``, leader moving in its demo motion);
corruption goes through its control socket exactly as an operator would send it:
``{"cmd": "corrupt", "arm": "follower", "rate": 0.02, "mode": M}``.

1. Our ``ControlLoop`` at the configured rate (100 Hz) with the leader and follower, clean and with
   2 % corruption in each mode (checksum, any, len, drop, insert): achieved rate (cycles over a
   measured wall interval), follower retries, failed reads, loop faults, overruns.
2. The same loop free-running (no sleep): rate clean vs noisy and their ratio (target >= 0.85).
3. LeRobot's ``FeetechMotorsBus`` on the same follower, free-running its teleop cycle
   (``sync_read("Present_Position", num_retry=2)`` as SOFollower does, then ``sync_write`` of the
   goals): rate and how many ``ConnectionError``s it raised (each one ends ``lerobot-teleoperate``).

    .venv/bin/python bench/bench_noisy_bus.py [--seconds 3] [--rate 0.02] [--modes checksum,drop]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from daemon.config.settings import config_from_dict
from daemon.control.loop import ControlLoop
from drivers.emulator import reference_calibration
from drivers.emulator.process import EmulatorProcess
from drivers.feetech_arm import FeetechFollower, FeetechLeader

MODES = ("checksum", "any", "len", "drop", "insert")
SLICES = 6  # clean/noisy alternations per mode


@dataclass
class LoopRun:
    label: str
    rate_hz: float
    cycles: int
    elapsed_s: float  # wall time the cycles were counted over
    retries: int
    failures: int
    follower_errors: int
    faults: int  # cycles seen in mode "fault" or "disconnected" (sampled)
    overruns: int
    corrupted: int  # status packets the emulator damaged meanwhile


def _wait_teleop(loop: ControlLoop, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not (
        loop.follower_link.connected and loop.leader_link and loop.leader_link.connected and loop.state.mode == "teleop"
    ):
        if time.monotonic() > end:
            raise RuntimeError(f"loop did not reach teleop: {loop.state.mode} {loop.state.reason}")
        time.sleep(0.02)


def measure_loop(ep: EmulatorProcess, loop: ControlLoop, label: str, rate: float, mode: str, seconds: float) -> LoopRun:
    """Set the corruption, then count the loop's cycles over a measured wall interval."""
    ep.control({"cmd": "corrupt", "arm": "follower", "rate": rate, "mode": mode})
    try:
        fol = loop.follower_link.arm
        c0, r0, f0, e0, o0 = (
            loop.cycles,
            fol.counters.retries,
            fol.counters.failures,
            loop.follower_errors,
            loop.overruns,
        )
        k0 = ep.control({"cmd": "stats", "arm": "follower"})["stats"]["corrupted_replies"]
        bad = 0
        t0 = time.monotonic()
        end = t0 + seconds
        while time.monotonic() < end:
            if loop.state.mode in ("fault", "disconnected"):
                bad += 1
            time.sleep(0.005)
        elapsed = time.monotonic() - t0
        cycles = loop.cycles - c0
        k1 = ep.control({"cmd": "stats", "arm": "follower"})["stats"]["corrupted_replies"]
        return LoopRun(
            label,
            cycles / elapsed,
            cycles,
            elapsed,
            fol.counters.retries - r0,
            fol.counters.failures - f0,
            loop.follower_errors - e0,
            bad,
            loop.overruns - o0,
            k1 - k0,
        )
    finally:
        ep.control({"cmd": "corrupt", "arm": "follower", "rate": 0.0})


def loop_section(
    rate_hz: float, free_run: bool, seconds: float, corrupt_rate: float, modes: list[str]
) -> list[LoopRun]:
    runs: list[LoopRun] = []
    with tempfile.TemporaryDirectory(prefix="bench-noisy-") as d:
        with EmulatorProcess(Path(d), leader_motion="demo") as ep:
            cfg = config_from_dict(
                {
                    "control": {"rate_hz": rate_hz, "health_period_s": 0.5},
                    "socket": {"path": str(Path(d) / "unused.sock")},
                }
            )
            leader = FeetechLeader(str(ep.leader_path), reference_calibration("leader"))
            follower = FeetechFollower(str(ep.follower_path), reference_calibration("follower"))
            loop = ControlLoop(leader, follower, cfg, free_run=free_run)
            loop.start()
            try:
                _wait_teleop(loop)
                time.sleep(0.3)
                # clean and noisy interleaved in short slices, so the load of the other processes
                # on this machine (it comes and goes over seconds) hits both alike
                slice_s = seconds / SLICES
                for mode in modes:
                    for _ in range(SLICES):
                        runs.append(measure_loop(ep, loop, f"clean/{mode}", 0.0, "checksum", slice_s))
                        runs.append(measure_loop(ep, loop, f"{corrupt_rate:.0%} {mode}", corrupt_rate, mode, slice_s))
            finally:
                loop.stop()
    return runs


def lerobot_section(seconds: float, corrupt_rate: float, modes: list[str]) -> list[tuple[str, float, int, int, int]]:
    """(label, rate Hz, cycles, ConnectionErrors, corrupted packets) for LeRobot's teleop cycle."""
    from bench.bench_bus import make_lerobot_bus

    out = []
    with tempfile.TemporaryDirectory(prefix="bench-noisy-lr-") as d:
        with EmulatorProcess(Path(d), leader=False) as ep:
            bus = make_lerobot_bus(str(ep.follower_path), reference_calibration("follower"))
            try:
                goals = bus.sync_read("Present_Position", normalize=False, num_retry=2)
                for label, rate, mode in [("clean", 0.0, "checksum")] + [
                    (f"{corrupt_rate:.0%} {m}", corrupt_rate, m) for m in modes
                ]:
                    ep.control({"cmd": "corrupt", "arm": "follower", "rate": rate, "mode": mode})
                    k0 = ep.control({"cmd": "stats", "arm": "follower"})["stats"]["corrupted_replies"]
                    n = errors = 0
                    t0 = time.monotonic()
                    end = t0 + seconds
                    while time.monotonic() < end:
                        try:
                            bus.sync_read("Present_Position", normalize=False, num_retry=2)
                            bus.sync_write("Goal_Position", goals, normalize=False)
                        except ConnectionError:
                            errors += 1
                        n += 1
                    elapsed = time.monotonic() - t0
                    ep.control({"cmd": "corrupt", "arm": "follower", "rate": 0.0})
                    k1 = ep.control({"cmd": "stats", "arm": "follower"})["stats"]["corrupted_replies"]
                    out.append((label, n / elapsed, n, errors, k1 - k0))
            finally:
                bus.disconnect(disable_torque=False)
    return out


def _merge(runs: list[LoopRun]) -> dict[str, LoopRun]:
    """Sum the interleaved runs of one label: cycles over the summed wall time (a slice in which the
    loop made no cycle at all, the machine stalling it, counts as time without cycles)."""
    merged: dict[str, LoopRun] = {}
    for r in runs:
        m = merged.get(r.label)
        if m is None:
            merged[r.label] = LoopRun(**vars(r))
            continue
        for f in ("cycles", "elapsed_s", "retries", "failures", "follower_errors", "faults", "overruns", "corrupted"):
            setattr(m, f, getattr(m, f) + getattr(r, f))
    for m in merged.values():
        m.rate_hz = m.cycles / m.elapsed_s if m.elapsed_s > 0 else 0.0
    return merged


def print_runs(title: str, runs: list[LoopRun]) -> dict[str, LoopRun]:
    print(title)
    print(
        f"   {'bus':<14} {'rate Hz':>8} {'cycles':>7} {'retries':>8} {'failed':>7} {'errors':>7} {'fault':>6} {'overruns':>9} {'damaged':>8}"
    )
    merged = _merge(runs)
    for r in merged.values():
        print(
            f"   {r.label:<14} {r.rate_hz:>8.1f} {r.cycles:>7d} {r.retries:>8d} {r.failures:>7d} {r.follower_errors:>7d} {r.faults:>6d} {r.overruns:>9d} {r.corrupted:>8d}"
        )
    return merged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="measurement time per condition (default 3)")
    ap.add_argument("--rate", type=float, default=0.02, help="share of damaged status packets (default 0.02)")
    ap.add_argument("--hz", type=float, default=100.0, help="control rate (default 100)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"corruption modes (default {','.join(MODES)})")
    ap.add_argument("--skip-lerobot", action="store_true")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}; known: {', '.join(MODES)}")
    logging.basicConfig(level=logging.ERROR)

    print_runs(
        f"1. our loop at {args.hz:g} Hz, {args.seconds:g} s per condition (clean runs interleaved)",
        loop_section(args.hz, False, args.seconds, args.rate, modes),
    )
    print("   target: >= 95 Hz at 100 Hz with 2 % corruption, no failed read, no fault (clean/M: the clean")
    print("   slices interleaved with mode M's)")
    print()
    free = print_runs(
        f"2. our loop free-running, {args.seconds:g} s per condition",
        loop_section(args.hz, True, args.seconds, args.rate, modes),
    )
    for mode in modes:
        noisy, clean = free[f"{args.rate:.0%} {mode}"], free[f"clean/{mode}"]
        ratio = f"{noisy.rate_hz / clean.rate_hz:.3f}" if clean.rate_hz > 0 else "n/a (no clean cycle)"
        print(f"   free-running rate ratio {args.rate:.0%} {mode} / its clean slices: {ratio} (target >= 0.85)")
    print()
    if not args.skip_lerobot:
        print(
            f"3. LeRobot 0.6.1 FeetechMotorsBus teleop cycle (sync_read num_retry=2 + sync_write), free-running, {args.seconds:g} s each"
        )
        print(f"   {'bus':<14} {'rate Hz':>8} {'cycles':>7} {'ConnectionError':>16} {'damaged':>8}")
        for label, hz, n, errors, damaged in lerobot_section(args.seconds, args.rate, modes):
            print(f"   {label:<14} {hz:>8.1f} {n:>7d} {errors:>16d} {damaged:>8d}")
        print("   (each ConnectionError ends lerobot-teleoperate)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
