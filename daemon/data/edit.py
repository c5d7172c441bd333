"""`so101d dataset delete | keep | split | merge | retag`: LeRobot's own editing code, made safe for
a dataset a daemon may be recording into, with our tags and timing files carried along.

- The edits themselves are LeRobot 0.6.1's: ``dataset_tools.delete_episodes`` and
  ``split_dataset``, ``aggregate.aggregate_datasets`` (what ``merge_datasets`` wraps). Retag has no
  LeRobot counterpart; it rewrites the tag column (daemon/data/tags.py).
- Each takes the dataset's owner lock first (DatasetStore.take_ownership, the lock a recording
  daemon holds), so it is refused while a daemon records that dataset, and a daemon started during
  the edit is refused instead.
- A dataset from before the tag column is migrated first (once, lossless), so its tags ride along.
- Output is written to a hidden folder beside the target and renamed into place at the end: a
  failure leaves the source untouched and no half dataset. In place (no ``out``): the result
  replaces the source only once complete, and the previous version is kept beside it
  (``<name>.before-<operation>-<time>``), as LeRobot's own tool keeps ``<name>_old``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.data.schema import (
    EPISODE_TAGS_FILE,
    LEROBOT_AUTO_KEYS,
    OPTIONAL_KEYS,
    EpisodeTag,
    read_episode_tags,
)
from daemon.data.store import TIMING_DIR, DatasetStore, StoreConfig
from daemon.data.tags import migrate_sidecar_tags, write_tags

log = logging.getLogger("so101d.datasets.edit")


class EditError(ValueError):
    """An edit that cannot be done; the message says why (nothing was changed)."""


@contextmanager
def owned(root: Path) -> Iterator[None]:
    """Hold the dataset's owner lock (refused while a daemon records it) and migrate its tags."""
    root = Path(root).resolve()
    if not (root / "meta" / "info.json").exists():
        raise EditError(f"{root}: no LeRobot dataset here (meta/info.json missing)")
    store = DatasetStore(StoreConfig(root=str(root)))
    store.take_ownership(wait_s=0.0)  # DatasetBusyError while a daemon records it
    try:
        note = migrate_sidecar_tags(root)
        if note:
            log.info("%s: %s", root, note)
        yield
    finally:
        store.release_ownership()


def repo_id_of(root: Path) -> str:
    return f"local/{Path(root).name}"


def _total(root: Path) -> int:
    return int(json.loads((Path(root) / "meta" / "info.json").read_text()).get("total_episodes", 0))


def _partial(target: Path) -> Path:
    return target.parent / f".{target.name}.so101d-partial"


def _finish(partial: Path, target: Path, in_place: bool, operation: str) -> Path | None:
    """Move a complete result into place; in place, the old version is kept beside. Returns it."""
    backup = None
    if in_place:
        backup = target.parent / f"{target.name}.before-{operation}-{time.strftime('%Y%m%dT%H%M%S')}"
        os.replace(target, backup)
    os.replace(partial, target)
    return backup


def _write_sidecar(root: Path, tags: dict[int, EpisodeTag]) -> None:
    """The plain-text index of the tags (from the tag column), one line per episode."""
    from dataclasses import asdict

    path = root / EPISODE_TAGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(t), sort_keys=True) + "\n" for _, t in sorted(tags.items())))


def _copy_timing(src: Path, dst: Path, mapping: dict[int, int]) -> None:
    """Our per-frame timing files follow their episodes (old index -> new index)."""
    for old, new in mapping.items():
        f = src / TIMING_DIR / f"episode_{old:06d}.npz"
        if f.exists():
            (dst / TIMING_DIR).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dst / TIMING_DIR / f"episode_{new:06d}.npz")


def _load(root: Path) -> Any:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(repo_id_of(root), root=root, video_backend="pyav")


def _check_target(target: Path) -> None:
    if target.exists():
        raise EditError(f"{target} exists already: choose a new --out")


@dataclass
class EditResult:
    out: Path
    episodes: int
    backup: Path | None = None


def delete(root: Path, episodes: list[int], out: Path | None = None) -> EditResult:
    """LeRobot's delete_episodes, into ``out`` (or in place)."""
    from lerobot.datasets.dataset_tools import delete_episodes

    root = Path(root).resolve()
    target = Path(out).resolve() if out else root
    if out:
        _check_target(target)
    with owned(root):
        total = _total(root)
        bad = [e for e in episodes if not 0 <= e < total]
        if bad:
            raise EditError(f"episodes {bad} do not exist (dataset has {total})")
        keep = [e for e in range(total) if e not in set(episodes)]
        if not keep:
            raise EditError("that would delete every episode; delete the folder instead")
        partial = _partial(target)
        shutil.rmtree(partial, ignore_errors=True)
        try:
            delete_episodes(
                _load(root), episode_indices=sorted(set(episodes)), output_dir=partial, repo_id=repo_id_of(target)
            )
            _copy_timing(root, partial, {old: new for new, old in enumerate(keep)})
            _write_sidecar(partial, read_episode_tags(partial))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        backup = _finish(partial, target, in_place=out is None, operation="delete")
    return EditResult(target, len(keep), backup)


def keep(root: Path, episodes: list[int], out: Path | None = None) -> EditResult:
    total = _total(root)
    return delete(root, [e for e in range(total) if e not in set(episodes)], out)


