"""Bimanual control-loop benchmark: two SO-101 pairs (four serial buses) on the virtual bimanual
bench (`so101d emulate --bimanual` in its own process, 1 Mbaud, wire time modelled).

Measured side by side in one run, on the same emulator:

1. so101d's loop driving both pairs (the daemon's own ``build_loop`` on an [arms.left] /
   [arms.right] configuration), free-running: the four buses overlapped (``control.overlap_io``:
   each leader on its read worker, the right follower on its bus worker while the loop thread
   does the left) and, for comparison, every bus in turn on the loop thread;
2. so101d's loop on one pair of the same bench (the left), overlapped: what a single-arm cycle
   costs here, so the bimanual cycle can be read against it;
3. LeRobot 0.6.1's own bimanual cycle on the same four ports: ``BiSOLeader.get_action`` ->
   ``BiSOFollower.send_action`` + ``BiSOFollower.get_observation`` (no cameras), free-running;
4. so101d's bimanual loop at 100 Hz: the rate held and the period jitter;
5. the daemon at 100 Hz recording both arms and two 640x480 cameras into one dataset: the rate,
   jitter and overruns while it records, the frames saved.

Each in two rounds on a fresh emulator: wire time only (the cycle is bound by CPU, ours and the
emulator's), and behind a CH343's USB delivery on every bus (the cycle waits on replies, as on a
real rig).

Goal (issue #25): so101d's bimanual cycle >= 2.5x faster than LeRobot's bimanual cycle, close
to a single-arm cycle, and 100 Hz held with both arms recording two cameras.

    .venv/bin/python bench/bench_bimanual.py [--seconds 3] [--rounds wire,ch343]
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from daemon.config.settings import Config, config_from_dict
from daemon.control.loop import ControlLoop
from daemon.service.daemon import build_loop
from drivers.emulator.process import EmulatorProcess

LEADER_ID, FOLLOWER_ID = "emulated_leader", "emulated_follower"  # the bench's --calibration-out ids


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def _cpu_s(pid: int | None = None) -> float:
    """CPU time (user + system) of this process, or of process ``pid``."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rig_config(bench: EmulatorProcess, *, bimanual: bool, overlap: bool, rate_hz: float) -> Config:
    return config_from_dict(_config_data(bench, bimanual=bimanual, overlap=overlap, rate_hz=rate_hz))


def _config_data(bench: EmulatorProcess, *, bimanual: bool, overlap: bool, rate_hz: float) -> dict:
    links = bench.links
    data: dict = {
        "leader": {"id": LEADER_ID},
        "follower": {"id": FOLLOWER_ID},
        "calibration": {"root": str(bench.directory / "calibration")},
        # health reads off the measurement
        "control": {"rate_hz": rate_hz, "overlap_io": overlap, "health_period_s": 1e6},
        "socket": {"path": str(bench.directory / "unused.sock")},
        # a free-running loop aligns at most two nominal (1 ms) periods' worth a cycle: quick alignment
        "safety": {"align_speed_deg_s": 360.0},
    }
    if bimanual:
        data["arms"] = {
            side: {"leader_port": str(links[f"{side}_leader"]), "follower_port": str(links[f"{side}_follower"])}
            for side in ("left", "right")
        }
    else:  # the left pair alone, with its own calibration ids
        data["leader"].update(port=str(links["left_leader"]), id=f"{LEADER_ID}_left")
        data["follower"].update(port=str(links["left_follower"]), id=f"{FOLLOWER_ID}_left")
    return data


def _tracking(loop: ControlLoop) -> bool:
    return all(a.link.connected and a.state.mode == "teleop" for a in loop.arms) and all(
        link.connected for link in loop.links()
    )


