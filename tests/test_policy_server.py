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
import tempfile
import time
from concurrent import futures
from pathlib import Path

import numpy as np
import pytest
from policy_support import LeRobotServer, free_port, tiny_act
from support import still_arm_on_pty, wait_for

from daemon.api.client import ControlClient
from daemon.apps.commands.policy import format_status
from daemon.config.settings import config_from_dict
from daemon.policy.safe_unpickle import UnsafePickleError, loads_actions
from daemon.service.attach_policy import attach_policy
from daemon.service.daemon import Daemon
from drivers.cameras import CameraConfig as CamCfg
from drivers.cameras import VirtualArmCamera
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

H, W = 48, 64
POSE = np.array([0.0, -20.0, 20.0, 10.0, 0.0, 40.0])
RATE_HZ = 50.0


def wait_mode(loop, c: ControlClient, mode: str, timeout_s: float, what: str) -> None:
    """wait_for the loop's mode; a timeout says what the policy status showed (load vs a bug)."""
    try:
        wait_for(lambda: loop.state.mode == mode, timeout_s, what)
    except AssertionError:
        st = c.request("policy.status")
        keys = (
            "state",
            "results",
            "requests",
            "chunks_rejected",
            "chunks_expired",
            "inference_latency_ms",
            "last_error",
            "server",
        )
        raise AssertionError(
            f"{what}: mode {loop.state.mode} ({loop.state.reason}) after {timeout_s} s; "
            f"policy { ({k: st.get(k) for k in keys}) }"
        ) from None


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_act(tmp_path_factory, {"front": (H, W)})


def make_bench(
    root: Path,
    server: str,
    checkpoint: str,
    actions_per_chunk: int = 10,
    record: bool = False,
    max_obs_age_s: float = 3.0,
):
    _la, lb = still_arm_on_pty(root / "leader", "leader", POSE)
    fa, fb = still_arm_on_pty(root / "follower", "follower", POSE)
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "control": {"rate_hz": RATE_HZ},
            "safety": {"align_speed_deg_s": 90.0, "align_gripper_speed_pct_s": 100.0, "max_step_deg": 1.0},
            "cameras": {"front": {"kind": "virtual", "width": W, "height": H, "fps": 30}},
            "policy": {
                "action_fps": 30.0,
                "refill_below": 4,
                "max_obs_age_s": max_obs_age_s,
                "path": checkpoint,
                "backend": "lerobot-server",
                "server": server,
                "server_policy_type": "act",
                "actions_per_chunk": actions_per_chunk,
            },
            **(
                {"recording": {"enabled": True, "dataset_root": str(root / "datasets"), "repo_id": "eval/remote"}}
                if record
                else {}
            ),
        }
    )
    cam = VirtualArmCamera(CamCfg(name="front", width=W, height=H, fps=30))
    daemon = Daemon(
        cfg,
        FeetechLeader(str(root / "leader"), reference_calibration("leader")),
        FeetechFollower(str(root / "follower"), reference_calibration("follower")),
    )

    class CamFeed:  # the virtual camera draws the follower's measured pose
        def on_cycle(self, now, state, action, raw):
            cam.set_state(state)

    daemon.loop.add_hook(CamFeed())
    cam.start()
    recorder = None
    if record:
        from daemon.service.attach_recording import attach_recorder

        recorder = attach_recorder(daemon, cameras=[cam])
        daemon.recorder = recorder  # the daemon's start() then uses this one (our virtual camera)
    ctl = attach_policy(daemon, cameras={"front": cam}, recorder=recorder)
    daemon.start()

    def close() -> None:
        daemon.stop()
        cam.stop()
        lb.stop()
        fb.stop()

    daemon.recorder_for_test = recorder
    return daemon, ctl, fa, close


