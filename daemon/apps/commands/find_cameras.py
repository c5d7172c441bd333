"""`so101d find-cameras`: every camera plugged in, what it offers, a snapshot each, and the
[cameras.*] block to paste into so101d.toml.

    so101d find-cameras                   # text; snapshots in ./camera-snapshots/
    so101d find-cameras --json            # the same for a program
    so101d find-cameras --no-snapshot     # do not open the cameras (one is in use by the daemon)

Exit status 0 when at least one usable camera was found, 1 when none was (a node that neither
tells its modes nor opens is listed with why, without a block to paste).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from drivers.camera_discovery import (
    FoundCamera,
    config_block,
    dangling_by_id,
    find_video_nodes,
    open_default,
    suggested_mode,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument(
        "--snapshots", default="camera-snapshots", help="folder for one PNG per camera (default ./camera-snapshots)"
    )
    p.add_argument("--no-snapshot", action="store_true", help="do not open the cameras (no snapshot, no default mode)")
    p.add_argument("--dev", default="/dev", help=argparse.SUPPRESS)  # another /dev tree (tests)
    p.add_argument("--sys", default="/sys", help=argparse.SUPPRESS)


def _modes_text(cam: FoundCamera) -> list[str]:
    if cam.modes_error:
        return [f"  modes: not readable ({cam.modes_error})"]
    by_format: dict[str, list[str]] = {}
    for m in cam.modes:
        rates = "/".join(f"{r:g}" for r in m.fps) or "?"
        by_format.setdefault(m.fourcc, []).append(f"{m.width}x{m.height}@{rates}")
    return [f"  {fourcc}: {', '.join(sizes)}" for fourcc, sizes in by_format.items()]


def _table_names(cams: list[FoundCamera]) -> list[str]:
    base = ["front", "wrist", "top", "side"]
    return [base[i] if i < len(base) else f"cam{i}" for i in range(len(cams))]


def run(args: argparse.Namespace) -> int:
    cams = find_video_nodes(Path(args.dev), Path(args.sys))
    snapshots = None if args.no_snapshot else Path(args.snapshots)
    if not args.no_snapshot:
        for cam in cams:
            open_default(cam, snapshots)
    dangling = dangling_by_id(Path(args.dev))
    usable = [cam for cam in cams if not cam.unusable()]
    names = dict(zip((id(cam) for cam in usable), _table_names(usable)))
    if args.json:
        out = [
            asdict(cam)
            | {
                "usable": not cam.unusable(),
                "problem": cam.unusable(),
                "suggested": suggested_mode(cam) if not cam.unusable() else None,
                "config": config_block(names[id(cam)], cam) if not cam.unusable() else "",
            }
            for cam in cams
        ]
        print(json.dumps({"cameras": out, "dangling_by_id": dangling}, indent=2))
        return 0 if usable else 1
    for link in dangling:
        print(f"{link}: a by-id link to nothing (that camera is unplugged, or its node is gone)")
    if not cams:
        print(f"no camera found (no {Path(args.dev) / 'video*'}); is it plugged in? (`lsusb`, `dmesg | tail`)")
        return 1
    for cam in cams:
        print(f"{cam.name}")
        print(f"  path: {cam.device}" + (f"  (now {cam.video_node})" if cam.by_id else "  (no by-id link)"))
        print(*_modes_text(cam), sep="\n")
        if cam.default:
            d = cam.default
            print(f"  opens at: {d['width']}x{d['height']} {d['fourcc'] or '?'} @ {d['fps']:g} fps")
        if cam.snapshot:
            print(f"  snapshot: {cam.snapshot}")
        if cam.snapshot_error:
            print(f"  snapshot: none ({cam.snapshot_error})")
        if cam.unusable():
            print("  not usable as a camera: no block to paste")
        print()
    if not usable:
        print(f"no usable camera: {len(cams)} video node(s), none tells its modes or opens (see above)")
        return 1
    print("# paste into so101d.toml (rename the tables; `so101d doctor` checks the USB bandwidth):")
    for cam in usable:
        print(config_block(names[id(cam)], cam))
        print()
    return 0
