"""LeRobot's own CLIs, unmodified, drive the daemon's arms through the so101d plugin
(lerobot_plugin/, installed by `make setup`): lerobot-record with robot and teleoperator
``so101d`` records episodes LeRobotDataset loads, with so101_follower's features;
lerobot-replay plays one back through the daemon's safety layer; no daemon at the socket is a
DeviceNotConnectedError naming it and how to start one; the daemon killed mid-run (SIGKILL, a
power cut's way) ends the tool with that error, not a hang.

Real parts: `so101d run` in its own process on the virtual bench (emulated leader and follower),
LeRobot's console scripts in theirs; nothing is mocked.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from lerobot_plugin_support import BIN, CAM_H, CAM_W, lerobot_env, require_plugin, start_daemon, stop_process
from support import wait_status
from virtual_bench_support import VirtualBench, open_virtual_bench

from calibration.conventions import JOINT_NAMES
from daemon.api.client import ControlClient

FEATURES = [f"{j}.pos" for j in JOINT_NAMES]


@dataclass
class Running:
    bench: VirtualBench
    daemon: subprocess.Popen[bytes]

    @property
    def sock(self) -> Path:
        return self.bench.socket_path


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    require_plugin()
    with open_virtual_bench() as bench:
        run = Running(bench, start_daemon(bench))
        try:
            yield run
        finally:
            stop_process(run.daemon)  # the daemon now running: a test may have killed and restarted it


def _operator_tracks(sock: Path) -> None:
    """The operator's `so101d teleop start` before a LeRobot tool takes the arm: a fault is the
    operator's to clear (LeRobot's connect does not), and an emulated bus on a loaded machine may
    have latched one (servos silent for a few cycles) while the bench waited."""
    with ControlClient(sock) as c:
        c.request("teleop.start")
    wait_status(sock, lambda st: st["mode"] == "teleop", timeout_s=30)


def _lerobot(tool: str, *args: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / tool), *args], capture_output=True, text=True, env=lerobot_env(), timeout=timeout_s
    )


def _record_args(sock: Path, root: Path, episodes: int, seconds: float, *extra: str) -> list[str]:
    return [
        "--robot.type=so101d",
        f"--robot.socket={sock}",
        *extra,
        "--teleop.type=so101d",
        f"--teleop.socket={sock}",
        "--dataset.repo_id=local/plugin",
        f"--dataset.root={root}",
        f"--dataset.num_episodes={episodes}",
        f"--dataset.episode_time_s={seconds}",
        "--dataset.reset_time_s=0",
        "--dataset.fps=30",
        "--dataset.single_task=pick the cube",
        "--dataset.push_to_hub=false",
        "--dataset.video=false",
        "--display_data=false",
        "--play_sounds=false",
    ]


def test_lerobot_record_and_replay_through_the_daemon(running: Running, tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    leader = running.bench.leader
    pose = np.array([10.0, -30.0, 40.0, 20.0, 5.0, 60.0])
    leader.set_pose_units(pose)
    root = tmp_path / "ds"
    _operator_tracks(running.sock)
    r = _lerobot("lerobot-record", *_record_args(running.sock, root, 2, 1.0, "--robot.daemon_cameras=[front]"))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    ds = LeRobotDataset("local/plugin", root=root)
    assert ds.meta.total_episodes == 2
    assert ds.meta.robot_type == "so_follower"
    for key in ("observation.state", "action"):
        feat = ds.meta.features[key]
        assert feat["dtype"] == "float32" and tuple(feat["shape"]) == (6,) and feat["names"] == FEATURES
    assert ds.meta.total_frames >= 40, ds.meta.total_frames  # two 1 s episodes at 30 fps, give or take
    # the daemon's camera, through shared memory, by its configured name and size
    cam = ds.meta.features["observation.images.front"]
    assert cam["dtype"] == "image" and tuple(cam["shape"]) == (CAM_H, CAM_W, 3), cam
    img = np.asarray(ds[0]["observation.images.front"])
    assert img.shape == (3, CAM_H, CAM_W) and float(img.std()) > 0.0, "a blank or missing camera frame"
    actions = np.stack([np.asarray(ds[i]["action"]) for i in range(len(ds))])
    assert np.allclose(actions, pose, atol=2.0), "the recorded action is not the leader's pose"
    # the daemon has the arm back, holding
    with ControlClient(running.sock) as c:
        obs = c.request("arm.observe")
    assert obs["holder"] is None and obs["mode"] == "hold", obs
    held = np.array([obs["follower"][j] for j in JOINT_NAMES])
    assert np.allclose(held, pose, atol=2.0), "the follower did not follow the leader through the plugin"

    # lerobot-replay moves the follower back along the recorded actions, through safety
    with ControlClient(running.sock) as c:
        c.request("teleop.start")  # the follower elsewhere first: the leader's new pose
    other = np.array([-15.0, -50.0, 55.0, 35.0, -5.0, 30.0])
    leader.set_pose_units(other)
    wait_status(
        running.sock,
        lambda st: np.allclose([st["joints"]["follower"][j] for j in JOINT_NAMES], other, atol=2.0),
        timeout_s=20,
    )
    r = _lerobot(
        "lerobot-replay",
        "--robot.type=so101d",
        f"--robot.socket={running.sock}",
        "--dataset.repo_id=local/plugin",
        f"--dataset.root={root}",
        "--dataset.episode=0",
        "--play_sounds=false",
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    with ControlClient(running.sock) as c:
        obs = c.request("arm.observe")
    back = np.array([obs["follower"][j] for j in JOINT_NAMES])
    # one second of replay at the alignment speed covers the way back (at most ~45 degrees)
    assert np.allclose(back, pose, atol=3.0), f"replay left the follower at {back}, not {pose}"


def test_no_daemon_at_the_socket_is_a_clear_error(tmp_path: Path) -> None:
    sock = tmp_path / "none.sock"
    r = _lerobot("lerobot-record", *_record_args(sock, tmp_path / "ds", episodes=1, seconds=1.0))
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "DeviceNotConnectedError" in out and str(sock) in out and "so101d run" in out, out[-3000:]


def test_the_daemon_killed_mid_run_ends_lerobot_record_with_a_clear_error(running: Running, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    _operator_tracks(running.sock)
    proc = subprocess.Popen(
        [str(BIN / "lerobot-record"), *_record_args(running.sock, root, episodes=1, seconds=60.0)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=lerobot_env(),
    )
    try:
        # it has the arm (LeRobot's imports take a minute on a busy 2-core machine)
        def holding(st: dict) -> bool:
            if proc.poll() is not None:
                raise AssertionError(
                    f"lerobot-record exited with {proc.returncode} first:\n{proc.communicate()[0][-3000:]}"
                )
            return st["arms"]["follower"]["source"] == "client"

        wait_status(running.sock, holding, timeout_s=300)
        os.killpg(running.daemon.pid, signal.SIGKILL)
        running.daemon.wait(10)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode != 0
    assert "DeviceNotConnectedError" in out and "stopped answering" in out and str(running.sock) in out, out[-3000:]
    # the dataset is what LeRobot leaves after an exception: finalize() ran, the table loads
    assert (root / "meta" / "info.json").exists()
    # the next daemon on the same bench takes the arm again from a clean start
    running.daemon = start_daemon(running.bench)
    shutil.rmtree(root, ignore_errors=True)
