"""The shared-memory frame slots: a reader in another mapping sees the writer's newest whole
frame, never a half-written one, and the file is gone once the writer closes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from drivers.frame_shm import FrameShareReader, FrameShareWriter


def test_the_reader_gets_the_newest_whole_frame(tmp_path: Path) -> None:
    w = FrameShareWriter("front cam", 8, 4, slots=3, directory=tmp_path)
    r = FrameShareReader(w.path)
    try:
        assert r.latest() is None
        for seq in range(5):
            w.write(np.full((4, 8, 3), seq, np.uint8), seq, 10.0 + seq)
        f = r.latest()
        assert f is not None and f.seq == 4 and f.capture_monotonic_s == pytest.approx(14.0)
        assert np.all(f.pixels == 4)
        f.pixels[:] = 99  # the reader's own copy: the share is untouched
        again = r.latest()
        assert again is not None and np.all(again.pixels == 4)
        with pytest.raises(ValueError, match="shape"):
            w.write(np.zeros((5, 8, 3), np.uint8), 5, 0.0)
    finally:
        r.close()
        w.close()
    assert not w.path.exists()


def test_a_slot_being_written_is_not_handed_out(tmp_path: Path) -> None:
    w = FrameShareWriter("c", 2, 2, slots=2, directory=tmp_path)
    r = FrameShareReader(w.path)
    try:
        w.write(np.ones((2, 2, 3), np.uint8), 0, 0.0)
        w._meta[0][0] += 1  # the writer is in the middle of this slot (odd generation)
        assert r.latest() is None
        w._meta[0][0] += 1
        assert r.latest() is not None
    finally:
        r.close()
        w.close()


def test_a_file_that_is_not_a_share_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "junk"
    p.write_bytes(bytes(4096))
    with pytest.raises(ValueError, match="not a so101d frame share"):
        FrameShareReader(p)
