"""What the replay stories share: the real CLI, the daemon (`so101d run`) on the virtual bench
with recording on, and reading a dataset's episode back as arrays."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from support import wait_status
from virtual_bench_support import VirtualBench, open_virtual_bench

from daemon.api.client import ControlClient

SO101D = [sys.executable, "-m", "daemon.apps.cli"]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SO101D, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )


@dataclass
class Bench:
    vb: VirtualBench
    data: Path  # the daemon's dataset
    proc: subprocess.Popen
    sock: list[str]
    log: Path

    def episodes(self) -> int:
        with ControlClient(self.vb.socket_path, timeout_s=10) as c:
            return int(c.request("episode.status")["episodes_in_dataset"] or 0)


@contextlib.contextmanager
def bench_daemon(repo_id: str, rate_hz: float, recording_fps: int = 30, extra_toml: str = "") -> Iterator[Bench]:
    """`so101d run` on a fresh virtual bench, recording into its own dataset ``repo_id`` at
    ``recording_fps``."""
    with open_virtual_bench() as vb:
        data = vb.root / "datasets"
        cfg = vb.write_config(
            f'[recording]\nenabled = true\ndataset_root = "{data}"\nrepo_id = "{repo_id}"\n'
            f"fps = {recording_fps}\n" + extra_toml,
            rate_hz=rate_hz,
        )
        log_path = vb.root / "so101d.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [*SO101D, "run", "--config", str(cfg)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, HF_HUB_OFFLINE="1"),
                start_new_session=True,
            )
        try:
            wait_status(vb.socket_path, lambda s: (s.get("recording") or {}).get("phase") == "idle", 180, proc)
            yield Bench(vb, data / repo_id, proc, ["--socket", str(vb.socket_path)], log_path)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(20)


def episode_columns(root: Path, episode_index: int, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """One episode's per-frame columns (frame order), read from the dataset's parquet files."""
    import pyarrow.parquet as pq

    parts: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for path in sorted((root / "data").glob("chunk-*/file-*.parquet")):
        t = pq.read_table(path, columns=["episode_index", "frame_index", *keys])
        t = t.filter(np.asarray(t.column("episode_index").to_numpy() == episode_index))
        order = np.argsort(t.column("frame_index").to_numpy(), kind="stable")
        for k in keys:
            parts[k].append(np.asarray(t.column(k).to_pylist(), np.float64)[order])
    return {k: np.concatenate(v) for k, v in parts.items()}
