"""One command that checks the LeIsaac path on a GPU workstation (not part of ``make test``).

Needs Isaac Sim 5.1, Isaac Lab 2.3 and a LeIsaac 0.4 source checkout with its assets, plus
so101d's own environment. Run it with so101d's Python from this repository:

    .venv/bin/python bench/leisaac_workstation_check.py --leisaac ~/leisaac --isaac-python ~/miniconda3/envs/leisaac/bin/python [--seconds 30]

What it does, in a scratch directory (``--keep DIR`` keeps it):

1. starts the LeIsaac follower headless on LiftCube (``--task``) with ``--seed_hdf5``, in
   LeIsaac's Python, from this repository (as the README says), and waits until it serves;
2. runs the daemon on the virtual bench (``so101d demo``: emulated leader moving through its demo
   motion) with ``[follower] kind = "sim"`` for ``--seconds``, recording one episode; once a
   second it reads ``so101d status --json`` for the follower link (connected, losses);
3. stops the follower (SIGTERM: it closes the seed file) and reads its log line "served N steps
   in S s: X steps/s";
4. runs LeIsaac's ``scripts/mimic/eef_action_process.py --to_ik`` and ``annotate_demos.py --auto``
   on the seed file. ``--to_ik`` drops demos whose ``success`` is false, and the bench's demo
   motion is not made to lift the cube, so the check feeds them a scratch copy marked successful;
   annotate judges the replay with the task's own success term and says how many it exported.
   What the check looks at is that annotate reads every demo (its ``env.seed(int(episode.seed))``,
   ``reset_to(initial_state)`` and replay) and exits 0.

It prints steps per second (and the ratio to the task's step rate), the daemon's view of the sim
(link losses, the fraction of status reads with the sim fresh, the episode's staleness notes),
the episode and seed demo recorded, and annotate's verdict; exit 0 when everything passed.
``--follower-cmd`` replaces step 1's command (e.g. ``so101d sim-follower --backend mujoco --bind
{bind}``) to rehearse the daemon half anywhere; steps 3's rate line and 4 are then skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SERVING_RE = re.compile(r"serving at (\S+)")
SERVED_RE = re.compile(r"served (\d+) steps in ([\d.]+) s: ([\d.]+) steps/s \(step rate ([\d.]+) Hz\)")
EXPORTED_RE = re.compile(r"Exported (\d+) \(out of (\d+)\)")


def so101d(*args: str) -> list[str]:
    return [sys.executable, "-m", "daemon.apps.cli", *args]


def _toml_value(v: object) -> str:
    return json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def _toml_tables(data: dict, prefix: str = "") -> list[str]:
    out: list[str] = []
    plain = {k: v for k, v in data.items() if not isinstance(v, dict)}
    if prefix and plain:
        out.append(f"[{prefix}]")
    out += [f"{k} = {_toml_value(v)}" for k, v in plain.items()]
    for k, v in data.items():
        if isinstance(v, dict):
            out += _toml_tables(v, f"{prefix}.{k}" if prefix else k)
    return out


def write_bench_config(path: Path, endpoint: str, dataset_root: Path, cameras: tuple[str, ...]) -> None:
    """The virtual bench's configuration with the simulated follower and its cameras (sim cameras
    take the simulator's size: no width/height written)."""
    from daemon.config.settings import config_from_dict

    data = tomllib.loads((REPO / "daemon" / "configs" / "virtual_bench.toml").read_text())
    data["follower"] = {"kind": "sim", "id": "emulated_follower", "endpoint": endpoint, "stale_timeout_s": 0.1}
    data["recording"]["dataset_root"] = str(dataset_root)
    data["recording"]["repo_id"] = "local/leisaac-check"
    data["cameras"] = {name: {"kind": "sim"} for name in cameras}
    config_from_dict(data)  # refuse here, not inside the demo
    path.write_text("\n".join(_toml_tables(data)) + "\n")


