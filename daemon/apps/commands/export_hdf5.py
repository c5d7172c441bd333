"""`so101d export-hdf5`: dataset episodes as Isaac Lab Mimic seed demos, when they can be.

A seed demo needs the scene state a LeRobot dataset does not keep (every articulation's and
object's pose at the start, for ``env.reset_to``) and the seed its episode ran with. Episodes imported from LeIsaac / Isaac Lab HDF5
demos are exported by copying their source demo; anything else (real arm, MuJoCo, live LeIsaac
episodes) is refused with the reason and what to do: record seeds with the LeIsaac follower's
``--seed_hdf5 FILE``. The file holds joint actions: LeIsaac's ``eef_action_process.py --to_ik``
turns them into Mimic's end-effector actions before ``annotate_demos.py``. A bimanual dataset's
episodes imported from LeIsaac bi-arm demos export as those demos (12-wide actions, both arms'
initial state), for LeIsaac's ``replay.py`` on the bi-arm task.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, type=Path, help="dataset root")
    p.add_argument("--episodes", default="all", help="'all', '3', '0-4' or '1,3,7-9' (default all)")
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        help="output .hdf5 file (joint actions: run LeIsaac's eef_action_process.py --to_ik on it before annotate_demos.py)",
    )


def run(args: argparse.Namespace) -> int:
    from daemon.data.isaaclab_hdf5 import export_hdf5

    try:
        n = export_hdf5(args.dataset, args.episodes, args.out, progress=print)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}\nnothing was written to {args.out}", file=sys.stderr)
        return 1
    from daemon.data.isaaclab_hdf5 import dataset_arms_at, next_steps

    arms = dataset_arms_at(args.dataset)
    print(f"wrote {n} {'bi-arm' if arms else 'seed'} demo(s) to {args.out}")
    print("next: " + next_steps(arms).replace("FILE", str(args.out)))
    return 0
