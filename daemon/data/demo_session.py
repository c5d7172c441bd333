"""Demo episodes on the virtual bench, and how to load what was recorded.

``so101d demo`` (``make run``) runs ``record_demo_episodes(daemon, n)`` on a thread beside the
live status: it waits for the daemon's recorder and for teleoperation to be aligned, records ``n``
short episodes of the emulated leader's pick-and-place motion, waits until they are on disk and
says where the dataset is and the exact command that loads it. When the demo is stopped first
(Ctrl-C, ``--duration``), the episode in progress is discarded and the function returns at once;
the recorder commits the saved ones as it closes.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def how_to_load(root: str, repo_id: str, python: str | None = None) -> str:
    """Where the dataset is and a command that loads it (offline), ready to paste."""
    py = python or sys.executable
    # double-quoted strings inside, so the shell quoting around the code stays plain '...'.
    # video_backend="pyav": PyAV brings its own FFmpeg and decodes our h264 videos everywhere;
    # LeRobot's default probes torchcodec, which needs a system FFmpeg and prints a 100-line
    # traceback where there is none.
    code = (
        f"from lerobot.datasets.lerobot_dataset import LeRobotDataset; "
        f'ds = LeRobotDataset({json.dumps(repo_id)}, root={json.dumps(str(root))}, video_backend="pyav"); '
        f"print(ds); print(ds[0].keys())"
    )
    return (
        f"dataset: {root}\n"
        "load it:\n"
        f"  HF_HUB_OFFLINE=1 {shlex.quote(py)} -c {shlex.quote(code)}\n"
        f"  episode tags (success, origin, timing): {root}/meta/so101d_episodes.jsonl"
    )


def episodes_on_disk(root: str | Path) -> int:
    """Episodes committed in a dataset folder (0 when there is none yet)."""
    info = Path(root) / "meta" / "info.json"
    try:
        return int(json.loads(info.read_text()).get("total_episodes", 0))
    except (OSError, ValueError):
        return 0


def _wait(pred: Callable[[], bool], timeout_s: float, stop: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if stop() or time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def record_demo_episodes(
    daemon: Any,
    episodes: int = 3,
    episode_s: float = 5.0,
    reset_s: float = 1.0,
    task: str = "demo: pick and place",
    say: Callable[[str], None] = print,
    stop: Callable[[], bool] = lambda: False,
) -> int:
    """Records ``episodes`` episodes through the daemon's recorder; returns how many were saved."""
    if not _wait(lambda: daemon.recorder is not None, 60, stop):
        if stop():
            return 0
        raise RuntimeError("recording is not enabled ([recording] enabled = true)")
    rec = daemon.recorder
    if not _wait(lambda: rec.phase != "starting", 300, stop):
        return 0
    rec.wait_ready(60)  # raises with the writer's error if it failed (ready is set just after the phase)
    # alignment first: record following, not aligning
    _wait(lambda: daemon.loop.state.mode == "teleop", 30, stop)
    saved = 0
    for i in range(episodes):
        if stop():
            break
        r = rec.start_episode(task)
        say(f"demo: recording episode {r['episode']} ({i + 1}/{episodes}, {episode_s:.0f} s)")
        end = time.monotonic() + episode_s
        while time.monotonic() < end and not stop():
            time.sleep(0.05)
        if stop():
            try:
                rec.discard_episode()
            except Exception:
                pass
            say("demo: stopped; the episode in progress was discarded")
            return saved
        rec.save_episode(True)
        saved += 1
        end = time.monotonic() + reset_s
        while time.monotonic() < end and not stop():
            time.sleep(0.05)
    if stop():
        return saved
    say(f"demo: {saved} episodes recorded; writing them (video encoding) ...")
    written = rec.wait_saved(120)
    st = rec.status()
    if st["phase"] == "error":  # never "in the dataset" for what is not: name the loss
        say(
            f"demo: recording stopped: {st['error']}; {st['episodes_in_dataset']} episodes in the dataset"
            + "".join(f"; LOST {x}" for x in st.get("lost_episodes", []))
        )
        return saved
    if not written:
        say(f"demo: {st['saves_pending']} episodes still being written after 120 s")
    say(f"demo: {st['episodes_in_dataset']} episodes in the dataset (teleoperation goes on; Ctrl-C stops)")
    say(how_to_load(st["dataset"], st["repo_id"]))
    return saved
