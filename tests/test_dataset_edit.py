"""`so101d dataset merge | delete | keep | split | retag`: LeRobot's own editing code with our tags
carried along, schemas checked before a merge, refused while a daemon records the dataset, and
the source left as it was when an edit fails."""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path

import pytest
from dataset_support import Ep, make_dataset, so101d, so101d_here

from daemon.data import edit
from daemon.data.schema import read_episode_tags
from daemon.data.store import DatasetStore, StoreConfig


def _fingerprint(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_merge_checks_schemas_first_then_joins_benches_with_their_tags(tmp_path: Path, capsys):
    a = make_dataset(tmp_path / "bench_a", [Ep(success=True, bench="a"), Ep(success=False, bench="a")])
    b = make_dataset(tmp_path / "bench_b", [Ep(success=True, follower_kind="emulated", bench="b")])
    cam = make_dataset(tmp_path / "with_camera", [Ep()], cameras=[("front", 48, 64)])
    before = _fingerprint(a)

    r = so101d("dataset", "merge", str(a), str(cam), "--out", str(tmp_path / "nope"))
    assert r.returncode == 1
    assert "cannot be merged" in r.stderr and "'observation.images.front' is only in" in r.stderr, r.stderr
    assert not (tmp_path / "nope").exists() and _fingerprint(a) == before

    rc, out, err = so101d_here(capsys, "dataset", "merge", str(a), str(b), "--out", str(tmp_path / "all"))
    assert rc == 0, err
    assert "3 episodes from 2 datasets" in out
    tags = read_episode_tags(tmp_path / "all")
    assert [(t.bench, t.success, t.kind) for t in tags.values()] == [
        ("a", True, "real"),
        ("a", False, "real"),
        ("b", True, "emulated"),
    ]
    rc, info, err = so101d_here(capsys, "dataset", "info", str(tmp_path / "all"))
    assert rc == 0, err
    assert "by bench     a 2   b 1" in info
    assert "by kind      real 2   emulated 1   sim 0" in info
    assert "'pick the cube' 3" in info
    assert 'video_backend="pyav"' in info  # the load command it prints decodes anywhere
    # timing files follow their episodes (check uses them)
    assert (tmp_path / "all" / "meta" / "so101d_timing" / "episode_000002.npz").exists()


def test_retag_delete_keep_split_keep_every_tag(tmp_path: Path, capsys):
    root = make_dataset(
        tmp_path / "ds",
        [Ep(success=None, notes=[f"ep {i}"], frames=40 + i) for i in range(4)],
    )
    uids = [t.uid for t in read_episode_tags(root).values()]

    rc, _, err = so101d_here(capsys, "dataset", "retag", str(root), "1,3", "--success")
    assert rc == 0, err
    assert [t.success for t in read_episode_tags(root).values()] == [None, True, None, True]

    res = edit.delete(root, [0], tmp_path / "without_0")
    assert res.episodes == 3 and res.backup is None
    assert [t.uid for t in read_episode_tags(res.out).values()] == uids[1:]

    rc, out, err = so101d_here(capsys, "dataset", "keep", str(root), "1-2")
    assert rc == 0, err
    assert "previous version kept at" in out
    kept = read_episode_tags(root)
    assert [(t.uid, t.success, t.notes[0]) for t in kept.values()] == [(uids[1], True, "ep 1"), (uids[2], None, "ep 2")]
    backup = Path(out.split("previous version kept at ")[1].strip())
    assert len(read_episode_tags(backup)) == 4  # nothing lost: the old version is beside

    parts = edit.split(backup, {"train": [0, 2, 3], "val": [1]}, tmp_path / "parts")
    assert [t.uid for t in read_episode_tags(parts["train"].out).values()] == [uids[0], uids[2], uids[3]]
    assert [t.uid for t in read_episode_tags(parts["val"].out).values()] == [uids[1]]
    with pytest.raises(edit.EditError, match="more than one split"):
        edit.split(backup, {"a": [0, 1], "b": [1]}, tmp_path / "parts2")


def test_edits_are_refused_while_a_daemon_records_the_dataset(tmp_path: Path):
    root = make_dataset(tmp_path / "ds", [Ep(), Ep(success=False)])
    before = _fingerprint(root)
    daemon_writer = DatasetStore(StoreConfig(root=str(root)))
    daemon_writer.take_ownership()  # what the recording daemon's writer holds
    try:
        for args in (("delete", str(root), "0"), ("retag", str(root), "0", "--failure")):
            r = so101d("dataset", *args)
            assert r.returncode == 1 and "in use by another so101d process" in r.stderr, r.stderr
        with pytest.raises(Exception, match="in use"):
            edit.merge([root, tmp_path / "other"], tmp_path / "out")
    finally:
        daemon_writer.release_ownership()
    assert _fingerprint(root) == before


def test_a_failed_edit_leaves_the_source_as_it_was(tmp_path: Path, monkeypatch):
    root = make_dataset(tmp_path / "ds", [Ep(), Ep(success=False), Ep()])
    before = _fingerprint(root)

    def disk_full(*a, **k):  # after LeRobot wrote the new dataset, before it is swapped in
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(edit, "_copy_timing", disk_full)
    with pytest.raises(OSError, match="No space"):
        edit.delete(root, [1])  # in place
    assert _fingerprint(root) == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".ds.so101d-staging")) == ["ds"]
    with pytest.raises(edit.EditError, match="every episode"):
        edit.delete(root, [0, 1, 2])
    assert json.loads((root / "meta" / "info.json").read_text())["total_episodes"] == 3
