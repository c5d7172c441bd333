"""`so101d dataset ACTION`: look at, check and edit LeRobot datasets.

- ``info ROOT``: what a dataset holds (kinds real / emulated / sim / generated, origins, outcomes,
  tasks, benches, duration, size) and how to load it.
- ``check ROOT``: per-episode quality report; ``--episodes-for-training`` prints the clean list.
- ``delete | keep ROOT EPISODES``, ``split ROOT --out DIR NAME=EPISODES|FRACTION ...``,
  ``merge A B ... --out C``, ``retag ROOT EPISODES --success|--failure|--unjudged``: LeRobot's own
  editing code, refused while a daemon records the dataset (daemon/data/edit.py).
- ``pack ROOT``: repack a one-file-per-episode dataset into LeRobot's packed layout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EPISODES_HELP = "episodes: '3', '0-4', '1,3,7-9'"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    info = sub.add_parser("info", help="summary of a dataset (kind, origin, outcome, task, bench, duration, size)")
    info.add_argument("root", type=Path)
    info.add_argument("--json", action="store_true", help="machine-readable output")
    pack = sub.add_parser(
        "pack", help="repack into LeRobot v3's packed files (crash-safe: new files beside, swapped in at the end)"
    )
    pack.add_argument("root", type=Path)
    for name, what in (("delete", "delete these episodes"), ("keep", "keep only these episodes")):
        e = sub.add_parser(name, help=f"{what} (LeRobot's delete_episodes); in place unless --out")
        e.add_argument("root", type=Path)
        e.add_argument("episodes", help=EPISODES_HELP)
        e.add_argument("--out", type=Path, help="write the result here instead (the source stays as it is)")
    sp = sub.add_parser("split", help="split into datasets OUT/NAME (LeRobot's split_dataset)")
    sp.add_argument("root", type=Path)
    sp.add_argument("splits", nargs="+", help="NAME=EPISODES (train=0-7) or NAME=FRACTION (train=0.8)")
    sp.add_argument("--out", type=Path, required=True, help="folder for the splits")
    m = sub.add_parser("merge", help="merge datasets into a new one (LeRobot's aggregate_datasets), tags kept")
    m.add_argument("roots", type=Path, nargs="+")
    m.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("retag", help="set the verdict of episodes")
    r.add_argument("root", type=Path)
    r.add_argument("episodes", help=EPISODES_HELP)
    verdict = r.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--success", dest="verdict", action="store_const", const=True)
    verdict.add_argument("--failure", dest="verdict", action="store_const", const=False)
    verdict.add_argument("--unjudged", dest="verdict", action="store_const", const="none")
    from daemon.data.check import add_check_arguments

    add_check_arguments(sub.add_parser("check", help="per-episode quality report before training"))


def _err(exc: BaseException) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    if args.action == "pack":
        return run_pack(args)
    if args.action == "info":
        return run_info(args)
    if args.action == "check":
        from daemon.data.check import run_check

        return run_check(args)
    return run_edit(args)


def _total(root: Path) -> int:
    info = Path(root) / "meta" / "info.json"
    if not info.exists():
        raise FileNotFoundError(f"{root}: no LeRobot dataset here (meta/info.json missing)")
    return int(json.loads(info.read_text()).get("total_episodes", 0))


def _episodes(sel: str, root: Path) -> list[int]:
    from daemon.data.isaaclab_hdf5 import parse_episode_selection

    return parse_episode_selection(sel, _total(root))


def _splits(items: list[str], root: Path) -> dict[str, list[int] | float]:
    out: dict[str, list[int] | float] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"bad split {item!r}: use NAME=EPISODES (train=0-7) or NAME=FRACTION (train=0.8)")
        out[name] = float(value) if "." in value else _episodes(value, root)
    return out


def run_edit(args: argparse.Namespace) -> int:
    from daemon.data import edit
    from daemon.data.store import DatasetBusyError

    try:
        if args.action in ("delete", "keep"):
            fn = edit.delete if args.action == "delete" else edit.keep
            res = fn(args.root, _episodes(args.episodes, args.root), args.out)
            print(f"{res.out}: {res.episodes} episodes")
            if res.backup:
                print(f"previous version kept at {res.backup}")
        elif args.action == "split":
            for name, sres in edit.split(args.root, _splits(args.splits, args.root), args.out).items():
                print(f"{name}: {sres.out} ({sres.episodes} episodes)")
        elif args.action == "merge":
            res = edit.merge(args.roots, args.out)
            print(f"{res.out}: {res.episodes} episodes from {len(args.roots)} datasets")
        elif args.action == "retag":
            success = None if args.verdict == "none" else args.verdict
            tags = edit.retag(args.root, _episodes(args.episodes, args.root), success)
            print(f"retagged {len(tags)} episodes: {tags[0].outcome()}")
    except (FileNotFoundError, ValueError, DatasetBusyError) as exc:
        return _err(exc)
    return 0


def run_info(args: argparse.Namespace) -> int:
    from daemon.data.demo_session import how_to_load
    from daemon.data.summary import dataset_summary

    try:
        s = dataset_summary(args.root)
    except (FileNotFoundError, ValueError) as exc:
        return _err(exc)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print("\n".join(info_lines(s)))
    print(how_to_load(str(Path(s["root"]).resolve()), f"local/{Path(s['root']).resolve().name}"))
    return 0


def _counts(d: dict[str, int]) -> str:
    return "   ".join(f"{name} {n}" for name, n in sorted(d.items())) or "-"


def info_lines(s: dict[str, Any]) -> list[str]:
    k, o = s["episodes_by_kind"], s["episodes_by_outcome"]
    duration = s["duration_s"]
    lines = [
        f"dataset      {s['root']}",
        f"robot_type   {s['robot_type']}   fps {s['fps']}",
        f"episodes     {s['total_episodes']}   frames {s['total_frames']}"
        + (f"   duration {_duration(duration)}" if duration is not None else "")
        + f"   size {s['size_bytes'] / 1e6:.1f} MB",
    ]
    if s["tags_lost"] and s["tags_lost"] == s["total_episodes"]:
        # nothing to count: saying "success 0" would answer what isn't so
        lines.append(f"tags lost by an external edit: {s['tags_lost']} episodes (every episode)")
    else:
        lines += [
            f"by kind      real {k['real']}   emulated {k['emulated']}   sim {k['sim']}   "
            f"generated {k['generated']}   untagged {k['untagged']}",
            f"by origin    {_counts(s['episodes_by_origin'])}",
            f"by outcome   success {o['success']}   failure {o['failure']}   unjudged {o['unknown']}",
            f"by bench     {_counts(s['episodes_by_bench'])}",
        ]
        if s["tags_lost"]:
            lines.append(
                f"tags lost by an external edit: {s['tags_lost']} episodes "
                f"({_short_list(s['tags_lost_episodes'])}), not counted above"
            )
    lines.append("by task      " + "   ".join(f"{t!r} {n}" for t, n in sorted(s["episodes_by_task"].items())))
    lines.append(f"features     {', '.join(s['features'])}")
    return lines


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _short_list(eps: list[int]) -> str:
    return ", ".join(map(str, eps[:10])) + (" ..." if len(eps) > 10 else "")


def run_pack(args: argparse.Namespace) -> int:
    from daemon.data.repack import pack
    from daemon.data.store import DatasetBusyError

    try:
        s = pack(args.root, log=lambda msg: print(msg, file=sys.stderr))
    except (FileNotFoundError, ValueError, DatasetBusyError) as exc:
        return _err(exc)
    print(f"packed {s['episodes']} episodes: {s['files_before']} files -> {s['files_after']} ({s['seconds']} s)")
    return 0
