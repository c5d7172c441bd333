"""[policy] backend = "lerobot-server": LeRobot's own async policy server drives the emulated bench.

The operator's story: the checkpoint sits on a GPU host running
``python -m lerobot.async_inference.policy_server``; the daemon next to the servos points at it.
Here the server is LeRobot 0.6.1's real one in a subprocess on loopback (CPU, a tiny ACT trained
offline with daemon/policy/tiny.py). The server is down when the policy is loaded, comes up,
drives the arm, is killed mid-episode (the follower holds, status says why) and restarted (it
resumes). A fake server built on LeRobot's own gRPC stubs sends a malicious pickle: nothing runs.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import numpy as np
import pytest

from daemon.config import config_from_dict
from daemon.control_client import ControlClient
from daemon.policy.attach import attach_policy
from daemon.policy.safe_unpickle import UnsafePickleError, loads_actions
from daemon.policy.tiny import tiny_act_checkpoint
from daemon.recording.cameras import CameraConfig as CamCfg
from daemon.recording.cameras import VirtualArmCamera
from daemon.service import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader
from support import still_arm_on_pty, wait_for

H, W = 48, 64
POSE = np.array([0.0, -20.0, 20.0, 10.0, 0.0, 40.0])
RATE_HZ = 50.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LeRobotServer:
    """LeRobot's policy server, unmodified, as an operator starts it (CPU, loopback)."""

    def __init__(self, port: int, workdir: Path):
        self.port, self.workdir, self.proc = port, workdir, None

    def start(self) -> None:
        # --inference_latency=0: no artificial sleep in GetActions (its default pads to 1/fps)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lerobot.async_inference.policy_server", "--host=127.0.0.1",
             f"--port={self.port}", "--fps=30", "--inference_latency=0"],
            cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=open(self.workdir / "server.err", "ab"),
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )

        def accepting() -> bool:
            assert self.proc.poll() is None, (self.workdir / "server.err").read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(accepting, 60, "LeRobot's policy server listening")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_act_checkpoint(tmp_path_factory.mktemp("server_policy"), {"front": (H, W)})


def make_bench(root: Path, server: str, checkpoint: str, actions_per_chunk: int = 10):
    la, lb = still_arm_on_pty(root / "leader", "leader", POSE)
    fa, fb = still_arm_on_pty(root / "follower", "follower", POSE)
    cfg = config_from_dict({
        "socket": {"path": str(root / "c.sock")},
        "control": {"rate_hz": RATE_HZ},
        "safety": {"align_speed_deg_s": 90.0, "align_gripper_speed_pct_s": 100.0, "max_step_deg": 1.0},
        "cameras": {"front": {"kind": "virtual", "width": W, "height": H, "fps": 30}},
        "policy": {"action_fps": 30.0, "refill_below": 4, "max_obs_age_s": 1.0, "path": checkpoint,
                   "backend": "lerobot-server", "server": server, "server_policy_type": "act",
                   "actions_per_chunk": actions_per_chunk},
    })
    cam = VirtualArmCamera(CamCfg(name="front", width=W, height=H, fps=30))
    daemon = Daemon(cfg, FeetechLeader(str(root / "leader"), reference_calibration("leader")),
                    FeetechFollower(str(root / "follower"), reference_calibration("follower")))

    class CamFeed:  # the virtual camera draws the follower's measured pose
        def on_cycle(self, now, state, action, raw):
            cam.set_state(state)

    daemon.loop.add_hook(CamFeed())
    cam.start()
    ctl = attach_policy(daemon, cameras={"front": cam})
    daemon.start()

    def close() -> None:
        daemon.stop()
        cam.stop()
        lb.stop()
        fb.stop()

    return daemon, ctl, fa, close


