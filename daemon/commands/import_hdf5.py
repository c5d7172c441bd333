"""`so101d import-hdf5`: append Isaac Lab / LeIsaac HDF5 demos to a LeRobot v3.0 dataset."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, help="LeIsaac / Isaac Lab HDF5 files (data/demo_N/...)")
    p.add_argument("--dataset", required=True, type=Path, help="dataset root (created if missing, else appended)")
    p.add_argument("--task", default="", help="task string for every imported episode")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--successful-only", dest="successful_only", action="store_true", default=True,
                     help="import only demos whose success attribute is true (default)")
    sel.add_argument("--all", dest="successful_only", action="store_false", help="import failed demos too (tagged)")
    p.add_argument("--skip-frames", type=int, default=0, metavar="K",
                   help="drop the first K sim steps of each demo (LeIsaac's recorder uses 5)")
    p.add_argument("--max-episodes", type=int, default=None, metavar="N", help="import at most N demos in all")
    p.add_argument("--step-hz", type=float, default=None,
                   help="sim step rate of the files (default: from their attributes, else 60)")
    p.add_argument("--fps", type=int, default=None, help="fps of a new dataset (default 30; an existing one keeps its own)")
    origin = p.add_mutually_exclusive_group()
    origin.add_argument("--generated", dest="generated", action="store_true", default=None,
                        help="tag the demos as Mimic-generated (default: guessed from the file name)")
    origin.add_argument("--human", dest="generated", action="store_false", help="tag the demos as human teleoperation")


def run(args: argparse.Namespace) -> int:
    from sim_bridge.isaaclab_hdf5 import HDF5FormatError, import_hdf5

    if args.skip_frames < 0 or (args.max_episodes is not None and args.max_episodes < 1):
        print("error: --skip-frames must be >= 0 and --max-episodes >= 1", file=sys.stderr)
        return 2
    try:
        s = import_hdf5(
            args.files, args.dataset, task=args.task, successful_only=args.successful_only,
            skip_frames=args.skip_frames, max_episodes=args.max_episodes, step_hz=args.step_hz,
            fps=args.fps, generated=args.generated, progress=print,
        )
    except HDF5FormatError as exc:
        print(f"error: {exc}\nnothing was written to {args.dataset}", file=sys.stderr)
        return 1
    print(
        f"imported {s.demos_imported} of {s.demos_seen} demos ({s.demos_skipped_failed} failed, "
        f"{s.demos_skipped_short} too short skipped): {s.frames_written} frames in {s.seconds:.1f} s "
        f"({s.frames_per_s:.0f} frames/s) -> {args.dataset}"
    )
    return 0
