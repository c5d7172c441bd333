"""Demo episodes on the virtual bench.

In-process: the daemon on emulated arms, the leader playing the pick-and-place demo, [recording]
on with a virtual camera; record_demo_episodes records them and prints where the dataset is and
how to load it; the follower's motion is in it.

`so101d demo` (what `make run` starts), as a subprocess: records its demo episodes beside the
status output, prints the dataset's path and a load command; that command, run as printed, loads
the dataset; Ctrl-C then exits 0 and the summary is printed again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from recording_support import load_dataset

from daemon.config.settings import config_from_dict
from daemon.data.demo_session import record_demo_episodes
from daemon.service.daemon import Daemon
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
from drivers.emulator.motion import DemoMotion
from drivers.feetech_arm import FeetechFollower, FeetechLeader

pytestmark = pytest.mark.e2e  # `so101d demo` recording episodes


def test_demo_records_episodes_of_the_emulated_arm_and_says_how_to_load_them():
    with tempfile.TemporaryDirectory(prefix="so101d-demo-rec-") as d:
        root = Path(d)
        la = EmulatedArm("leader", motion=DemoMotion())
        fa = EmulatedArm("follower")
        lb = BusEmulator(root / "leader", la).start()
        fb = BusEmulator(root / "follower", fa).start()
        cfg = config_from_dict(
            {
                "socket": {"path": str(root / "c.sock")},
                "recording": {"enabled": True, "dataset_root": str(root / "datasets"), "repo_id": "demo/bench"},
                "cameras": {"front": {"kind": "virtual", "width": 160, "height": 120}},
            }
        )
        daemon = Daemon(
            cfg,
            FeetechLeader(str(root / "leader"), reference_calibration("leader")),
            FeetechFollower(str(root / "follower"), reference_calibration("follower")),
        )
        lines: list[str] = []
        try:
            daemon.start()
            n = record_demo_episodes(daemon, episodes=2, episode_s=2.0, reset_s=0.2, say=lines.append)
        finally:
            daemon.stop()
            lb.stop()
            fb.stop()
        assert n == 2
        text = "\n".join(lines)
        ds_root = root / "datasets" / "demo" / "bench"
        assert f"dataset: {ds_root}" in text and 'LeRobotDataset("demo/bench", root=' in text
        ds = load_dataset(ds_root, "demo/bench")
        assert ds.num_episodes == 2
        state = np.array(ds.hf_dataset.with_format(None)["observation.state"])
        assert np.ptp(state, axis=0).max() > 2.0  # the follower moved with the demo leader
        assert tuple(ds[0]["observation.images.front"].shape) == (3, 120, 160)


def test_so101d_demo_records_episodes_and_prints_a_load_command_that_works(tmp_path):
    run_dir = tmp_path / "bench"
    out_path = tmp_path / "demo.out"
    with open(out_path, "w") as out, open(tmp_path / "demo.err", "w") as err:
        # not --quiet (that prints the final summary only): piped, it prints the progress lines
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daemon.apps.cli",
                "demo",
                "--dir",
                str(run_dir),
                "--record",
                "2",
                "--episode-time",
                "2",
                "--socket",
                str(tmp_path / "d.sock"),
            ],
            stdout=out,
            stderr=err,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        )
    try:
        end = time.monotonic() + 240
        while "episodes in the dataset" not in out_path.read_text():
            assert proc.poll() is None, (tmp_path / "demo.err").read_text()[-3000:]
            assert time.monotonic() < end, out_path.read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, (tmp_path / "demo.err").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out_path.read_text()
    ds_root = run_dir / "datasets" / "local" / "so101d-demo"
    assert "demo: recording episode 1 (2/2, 2 s)" in text
    assert "demo: 2 episodes in the dataset" in text
    assert text.count(f"dataset: {ds_root}") == 2  # when recorded, and again at exit
    assert text.rstrip().splitlines()[-5] == "so101d demo: 2 episodes in the dataset"  # then the 4 how-to lines
    cmd = next(line.strip() for line in text.splitlines() if line.strip().startswith("HF_HUB_OFFLINE=1 "))
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Number of selected episodes: '2'" in r.stdout and "observation.images.wrist" in r.stdout
    ds = load_dataset(ds_root, "local/so101d-demo")
    assert tuple(ds[0]["observation.images.front"].shape) == (3, 240, 320)
    assert not (run_dir / "leader").exists()  # the emulator is gone; the dataset stays