def run_ours(bench: EmulatorProcess, seconds: float, *, bimanual: bool, overlap: bool, rate_hz: float) -> dict:
    cfg = rig_config(bench, bimanual=bimanual, overlap=overlap, rate_hz=rate_hz)
    loop = build_loop(cfg, free_run=rate_hz >= 1000.0)
    loop.start()
    try:
        end = time.monotonic() + 30
        while not _tracking(loop):
            if time.monotonic() > end:
                modes = {a.name: (a.state.mode, a.state.reason) for a in loop.arms}
                raise RuntimeError(f"the loop did not reach teleop on every arm: {modes}")
            time.sleep(0.02)
        loop.wait_cycles(20)
        loop.call(loop.stats.reset)  # on the loop thread, between cycles
        emulator_pid = int(bench.control({"cmd": "ping"})["pid"])
        c0, o0 = loop.cycles, loop.overruns
        cpu0, emu0 = _cpu_s(), _cpu_s(emulator_pid)
        t0 = time.monotonic()
        time.sleep(seconds)  # the measurement window itself (a benchmark, not a test's wait)
        cycles, elapsed = loop.cycles - c0, time.monotonic() - t0
        cpu_ms = (_cpu_s() - cpu0) / max(cycles, 1) * 1e3
        emu_ms = (_cpu_s(emulator_pid) - emu0) / max(cycles, 1) * 1e3
        s = loop.stats
        cyc, jit = s.cycle.values(), s.jitter.values()
        modes = sorted({a.state.mode for a in loop.arms})
        return {
            "rate_hz": cycles / elapsed,
            "cycle_p50_ms": pct(cyc, 50) * 1e3,
            "cycle_p99_ms": pct(cyc, 99) * 1e3,
            "jitter_p50_ms": pct(jit, 50) * 1e3,
            "jitter_p99_ms": pct(jit, 99) * 1e3,
            "jitter_max_ms": float(jit.max()) * 1e3 if jit.size else float("nan"),
            "overruns": loop.overruns - o0,
            "arms": len(loop.arms),
            "cpu_ms": cpu_ms,  # this process's CPU per cycle (every thread)
            "emulator_cpu_ms": emu_ms,  # the emulator's CPU per cycle (it serves all four buses)
            "modes": ",".join(modes),
        }
    finally:
        loop.stop()


def run_lerobot(bench: EmulatorProcess, seconds: float) -> dict:
    from lerobot.robots import robot as lerobot_robot
    from lerobot.robots.bi_so_follower import BiSOFollower, BiSOFollowerConfig
    from lerobot.robots.so_follower import SOFollowerConfig
    from lerobot.teleoperators import teleoperator as lerobot_teleoperator
    from lerobot.teleoperators.bi_so_leader import BiSOLeader, BiSOLeaderConfig
    from lerobot.teleoperators.so_leader import SOLeaderConfig

    # LeRobot reads HF_LEROBOT_CALIBRATION once at import: point its base classes at the bench's
    # --calibration-out folder (what the variable does for a LeRobot started afterwards)
    root = bench.directory / "calibration"
    lerobot_robot.HF_LEROBOT_CALIBRATION = root
    lerobot_teleoperator.HF_LEROBOT_CALIBRATION = root
    links = bench.links
    leader = BiSOLeader(
        BiSOLeaderConfig(
            id=LEADER_ID,
            left_arm_config=SOLeaderConfig(port=str(links["left_leader"])),
            right_arm_config=SOLeaderConfig(port=str(links["right_leader"])),
        )
    )
    robot = BiSOFollower(
        BiSOFollowerConfig(
            id=FOLLOWER_ID,
            left_arm_config=SOFollowerConfig(port=str(links["left_follower"])),
            right_arm_config=SOFollowerConfig(port=str(links["right_follower"])),
        )
    )
    leader.connect(calibrate=False)
    robot.connect(calibrate=False)
    try:
        for _ in range(20):  # warm up
            robot.send_action(leader.get_action())
            robot.get_observation()
        times = []
        t0 = time.monotonic()
        t_end = t0 + seconds
        while time.monotonic() < t_end:
            a = time.perf_counter()
            robot.send_action(leader.get_action())
            robot.get_observation()
            times.append(time.perf_counter() - a)
        elapsed = time.monotonic() - t0
    finally:
        robot.disconnect()
        leader.disconnect()
    arr = np.array(times)
    return {"rate_hz": len(times) / elapsed, "cycle_p50_ms": pct(arr, 50) * 1e3, "cycle_p99_ms": pct(arr, 99) * 1e3}


CAMERA_W, CAMERA_H, CAMERA_FPS = 640, 480, 30  # two cameras as a bimanual rig records them (top, right wrist)


