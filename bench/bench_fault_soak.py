"""Fault soak: the daemon records on the virtual bench while faults are injected at
random for N minutes; no crash, no snap, nothing lost.

The bench: ``so101d emulate`` in its own process (leader in its demo motion, follower), our
``Daemon`` with the README's recording on (one virtual camera), recording back-to-back episodes.
Faults, one at a time at random intervals, through the emulator's control socket as an operator's
script would send them:

- corruption burst: 5-20 % of the follower's status packets damaged (a random mode), 1-4 s;
- latency spike: every follower reply 10-60 ms late, 0.5-2 s;
- leader unplug, replugged after 1-3 s;
- a follower servo dropping off the bus, back after 1-3 s;
- overload bit on a follower servo, cleared after 1 s.

After each one the soak acts as the operator: ``teleop.start`` (through the loop, as the control
socket verb does) until the loop is back in teleop, and counts that as a recovery (with its time).

Report: loop rate per 1 s window (min, p1, p5, p50), time in each mode, faults injected and
recoveries, the largest per-cycle command step against the step limit (never above), that every
saved episode loads with LeRobotDataset, and the resident memory (RSS) of the daemon and of its
writer process: first and last sample, and the growth per minute after the first minute (a
least-squares slope over the samples), asserted below ``--rss-growth-mb-min`` for each.
``--tracemalloc`` also prints where the daemon's Python allocations grew most.

    .venv/bin/python bench/bench_fault_soak.py [--minutes 10] [--seed 0] [--episode-s 20]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calibration.conventions import JOINT_NAMES
from daemon.config.settings import config_from_dict
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.emulator.process import EmulatorProcess
from drivers.feetech_arm import FeetechFollower, FeetechLeader

CORRUPT_MODES = ("checksum", "any", "len", "drop", "insert")
RSS_SAMPLE_S = 5.0
RSS_WARMUP_S = 60.0  # imports, first encoders, caches filling: not growth
RSS_GROWTH_BOUND_MB_MIN = 0.25  # per process; the leak this bound catches grew 1.2 MB/min


def rss_mb(pid: int | None) -> float | None:
    """Resident set size of a process from /proc (None when it is gone)."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class RssWatch:
    """Samples the daemon's and the writer's RSS every few seconds while the soak runs."""

    def __init__(self, daemon: Daemon, stop: threading.Event) -> None:
        self.daemon = daemon
        self.stop = stop
        self.samples: dict[str, list[tuple[float, float]]] = {"daemon": [], "writer": []}

    def run(self) -> None:
        t0 = time.monotonic()
        while True:
            t = time.monotonic() - t0
            writer = self.daemon.recorder.writer_pid if self.daemon.recorder is not None else None
            for name, pid in (("daemon", os.getpid()), ("writer", writer)):
                mb = rss_mb(pid)
                if mb is not None:
                    self.samples[name].append((t, mb))
            if self.stop.wait(RSS_SAMPLE_S):
                return

    def growth_mb_min(self, name: str) -> float:
        pts = [(t, mb) for t, mb in self.samples[name] if t >= RSS_WARMUP_S]
        if len(pts) < 3:
            return float("nan")
        t, mb = np.asarray(pts).T
        return float(np.polyfit(t / 60.0, mb, 1)[0])

    def line(self, name: str) -> str:
        pts = self.samples[name]
        if not pts:
            return f"{name} -"
        return (
            f"{name} {pts[0][1]:.1f} -> {pts[-1][1]:.1f} MB (max {max(mb for _, mb in pts):.1f}), "
            f"growth after {RSS_WARMUP_S:.0f} s {self.growth_mb_min(name):+.2f} MB/min"
        )


REPO_ID = "soak/bench"


class StepWatch:
    """A cycle hook: the largest step between consecutive commands sent to the follower, per
    joint, against the safety's per-cycle limit (max_step tracking, the alignment step at most)."""

    def __init__(self, daemon: Daemon) -> None:
        self.loop = daemon.loop
        self.prev: np.ndarray | None = None
        self.max_ratio = 0.0  # step / limit, worst joint and cycle
        self.max_step = np.zeros(len(JOINT_NAMES))
        self.commands = 0

    def on_cycle(self, now: float, state: np.ndarray, action: np.ndarray, teleop_action: np.ndarray) -> None:
        cmd = self.loop.command
        params = self.loop.params
        if cmd is None or params is None:
            self.prev = None  # no goal written this cycle: the next one steps from the pose (aligns)
            return
        self.commands += 1
        if self.prev is not None:
            step = np.abs(cmd - self.prev)
            limit = np.maximum(params.max_step, params.max_align_step)
            self.max_step = np.maximum(self.max_step, step)
            self.max_ratio = max(self.max_ratio, float(np.max(step / limit)))
        self.prev = np.array(cmd, dtype=float)


