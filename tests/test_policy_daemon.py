"""Mode `policy` in the running daemon against the emulated bench: a tiny ACT drives the emulated
follower through the same safety layer, over the control socket verbs, with a virtual camera."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from policy_support import tiny_act
from support import wait_for
from virtual_bench_support import VirtualBench

from daemon.api.client import ControlClient
from daemon.config.settings import config_from_dict
from daemon.service.attach_policy import attach_policy
from daemon.service.daemon import Daemon
from drivers.cameras import CameraConfig as CamCfg
from drivers.cameras import VirtualArmCamera
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

H, W = 48, 64
POSE = np.array([0.0, -20.0, 20.0, 10.0, 0.0, 40.0])


class Rows:
    """Every cycle's (now, state, action, raw target) and the mode the cycle ran in."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []
        self.modes: list[str] = []
        self.loop = None

    def on_cycle(self, now, state, action, raw):
        self.rows.append((now, state.copy(), action.copy(), raw.copy()))
        self.modes.append(self.loop.state.mode if self.loop is not None else "?")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_act(tmp_path_factory, {"front": (H, W)})


@pytest.fixture()
def policy_bench(virtual_bench: VirtualBench):
    root = virtual_bench.root
    la = virtual_bench.leader
    la.set_pose_units(POSE)
    virtual_bench.follower.set_pose_units(POSE)
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "safety": {"align_speed_deg_s": 90.0, "align_gripper_speed_pct_s": 100.0, "max_step_deg": 1.0},
            "cameras": {"front": {"kind": "virtual", "width": W, "height": H, "fps": 30}},
            # torch_threads: the configured count reaches the worker (0, the default, leaves a core)
            "policy": {"action_fps": 30.0, "refill_below": 4, "max_obs_age_s": 5.0, "torch_threads": 2},
        }
    )
    cam = VirtualArmCamera(CamCfg(name="front", width=W, height=H, fps=30))
    daemon = Daemon(
        cfg,
        FeetechLeader(str(root / "leader"), reference_calibration("leader")),
        FeetechFollower(str(root / "follower"), reference_calibration("follower")),
    )
    rows = Rows()
    rows.loop = daemon.loop
    daemon.loop.add_hook(rows)

    class CamFeed:  # the virtual camera draws the follower's measured pose
        def on_cycle(self, now, state, action, raw):
            cam.set_state(state)

    daemon.loop.add_hook(CamFeed())
    cam.start()
    ctl = attach_policy(daemon, cameras={"front": cam})
    daemon.start()
    yield daemon, ctl, rows, la, root
    daemon.stop()
    cam.stop()


def test_policy_mode_drives_the_follower_through_safety(policy_bench, ckpt: Path) -> None:
    daemon, _ctl, rows, _la_emu, root = policy_bench
    loop = daemon.loop
    wait_for(
        lambda: loop.state.mode == "idle" or loop.state.mode == "teleop" or loop.state.mode == "hold",
        15,
        "follower connected",
    )
    with ControlClient(str(root / "c.sock"), timeout_s=100) as c:
        r = c.call("policy.start")
        assert r["ok"] is False and "no policy loaded" in r["error"]
        r = c.call("policy.load", path=str(ckpt), wait_s=90)
        assert r["ok"] and r["state"] == "ready", r
        st = c.request("policy.status")
        assert st["state"] == "ready" and st["worker"]["torch_threads"] == 2, st["worker"]
        n0 = len(rows.rows)
        assert c.request("policy.start", record=False)["ok"]
        wait_for(lambda: loop.state.mode == "policy", 20, f"policy mode (now {loop.state.mode}: {loop.state.reason})")
        start_policy = len(rows.rows)
        wait_for(lambda: len(rows.rows) >= start_policy + 100, 30, "100 loop cycles in policy mode")
        wait_for(lambda: c.request("status")["policy"]["results"] >= 2, 30, "two policy results")
        st = c.request("status")
        pol = st["policy"]
        assert pol["driving"] and pol["results"] >= 2 and pol["inference_latency_ms"]["p50"] > 0
        chunk_size = json.loads((ckpt / "config.json").read_text())["chunk_size"]
        assert pol["chunks_live"] >= 1 and pol["queue_depth"] <= chunk_size, pol
        assert pol["chunk_age_ms"] is not None and pol["chunk_age_ms"] >= 0
        # the loop keeps cycling while the policy runs (its rate is bench_policy's business)
        wait_for(lambda: c.request("status")["cycles"] > st["cycles"] + 10, 10, "loop cycles during the policy")
        end = len(rows.rows)  # the policy's cycles only (a hold commands the measured pose)
        assert c.request("policy.stop")["mode"] in ("hold", "policy")
        wait_for(lambda: loop.state.mode == "hold", 5, "hold after policy.stop")
    acts = np.array([r[2] for r in rows.rows[start_policy:end]])
    raws = np.array([r[3] for r in rows.rows[start_policy:end]])
    assert len(acts) > 50
    # safety applied: per-cycle steps bounded while tracking the policy (a stale gap between chunks
    # holds the measured pose and re-aligns: that is the safety layer's stale rule, checked elsewhere)
    modes = rows.modes[start_policy:end]
    tracking = np.array([a == "policy" and b == "policy" for a, b in itertools.pairwise(modes)])
    steps = np.abs(np.diff(acts, axis=0))[tracking]
    assert len(steps) > 20
    assert np.all(steps[:, :5] <= 1.0 + 1e-6), steps.max(axis=0)
    lo, hi = loop.params.lower, loop.params.upper
    assert np.all(acts >= lo - 1e-6) and np.all(acts <= hi + 1e-6)
    # the loop's target was the policy's output, not the (still) leader, and the follower moved toward it
    in_policy = np.array([m == "policy" for m in rows.modes[start_policy:end]])
    assert np.abs(raws[in_policy] - POSE).max(axis=1).min() > 2.0
    assert loop.limited_cycles > 0
    first, last = rows.rows[n0][1], rows.rows[-1][1]
    assert np.abs(last - first).max() > 1.0


