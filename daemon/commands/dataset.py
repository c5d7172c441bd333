"""`so101d dataset info ROOT`: what a dataset holds, with its real / sim / generated mix.
`so101d dataset pack ROOT`: repack a one-file-per-episode dataset into LeRobot's packed layout."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    info = sub.add_parser("info", help="summary of a dataset (episodes by kind, origin and outcome)")
    info.add_argument("root", type=Path)
    info.add_argument("--json", action="store_true", help="machine-readable output")
    pack = sub.add_parser(
        "pack", help="repack into LeRobot v3's packed files (crash-safe: new files beside, swapped in at the end)"
    )
    pack.add_argument("root", type=Path)


def run(args: argparse.Namespace) -> int:
    if args.action == "pack":
        return run_pack(args)
    from daemon.datasets.isaaclab_hdf5 import dataset_summary

    try:
        s = dataset_summary(args.root)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    k, o = s["episodes_by_kind"], s["episodes_by_outcome"]
    print(f"dataset      {s['root']}")
    print(f"robot_type   {s['robot_type']}   fps {s['fps']}")
    print(f"episodes     {s['total_episodes']}   frames {s['total_frames']}")
    print(f"by kind      real {k['real']}   sim {k['sim']}   generated {k['generated']}   untagged {k['untagged']}")
    print("by origin    " + "   ".join(f"{name} {n}" for name, n in sorted(s["episodes_by_origin"].items())))
    print(f"by outcome   success {o['success']}   failure {o['failure']}   unjudged {o['unknown']}")
    print(f"features     {', '.join(s['features'])}")
    return 0


def run_pack(args: argparse.Namespace) -> int:
    from daemon.recording.repack import pack
    from daemon.recording.store import DatasetBusyError

    try:
        s = pack(args.root, log=lambda msg: print(msg, file=sys.stderr))
    except (FileNotFoundError, ValueError, DatasetBusyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"packed {s['episodes']} episodes: {s['files_before']} files -> {s['files_after']} ({s['seconds']} s)")
    return 0