def test_remote_policy_holds_without_server_drives_with_it_and_survives_a_restart(ckpt: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="so101d-srv-") as d:
        root = Path(d)
        port = free_port()
        server = LeRobotServer(port, root)
        daemon, ctl, follower, close = make_bench(root, f"127.0.0.1:{port}", str(ckpt))
        loop = daemon.loop
        try:
            wait_for(lambda: loop.state.mode in ("idle", "teleop", "hold"), 15, "follower connected")
            with ControlClient(str(root / "c.sock"), timeout_s=60) as c:
                # 1. server down at load: loaded, not crashed; status says why
                r = c.call("policy.load", wait_s=60)
                assert r["ok"] and r["state"] == "ready", r
                st = c.request("policy.status")
                assert st["backend"] == "lerobot-server"
                assert st["server"]["connected"] is False
                assert f"127.0.0.1:{port}" in st["server"]["error"], st["server"]
                assert c.request("policy.start", record=False)["ok"]
                time.sleep(1.0)
                assert loop.state.mode == "hold", loop.state.mode  # nothing to follow: hold

                # 2. the server comes up: the daemon reconnects (back-off), sets the policy up, drives
                server.start()
                wait_for(lambda: loop.state.mode == "policy", 90, f"policy mode (now {loop.state.mode}: {loop.state.reason})")
                wait_for(lambda: c.request("policy.status")["results"] >= 3, 30, "three remote chunks")
                s0 = c.request("status")
                t0 = time.monotonic()
                time.sleep(2.0)
                s1 = c.request("status")
                rate = (s1["cycles"] - s0["cycles"]) / (time.monotonic() - t0)
                assert rate > 0.8 * RATE_HZ, f"loop ran at {rate:.1f} Hz under the remote policy"
                st = c.request("policy.status")
                srv = st["server"]
                assert srv["connected"] is True and srv["round_trip_ms"]["p50"] > 0
                assert srv["network_ms"]["p50"] > 0 and srv["get_actions_ms"]["p50"] > 0
                assert srv["server_compute_ms"] is None and "unknown" in srv["server_compute_note"]
                assert st["driving"] and loop.state.mode == "policy"

                # 3. the server dies mid-episode: hold, status says why
                results_before = st["results"]
                server.kill()
                wait_for(lambda: loop.state.mode == "hold", 10, f"hold after the server died (now {loop.state.mode})")
                wait_for(lambda: c.request("policy.status")["server"]["connected"] is False, 15, "status: server lost")
                st = c.request("policy.status")
                assert st["last_error"] and f"127.0.0.1:{port}" in st["last_error"], st["last_error"]
                assert daemon.loop.state.mode == "hold"

                # 4. restarted: it resumes without an operator command
                server.start()
                wait_for(lambda: loop.state.mode == "policy", 90, f"policy mode again (now {loop.state.mode}: {loop.state.reason})")
                wait_for(lambda: c.request("policy.status")["results"] > results_before + 2, 30, "chunks after the restart")
                assert c.request("policy.status")["server"]["connects"] >= 2
                assert c.request("policy.stop")["ok"]
        finally:
            close()
            server.kill()


def test_follower_moves_under_the_remote_policy(ckpt: Path) -> None:
    """The targets the loop sends while the server drives are the server's actions: they differ
    from the still leader's pose and change over time."""
    with tempfile.TemporaryDirectory(prefix="so101d-srv-") as d:
        root = Path(d)
        port = free_port()
        server = LeRobotServer(port, root)
        server.start()
        daemon, ctl, follower, close = make_bench(root, f"127.0.0.1:{port}", str(ckpt))
        loop = daemon.loop
        rows: list[tuple[str, np.ndarray, np.ndarray]] = []

        class Rec:
            def on_cycle(self, now, state, action, raw):
                rows.append((loop.state.mode, np.array(state, dtype=float), np.array(action, dtype=float)))

        loop.add_hook(Rec())
        try:
            wait_for(lambda: loop.state.mode in ("idle", "teleop", "hold"), 15, "follower connected")
            with ControlClient(str(root / "c.sock"), timeout_s=60) as c:
                r = c.call("policy.load", wait_s=90)
                assert r["ok"] and r["state"] == "ready", r
                assert c.request("policy.status")["server"]["connected"] is True
                assert c.request("policy.start", record=False)["ok"]
                wait_for(lambda: loop.state.mode == "policy", 60, f"policy mode (now {loop.state.mode})")
                n0 = len(rows)
                wait_for(lambda: c.request("policy.status")["results"] >= 5, 30, "five remote chunks")
                time.sleep(1.0)
                n1 = len(rows)
                c.request("policy.stop")
            seg = [r for r in rows[n0:n1] if r[0] == "policy"]
            assert len(seg) > 30
            acts = np.array([r[2] for r in seg])
            states = np.array([r[1] for r in seg])
            # commanded targets moved (the policy's, not a frozen hold) and the follower followed
            assert np.ptp(acts[:, :5], axis=0).max() > 0.05, np.ptp(acts, axis=0)
            assert np.ptp(states[:, :5], axis=0).max() > 0.05, np.ptp(states, axis=0)
        finally:
            close()
            server.kill()


