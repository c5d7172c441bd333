"""Merging a dataset recorded before so101d wrote its per-frame ``so101d.source`` column with one
recorded since: LeRobot's aggregate needs the same features in both, so the merge is refused
before anything is written, and the refusal must say what the operator can do about it, not only
that a feature "is only in" one of them.

The two info.json files are what so101d records (``dataset_features``: every feature today) and
the same without the source column (what a dataset recorded before it holds).
"""

from __future__ import annotations

import json
from pathlib import Path

from daemon.data.edit import schema_differences
from daemon.data.schema import SOURCE_KEY, dataset_features


def _dataset(root: Path, features: dict) -> Path:
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(
        json.dumps({"fps": 30, "robot_type": "so101_follower", "features": features}, default=list)
    )
    return root


def test_a_merge_with_an_older_dataset_says_which_column_and_what_to_do(tmp_path: Path) -> None:
    new_features = dataset_features({})
    assert SOURCE_KEY in new_features
    old_features = {k: v for k, v in new_features.items() if k != SOURCE_KEY}
    old = _dataset(tmp_path / "old", old_features)
    new = _dataset(tmp_path / "new", new_features)
    for roots in ([old, new], [new, old]):
        diffs = schema_differences(roots)
        assert len(diffs) == 1, diffs
        said = diffs[0]
        assert SOURCE_KEY in said and "recorded before" in said and "record" in said, said