def run_recording(bench: EmulatorProcess, seconds: float) -> dict:
    """The daemon itself (``so101d run``'s Daemon) at 100 Hz on both pairs, recording one episode
    of both arms and two 640x480 cameras: the loop's rate, jitter and overruns while it records,
    and what the episode holds once saved."""
    from daemon.api.client import ControlClient
    from daemon.service.daemon import Daemon

    d = bench.directory
    cam = {"kind": "virtual", "width": CAMERA_W, "height": CAMERA_H, "fps": CAMERA_FPS}
    cfg = config_from_dict(
        {
            **_config_data(bench, bimanual=True, overlap=True, rate_hz=100.0),
            "recording": {"enabled": True, "dataset_root": str(d / "datasets"), "repo_id": "bench/bimanual", "fps": 30},
            "cameras": {"top": dict(cam), "right_wrist": dict(cam)},
            "socket": {"path": str(d / "rec.sock")},
        }
    )
    daemon = Daemon(cfg)
    daemon.start()
    loop = daemon.loop
    try:
        with ControlClient(daemon.socket_path, timeout_s=60) as c:
            end = time.monotonic() + 180
            while c.request("episode.status")["phase"] != "idle" or not _tracking(loop):
                if time.monotonic() > end:
                    raise RuntimeError(f"the recording daemon did not get ready: {c.request('episode.status')}")
                time.sleep(0.05)
            c.request("episode.start")
            loop.call(loop.stats.reset)
            c0, o0 = loop.cycles, loop.overruns
            t0 = time.monotonic()
            time.sleep(seconds)  # the measurement window (a benchmark, not a test's wait)
            cycles, elapsed = loop.cycles - c0, time.monotonic() - t0
            overruns = loop.overruns - o0
            jit = loop.stats.jitter.values()
            status = c.request("episode.status")
            saved = c.request("episode.save", success=True)
            end = time.monotonic() + 120
            while c.request("episode.status")["episodes_in_dataset"] < 1:
                if time.monotonic() > end:
                    raise RuntimeError("the recorded episode was not committed in 120 s")
                time.sleep(0.05)
    finally:
        daemon.stop()
    cams = {cs["name"]: cs for cs in status.get("cameras", [])}
    return {
        "rate_hz": cycles / elapsed,
        "jitter_p50_ms": pct(jit, 50) * 1e3,
        "jitter_p99_ms": pct(jit, 99) * 1e3,
        "jitter_max_ms": float(jit.max()) * 1e3 if jit.size else float("nan"),
        "overruns": overruns,
        "frames": int(saved.get("frames") or status.get("frames") or 0),
        "camera_fps": {n: cs.get("fps_measured") for n, cs in cams.items()},
    }


# Rounds: the emulator as fast as its wire (replies the moment the bytes are on the line, so the
# cycle is bound by CPU: ours and the emulator's, which serves all four buses from one process),
# and the same bench behind a CH343's USB delivery (a cdc_acm adapter, the kind behind the
# /dev/ttyACM0 of an SO-101's bus board: 64-byte bulk transfers on 1 ms frames, 1-4 ms from the
# line to read()), where a cycle waits on four buses' replies and overlapping them is what counts.
ROUNDS = {
    "wire": ("wire time only (the emulator's default)", []),
    "ch343": ("behind a CH343's USB delivery (--realism ch343 on every bus)", ["--realism", "ch343"]),
}


def measure(secs: float, usb_args: list[str]) -> dict[str, dict]:
    with tempfile.TemporaryDirectory(prefix="so101d-bibench-") as d:
        with EmulatorProcess(d, bimanual=True, calibration_out=Path(d) / "calibration", extra_args=usb_args) as bench:
            return {
                "bi_overlap": run_ours(bench, secs, bimanual=True, overlap=True, rate_hz=1000.0),
                "bi_serial": run_ours(bench, secs, bimanual=True, overlap=False, rate_hz=1000.0),
                "single": run_ours(bench, secs, bimanual=False, overlap=True, rate_hz=1000.0),
                "lerobot": run_lerobot(bench, secs),
                "at100": run_ours(bench, max(secs, 3.0), bimanual=True, overlap=True, rate_hz=100.0),
                "recording": run_recording(bench, max(secs, 3.0)),
            }