def test_remote_policy_holds_without_server_drives_with_it_and_survives_a_restart(ckpt: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="so101d-srv-") as d:
        root = Path(d)
        port = free_port()
        server = LeRobotServer(port, root)
        daemon, _ctl, _follower, close = make_bench(root, f"127.0.0.1:{port}", str(ckpt))
        loop = daemon.loop
        try:
            wait_for(lambda: loop.state.mode in ("idle", "teleop", "hold"), 15, "follower connected")
            with ControlClient(str(root / "c.sock"), timeout_s=100) as c:
                # 1. server down at load: loaded, not crashed; status says why
                r = c.call("policy.load", wait_s=60)
                assert r["ok"] and r["state"] == "ready", r
                assert f"127.0.0.1:{port} (not reachable now" in r["message"], r["message"]
                st = c.request("policy.status")
                assert st["backend"] == "lerobot-server"
                assert st["server"]["connected"] is False
                assert f"127.0.0.1:{port}" in st["server"]["error"], st["server"]
                assert c.request("policy.start", record=False)["ok"]
                c0 = c.request("status")["cycles"]
                wait_for(lambda: c.request("status")["cycles"] >= c0 + 50, 30, "50 loop cycles after policy.start")
                assert loop.state.mode == "hold", loop.state.mode  # nothing to follow: hold

                # 2. the server comes up: the daemon reconnects (back-off), sets the policy up, drives
                server.start()
                wait_mode(loop, c, "policy", 90, "policy mode once the server is up")
                wait_for(lambda: c.request("policy.status")["results"] >= 3, 30, "three remote chunks")
                s0 = c.request("status")
                t0 = time.monotonic()
                # the rate over 60 cycles (1.2 s at RATE_HZ); a slower loop takes longer and fails below
                wait_for(lambda: c.request("status")["cycles"] >= s0["cycles"] + 60, 30, "60 loop cycles")
                s1 = c.request("status")
                rate = (s1["cycles"] - s0["cycles"]) / (time.monotonic() - t0)
                assert rate > 0.8 * RATE_HZ, f"loop ran at {rate:.1f} Hz under the remote policy"
                st = c.request("policy.status")
                srv = st["server"]
                assert srv["connected"] is True and srv["round_trip_ms"]["p50"] > 0
                assert srv["network_ms"]["p50"] > 0 and srv["get_actions_ms"]["p50"] > 0
                assert srv["server_compute_ms"] is None and "unknown" in srv["server_compute_note"]
                assert st["driving"] and loop.state.mode == "policy"
                text = format_status(st)  # what `so101d policy status` prints
                assert f"127.0.0.1:{port} connected" in text and "round trip" in text and "network" in text
                assert "server compute unknown" in text, text

                # 3. the server dies mid-episode: hold, status says why
                results_before = st["results"]
                server.kill()
                wait_for(lambda: loop.state.mode == "hold", 10, f"hold after the server died (now {loop.state.mode})")
                wait_for(lambda: c.request("policy.status")["server"]["connected"] is False, 15, "status: server lost")
                st = c.request("policy.status")
                assert st["last_error"] and f"127.0.0.1:{port}" in st["last_error"], st["last_error"]
                assert "NOT connected" in format_status(st) and "UNAVAILABLE" in format_status(st), format_status(st)
                assert daemon.loop.state.mode == "hold"

                # 4. restarted: it resumes without an operator command
                server.start()
                wait_mode(loop, c, "policy", 90, "policy mode again after the restart")
                wait_for(
                    lambda: c.request("policy.status")["results"] > results_before + 2, 30, "chunks after the restart"
                )
                assert c.request("policy.status")["server"]["connects"] >= 2
                assert c.request("policy.stop")["ok"]
        finally:
            close()
            server.kill()


