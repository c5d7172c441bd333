"""Demo episodes on the virtual bench, and how to load what was recorded.

``so101d demo`` (daemon core) can call ``record_demo_episodes(daemon, n)`` from a thread once the
daemon runs with [recording] enabled: it records ``n`` short episodes of the emulated leader's
pick-and-place motion, waits until they are on disk and prints where the dataset is and the two
lines that load it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def how_to_load(root: str, repo_id: str) -> str:
    return (f"dataset: {root}\n"
            "load it:\n"
            f"  HF_HUB_OFFLINE=1 python -c \"from lerobot.datasets.lerobot_dataset import LeRobotDataset; "
            f"ds = LeRobotDataset('{repo_id}', root='{root}'); print(ds); print(ds[0].keys())\"\n"
            f"  episode tags (success, timing): {root}/meta/so101d_episodes.jsonl")


def record_demo_episodes(daemon: Any, episodes: int = 3, episode_s: float = 5.0, reset_s: float = 1.0,
                         task: str = "demo: pick and place", say: Callable[[str], None] = print,
                         stop: Callable[[], bool] = lambda: False) -> int:
    """Records ``episodes`` episodes through the daemon's recorder; returns how many were saved."""
    rec = daemon.recorder
    if rec is None:
        raise RuntimeError("recording is not enabled ([recording] enabled = true)")
    rec.wait_ready(300)
    deadline = time.monotonic() + 30
    while daemon.loop.state.mode != "teleop" and time.monotonic() < deadline and not stop():
        time.sleep(0.1)  # alignment first: record following, not aligning
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
            rec.discard_episode()
            break
        rec.save_episode(True)
        saved += 1
        time.sleep(reset_s)
    rec.wait_saved(120)
    st = rec.status()
    say(f"demo: {saved} episodes recorded; {st['episodes_in_dataset']} in the dataset")
    say(how_to_load(st["dataset"], st["repo_id"]))
    return saved