def report(title: str, secs: float, r: dict[str, dict]) -> None:
    bi_overlap, bi_serial, single, lerobot, at100 = (
        r["bi_overlap"],
        r["bi_serial"],
        r["single"],
        r["lerobot"],
        r["at100"],
    )
    print(f"\nbimanual control cycle on the emulated bench, 4 buses at 1 Mbaud, {title} ({secs:g} s each)\n")
    print(f"{'':44}{'rate Hz':>10}{'cycle p50 ms':>14}{'cycle p99 ms':>14}")
    rows = (
        ("so101d, two pairs, buses overlapped", bi_overlap),
        ("so101d, two pairs, buses in turn", bi_serial),
        ("so101d, one pair (left), overlapped", single),
        ("LeRobot 0.6.1 BiSOLeader -> BiSOFollower", lerobot),
    )
    for name, row in rows:
        print(f"{name:44}{row['rate_hz']:>10.1f}{row['cycle_p50_ms']:>14.3f}{row['cycle_p99_ms']:>14.3f}")
    print(
        "\nCPU per cycle, ms (ours / the emulator's): two pairs overlapped {:.2f} / {:.2f}, in turn {:.2f} / {:.2f}, "
        "one pair {:.2f} / {:.2f}; {} cores, load average {:.2f}: where ours + the emulator's approach the cycle "
        "times the free cores, the emulator's own CPU bounds the bimanual cycle".format(
            bi_overlap["cpu_ms"],
            bi_overlap["emulator_cpu_ms"],
            bi_serial["cpu_ms"],
            bi_serial["emulator_cpu_ms"],
            single["cpu_ms"],
            single["emulator_cpu_ms"],
            os.cpu_count(),
            os.getloadavg()[0],
        )
    )
    ratio = bi_overlap["rate_hz"] / lerobot["rate_hz"]
    print(
        "\nso101d bimanual / LeRobot bimanual: rate {:.2f}x, cycle time {:.2f}x   goal >= 2.5x  [{}]".format(
            ratio, lerobot["cycle_p50_ms"] / bi_overlap["cycle_p50_ms"], "ok" if ratio >= 2.5 else "MISSED"
        )
    )
    print(
        "so101d bimanual cycle / single-arm cycle (p50): {:.2f}x;  overlapped / in turn: rate {:.2f}x".format(
            bi_overlap["cycle_p50_ms"] / single["cycle_p50_ms"], bi_overlap["rate_hz"] / bi_serial["rate_hz"]
        )
    )
    print(
        "so101d bimanual at 100 Hz: {:.1f} Hz, period jitter p50 {:.3f} / p99 {:.3f} / max {:.3f} ms, "
        "{} overruns, modes {} (no cameras, not recording)".format(
            at100["rate_hz"],
            at100["jitter_p50_ms"],
            at100["jitter_p99_ms"],
            at100["jitter_max_ms"],
            at100["overruns"],
            at100["modes"],
        )
    )
    rec = r["recording"]
    fps = ", ".join(f"{n} {v:.1f}" for n, v in sorted(rec["camera_fps"].items()) if v is not None) or "none"
    print(
        "so101d bimanual at 100 Hz recording both arms and two {}x{} cameras (the daemon): {:.1f} Hz, period "
        "jitter p50 {:.3f} / p99 {:.3f} / max {:.3f} ms, {} overruns; {} frames saved, cameras fps {}  [{}]".format(
            CAMERA_W,
            CAMERA_H,
            rec["rate_hz"],
            rec["jitter_p50_ms"],
            rec["jitter_p99_ms"],
            rec["jitter_max_ms"],
            rec["overruns"],
            rec["frames"],
            fps,
            "ok" if rec["rate_hz"] >= 99.0 else "MISSED",
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="measurement time per configuration (default 3)")
    ap.add_argument(
        "--rounds",
        default="wire,ch343",
        help="comma-separated rounds: wire (the emulator's wire time only), ch343 (a CH343's USB "
        "delivery on every bus); default both",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    names = [n.strip() for n in args.rounds.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROUNDS]
    if unknown or not names:
        ap.error(f"--rounds: unknown {unknown or names}; choose from {', '.join(ROUNDS)}")
    for name in names:
        title, usb_args = ROUNDS[name]
        report(title, args.seconds, measure(args.seconds, usb_args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
