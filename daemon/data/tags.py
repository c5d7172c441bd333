"""Episode tags in the data table: migration of sidecar-only datasets, rewriting tags (retag), and
telling tags that are gone from tags never written.

Why the tag column (dataset_schema.TAG_KEY) and not the sidecar: LeRobot 0.6.1's own editing tools
carry data columns through delete, split and merge and drop everything else of ours (see
dataset_schema's docstring and tests/test_dataset_tags.py). A dataset recorded before the column
existed is migrated once, on open, by ``migrate_sidecar_tags``: each data file is rewritten beside
with the column added (one row group per source row group, as the store appends them), the files
are renamed in, info.json last. A crash between the renames leaves files that already have the
column; the next open finishes the job (files with the column are skipped).

Callers hold the dataset's owner lock (DatasetStore.take_ownership): nothing else writes then.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.data.schema import (
    TAG_KEY,
    TELEOP_ACTION_KEY,
    EpisodeTag,
    has_tag_column,
    read_column_tags,
    read_sidecar_tags,
    tag_feature,
    tag_to_cell,
)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_info(root: Path, info: dict[str, Any]) -> None:
    path = root / "meta" / "info.json"
    tmp = path.with_name("info.json.tmp")
    tmp.write_text(json.dumps(info, indent=4))
    _fsync_path(tmp)
    os.replace(tmp, path)
    _fsync_path(path.parent)


def _episode_lengths(root: Path) -> dict[int, int]:
    """LeRobot's own episode lengths, from meta/episodes (the table LeRobot's tools rewrite)."""
    import pyarrow.parquet as pq

    lengths: dict[int, int] = {}
    for path in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        t = pq.read_table(path, columns=["episode_index", "length"])
        for ep, n in zip(t.column("episode_index").to_pylist(), t.column("length").to_pylist()):
            lengths[int(ep)] = int(n)
    return lengths


def sidecar_tags_that_fit(root: Path) -> dict[int, EpisodeTag]:
    """The sidecar's tags that still describe the dataset's episodes (same index, same length).

    A sidecar copied along after an external edit renumbered the episodes describes other
    episodes; those tags are not used (they would answer what isn't so)."""
    lengths = _episode_lengths(root)
    return {
        i: t for i, t in read_sidecar_tags(root).items() if i in lengths and (t.frames == 0 or t.frames == lengths[i])
    }


def _rewrite_data_files(root: Path, features: dict[str, Any], cell_of: dict[int, str]) -> int:
    """Every data file with the tag column set from ``cell_of`` (episode index -> cell; others
    keep theirs, or "" where they have none): written beside, then renamed in. Returns files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lerobot.datasets.feature_utils import get_hf_features_from_features

    schema = get_hf_features_from_features(features).arrow_schema
    planned: list[tuple[Path, Path]] = []
    try:
        for path in sorted((root / "data").glob("chunk-*/file-*.parquet")):
            pf = pq.ParquetFile(path)
            has_column = TAG_KEY in pf.schema_arrow.names
            episodes_here = set(pq.read_table(path, columns=["episode_index"]).column(0).to_pylist())
            if has_column and not episodes_here & set(cell_of):
                continue  # nothing to change in this file
            tmp = path.with_name(path.name + ".tags")
            with pq.ParquetWriter(tmp, schema, compression="snappy", use_dictionary=True) as w:
                for g in range(pf.num_row_groups):  # one row group per episode, as the store writes
                    t = pf.read_row_group(g)
                    old = t.column(TAG_KEY).to_pylist() if has_column else [""] * t.num_rows
                    eps = t.column("episode_index").to_pylist()
                    cells = [cell_of.get(int(e), o or "") for e, o in zip(eps, old)]
                    if has_column:
                        t = t.drop_columns([TAG_KEY])
                    t = t.append_column(TAG_KEY, pa.array(cells, type=pa.string()))
                    w.write_table(t.select(schema.names).cast(schema))
            _fsync_path(tmp)
            planned.append((tmp, path))
    except BaseException:
        for tmp, _ in planned:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in planned:
        os.replace(tmp, path)
        _fsync_path(path.parent)
    return len(planned)


def migrate_sidecar_tags(root: Path) -> str | None:
    """Give a dataset recorded before the tag column its column, from the sidecar. Once: a
    dataset that has the column is left alone. Returns what was done (None: nothing).

    Only our own datasets are migrated (recognised by the ``teleop.action`` feature); a foreign
    LeRobot dataset is never rewritten by opening it."""
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.exists() or has_tag_column(root):
        return None
    info = json.loads(info_path.read_text())
    if TELEOP_ACTION_KEY not in info.get("features", {}):
        return None
    tags = sidecar_tags_that_fit(root)
    features = {k: {**v, "shape": tuple(v["shape"])} for k, v in info["features"].items()}
    features[TAG_KEY] = tag_feature()
    files = _rewrite_data_files(root, features, {i: tag_to_cell(t) for i, t in tags.items()})
    info["features"][TAG_KEY] = {**tag_feature(), "shape": [1]}
    _write_info(root, info)
    total = int(info.get("total_episodes", 0))
    return f"moved {len(tags)} of {total} episode tags into the data table ({files} files rewritten)"


def write_tags(root: Path, tags: Iterable[EpisodeTag]) -> None:
    """Rewrite the given episodes' tags (column and sidecar), e.g. a new verdict."""
    from daemon.data.schema import append_episode_tag

    root = Path(root)
    tags = list(tags)
    info = json.loads((root / "meta" / "info.json").read_text())
    features = {k: {**v, "shape": tuple(v["shape"])} for k, v in info["features"].items()}
    _rewrite_data_files(root, features, {t.episode_index: tag_to_cell(t) for t in tags})
    for t in tags:  # later lines win in the sidecar
        append_episode_tag(root, t)


@dataclass
class TagReport:
    """Which episodes have a tag, and whether missing ones were lost (vs. never written)."""

    tags: dict[int, EpisodeTag]
    total_episodes: int
    ours: bool  # recorded by so101d (our schema)
    lost: list[int]  # episodes of ours whose tags are gone (an external edit dropped them)
    untagged: list[int]  # episodes nobody tagged (a foreign dataset)


def tag_report(root: Path) -> TagReport:
    """Tags as they stand, telling "lost by an external edit" from "never tagged".

    Our datasets are recognised by ``teleop.action``. If one of ours has no tag column and no
    sidecar line that fits an episode, that episode's tag was lost: a tool that does not carry
    our data column (or an older so101d dataset edited by LeRobot's tools before migration)."""
    root = Path(root)
    info = json.loads((root / "meta" / "info.json").read_text())
    total = int(info.get("total_episodes", 0))
    ours = TELEOP_ACTION_KEY in info.get("features", {})
    tags = read_column_tags(root) if has_tag_column(root) else sidecar_tags_that_fit(root)
    missing = [i for i in range(total) if i not in tags]
    return TagReport(tags, total, ours, missing if ours else [], [] if ours else missing)
