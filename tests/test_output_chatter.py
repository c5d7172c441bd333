"""Third-party chatter stays below our INFO: an operator reads one line per episode of ours.

A process that records does what the recording writer does: LeRobot picks the codec, PyAV encodes
with libx264, LeRobot probes the video (which restores FFmpeg's default log callback), the next
encoder closes, HF datasets maps the episode's rows. With a plain ``logging.basicConfig`` that
floods stderr (the baseline run proves the test can see it); after ``setup_logging(libav=True)``
only our line is left, and ``--log-level DEBUG`` still shows LeRobot's INFO (routed, not lost).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import logging, sys
from pathlib import Path
import numpy as np

out, mode = Path(sys.argv[1]), sys.argv[2]
if mode == "baseline":
    logging.basicConfig(level=logging.INFO)
else:
    from daemon.system.logs import setup_logging
    setup_logging(mode, libav=True)
import av
import datasets
from lerobot.configs.video import VideoEncoderConfig
from lerobot.datasets.video_utils import get_video_info


def encode(path):
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=30)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        for i in range(30):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 8, dtype=np.uint8), format="rgb24")
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


enc = VideoEncoderConfig(vcodec="h264")
encode(out / "episode_0.mp4")
get_video_info(out / "episode_0.mp4", enc)
encode(out / "episode_1.mp4")
datasets.Dataset.from_dict({"a": list(range(50))}).map(lambda x: x)
logging.getLogger("so101d.recording").info("episode 0 saved (30 frames)")
"""

CHATTER = ("[libx264", "Using video codec", "Map:")


def _run(tmp_path: Path, mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "HF_DATASETS_DISABLE_PROGRESS_BARS"}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), mode], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_a_recording_process_prints_our_episode_line_and_no_library_chatter(tmp_path: Path) -> None:
    baseline = _run(tmp_path, "baseline")
    assert all(c in baseline for c in CHATTER), f"the baseline no longer shows the chatter:\n{baseline[-3000:]}"

    quiet = _run(tmp_path, "INFO")

    assert [c for c in CHATTER if c in quiet] == [], quiet[-3000:]
    assert quiet.strip().splitlines()[-1].endswith("INFO so101d.recording: episode 0 saved (30 frames)"), quiet
    assert len(quiet.strip().splitlines()) == 1, quiet


def test_log_level_debug_still_shows_what_the_libraries_said(tmp_path: Path) -> None:
    debug = _run(tmp_path, "DEBUG")
    assert "Using video codec: h264" in debug
    assert "episode 0 saved" in debug


def test_our_packages_keep_their_info_lines_and_other_libraries_do_not(capsys, monkeypatch) -> None:
    import logging

    for var in ("SO101D_LOG_LEVEL", "HF_DATASETS_DISABLE_PROGRESS_BARS"):  # set by setup_logging: restored after
        monkeypatch.delenv(var, raising=False)

    from daemon.system.logs import setup_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("INFO")
        for name in ("so101d.loop", "drivers.feetech_bus", "calibration", "lerobot.configs.video", "datasets", "root"):
            logging.getLogger(name).info("hello from %s", name)
        logging.getLogger("lerobot.datasets").warning("a library's warning")
        err = capsys.readouterr().err
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    assert (
        "hello from so101d.loop" in err and "hello from drivers.feetech_bus" in err and "hello from calibration" in err
    )
    assert "hello from lerobot" not in err and "hello from datasets" not in err and "hello from root" not in err
    assert "a library's warning" in err