def test_load_lists_camera_mismatches_over_the_socket(policy_bench, ckpt: Path, tmp_path: Path) -> None:
    daemon, _ctl, _rows, _la_emu, root = policy_bench
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{}")  # looks like a checkpoint, so it is looked into
    (tmp_path / "bad" / "model.pth").write_bytes(b"\x80\x04")
    with ControlClient(str(root / "c.sock"), timeout_s=10) as c:
        r = c.call("policy.load", path=str(tmp_path / "bad"))
        assert r["ok"] is False and "model.pth" in r["error"] and "only safetensors" in r["error"]
    # a daemon configured with another camera than the policy was trained with
    daemon.cfg.cameras["front"].width = 640
    daemon.cfg.cameras["front"].height = 480
    with ControlClient(str(root / "c.sock"), timeout_s=10) as c:
        r = c.call("policy.load", path=str(ckpt))
        assert r["ok"] is False and "camera 'front': policy expects 64x48, configured 640x480" in r["error"]
        assert c.request("policy.status")["state"] == "none"


def test_takeover_hands_over_to_teleop_without_a_jump(policy_bench, ckpt: Path) -> None:
    daemon, ctl, rows, la_emu, root = policy_bench
    loop = daemon.loop
    wait_for(lambda: loop.follower_link.connected and loop.measured is not None, 15, "follower connected")
    with ControlClient(str(root / "c.sock"), timeout_s=100) as c:
        assert c.request("policy.load", path=str(ckpt), wait_s=90)["state"] == "ready"
        c.request("policy.start", record=False)
        wait_for(lambda: loop.state.mode == "policy", 20, "policy mode")
        wait_for(  # the policy moves the follower away from the (still) leader
            lambda: np.abs(np.array(loop.leader_units) - np.array(loop.measured)).max() > 3.0,
            30,
            "the follower 3 degrees away from the leader",
        )
        follower_at_stop = np.array(loop.measured)
        emu_leader = la_emu  # still playing its demo motion: the release pauses it (no snap back)
        leader_before = np.array(loop.leader_units)
        assert np.abs(leader_before - follower_at_stop).max() > 2.0  # there is a gap to close
        r = c.request("policy.takeover")
        assert r["phase"] in ("torque_on", "moving")
        wait_for(lambda: ctl.takeover_state.finished, 20, "take-over finished")
        assert ctl.takeover_state.phase == "done", ctl.takeover_state.error
        wait_for(lambda: loop.state.mode == "teleop", 10, f"teleop after take-over (now {loop.state.mode})")
        n = len(rows.rows)
        wait_for(lambda: len(rows.rows) >= n + 50, 30, "50 loop cycles in teleop")
        st = c.request("policy.status")
        assert st["takeover"]["phase"] == "done" and not st["driving"]
    # no jump: from the policy's stop to teleop the follower stayed where the policy left it
    after = np.array([r[1] for r in rows.rows[n:]])
    assert np.abs(after - follower_at_stop).max() < 4.0
    assert np.abs(np.array(loop.leader_units) - follower_at_stop).max() < 4.0
    assert not any(bool(s.torque_enabled) for s in emu_leader.servos)  # released for the hand