# -- the server's replies are never blindly unpickled -----------------------------------------

class Boom:
    """Unpickling this calls os.system: a file appears if anything ran it."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_real_chunk_decodes_and_a_malicious_one_is_refused(tmp_path: Path) -> None:
    import torch
    from lerobot.async_inference.helpers import TimedAction

    chunk = [TimedAction(timestamp=1.0 + i / 30, timestep=i, action=torch.arange(6.0) + i) for i in range(4)]
    back = loads_actions(pickle.dumps(chunk))
    assert [a.timestep for a in back] == [0, 1, 2, 3]
    assert torch.equal(back[3].action, torch.arange(6.0) + 3)
    marker = tmp_path / "pwned"
    with pytest.raises(UnsafePickleError, match="posix.system"):
        loads_actions(pickle.dumps([Boom(marker)]))
    assert not marker.exists()
    # hidden in the tensor's storage bytes (torch's own _load_from_bytes would torch.load them unrestricted)
    evil_storage = pickle.dumps(Boom(marker), protocol=2)
    with pytest.raises(UnsafePickleError):
        loads_actions(pickle.dumps([TimedAction(0.0, 0, _StorageSmuggler(evil_storage))]))
    assert not marker.exists()


class _StorageSmuggler:
    """Pickles as torch.storage._load_from_bytes(payload): the nested-pickle route."""

    def __init__(self, payload: bytes):
        self.payload = payload

    def __reduce__(self):
        import torch.storage

        return (torch.storage._load_from_bytes, (self.payload,))


def test_malicious_server_reply_runs_nothing_and_the_daemon_holds(ckpt: Path) -> None:
    import grpc
    from lerobot.transport import services_pb2, services_pb2_grpc

    with tempfile.TemporaryDirectory(prefix="so101d-evil-") as d:
        root = Path(d)
        marker = root / "pwned"
        calls = {"get": 0}

        class EvilServer(services_pb2_grpc.AsyncInferenceServicer):
            """Accepts LeRobot's setup and observations; answers GetActions with a payload."""

            def Ready(self, request, context):  # noqa: N802
                return services_pb2.Empty()

            def SendPolicyInstructions(self, request, context):  # noqa: N802
                return services_pb2.Empty()

            def SendObservations(self, request_iterator, context):  # noqa: N802
                for _ in request_iterator:
                    pass
                return services_pb2.Empty()

            def GetActions(self, request, context):  # noqa: N802
                calls["get"] += 1
                return services_pb2.Actions(data=pickle.dumps([Boom(marker)]))

        port = free_port()
        srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        services_pb2_grpc.add_AsyncInferenceServicer_to_server(EvilServer(), srv)
        srv.add_insecure_port(f"127.0.0.1:{port}")
        srv.start()
        daemon, ctl, follower, close = make_bench(root, f"127.0.0.1:{port}", str(ckpt))
        loop = daemon.loop
        try:
            wait_for(lambda: loop.state.mode in ("idle", "teleop", "hold"), 15, "follower connected")
            with ControlClient(str(root / "c.sock"), timeout_s=60) as c:
                assert c.call("policy.load", wait_s=60)["ok"]
                assert c.request("policy.start", record=False)["ok"]
                wait_for(lambda: calls["get"] >= 3, 30, "the daemon asked the evil server a few times")
                st = c.request("policy.status")
                assert "posix.system" in (st["last_error"] or "") and "refused" in st["last_error"], st["last_error"]
                assert st["results"] == 0
                assert loop.state.mode == "hold", loop.state.mode
                assert st["state"] == "ready"  # the daemon and its worker are still up
            assert not marker.exists()
        finally:
            close()
            srv.stop(0)
