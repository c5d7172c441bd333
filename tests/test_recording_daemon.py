"""End to end through the daemon: `so101d run` on emulated arms with [recording] and two virtual
cameras; episodes driven with the `so101d episode` and `so101d record` CLIs over the control
socket; SIGTERM; the dataset then loads with LeRobotDataset and holds the follower's motion."""

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
from test_daemon_process import wait_status

from calibration.calibration_file import save_calibration
from daemon.dataset_schema import read_episode_tags
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration

SO101D = [sys.executable, "-m", "daemon.cli"]


@pytest.fixture
def run_dir():
    with tempfile.TemporaryDirectory(prefix="so101d-rec-") as d:
        yield Path(d)


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SO101D, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )


def keyboard_session(sock_args: list[str]) -> None:
    """`so101d record` on a terminal: f = failure, backspace = redo, enter = success, esc = stop."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            *SO101D,
            "record",
            "--episodes",
            "5",
            "--episode-time",
            "60",
            "--reset-time",
            "30",
            "--task",
            "keys",
            *sock_args,
        ],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    os.close(slave)
    try:
        for key, pause in ((b"f", 4.0), (b"\r", 1.0), (b"\x7f", 1.0), (b"\r", 1.0), (b"\r", 1.0), (b"\x1b", 1.0)):
            time.sleep(pause)  # first pause: the CLI starts (imports) and starts episode 3
            os.write(master, key)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    # f: episode 3 saved as failure; enter: skips the reset; backspace: episode 4 redone;
    # enter: episode 4 saved as success; enter: skips the reset; esc: episode 5 discarded, stop
    assert "episode 3 saved" in out and "failure" in out, out
    assert "discarded; recording it again" in out, out
    assert "episode 4 saved" in out and "success" in out, out
    assert "stopped; the episode in progress was discarded" in out, out
    assert "2 episodes saved" in out, out


def test_daemon_records_episodes_from_the_cli(run_dir):
    la, fa = EmulatedArm("leader"), EmulatedArm("follower")
    cal = run_dir / "cal"
    save_calibration(reference_calibration("leader"), "leader", "l1", cal)
    save_calibration(reference_calibration("follower"), "follower", "f1", cal)
    sock = run_dir / "control.sock"
    cfg = run_dir / "so101d.toml"
    cfg.write_text(
        f'[leader]\nport = "{run_dir / "leader"}"\nid = "l1"\n'
        f'[follower]\nport = "{run_dir / "follower"}"\nid = "f1"\n'
        f'[calibration]\nroot = "{cal}"\n[socket]\npath = "{sock}"\n'
        f'[recording]\nenabled = true\ndataset_root = "{run_dir / "datasets"}"\nrepo_id = "bench/e2e"\n'
        f'task = "default task"\n'
        '[cameras.front]\nkind = "virtual"\nwidth = 160\nheight = 120\n'
        '[cameras.wrist]\nkind = "virtual"\nwidth = 160\nheight = 120\n'
    )
    root = run_dir / "datasets" / "bench" / "e2e"
    with BusEmulator(run_dir / "leader", la), BusEmulator(run_dir / "follower", fa):
        err = open(run_dir / "daemon.err", "w+")  # a file, not a pipe nobody reads while the test runs
        proc = subprocess.Popen(
            [*SO101D, "run", "--config", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        )
        try:
            wait_status(
                sock,
                lambda s: s["mode"] == "teleop" and s.get("recording", {}).get("phase") == "idle",
                timeout_s=180,
                proc=proc,
            )
            s = ["--socket", str(sock)]
            r = cli("episode", "start", "--task", "wave", *s)
            assert r.returncode == 0, r.stderr
            assert "episode 0 recording" in r.stdout
            r = cli("episode", "start", *s)
            assert r.returncode == 1 and "already recording" in r.stderr
            time.sleep(1.5)
            r = cli("episode", "save", "--failure", *s)
            assert r.returncode == 0 and "failure" in r.stdout, r.stderr
            r = cli(
                "record",
                "--episodes",
                "2",
                "--episode-time",
                "1",
                "--reset-time",
                "0.3",
                "--no-keys",
                "--task",
                "pick",
                *s,
                timeout=120,
            )
            assert r.returncode == 0, r.stderr
            assert "2 episodes saved" in r.stdout and str(root) in r.stdout
            st = wait_status(sock, lambda s: s["recording"]["saves_pending"] == 0, timeout_s=120, proc=proc)
            assert st["recording"]["episodes_in_dataset"] == 3
            r = cli("episode", "status", *s)
            assert r.returncode == 0 and "3 episodes" in r.stdout
            r = cli("episode", "discard", *s)
            assert r.returncode == 1 and "no episode is recording" in r.stderr
            keyboard_session(s)
            wait_status(sock, lambda s: s["recording"]["saves_pending"] == 0, timeout_s=120, proc=proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=120)
        err.seek(0)
        assert rc == 0, err.read()[-2000:]
    ds = load_dataset(root, "bench/e2e")
    assert ds.num_episodes == 5
    tags = read_episode_tags(root)
    assert [tags[i].success for i in range(5)] == [False, None, None, False, True]
    assert ds[0]["task"] == "wave" and ds[len(ds) - 1]["task"] == "keys"
    assert ds[ds.meta.episodes[1]["dataset_from_index"]]["task"] == "pick"
    state = np.array(ds.hf_dataset.with_format(None)["observation.state"])
    assert np.isfinite(state).all() and (np.abs(state[:, :5]) < 200).all()
    assert state[:, 5].min() >= 0 and state[:, 5].max() <= 100
    assert tuple(ds[0]["observation.images.wrist"].shape) == (3, 120, 160)
    for i in range(5):
        assert tags[i].frames == ds.meta.episodes[i]["length"] > 20