def wait_for_line(log_path: Path, proc: subprocess.Popen[bytes], pattern: re.Pattern[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    ticker = threading.Event()
    while time.monotonic() < deadline:
        m = pattern.search(log_path.read_text(errors="replace"))
        if m:
            return m.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"the follower exited ({proc.returncode}) before serving:\n{tail(log_path)}")
        ticker.wait(1.0)
    raise RuntimeError(f"the follower did not serve within {timeout_s:.0f} s:\n{tail(log_path)}")


def tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def watch_status(socket: Path, stop: threading.Event, samples: list[dict]) -> None:
    while not stop.wait(1.0):
        out = subprocess.run(so101d("status", "--json", "--socket", str(socket)), capture_output=True, text=True)
        if out.returncode == 0:
            try:
                samples.append(json.loads(out.stdout))
            except json.JSONDecodeError:
                pass


def follower_view(samples: list[dict]) -> tuple[float, int]:
    """(fraction of status reads with the follower connected, link losses at the end)."""
    links = [s.get("follower") or {} for s in samples]
    links = [x for x in links if isinstance(x, dict) and "connected" in x]
    if not links:
        return 0.0, -1
    return sum(bool(x["connected"]) for x in links) / len(links), int(links[-1].get("losses", 0))


def run_leisaac(isaac_python: str, leisaac: Path, script: str, args: list[str], log_path: Path) -> int:
    with log_path.open("wb") as out:
        return subprocess.run(
            [isaac_python, script, *args], cwd=str(leisaac), stdout=out, stderr=subprocess.STDOUT, timeout=1800
        ).returncode


def check_annotate(isaac_python: str, leisaac: Path, seeds: Path, work: Path, task: str) -> tuple[bool, str]:
    import h5py

    judged = work / "seeds_marked_successful.hdf5"
    shutil.copy(seeds, judged)
    with h5py.File(judged, "a") as f:
        for g in f["data"].values():
            g.attrs["success"] = True  # --to_ik would drop it otherwise; annotate judges the replay itself
    processed, annotated = work / "processed_seeds.hdf5", work / "annotated_seeds.hdf5"
    rc = run_leisaac(
        isaac_python,
        leisaac,
        "scripts/mimic/eef_action_process.py",
        ["--input_file", str(judged), "--output_file", str(processed), "--to_ik", "--headless"],
        work / "eef_action_process.log",
    )
    if rc != 0:
        return False, f"eef_action_process.py --to_ik exited {rc}:\n{tail(work / 'eef_action_process.log')}"
    mimic_task = task.replace("-v0", "").removesuffix("-Mimic") + "-Mimic-v0"
    log_path = work / "annotate_demos.log"
    rc = run_leisaac(
        isaac_python,
        leisaac,
        "scripts/mimic/annotate_demos.py",
        [
            "--device",
            "cuda",
            "--task",
            mimic_task,
            "--input_file",
            str(processed),
            "--output_file",
            str(annotated),
            "--enable_cameras",
            "--auto",
            "--headless",
        ],
        log_path,
    )
    text = log_path.read_text(errors="replace")
    m = EXPORTED_RE.search(text)
    if rc != 0 or m is None:
        return False, f"annotate_demos.py exited {rc}:\n{tail(log_path)}"
    return True, f"annotate_demos.py read {m.group(2)} demo(s), exported {m.group(1)} after its success check"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leisaac", type=Path, help="the LeIsaac source checkout (for scripts/mimic)")
    ap.add_argument("--isaac-python", default="python", help="LeIsaac's Python (default: python on PATH)")
    ap.add_argument("--task", default="LeIsaac-SO101-LiftCube-v0")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the daemon runs (default %(default)s)")
    ap.add_argument("--port", type=int, default=5555)
    ap.add_argument("--startup-timeout", type=float, default=900.0, help="seconds for Isaac Sim to start")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR", help="work in DIR and keep it")
    ap.add_argument("--follower-cmd", default=None, help="replace the follower's command ({bind} is filled in)")
    args = ap.parse_args()
    if args.follower_cmd is None and args.leisaac is None:
        ap.error("--leisaac DIR is needed (or --follower-cmd to rehearse without LeIsaac)")
    if args.seconds < 15:
        ap.error("--seconds must be at least 15 (one episode of seconds - 10 s is recorded)")

    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="leisaac-check-"))
    work.mkdir(parents=True, exist_ok=True)
    bind = f"tcp://127.0.0.1:{args.port}"
    seeds = work / "seeds.hdf5"
    cameras = ("front",) if "LiftCube" in args.task else ("front", "wrist")  # LiftCube has no wrist camera
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if args.follower_cmd:
        cmd = shlex.split(args.follower_cmd.format(bind=bind))
    else:
        cmd = [
            args.isaac_python,
            "-m",
            "sim_bridge.leisaac_follower",
            "--task",
            args.task,
            "--bind",
            bind,
            "--enable_cameras",
            "--device",
            "cuda",
            "--headless",
            "--seed",
            "42",
            "--seed_hdf5",
            str(seeds),
        ]
    follower_log = work / "follower.log"
    results: list[tuple[str, bool, str]] = []
    with follower_log.open("wb") as out:
        follower = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        if args.follower_cmd is None:
            print(f"starting the LeIsaac follower ({args.task}); Isaac Sim takes a few minutes ...", flush=True)
            wait_for_line(follower_log, follower, SERVING_RE, args.startup_timeout)
        config = work / "bench.toml"
        write_bench_config(config, bind, work / "datasets", cameras)
        socket = work / "so101d.sock"
        samples: list[dict] = []
        stop = threading.Event()
        watcher = threading.Thread(target=watch_status, args=(socket, stop, samples), daemon=True)
        watcher.start()
        print(f"daemon on the virtual bench for {args.seconds:.0f} s, recording one episode ...", flush=True)
        demo = subprocess.run(
            so101d(
                "demo",
                "--config",
                str(config),
                "--dir",
                str(work / "bench"),
                "--socket",
                str(socket),
                "--duration",
                str(args.seconds),
                "--record",
                "1",
                "--episode-time",
                str(args.seconds - 10),
                "--quiet",
            ),
            cwd=str(REPO),
            capture_output=True,
            text=True,
        )
        stop.set()
        watcher.join()
        (work / "daemon.log").write_text(demo.stdout + demo.stderr)
        results.append(("daemon ran", demo.returncode == 0, f"exit {demo.returncode}; log {work / 'daemon.log'}"))
    finally:
        if follower.poll() is None:
            follower.send_signal(signal.SIGTERM)
            try:
                follower.wait(120)
            except subprocess.TimeoutExpired:
                follower.kill()
                follower.wait()

    fresh, losses = follower_view(samples)
    results.append(
        ("sim fresh for the daemon", fresh > 0.9 and losses == 0, f"{fresh:.0%} of status reads, {losses} link losses")
    )
    from daemon.data.schema import read_episode_tags

    ds = work / "datasets" / "leisaac-check"
    roots = [p.parent.parent for p in (work / "datasets").rglob("meta/info.json")]
    if roots:
        ds = roots[0]
        tags = read_episode_tags(ds)
        notes = [n for t in tags.values() for n in t.notes if "stale" in n or "back at" in n]
        results.append(("episode recorded", len(tags) >= 1, f"{len(tags)} in {ds}; staleness notes: {notes or 'none'}"))
    else:
        results.append(("episode recorded", False, f"no dataset under {work / 'datasets'}"))
    if args.follower_cmd is None:
        m = SERVED_RE.search(follower_log.read_text(errors="replace"))
        if m:
            rate, step_hz = float(m.group(3)), float(m.group(4))
            results.append(
                (
                    "steps/s at the step rate",
                    abs(rate / step_hz - 1) < 0.01,
                    f"{rate:.2f} steps/s, step rate {step_hz:.2f} Hz, ratio {rate / step_hz:.4f}",
                )
            )
        else:
            results.append(("steps/s at the step rate", False, f"no 'served' line in {follower_log}"))
        import h5py

        with h5py.File(seeds, "r") as f:
            demos = {name: dict(g.attrs) for name, g in f["data"].items()}
        has_seed = bool(demos) and all("seed" in a and int(a.get("num_samples", 0)) > 0 for a in demos.values())
        results.append(("seed demo recorded", has_seed, f"{seeds}: {demos}"))
        ok, detail = check_annotate(args.isaac_python, args.leisaac.expanduser(), seeds, work, args.task)
        results.append(("annotate_demos.py accepts the seed file", ok, detail))

    width = max(len(r[0]) for r in results)
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name:{width}s}  {detail}")
    print(f"work directory: {work}" + ("" if args.keep else " (removed)"))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(ok for _n, ok, _d in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