def test_follower_moves_under_the_remote_policy_and_the_episode_is_tagged(ckpt: Path) -> None:
    """The targets the loop sends while the server drives are the server's actions: they differ
    from the still leader's pose and change over time. The evaluation episode is recorded as with
    the local backend: origin policy, its tag naming the backend and the server."""
    with tempfile.TemporaryDirectory(prefix="so101d-srv-") as d:
        root = Path(d)
        port = free_port()
        server = LeRobotServer(port, root)
        server.start()
        daemon, _ctl, _follower, close = make_bench(root, f"127.0.0.1:{port}", str(ckpt), record=True)
        loop = daemon.loop
        rows: list[tuple[str, np.ndarray, np.ndarray]] = []

        class Rec:
            def on_cycle(self, now, state, action, raw):
                rows.append((loop.state.mode, np.array(state, dtype=float), np.array(action, dtype=float)))

        loop.add_hook(Rec())
        try:
            wait_for(lambda: loop.state.mode in ("idle", "teleop", "hold"), 15, "follower connected")
            with ControlClient(str(root / "c.sock"), timeout_s=100) as c:
                r = c.call("policy.load", wait_s=90)
                assert r["ok"] and r["state"] == "ready", r
                assert c.request("policy.status")["server"]["connected"] is True
                wait_for(lambda: c.request("status").get("recording", {}).get("phase") == "idle", 120, "recorder ready")
                assert c.request("policy.start", record=True)["ok"]
                wait_mode(loop, c, "policy", 60, "policy mode")
                n0 = len(rows)
                wait_for(lambda: c.request("policy.status")["results"] >= 5, 30, "five remote chunks")
                wait_for(lambda: sum(r[0] == "policy" for r in rows[n0:]) > 40, 30, "40 cycles driven by the policy")
                n1 = len(rows)
                saved = c.request("policy.stop")
                assert saved["episode"] is not None, saved
                assert daemon.recorder_for_test.wait_saved(120), daemon.recorder_for_test.status()
            from daemon.data.schema import read_episode_tags

            tags = read_episode_tags(root / "datasets" / "eval" / "remote")
            assert len(tags) == 1 and tags[0].origin == "policy", tags
            assert any(f"policy backend lerobot-server, server 127.0.0.1:{port}" in n for n in tags[0].notes), tags[
                0
            ].notes
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


def test_a_server_slower_than_max_obs_age_leaves_the_follower_holding(ckpt: Path) -> None:
    """LeRobot's own --inference_latency pads every GetActions to 1.5 s; max_obs_age_s is 1 s: every
    chunk is stale on arrival, so none drives the arm, and status shows where the time went."""
    with tempfile.TemporaryDirectory(prefix="so101d-srv-") as d:
        root = Path(d)
        port = free_port()
        server = LeRobotServer(port, root, inference_latency_s=1.5)
        server.start()
        daemon, _ctl, _follower, close = make_bench(root, f"127.0.0.1:{port}", str(ckpt), max_obs_age_s=1.0)
        loop = daemon.loop
        modes: list[str] = []

        class Rec:
            def on_cycle(self, now, state, action, raw):
                modes.append(loop.state.mode)

        loop.add_hook(Rec())
        try:
            wait_for(lambda: loop.state.mode in ("idle", "teleop", "hold"), 15, "follower connected")
            with ControlClient(str(root / "c.sock"), timeout_s=100) as c:
                assert c.call("policy.load", wait_s=90)["ok"]
                assert c.request("policy.start", record=False)["ok"]
                n0 = len(modes)
                wait_for(lambda: c.request("policy.status")["results"] >= 3, 60, "three slow chunks")
                st = c.request("policy.status")
                assert st["chunks_rejected"] >= 3, st
                assert st["server"]["get_actions_ms"]["p50"] >= 1400, st["server"]
                assert st["warning"] and "usable horizon" in st["warning"], st["warning"]
                assert "policy" not in modes[n0:], "a stale chunk drove the arm"
                assert loop.state.mode == "hold"
                c.request("policy.stop")
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

            def Ready(self, request, context):
                return services_pb2.Empty()

            def SendPolicyInstructions(self, request, context):
                return services_pb2.Empty()

            def SendObservations(self, request_iterator, context):
                for _ in request_iterator:
                    pass
                return services_pb2.Empty()

            def GetActions(self, request, context):
                calls["get"] += 1
                return services_pb2.Actions(data=pickle.dumps([Boom(marker)]))

        port = free_port()
        srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        services_pb2_grpc.add_AsyncInferenceServicer_to_server(EvilServer(), srv)
        srv.add_insecure_port(f"127.0.0.1:{port}")
        srv.start()
        daemon, _ctl, _follower, close = make_bench(root, f"127.0.0.1:{port}", str(ckpt))
        loop = daemon.loop
        try:
            wait_for(lambda: loop.state.mode in ("idle", "teleop", "hold"), 15, "follower connected")
            with ControlClient(str(root / "c.sock"), timeout_s=100) as c:
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


