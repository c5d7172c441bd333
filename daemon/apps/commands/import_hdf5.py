"""`so101d import-hdf5`: append Isaac Lab / LeIsaac HDF5 demos to a LeRobot v3.0 dataset.

Defaults follow LeIsaac's own converter (scripts/convert/isaaclab2lerobot.py): empty demos
(initial_state only, num_samples = 0) skipped, demos without a success attribute treated as
failed, demos under 10 steps dropped, the first 5 steps of each demo skipped. Each rule can be
changed and every skip is counted in the summary. Progress is one bar (rate, ETA) on stderr, the
summary goes to stdout. A LeIsaac bi-arm file (``obs/left_joint_pos``, ``obs/right_joint_pos``,
12-wide actions) imports into a bimanual dataset (daemon/data/isaaclab_hdf5.py says how).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    from daemon.data.isaaclab_hdf5 import LEISAAC_MIN_FRAMES, LEISAAC_SKIP_FRAMES

    p.add_argument(
        "files",
        nargs="+",
        type=Path,
        help="LeIsaac / Isaac Lab HDF5 files (data/demo_N/...), one arm or LeIsaac's bi-arm tasks",
    )
    p.add_argument("--dataset", required=True, type=Path, help="dataset root (created if missing, else appended)")
    p.add_argument("--task", default="", help="task string for every imported episode")
    p.add_argument(
        "--no-check", action="store_true", help="skip the feasibility check of the imported episodes (dataset check)"
    )
    p.add_argument(
        "--config", type=Path, help="daemon configuration whose follower the feasibility check uses (default: defaults)"
    )
    sel = p.add_mutually_exclusive_group()
    sel.add_argument(
        "--successful-only",
        dest="successful_only",
        action="store_true",
        default=True,
        help="import only demos whose success attribute is true (default, like LeIsaac's converter)",
    )
    sel.add_argument(
        "--all",
        dest="successful_only",
        action="store_false",
        help="import failed and unjudged demos too (tagged with their outcome)",
    )
    p.add_argument(
        "--keep-unjudged",
        action="store_true",
        help="import demos that have no success attribute (LeIsaac's converter drops them as failed)",
    )
    p.add_argument(
        "--skip-frames",
        type=int,
        default=LEISAAC_SKIP_FRAMES,
        metavar="K",
        help="drop the first K sim steps of each demo (default %(default)s, as LeIsaac's converter)",
    )
    p.add_argument(
        "--min-frames",
        type=int,
        default=LEISAAC_MIN_FRAMES,
        metavar="N",
        help="drop demos with fewer than N sim steps (default %(default)s, as LeIsaac's converter)",
    )
    p.add_argument("--max-episodes", type=int, default=None, metavar="N", help="import at most N demos in all")
    p.add_argument(
        "--step-hz",
        type=float,
        default=None,
        help="sim step rate of the files (default: from their attributes, else 60)",
    )
    p.add_argument(
        "--fps", type=int, default=None, help="fps of a new dataset (default 30; an existing one keeps its own)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the summary is still printed)")
    origin = p.add_mutually_exclusive_group()
    origin.add_argument(
        "--generated",
        dest="generated",
        action="store_true",
        default=None,
        help="tag the demos as Mimic-generated (default: guessed from the file name)",
    )
    origin.add_argument("--human", dest="generated", action="store_false", help="tag the demos as human teleoperation")


class RichImportProgress:
    """One progress bar on stderr: demos done / total, frames per second, time left."""

    def __init__(self, label: str = "importing") -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("demos"),
            TextColumn("{task.fields[fps]:>6.0f} frames/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task: Any = None
        self._frames = 0
        self._t0 = 0.0

    def begin(self, demos: int, frames: int) -> None:
        import time

        self._t0 = time.monotonic()
        self._progress.start()
        self._task = self._progress.add_task("import", total=demos, fps=0.0)

    def advance(self, demos: int, frames: int) -> None:
        import time

        self._frames += frames
        rate = self._frames / max(time.monotonic() - self._t0, 1e-9)
        self._progress.update(self._task, advance=demos, fps=rate)

    def end(self) -> None:
        self._progress.stop()


def format_summary(s: Any, dataset: Path) -> str:
    """The import's summary: what was imported and every reason a demo was not."""
    skipped = [
        (s.demos_skipped_empty, "empty (initial_state only, num_samples = 0)"),
        (s.demos_skipped_failed, "failed (success = false)"),
        (s.demos_skipped_unjudged, "without a success attribute (counted as failed; --keep-unjudged imports them)"),
        (s.demos_skipped_short, f"shorter than {s.min_frames} steps"),
        (s.demos_not_selected, "beyond --max-episodes"),
    ]
    lines = [
        f"imported {s.demos_imported} of {s.demos_seen} demos -> {dataset}: {s.frames_written} frames "
        f"in {s.seconds:.1f} s ({s.frames_per_s:.0f} frames/s)"
    ]
    lines += [f"  skipped {n} {why}" for n, why in skipped if n]
    if s.demos_skipped_damaged:
        lines.append(
            f"  skipped {len(s.demos_skipped_damaged)} damaged (left in the file as they are; the others imported):"
        )
        lines += [f"    {where}" for where in s.demos_skipped_damaged]
    if s.demos_actions_from_joint_targets:
        lines.append(
            f"  {s.demos_actions_from_joint_targets} demos hold Mimic's 8-D end-effector actions: their action is "
            "obs/joint_pos_target (what eef_action_process.py --to_joint makes)"
        )
    if s.demos_imported:
        lines.append(f"  first {s.skip_frames} steps of each demo skipped (--skip-frames)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from daemon.data.isaaclab_hdf5 import HDF5FormatError, import_hdf5

    if args.skip_frames < 0 or args.min_frames < 0 or (args.max_episodes is not None and args.max_episodes < 1):
        print("error: --skip-frames and --min-frames must be >= 0 and --max-episodes >= 1", file=sys.stderr)
        return 2
    progress = None if args.no_progress else RichImportProgress()
    before = _total_episodes(args.dataset)
    try:
        s = import_hdf5(
            args.files,
            args.dataset,
            task=args.task,
            successful_only=args.successful_only,
            skip_frames=args.skip_frames,
            max_episodes=args.max_episodes,
            step_hz=args.step_hz,
            fps=args.fps,
            generated=args.generated,
            progress=progress,
            min_frames=args.min_frames,
            keep_unjudged=args.keep_unjudged or not args.successful_only,
        )
    except HDF5FormatError as exc:
        print(f"error: {exc}\nnothing was written to {args.dataset}", file=sys.stderr)
        return 1
    print(format_summary(s, args.dataset))
    if not args.no_check and s.demos_imported:
        return report_feasibility(args, before)
    return 0


def report_feasibility(args: argparse.Namespace, before: int) -> int:
    """`dataset check`'s feasibility findings for the episodes just imported (what the real arm
    cannot do: too fast, past a limit, a jump, a gripper excursion)."""
    from daemon.data.check import check_dataset, feasibility_limits

    try:
        limits = feasibility_limits(args.config, args.dataset)
        total = _total_episodes(args.dataset)
        reports = check_dataset(args.dataset, limits=limits, episodes=set(range(before, total)))
    except (FileNotFoundError, ValueError, KeyError, OSError) as exc:
        print(f"error: the feasibility check did not run: {exc}", file=sys.stderr)
        return 1
    feasibility = ("jump:", "speed:", "step limit:", "range:", "gripper: command", "gripper: commanded")
    found = [(r.episode_index, w) for r in reports for w in r.reasons if w.startswith(feasibility)]
    episodes = sorted({e for e, _ in found})
    print(
        f"feasibility ({limits.model.upper()} at {limits.supply_voltage_v:g} V): "
        + (f"{len(episodes)} of {len(reports)} imported episodes ask what the arm cannot do" if found else "all clean")
    )
    for e, why in found:
        print(f"  episode {e}: {why}")
    if found:
        print(f"  (`so101d dataset check {args.dataset} --tag` writes these into the episodes' tags)")
    return 0


def _total_episodes(root: Path) -> int:
    import json

    info = root / "meta" / "info.json"
    return int(json.loads(info.read_text()).get("total_episodes", 0)) if info.exists() else 0
