"""Episode tags survive LeRobot 0.6.1's own `lerobot-edit-dataset` (delete_episodes, split, merge),
a dataset from before the tag column is migrated on open without loss, and a tag that an external
edit did lose is reported as lost, never as zeros."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from dataset_support import Ep, info_json, lerobot_edit_dataset, make_dataset, so101d, store_for

from daemon.data.schema import EPISODE_TAGS_FILE, TAG_KEY, read_episode_tags, read_sidecar_tags
from daemon.data.tags import tag_report

CAMERA = [("front", 48, 64)]


def _three_episodes(root: Path, cameras=None) -> Path:
    return make_dataset(
        root,
        [
            Ep(success=True, follower_kind="feetech", notes=["first"], bench="bench-a"),
            Ep(success=False, follower_kind="emulated", origin="policy", task="stack", frames=50, bench="bench-a"),
            Ep(success=True, follower_kind="sim-mujoco", notes=["third"], frames=40, bench="bench-a"),
        ],
        cameras,
    )


def _facts(tag):
    return (tag.uid, tag.success, tag.follower_kind, tag.origin, tag.bench, tag.notes, tag.frames)


def test_tags_survive_lerobots_delete_episodes_with_video(tmp_path: Path):
    src = _three_episodes(tmp_path / "three", CAMERA)
    before = read_episode_tags(src)
    assert len({t.uid for t in before.values()}) == 3
    out = tmp_path / "two"
    lerobot_edit_dataset(
        "--repo_id=local/three",
        f"--root={src}",
        "--new_repo_id=local/two",
        f"--new_root={out}",
        "--operation.type=delete_episodes",
        "--operation.episode_indices=[0]",
    )
    # what LeRobot's tool left behind: our sidecar is gone, the data column is there
    assert not (out / EPISODE_TAGS_FILE).exists()
    assert TAG_KEY in info_json(out)["features"]
    after = read_episode_tags(out)
    assert sorted(after) == [0, 1]
    assert [_facts(after[i]) for i in (0, 1)] == [_facts(before[i]) for i in (1, 2)]
    r = so101d("dataset", "info", str(out), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["episodes_by_outcome"] == {"success": 1, "failure": 1, "unknown": 0}
    assert s["episodes_by_kind"]["emulated"] == 1 and s["episodes_by_kind"]["sim"] == 1
    assert s["tags_lost"] == 0


def test_tags_survive_lerobots_split_and_merge(tmp_path: Path):
    src = _three_episodes(tmp_path / "three")
    before = read_episode_tags(src)
    lerobot_edit_dataset(
        "--repo_id=local/three",
        f"--root={src}",
        f"--new_root={tmp_path / 'parts'}",
        "--operation.type=split",
        '--operation.splits={"train": [0, 2], "val": [1]}',
    )
    train, val = tmp_path / "parts" / "train", tmp_path / "parts" / "val"
    assert [_facts(t) for t in read_episode_tags(train).values()] == [_facts(before[0]), _facts(before[2])]
    assert [_facts(t) for t in read_episode_tags(val).values()] == [_facts(before[1])]

    other = make_dataset(tmp_path / "other", [Ep(success=None, follower_kind="sim-leisaac", bench="bench-b")])
    lerobot_edit_dataset(
        "--new_repo_id=local/merged",
        f"--new_root={tmp_path / 'merged'}",
        "--operation.type=merge",
        "--operation.repo_ids=['local/val', 'local/other', 'local/train']",
        f"--operation.roots=['{val}', '{other}', '{train}']",
    )
    merged = read_episode_tags(tmp_path / "merged")
    expected = [before[1], read_episode_tags(other)[0], before[0], before[2]]
    assert [_facts(merged[i]) for i in range(4)] == [_facts(t) for t in expected]
    assert {t.bench for t in merged.values()} == {"bench-a", "bench-b"}


def _strip_tag_column(root: Path) -> None:
    """Today's layout (before the tag column): data files and info.json without it, tags only in
    the sidecar. Built from a current dataset by dropping the column, schema metadata included."""
    from lerobot.datasets.feature_utils import get_hf_features_from_features

    info = info_json(root)
    del info["features"][TAG_KEY]
    features = {k: {**v, "shape": tuple(v["shape"])} for k, v in info["features"].items()}
    schema = get_hf_features_from_features(features).arrow_schema
    for path in (root / "data").glob("chunk-*/file-*.parquet"):
        pf = pq.ParquetFile(path)
        groups = [
            pf.read_row_group(g).drop_columns([TAG_KEY]).select(schema.names).cast(schema)
            for g in range(pf.num_row_groups)
        ]
        with pq.ParquetWriter(path, schema) as w:
            for g in groups:
                w.write_table(g)
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))


def test_a_sidecar_only_dataset_is_migrated_on_open_once_without_loss(tmp_path: Path):
    root = _three_episodes(tmp_path / "old")
    sidecar_before = read_sidecar_tags(root)
    _strip_tag_column(root)
    assert read_episode_tags(root) == sidecar_before  # read from the sidecar until migrated
    store = store_for(root)  # what the daemon, an import or an edit does on open
    store.release_ownership()
    assert TAG_KEY in info_json(root)["features"]
    assert read_episode_tags(root) == sidecar_before
    assert read_sidecar_tags(root) == sidecar_before  # the sidecar is kept
    data_files = sorted((root / "data").rglob("*.parquet"))
    stamps = [p.stat().st_mtime_ns for p in data_files]
    store = store_for(root)  # once: a migrated dataset is left alone
    store.release_ownership()
    assert [p.stat().st_mtime_ns for p in data_files] == stamps
    # and it still loads in LeRobot, and records on
    from recording_support import load_dataset

    ds = load_dataset(root, "local/old")
    assert ds.num_episodes == 3 and ds[0][TAG_KEY]
    make_dataset(root, [Ep(success=False)])
    assert [t.success for t in read_episode_tags(root).values()] == [True, False, True, False]


def test_tags_an_external_edit_lost_are_reported_as_lost_not_zero(tmp_path: Path):
    """The issue's story on a dataset never opened since the upgrade: LeRobot's delete drops the
    sidecar, and the column was never there."""
    src = _three_episodes(tmp_path / "three")
    _strip_tag_column(src)
    out = tmp_path / "edited"
    lerobot_edit_dataset(
        "--repo_id=local/three",
        f"--root={src}",
        f"--new_root={out}",
        "--operation.type=delete_episodes",
        "--operation.episode_indices=[0]",
    )
    # a user copying the old sidecar along would make it describe other episodes
    shutil.copy(src / EPISODE_TAGS_FILE, out / EPISODE_TAGS_FILE)
    rep = tag_report(out)
    assert rep.ours and rep.lost == [0, 1] and rep.tags == {}
    r = so101d("dataset", "info", str(out))
    assert r.returncode == 0, r.stderr
    assert "tags lost by an external edit: 2 episodes" in r.stdout
    assert "success 0" not in r.stdout
