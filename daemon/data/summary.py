"""What a dataset holds: LeRobot's totals, our tags counted by kind / origin / outcome / task /
bench, duration and size on disk, and tags an external edit lost (reported as lost, not zero)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from daemon.data.tags import tag_report

KINDS = ("real", "emulated", "sim", "generated")


def _tasks_by_episode(root: Path) -> dict[int, str]:
    import pyarrow.parquet as pq

    out: dict[int, str] = {}
    for path in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        t = pq.read_table(path, columns=["episode_index", "tasks"])
        for ep, tasks in zip(t.column("episode_index").to_pylist(), t.column("tasks").to_pylist()):
            out[int(ep)] = ", ".join(tasks or [])
    return out


def size_on_disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def dataset_summary(root: Path) -> dict[str, Any]:
    """Counts of real / emulated / sim / generated episodes (from our tags) plus LeRobot's totals."""
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.exists():
        raise FileNotFoundError(f"{root}: no LeRobot dataset here (meta/info.json missing)")
    info = json.loads(info_path.read_text())
    rep = tag_report(root)
    kinds = {k: 0 for k in KINDS} | {"untagged": len(rep.untagged)}
    by_origin: dict[str, int] = {}
    by_bench: dict[str, int] = {}
    outcome = {"success": 0, "failure": 0, "unknown": 0}
    for tag in rep.tags.values():
        kinds[tag.kind] += 1
        by_origin[tag.origin] = by_origin.get(tag.origin, 0) + 1
        if tag.bench:
            by_bench[tag.bench] = by_bench.get(tag.bench, 0) + 1
        outcome[tag.outcome()] += 1
    by_task: dict[str, int] = {}
    for task in _tasks_by_episode(root).values():
        by_task[task] = by_task.get(task, 0) + 1
    fps = info.get("fps") or 0
    frames = int(info.get("total_frames") or 0)
    return {
        "root": str(root),
        "fps": fps,
        "robot_type": info.get("robot_type"),
        "total_episodes": info.get("total_episodes"),
        "total_frames": frames,
        "duration_s": round(frames / fps, 2) if fps else None,
        "size_bytes": size_on_disk_bytes(root),
        "features": sorted(info.get("features", {})),
        "episodes_by_kind": kinds,
        "episodes_by_origin": by_origin,
        "episodes_by_outcome": outcome,
        "episodes_by_task": by_task,
        "episodes_by_bench": by_bench,
        # episodes of ours whose tags are gone (an external edit dropped them): never counted
        # as untagged or as failures
        "tags_lost": len(rep.lost),
        "tags_lost_episodes": rep.lost,
    }