def split(root: Path, splits: dict[str, list[int] | float], out_dir: Path) -> dict[str, EditResult]:
    """LeRobot's split_dataset into ``out_dir/<name>`` per split."""
    from lerobot.datasets.dataset_tools import _fractions_to_episode_indices, split_dataset

    root = Path(root).resolve()
    out_dir = Path(out_dir).resolve()
    for name in splits:
        _check_target(out_dir / name)
    with owned(root):
        total = _total(root)
        if all(isinstance(v, float) for v in splits.values()):
            resolved: dict[str, list[int]] = _fractions_to_episode_indices(total, splits)
        elif any(isinstance(v, float) for v in splits.values()):
            raise EditError("give every split as a fraction, or every split as episodes, not a mix")
        else:
            resolved = {k: sorted(v) for k, v in splits.items() if isinstance(v, list)}
        seen: set[int] = set()
        for name, eps in resolved.items():
            if not eps:
                raise EditError(f"split {name!r} has no episodes")
            if seen & set(eps):
                raise EditError(f"episodes {sorted(seen & set(eps))} are in more than one split")
            bad = [e for e in eps if not 0 <= e < total]
            if bad:
                raise EditError(f"episodes {bad} do not exist (dataset has {total})")
            seen |= set(eps)
        partial = _partial(out_dir)
        shutil.rmtree(partial, ignore_errors=True)
        try:
            split_dataset(_load(root), splits=resolved, output_dir=partial)
            for name, eps in resolved.items():
                _copy_timing(root, partial / name, {old: new for new, old in enumerate(sorted(eps))})
                _write_sidecar(partial / name, read_episode_tags(partial / name))
            out_dir.mkdir(parents=True, exist_ok=True)
            results = {}
            for name, eps in resolved.items():
                os.replace(partial / name, out_dir / name)
                results[name] = EditResult(out_dir / name, len(eps))
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return results


def schema_differences(roots: list[Path]) -> list[str]:
    """What stops these datasets from being one (fps, robot type, features): readable, all of
    it, before anything is written (LeRobot's aggregate would stop at the first with a dump)."""
    infos = [json.loads((Path(r) / "meta" / "info.json").read_text()) for r in roots]
    first, diffs = infos[0], []
    for root, info in zip(roots[1:], infos[1:]):
        label = f"{root} vs {roots[0]}"
        if info.get("fps") != first.get("fps"):
            diffs.append(f"{label}: fps {info.get('fps')} vs {first.get('fps')}")
        if info.get("robot_type") != first.get("robot_type"):
            diffs.append(f"{label}: robot_type {info.get('robot_type')!r} vs {first.get('robot_type')!r}")
        a = {k: v for k, v in first["features"].items() if k not in LEROBOT_AUTO_KEYS}
        b = {k: v for k, v in info["features"].items() if k not in LEROBOT_AUTO_KEYS}
        for key in sorted(set(a) | set(b)):
            if key in OPTIONAL_KEYS and (key not in a or key not in b):
                older = root if key not in b else roots[0]
                diffs.append(
                    f"{label}: {older} was recorded before so101d wrote the per-frame {key!r} column, "
                    "and LeRobot merges only datasets of the same features: merge it with datasets of "
                    "its own age, or record on into it (new episodes keep its features)"
                )
            elif key not in b:
                diffs.append(f"{label}: feature {key!r} is missing in {root}")
            elif key not in a:
                diffs.append(f"{label}: feature {key!r} is only in {root}")
            else:
                for attr in ("dtype", "shape", "names"):
                    va, vb = a[key].get(attr), b[key].get(attr)
                    if attr == "shape":
                        va, vb = tuple(va or ()), tuple(vb or ())
                    if va != vb and not (attr == "names" and a[key].get("dtype") == "video"):
                        diffs.append(f"{label}: {key} {attr} {vb!r} vs {va!r}")
    return diffs


def merge(roots: list[Path], out: Path) -> EditResult:
    """LeRobot's aggregate_datasets (what merge_datasets and `lerobot-edit-dataset merge` run)."""
    from lerobot.datasets.aggregate import aggregate_datasets

    roots = [Path(r).resolve() for r in roots]
    out = Path(out).resolve()
    if len(roots) < 2:
        raise EditError("merge needs two datasets or more")
    if len(set(roots)) != len(roots):
        raise EditError("the same dataset is given twice")
    _check_target(out)
    with ExitStack() as stack:
        for r in roots:
            stack.enter_context(owned(r))
        diffs = schema_differences(roots)
        if diffs:
            raise EditError("these datasets cannot be merged:\n  " + "\n  ".join(diffs))
        partial = _partial(out)
        shutil.rmtree(partial, ignore_errors=True)
        try:
            aggregate_datasets(
                repo_ids=[repo_id_of(r) for r in roots], aggr_repo_id=repo_id_of(out), roots=roots, aggr_root=partial
            )
            offset = 0
            for r in roots:
                n = _total(r)
                _copy_timing(r, partial, {i: offset + i for i in range(n)})
                offset += n
            _write_sidecar(partial, read_episode_tags(partial))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        _finish(partial, out, in_place=False, operation="merge")
    return EditResult(out, offset)


def retag(root: Path, episodes: list[int], success: bool | None) -> list[EpisodeTag]:
    """A new verdict for the given episodes, in the tag column and the sidecar."""
    root = Path(root).resolve()
    with owned(root):
        tags = read_episode_tags(root)
        missing = [e for e in episodes if e not in tags]
        if missing:
            raise EditError(f"episodes {missing} have no tag to change (not recorded by so101d, or lost)")
        changed = []
        for e in episodes:
            t = tags[e]
            t.success = success
            t.notes = [*t.notes, f"retagged {'unjudged' if success is None else 'success' if success else 'failure'}"]
            changed.append(t)
        write_tags(root, changed)
    return changed
