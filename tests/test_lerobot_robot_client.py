"""LeRobot's async inference pair drives the daemon's follower: ``python -m
lerobot.async_inference.policy_server`` on loopback with a tiny ACT, and ``python -m
lerobot.async_inference.robot_client --robot.type=so101d`` (the so101d plugin) between it and
the daemon. The policy's actions reach the emulated follower through the daemon's safety layer
(status says the arm's source is the client; the command never steps past the step limit);
Ctrl-C on the client hands the arm back and it holds. The operator's hold mid-run: the client's
``send_action`` is refused with the daemon's reason, and LeRobot's client ends on that error
(its traceback, exit status 1), giving the arm back on its way out. No server at the address:
LeRobot's client returns without stopping, and the plugin gives the arm back at exit.

Real parts: `so101d run` on the virtual bench (emulated leader and follower, one virtual camera),
LeRobot 0.6.1's server and client, unmodified, each in its own process. The pair speaks pickle
over gRPC to each other on loopback; the daemon only ever sees the plugin's JSON requests on its
control socket.
"""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from lerobot_plugin_support import CAM_H, CAM_W, lerobot_env, require_plugin, start_daemon, stop_process
from policy_support import tiny_act
from support import free_port, wait_for, wait_status
from virtual_bench_support import VirtualBench, open_virtual_bench

from calibration.conventions import GRIPPER_INDEX, JOINT_NAMES
from daemon.api.client import ControlClient

RATE_HZ = 100.0
MAX_STEP_DEG = 1.0  # the step limit under test: small, so the policy's jumps must be cut to it
ALIGN_DEG_S = 60.0  # alignment at 0.6 degrees a cycle: within the step limit too
CHUNK = 10


@dataclass
class Bench:
    bench: VirtualBench
    daemon: subprocess.Popen[bytes]
    server: subprocess.Popen[bytes]
    port: int
    checkpoint: Path
    workdir: Path

    @property
    def sock(self) -> Path:
        return self.bench.socket_path


