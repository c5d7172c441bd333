"""Per-episode tags from the recorder: origin per episode (policy vs teleop), notes, the follower
kind asked at save time, episode hooks (verdict + notes, a failing start), and what close() does
with the episode in progress (save or discard). Real writer process, dataset loaded back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recording_support import SyntheticLoop, load_dataset
from support import poll_until

from daemon.data.recorder import Recorder, RecorderConfig, RecordingError, save_extras_bytes
from daemon.data.ring import TASK_BYTES
from daemon.data.schema import TAG_KEY, read_episode_tags
from daemon.data.writer import save_extras


class VerdictHook:
    """An episode hook that judges every saved episode a success and can refuse one start."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool | None]] = []
        self.refuse_next = False

    def episode_starting(self, recorder) -> None:
        self.calls.append(("start", None))
        if self.refuse_next:
            self.refuse_next = False
            raise RuntimeError("scene not ready")

    def episode_ending(self, recorder, saved: bool):
        self.calls.append(("end", saved))
        return (True if saved else None), [f"hook saw {recorder.frames_recorded} frames"]


def test_extras_fit_the_record_field_and_round_trip():
    raw = save_extras_bytes({"origin": "policy", "follower_kind": "sim-mujoco", "notes": ["a", "b"]})
    assert save_extras(raw) == {"origin": "policy", "follower_kind": "sim-mujoco", "notes": ["a", "b"]}
    many = save_extras_bytes(
        {"origin": "teleop", "follower_kind": "x", "notes": [f"note {i} " * 10 for i in range(40)]}
    )
    assert len(many) <= TASK_BYTES
    back = save_extras(many)
    assert back["origin"] == "teleop" and back["notes"][-1].endswith("more notes dropped")
    assert save_extras(b"") == {} and save_extras(b"{not json") == {}


def _until_frames(rec: Recorder, n: int, timeout_s: float = 30.0) -> None:
    """Wait until the episode in progress has ``n`` frames (the synthetic loop feeds it)."""
    assert poll_until(lambda: rec.status()["frames"] >= n, timeout_s), rec.status()


def test_origin_notes_kind_and_hooks_reach_the_episode_tags(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SO101D_BENCH", "bench-7")  # the writer process names the bench in every tag
    root = tmp_path / "ds"
    rec = Recorder(RecorderConfig(root=str(root), fps=30, follower_kind="feetech"), [])
    kinds = iter(["sim", "sim-mujoco", "sim-mujoco", "sim-mujoco"])
    rec.follower_kind_fn = lambda: next(kinds)
    hook = VerdictHook()
    rec.add_episode_hook(hook)
    rec.open()
    try:
        rec.wait_ready(120)
        with SyntheticLoop(rec):
            r = rec.start_episode("teleop one")
            assert r["origin"] == "teleop"
            _until_frames(rec, 10)
            assert rec.add_note("operator bumped the table")
            rec.save_episode(False)  # explicit verdict wins over the hook's
            r = rec.start_episode("policy one", origin="policy")
            assert r["origin"] == "policy" and rec.status()["origin"] == "policy"
            _until_frames(rec, 10)
            rec.save_episode()  # no verdict given: the hook's
            hook.refuse_next = True
            with pytest.raises(RecordingError, match="scene not ready"):
                rec.start_episode("refused")
            assert rec.phase == "idle"
            with pytest.raises(RecordingError, match="origin"):
                rec.start_episode("bad origin", origin=" ")
            rec.start_episode("in progress at close")
            _until_frames(rec, 10)
            assert rec.wait_saved(120), rec.status()
            rec.close(on_episode="save")
        assert not rec.add_note("after close")
    finally:
        rec.close()
    tags = read_episode_tags(root)
    assert sorted(tags) == [0, 1, 2]
    assert (tags[0].origin, tags[0].success, tags[0].follower_kind) == ("teleop", False, "sim")
    assert "operator bumped the table" in tags[0].notes
    assert any(n.startswith("hook saw ") for n in tags[0].notes)
    assert (tags[1].origin, tags[1].success, tags[1].follower_kind) == ("policy", True, "sim-mujoco")
    # close(on_episode="save"): kept, tagged; the hook still ran (a sim would stop its episode)
    assert tags[2].origin == "teleop" and "saved at shutdown (daemon stopping)" in tags[2].notes
    assert ("end", True) in hook.calls[-1:]
    assert {t.bench for t in tags.values()} == {"bench-7"}
    assert len({t.uid for t in tags.values()}) == 3
    ds = load_dataset(root)
    assert ds.num_episodes == 3 and ds.meta.episodes[2]["length"] == tags[2].frames > 5
    # the tag rides in the data table, on every frame (what LeRobot's editing tools carry)
    cell = json.loads(ds.hf_dataset[int(ds.meta.episodes[1]["dataset_from_index"])][TAG_KEY])
    assert (cell["origin"], cell["source"]["recording_uid"]) == ("policy", tags[1].uid)


def test_close_discards_the_episode_in_progress_when_asked(tmp_path: Path):
    root = tmp_path / "ds"
    rec = Recorder(RecorderConfig(root=str(root), fps=30), [])
    hook = VerdictHook()
    rec.add_episode_hook(hook)
    rec.open()
    try:
        rec.wait_ready(120)
        with SyntheticLoop(rec):
            rec.start_episode("kept")
            _until_frames(rec, 8)
            rec.save_episode()
            rec.start_episode("dropped")
            _until_frames(rec, 8)
            with pytest.raises(ValueError, match="on_episode"):
                rec.close(on_episode="keep")
            rec.close(on_episode="discard")
    finally:
        rec.close()
    assert hook.calls[-1] == ("end", False)
    tags = read_episode_tags(root)
    assert sorted(tags) == [0]
    assert load_dataset(root).num_episodes == 1