def so101d(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daemon.apps.cli", *args], capture_output=True, text=True, timeout=60)


def test_policy_verbs_say_what_the_arm_does(policy_bench, ckpt: Path) -> None:
    """Issue 18: `so101d policy stop` with no policy said "policy stopped: holding" (exit 0) while
    the arm kept following the leader. Every policy verb now answers what actually happens."""
    daemon, _ctl, _rows, _la_emu, root = policy_bench
    loop = daemon.loop
    sock = str(root / "c.sock")
    wait_for(lambda: loop.follower_link.connected and loop.measured is not None, 15, "follower connected")
    with ControlClient(sock, timeout_s=100) as c:
        c.request("teleop.start")
    wait_for(lambda: loop.state.mode == "teleop", 15, f"teleop (now {loop.state.mode}: {loop.state.reason})")
    # no policy loaded: stop and unload refuse, and the arm goes on following the leader
    r = so101d("policy", "stop", "--socket", sock)
    assert r.returncode != 0 and "no policy is driving; nothing to stop" in r.stderr, (r.stdout, r.stderr)
    assert "holding" not in r.stdout
    r = so101d("policy", "unload", "--socket", sock)
    assert r.returncode != 0 and "no policy loaded; nothing to unload" in r.stderr, (r.stdout, r.stderr)
    time.sleep(0.3)
    assert loop.intent == "teleop" and loop.state.mode == "teleop"
    # loaded but not driving: still nothing to stop
    with ControlClient(sock, timeout_s=100) as c:
        assert c.request("policy.load", path=str(ckpt), wait_s=90)["state"] == "ready"
    r = so101d("policy", "stop", "--socket", sock)
    assert r.returncode != 0 and "no policy is driving; nothing to stop (mode teleop, policy ready)" in r.stderr, (
        r.stderr
    )
    r = so101d("policy", "stop", "--takeover", "--socket", sock)
    assert r.returncode != 0 and "already follows the leader (teleop); nothing to take over" in r.stderr, r.stderr
    assert loop.state.mode == "teleop"
    # driving: a second start is refused (it would clear the running policy's queue), stop holds
    r = so101d("policy", "start", "--no-record", "--socket", sock)
    assert r.returncode == 0, r.stderr
    # the first chunk may still be computing: the answer says so rather than "driving"
    assert r.stdout.strip() in (
        "policy started: the follower holds until the first chunk, then aligns to it",
        "policy driving the follower (aligning first)",
    ), r.stdout
    wait_for(lambda: loop.intent == "policy", 10, "policy intent")
    r = so101d("policy", "start", "--no-record", "--socket", sock)
    assert r.returncode != 0 and "already driving" in r.stderr, r.stderr
    r = so101d("policy", "stop", "--socket", sock)
    assert r.returncode == 0 and r.stdout.strip() == "policy stopped: holding", (r.stdout, r.stderr)
    assert loop.state.mode == "hold" and loop.intent == "hold"
    r = so101d("policy", "unload", "--socket", sock)
    assert r.returncode == 0 and r.stdout.strip() == "policy unloaded", (r.stdout, r.stderr)


def test_a_sim_camera_without_a_size_is_checked_at_the_simulators_size() -> None:
    """`[cameras.front] kind = "sim"` with no size (as the README shows): the policy is checked
    against the size the simulator announced, not the 640x480 default; a size given is kept."""
    from types import SimpleNamespace

    from daemon.service.attach_policy import PolicyController

    cfg = config_from_dict({"cameras": {"front": {"kind": "sim"}, "wrist": {"kind": "sim", "width": 64, "height": 48}}})
    announced = SimpleNamespace(width=320, height=240)
    ctl = PolicyController(SimpleNamespace(cfg=cfg), cameras={"front": announced, "wrist": announced})
    assert ctl._camera_size("front", cfg.cameras["front"]) == (240, 320)
    assert ctl._camera_size("wrist", cfg.cameras["wrist"]) == (48, 64)
    # before the simulator's hello the live camera has no size yet: the configured default stands
    unknown = PolicyController(SimpleNamespace(cfg=cfg), cameras={"front": SimpleNamespace(width=0, height=0)})
    assert unknown._camera_size("front", cfg.cameras["front"]) == (
        cfg.cameras["front"].height,
        cfg.cameras["front"].width,
    )
