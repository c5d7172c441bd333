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
from daemon.data.schema import read_episode_tags
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration

SO101D = [sys.executable, "-m", "daemon.apps.cli"]


pytestmark = pytest.mark.e2e  # `so101d run` with recording, driven by the episode/record CLIs


@pytest.fixture
def run_dir():
    with tempfile.TemporaryDirectory(prefix="so101d-rec-") as d:
        yield Path(d)


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SO101D, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )


def keyboard_session(sock: Path) -> None:
    """`so101d record` on a terminal: f = failure, backspace = redo, enter = success, esc = stop.

    Each key is typed once the CLI has said what it is doing and, while an episode records, once
    the daemon reports enough frames in it (not after fixed pauses, which a loaded machine beats)."""
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
            "--socket",
            str(sock),
        ],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1"),  # lines as they are printed
    )
    os.close(slave)
    seen: list[str] = []

    def after(line_part: str) -> None:
        deadline = time.monotonic() + 60
        while not any(line_part in line for line in seen):
            assert time.monotonic() < deadline, f"no {line_part!r} from `so101d record`: {seen}"
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, f"`so101d record` ended before {line_part!r}: {seen} {proc.stderr.read()}"  # type: ignore[union-attr]
            seen.append(line)

    def recorded_frames(n: int) -> None:
        wait_status(sock, lambda s: s["recording"]["phase"] == "recording" and s["recording"]["frames"] >= n, 60)

    try:
        # (what the CLI must have said, whether the episode needs frames first, the key)
        steps = (
            ("episode 3 (1/5) recording", True, b"f"),
            ("reset the scene", False, b"\r"),
            ("episode 4 (2/5) recording", True, b"\x7f"),
            ("discarded; recording it again", True, b"\r"),
            ("episode 4 saved", False, b"\r"),
            ("episode 5 (3/5) recording", False, b"\x1b"),
        )
        for said, needs_frames, key in steps:
            after(said)
            if needs_frames:
                recorded_frames(25)
            os.write(master, key)
        out, err = proc.communicate(timeout=60)
        out = "".join(seen) + out
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
            wait_status(sock, lambda s: s["recording"]["frames"] >= 30, timeout_s=60, proc=proc)
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
            keyboard_session(sock)
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