# -- `so101d policy check` for a checkpoint that exists only on the server ---------------------


def _policy_check(capsys, *args: str) -> tuple[int, str, str]:
    """`so101d policy check ...` as the operator types it (the CLI's own main, in this process)."""
    from daemon.apps.cli import main

    capsys.readouterr()
    rc = main(["policy", "check", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_policy_check_on_the_server_sets_it_up_and_runs_one_observation(ckpt: Path, tmp_path: Path, capsys) -> None:
    """The operator's checkpoint sits on the GPU host: `policy check` asks LeRobot's server to set it
    up (the daemon's handshake) and sends one observation of this configuration. Server down, a
    checkpoint the server does not have, an observation the policy cannot take: a clear reason and
    exit 1, never a traceback."""
    port = free_port()
    cfg = tmp_path / "so101d.toml"
    cfg.write_text(
        f'[socket]\npath = "{tmp_path / "c.sock"}"\n'
        f'[cameras.front]\nkind = "virtual"\nwidth = {W}\nheight = {H}\n'
        f'[policy]\nbackend = "lerobot-server"\nserver = "127.0.0.1:{port}"\npath = "{ckpt}"\n'
        'server_policy_type = "act"\nactions_per_chunk = 10\n'
    )
    # no [policy] backend here: --server says where; the camera is one the policy was not trained on
    wrist = tmp_path / "wrist.toml"
    wrist.write_text(
        f'[socket]\npath = "{tmp_path / "c.sock"}"\n[cameras.wrist]\nkind = "virtual"\nwidth = {W}\nheight = {H}\n'
        "[policy]\nactions_per_chunk = 10\n"
    )
    server = LeRobotServer(port, tmp_path)
    try:
        rc, out, err = _policy_check(capsys, "--config", str(cfg))
        assert rc == 1, (out, err)
        assert f"127.0.0.1:{port}" in err and "UNAVAILABLE" in err and "Traceback" not in err, err

        server.start()
        rc, out, err = _policy_check(capsys, "--config", str(cfg))
        assert rc == 0, (out, err)
        assert f"act from {ckpt} on the policy server 127.0.0.1:{port}" in out, out
        assert "6 joint positions, front 64x48" in out
        assert "ok: the server set the policy up" in out
        assert "an action chunk of 10 x 6" in out and "first forward pass" in out, out
        assert "timing: round trip" in out and "GetActions" in out and "of 5" in out, out

        missing = tmp_path / "not-on-the-server"
        rc, out, err = _policy_check(capsys, str(missing), "--config", str(cfg))
        assert rc == 1, (out, err)
        assert f"cannot set the policy up on 127.0.0.1:{port}" in err and str(missing) in err, err

        rc, out, err = _policy_check(capsys, str(ckpt), "--server", f"127.0.0.1:{port}", "--config", str(wrist))
        assert rc == 1, (out, err)
        assert "answered no actions for the observation (6 joint positions, wrist 64x48)" in err, err
    finally:
        server.kill()