class Soak:
    def __init__(self, ep: EmulatorProcess, daemon: Daemon, rng: random.Random) -> None:
        self.ep = ep
        self.daemon = daemon
        self.loop = daemon.loop
        self.rng = rng
        self.injected: Counter[str] = Counter()
        self.recovered: Counter[str] = Counter()
        self.recovery_s: list[float] = []
        self.unrecovered: list[str] = []
        self.modes: Counter[str] = Counter()  # 10 ms samples per mode
        self.window_hz: list[float] = []
        self.window_kind: list[str] = []  # the fault under way when each window ended ("none")
        self.current = "none"
        self.failed_reads: Counter[str] = Counter()  # follower transactions given up, per fault kind
        self.stop = threading.Event()

    # ---- sampling --------------------------------------------------------------------------
    def sample(self) -> None:
        c_prev, t_prev = self.loop.cycles, time.monotonic()
        next_window = t_prev + 1.0
        while not self.stop.is_set():
            self.modes[self.loop.state.mode] += 1
            now = time.monotonic()
            if now >= next_window:
                c = self.loop.cycles
                self.window_hz.append((c - c_prev) / (now - t_prev))
                self.window_kind.append(self.current)
                c_prev, t_prev, next_window = c, now, now + 1.0
            time.sleep(0.01)

    # ---- faults ----------------------------------------------------------------------------
    def _ctl(self, **req) -> None:
        r = self.ep.control(req)
        if not r.get("ok", False):
            raise RuntimeError(f"emulator refused {req}: {r}")

    def inject(self) -> str:
        rng = self.rng
        kind = rng.choice(["corruption", "latency", "leader_unplug", "servo_drop", "overload"])
        joint = rng.choice(JOINT_NAMES)
        self.current = kind
        if kind == "corruption":
            self._ctl(cmd="corrupt", arm="follower", rate=rng.uniform(0.05, 0.2), mode=rng.choice(CORRUPT_MODES))
            time.sleep(rng.uniform(1, 4))
            self._ctl(cmd="corrupt", arm="follower", rate=0.0)
        elif kind == "latency":
            self._ctl(cmd="latency", arm="follower", seconds=rng.uniform(0.01, 0.06))
            time.sleep(rng.uniform(0.5, 2))
            self._ctl(cmd="latency", arm="follower", seconds=0.0)
        elif kind == "leader_unplug":
            self._ctl(cmd="unplug", arm="leader")
            time.sleep(rng.uniform(1, 3))
            self._ctl(cmd="replug", arm="leader")
        elif kind == "servo_drop":
            self._ctl(cmd="set_online", arm="follower", joint=joint, online=False)
            time.sleep(rng.uniform(1, 3))
            self._ctl(cmd="set_online", arm="follower", joint=joint, online=True)
        else:
            self._ctl(cmd="error_bits", arm="follower", joint=joint, bits=0x20)
            time.sleep(1.0)
            self._ctl(cmd="error_bits", arm="follower", joint=joint, bits=0)
        self.injected[kind] += 1
        return kind

    def recover(self, kind: str, timeout_s: float = 30.0) -> None:
        """As the operator: ask for teleop until the loop follows again."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.loop.state.mode == "teleop":
                self.recovered[kind] += 1
                self.recovery_s.append(time.monotonic() - t0)
                return
            if self.loop.state.mode != "aligning":
                try:
                    self.loop.call(lambda: self.loop.set_intent("teleop"), timeout_s=3.0)
                except (RuntimeError, TimeoutError):
                    pass  # fault still present / arm reconnecting: try again shortly
            time.sleep(0.2)
        self.unrecovered.append(
            f"{kind}: still {self.loop.state.mode} ({self.loop.state.reason}) after {timeout_s:.0f} s"
        )

    def faults(self) -> None:
        counters = self.loop.follower_link.arm.counters
        while not self.stop.wait(self.rng.uniform(3, 8)):
            f0 = counters.failures
            kind = self.inject()  # sets self.current while the fault is on
            self.current = f"{kind} (recovering)"
            self.recover(kind)
            self.current = "none"
            self.failed_reads[kind] += counters.failures - f0


def record(daemon: Daemon, soak: Soak, episode_s: float, saved: list[int], errors: list[str]) -> None:
    rec = daemon.recorder
    while not soak.stop.is_set():
        try:
            r = rec.start_episode("soak: follow the leader")
            if soak.stop.wait(episode_s):
                rec.save_episode(True)
                saved.append(r["episode"])
                return
            rec.save_episode(True)
            saved.append(r["episode"])
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            soak.stop.wait(1.0)
        soak.stop.wait(0.5)


def pct(a: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(a, dtype=float), q)) if a else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="soak duration (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episode-s", type=float, default=20.0, help="length of each recorded episode (default 20 s)")
    ap.add_argument("--hz", type=float, default=100.0)
    ap.add_argument(
        "--rss-growth-mb-min",
        type=float,
        default=RSS_GROWTH_BOUND_MB_MIN,
        help=f"bound on each process's RSS growth per minute (default {RSS_GROWTH_BOUND_MB_MIN})",
    )
    ap.add_argument("--tracemalloc", action="store_true", help="print the daemon's largest allocation growth")
    args = ap.parse_args(argv)
    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start(8)
    logging.basicConfig(level=logging.CRITICAL)  # the loop logs every fault; the report says what matters
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory(prefix="bench-soak-") as d:
        root = Path(d)
        ds_root = root / "datasets" / REPO_ID
        with EmulatorProcess(root, leader_motion="demo") as ep:
            cfg = config_from_dict(
                {
                    "control": {"rate_hz": args.hz},
                    "socket": {"path": str(root / "c.sock")},
                    "recording": {"enabled": True, "dataset_root": str(root / "datasets"), "repo_id": REPO_ID},
                    "cameras": {"front": {"kind": "virtual", "width": 96, "height": 72}},
                }
            )
            daemon = Daemon(
                cfg,
                FeetechLeader(str(ep.leader_path), reference_calibration("leader")),
                FeetechFollower(str(ep.follower_path), reference_calibration("follower")),
            )
            daemon.start()
            steps = StepWatch(daemon)
            daemon.loop.add_hook(steps)
            soak = Soak(ep, daemon, rng)
            rss = RssWatch(daemon, soak.stop)
            snap0 = None
            saved: list[int] = []
            rec_errors: list[str] = []
            crashed = ""
            try:
                end = time.monotonic() + 180  # a loaded 2-core machine aligns slowly
                while (
                    daemon.recorder is None or daemon.recorder.phase == "starting" or daemon.loop.state.mode != "teleop"
                ):
                    if time.monotonic() > end:
                        raise RuntimeError(f"bench did not come up: mode {daemon.loop.state.mode}")
                    time.sleep(0.05)
                daemon.recorder.wait_ready(60)
                threads = [
                    threading.Thread(target=soak.sample, daemon=True),
                    threading.Thread(target=soak.faults, daemon=True),
                    threading.Thread(
                        target=record, args=(daemon, soak, args.episode_s, saved, rec_errors), daemon=True
                    ),
                    threading.Thread(target=rss.run, daemon=True),
                ]
                for t in threads:
                    t.start()
                t0 = time.monotonic()
                while time.monotonic() - t0 < args.minutes * 60:
                    if args.tracemalloc and snap0 is None and time.monotonic() - t0 > RSS_WARMUP_S:
                        snap0 = tracemalloc.take_snapshot()
                    if not daemon.loop.is_running():
                        crashed = "control loop stopped"
                        break
                    time.sleep(0.5)
                snap1 = tracemalloc.take_snapshot() if args.tracemalloc else None
                soak.stop.set()
                for t in threads:
                    t.join(60)
                written = daemon.recorder.wait_saved(300)
                rec_status = daemon.recorder.status()
                fol = daemon.loop.follower_link
                lead = daemon.loop.leader_link
                counters = fol.arm.counters
            finally:
                daemon.stop()
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        load_error = ""
        n_eps = frames = 0
        try:
            ds = LeRobotDataset(REPO_ID, root=ds_root)
            n_eps, frames = ds.num_episodes, ds.num_frames
            for i in range(n_eps):  # every episode's first frame, video decoded
                idx = int(ds.meta.episodes[i]["dataset_from_index"])
                _ = ds[idx]["observation.images.front"]
        except Exception as exc:
            load_error = f"{type(exc).__name__}: {exc}"

    total = sum(soak.modes.values()) or 1
    print(
        f"fault soak: {args.minutes:g} min at {args.hz:g} Hz, seed {args.seed}, recording {args.episode_s:g} s episodes"
    )
    print(
        f"loop rate per 1 s window (n={len(soak.window_hz)}): min {min(soak.window_hz, default=float('nan')):.1f}  "
        f"p1 {pct(soak.window_hz, 1):.1f}  p5 {pct(soak.window_hz, 5):.1f}  p50 {pct(soak.window_hz, 50):.1f} Hz"
    )
    by_kind: dict[str, list[float]] = {}
    for hz, kind in zip(soak.window_hz, soak.window_kind):
        by_kind.setdefault(kind, []).append(hz)
    print(
        "   per fault under way, min/p50 Hz: "
        + ", ".join(f"{k} {min(v):.0f}/{pct(v, 50):.0f}" for k, v in sorted(by_kind.items()))
    )
    print("time in each mode: " + ", ".join(f"{m} {100 * n / total:.1f} %" for m, n in soak.modes.most_common()))
    print("faults injected:   " + ", ".join(f"{k} {v}" for k, v in sorted(soak.injected.items())))
    print(
        "recovered:         "
        + ", ".join(f"{k} {v}" for k, v in sorted(soak.recovered.items()))
        + f"  (to teleop: p50 {pct(soak.recovery_s, 50):.2f} s, max {max(soak.recovery_s, default=float('nan')):.2f} s)"
    )
    print(
        "failed follower transactions during each kind: "
        + ", ".join(f"{k} {v}" for k, v in sorted(soak.failed_reads.items()))
    )
    if snap0 is not None and snap1 is not None:
        print("daemon allocation growth after the warm-up (tracemalloc, top 8):")
        for stat in snap1.compare_to(snap0, "traceback")[:8]:
            print(f"  {stat.size_diff / 1024:+.1f} KiB in {stat.count_diff:+d} blocks at")
            for fr in stat.traceback.format()[-6:]:
                print(f"      {fr}")
    for u in soak.unrecovered:
        print(f"NOT RECOVERED:     {u}")
    print(
        f"follower bus: {counters.transactions} transactions, {counters.retries} retries, {counters.failures} failed, "
        f"{counters.reconnects} reconnects; link losses: follower {fol.losses}, leader {lead.losses if lead else 0}"
    )
    print(
        f"command step: max {steps.max_ratio:.3f} of the per-cycle limit over {steps.commands} commands "
        f"({'never above' if steps.max_ratio <= 1.0 + 1e-9 else 'ABOVE THE LIMIT'}); per joint max "
        + ", ".join(f"{n} {s:.2f}" for n, s in zip(JOINT_NAMES, steps.max_step))
    )
    print(
        f"episodes: {len(saved)} saved, writer {'done' if written else 'NOT DONE'}, recorder phase {rec_status['phase']}, "
        f"lost {rec_status.get('lost_episodes', [])}; errors {rec_errors or 'none'}"
    )
    print(
        f"dataset: {n_eps} episodes, {frames} frames load with LeRobotDataset"
        if not load_error
        else f"dataset LOAD FAILED: {load_error}"
    )
    print("rss: " + "; ".join(rss.line(n) for n in ("daemon", "writer")) + f" (bound {args.rss_growth_mb_min} MB/min)")
    rss_ok = all(
        not rss.growth_mb_min(n) > args.rss_growth_mb_min for n in ("daemon", "writer")
    )  # nan (a soak shorter than the warm-up) does not fail it
    if not rss_ok:
        print("RSS GROWS above the bound")
    ok = (
        rss_ok
        and not crashed
        and not soak.unrecovered
        and steps.max_ratio <= 1.0 + 1e-9
        and not load_error
        and n_eps == len(saved)
        and written
        and not rec_errors
    )
    print("result: " + ("ok" if ok else f"FAILED {crashed}"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
