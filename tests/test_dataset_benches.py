"""One dataset from two benches: two daemons on two virtual benches (`so101d demo`, each its own
emulated arms, socket and dataset) record the same task side by side, `so101d dataset merge`
joins their datasets, the merged tags say which bench and which follower each episode came from,
and LeRobot's own `lerobot-train` trains a few steps on the result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dataset_support import so101d
from recording_support import train_tiny_act

from daemon.data.schema import read_episode_tags

pytest.importorskip("accelerate", reason="lerobot-train needs accelerate (lerobot[training])")


def _start_bench(tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.out"
    with open(out, "w") as fo, open(tmp_path / f"{name}.err", "w") as fe:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", "demo", "--dir", str(tmp_path / name), "--record", "1"]
            + ["--episode-time", "2", "--socket", str(tmp_path / f"{name}.sock")],
            stdout=fo,
            stderr=fe,
            env=dict(os.environ, HF_HUB_OFFLINE="1", SO101D_BENCH=name),
        )
    return proc, out


@pytest.mark.timeout(1200)  # two daemons, then lerobot-train: minutes on a loaded 2-core machine
def test_two_benches_record_merge_and_train(tmp_path: Path):
    benches = {name: _start_bench(tmp_path, name) for name in ("bench-a", "bench-b")}
    try:
        end = time.monotonic() + 300
        for name, (proc, out) in benches.items():
            while "episodes in the dataset" not in out.read_text():
                assert proc.poll() is None, (tmp_path / f"{name}.err").read_text()[-3000:]
                assert time.monotonic() < end, out.read_text()[-3000:]
                time.sleep(0.2)
        for proc, _ in benches.values():
            proc.send_signal(signal.SIGINT)
        for name, (proc, _) in benches.items():
            assert proc.wait(timeout=120) == 0, (tmp_path / f"{name}.err").read_text()[-3000:]
    finally:
        for proc, _ in benches.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    roots = [tmp_path / name / "datasets" / "local" / "so101d-demo" for name in benches]
    merged = tmp_path / "lab" / "pick"
    r = so101d("dataset", "merge", *map(str, roots), "--out", str(merged))
    assert r.returncode == 0, r.stderr[-3000:]
    tags = read_episode_tags(merged)
    assert [(t.bench, t.follower_kind, t.kind) for t in tags.values()] == [
        ("bench-a", "emulated", "emulated"),
        ("bench-b", "emulated", "emulated"),
    ]
    info = so101d("dataset", "info", str(merged)).stdout
    assert "by bench     bench-a 1   bench-b 1" in info and "'demo: pick and place' 2" in info
    # the load command `dataset info` prints decodes the videos with no torchcodec traceback
    load = next(line.strip() for line in info.splitlines() if line.strip().startswith("HF_HUB_OFFLINE=1 "))
    r = subprocess.run(["bash", "-c", load], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "observation.images.front" in r.stdout, r.stderr[-3000:]

    train_tiny_act("local/pick", merged, tmp_path / "train", 2, 2, "--dataset.video_backend=pyav")
    # (lerobot-train itself still probes torchcodec while building its config, whatever
    # --dataset.video_backend says: LeRobot's DatasetConfig default_factory, not ours to change)