def _start_server(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    """LeRobot's policy server as its docstring starts it (its logs/ folder lands in workdir)."""
    with open(workdir / "server.log", "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lerobot.async_inference.policy_server",
                "--host=127.0.0.1",
                f"--port={port}",
                "--fps=30",
                "--inference_latency=0",
                "--obs_queue_timeout=1",
            ],
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=lerobot_env(),
            start_new_session=True,
        )

    def listening() -> bool:
        assert proc.poll() is None, (workdir / "server.log").read_text()[-3000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    try:
        wait_for(listening, 120, "LeRobot's policy server listening")
    except BaseException:
        stop_process(proc)
        raise
    return proc


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    require_plugin()
    work = tmp_path_factory.mktemp("robot-client")
    ckpt = tiny_act(tmp_path_factory, {"front": (CAM_H, CAM_W)}, chunk_size=CHUNK)
    with open_virtual_bench() as vb:
        daemon = start_daemon(vb, f"max_step_deg = {MAX_STEP_DEG}\n", align_deg_s=ALIGN_DEG_S, rate_hz=RATE_HZ)
        try:
            port = free_port()
            server = _start_server(port, work)
            try:
                yield Bench(vb, daemon, server, port, ckpt, work)
            finally:
                stop_process(server)
        finally:
            stop_process(daemon)


def _robot_client(b: Bench, log: Path, port: int | None = None) -> subprocess.Popen[bytes]:
    """LeRobot's robot client as a user types it, with the plugin's robot."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lerobot.async_inference.robot_client",
                "--robot.type=so101d",
                f"--robot.socket={b.sock}",
                "--robot.daemon_cameras=[front]",
                "--task=pick the cube",
                f"--server_address=127.0.0.1:{port or b.port}",
                "--policy_type=act",
                f"--pretrained_name_or_path={b.checkpoint}",
                "--policy_device=cpu",
                f"--actions_per_chunk={CHUNK}",
                "--chunk_size_threshold=0.5",
                "--fps=30",
            ],
            cwd=b.workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=lerobot_env(),
        )


def _live(c: ControlClient) -> tuple[int, np.ndarray | None, np.ndarray | None]:
    live = c.request("status.live")
    cmd, fol = live["joints"]["command"], live["joints"]["follower"]
    return (
        int(live["cycles"]),
        None if cmd is None else np.array(cmd, dtype=float),
        None if fol is None else np.array(fol, dtype=float),
    )


def _source(sock: Path) -> str:
    with ControlClient(sock) as c:
        return str(c.request("status")["arms"]["follower"]["source"])


def _operator_tracks(sock: Path) -> None:
    """`so101d teleop start`: the operator's resume (clears a latched fault, leaves a hold)."""
    with ControlClient(sock) as c:
        c.request("teleop.start")
    wait_status(sock, lambda st: st["mode"] == "teleop", timeout_s=30)


def _wait_client_drives(sock: Path, client: subprocess.Popen[bytes], log: Path) -> None:
    def holding(st: dict) -> bool:
        if client.poll() is not None:
            raise AssertionError(f"robot_client exited with {client.returncode} first:\n{log.read_text()[-4000:]}")
        return st["arms"]["follower"]["source"] == "client"

    # LeRobot's imports and the server's policy load take a while on a busy 2-core machine
    wait_status(sock, holding, timeout_s=300)


def _end(client: subprocess.Popen[bytes]) -> None:
    if client.poll() is None:
        client.kill()
        client.wait(10)


def test_robot_client_drives_the_follower_through_the_safety_layer(bench: Bench) -> None:
    _operator_tracks(bench.sock)
    start = bench.bench.follower.pose_units().copy()
    log = bench.workdir / "client-drive.log"
    client = _robot_client(bench, log)
    try:
        _wait_client_drives(bench.sock, client, log)
        # the policy's chunks move the arm: watch the command and the measured pose, cycle by cycle
        samples: list[tuple[int, np.ndarray]] = []
        moved = 0.0
        with ControlClient(bench.sock) as c:

            def travelled() -> bool:
                nonlocal moved
                assert client.poll() is None, log.read_text()[-4000:]
                cycle, cmd, fol = _live(c)
                if cmd is not None:
                    samples.append((cycle, cmd))
                if fol is not None:
                    moved = float(np.abs(fol - start)[:GRIPPER_INDEX].max())
                return moved > 5.0 and len(samples) >= 50

            wait_for(travelled, 120, "the follower moving 5 degrees under the policy's actions")
        assert _source(bench.sock) == "client"
        # every command step within the step limit: between two samples n cycles apart the
        # command moved at most n steps (body joints; the gripper has its own speed)
        rates = []
        for (c0, a), (c1, b) in itertools.pairwise(samples):
            if c1 > c0:
                step = float(np.abs(b - a)[:GRIPPER_INDEX].max())
                assert step <= MAX_STEP_DEG * (c1 - c0) + 1e-3, (
                    f"command moved {step:.3f} deg in {c1 - c0} cycles (limit {MAX_STEP_DEG} a cycle)"
                )
                rates.append(step / (c1 - c0))
        assert rates and max(rates) > 0.0, "the command never moved between two samples"
        text = log.read_text()
        assert "Robot connected and ready" in text and "Control loop thread starting" in text, text[-3000:]

        # Ctrl-C, as a user stops it: LeRobot's finally disconnects the robot, the arm holds
        client.send_signal(signal.SIGINT)
        client.wait(120)
    finally:
        _end(client)
    # LeRobot lets the KeyboardInterrupt out after its finally: Python's exit by the signal
    assert client.returncode == -signal.SIGINT, log.read_text()[-3000:]
    assert "KeyboardInterrupt" in log.read_text() and "Client stopped" in log.read_text()
    with ControlClient(bench.sock) as c:
        obs = c.request("arm.observe")
    assert obs["holder"] is None and obs["mode"] == "hold", obs
    assert obs["source"] != "client", obs
    held = np.array([obs["follower"][j] for j in JOINT_NAMES])
    assert float(np.abs(held - start)[:GRIPPER_INDEX].max()) > 5.0, "the follower is back where it began"

    # held: the measured pose stays put over the next second of cycles
    with ControlClient(bench.sock) as c:
        cycle0, _, pose0 = _live(c)
        wait_for(lambda: _live(c)[0] >= cycle0 + int(RATE_HZ), 30, "a second of cycles")
        _, _, pose1 = _live(c)
    assert pose0 is not None and pose1 is not None
    assert np.allclose(pose0, pose1, atol=1.0), f"the arm drifted while held: {pose0} -> {pose1}"


def test_the_operators_hold_refuses_the_clients_actions_with_its_reason(bench: Bench) -> None:
    _operator_tracks(bench.sock)
    log = bench.workdir / "client-hold.log"
    client = _robot_client(bench, log)
    try:
        _wait_client_drives(bench.sock, client, log)
        with ControlClient(bench.sock) as c:
            c.request("teleop.stop")  # the operator's Hold mid-run
        # LeRobot's control loop lets the error out of send_action: the client ends (no hang,
        # no silent retry), its finally gives the arm back
        client.wait(120)
    finally:
        _end(client)
    text = log.read_text()
    assert client.returncode == 1, text[-4000:]
    assert "DaemonRefused" in text and "refused arm.action" in text and "hold" in text, text[-4000:]
    assert str(bench.sock) in text, text[-4000:]
    with ControlClient(bench.sock) as c:
        obs = c.request("arm.observe")
    assert obs["holder"] is None and obs["mode"] == "hold", obs


def test_no_policy_server_leaves_the_arm_handed_back(bench: Bench) -> None:
    """The user forgot the server: LeRobot's client connects the robot, fails its handshake and
    returns without stopping (robot_client.py async_client: start() False, no client.stop());
    the plugin gives the arm back as the interpreter exits, not left to a gone process."""
    _operator_tracks(bench.sock)
    log = bench.workdir / "client-noserver.log"
    client = _robot_client(bench, log, port=free_port())
    try:
        client.wait(300)
    finally:
        _end(client)
    text = log.read_text()
    assert "Failed to connect to policy server" in text, text[-3000:]
    with ControlClient(bench.sock) as c:
        obs = c.request("arm.observe")
    assert obs["holder"] is None and obs["mode"] == "hold" and obs["source"] != "client", obs
    assert "giving the arm back" in text, text[-3000:]
