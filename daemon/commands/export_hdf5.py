"""`so101d export-hdf5`: write dataset episodes as LeIsaac-style HDF5 seed demos for Isaac Lab Mimic."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, type=Path, help="dataset root")
    p.add_argument("--episodes", default="all", help="'all', '3', '0-4' or '1,3,7-9' (default all)")
    p.add_argument("--out", required=True, type=Path, help="output .hdf5 file")
    p.add_argument("--env-name", default="LeIsaac-SO101-PickOrange-v0", help="env_name stored in env_args")
    p.add_argument("--step-hz", type=float, default=60.0, help="sim step rate to write at (default 60)")


def run(args: argparse.Namespace) -> int:
    from sim_bridge.isaaclab_hdf5 import export_hdf5

    try:
        n = export_hdf5(args.dataset, args.episodes, args.out, env_name=args.env_name, step_hz=args.step_hz, progress=print)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {n} demo(s) to {args.out}")
    return 0
