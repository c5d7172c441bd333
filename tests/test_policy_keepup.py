"""Issue 16, as the operator met it: a checkpoint with LeRobot's default chunk (100 actions at
30 fps), an inference of ~150 ms, `max_obs_age_s` = 1 s. The arm used to hold ~170 ms out of every
second (the next chunk was asked for by the count of queued actions, which counted the ones that
would expire first). Now the policy drives without a gap, chunk boundaries are not steps, and a
policy too slow for its chunk is explained instead of silently stuttering.

The slow forward pass is the engine's own test knob (SO101D_POLICY_FORWARD_DELAY_S: the real
forward pass runs, then sleeps out the rest), inherited by the spawned worker.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from policy_support import tiny_act
from support import still_arm_on_pty, wait_for

from daemon.api.client import ControlClient
from daemon.config.settings import config_from_dict
from daemon.policy.engine import FORWARD_DELAY_ENV
from daemon.policy.runner import STAGE_KEYS
from daemon.service.attach_policy import attach_policy
from daemon.service.daemon import Daemon
from drivers.cameras import CameraConfig as CamCfg
from drivers.cameras import VirtualArmCamera
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

H, W = 48, 64
POSE = np.array([0.0, -20.0, 20.0, 10.0, 0.0, 40.0])


class Cycles:
    """Every cycle's mode, the policy's raw target and the command the loop wrote."""

    def __init__(self, loop) -> None:
        self.loop = loop
        self.rows: list[tuple[float, str, np.ndarray, np.ndarray]] = []

    def on_cycle(self, now, state, action, raw):
        self.rows.append(
            (now, self.loop.state.mode, np.array(raw, dtype=np.float64), np.array(action, dtype=np.float64))
        )


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    # plain lerobot-train's ACT chunk: chunk_size = n_action_steps = 100
    return tiny_act(tmp_path_factory, {"front": (H, W)}, steps=4, chunk_size=100)


def make_bench(root: Path, policy: dict) -> tuple[Daemon, Cycles, list]:
    _la, lb = still_arm_on_pty(root / "leader", "leader", POSE)
    _fa, fb = still_arm_on_pty(root / "follower", "follower", POSE)
    # safety and policy at their defaults (max_step_deg 10, refill_below 10, merge latest) unless given
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "cameras": {"front": {"kind": "virtual", "width": W, "height": H, "fps": 30}},
            "policy": policy,
        }
    )
    cam = VirtualArmCamera(CamCfg(name="front", width=W, height=H, fps=30))
    daemon = Daemon(
        cfg,
        FeetechLeader(str(root / "leader"), reference_calibration("leader")),
        FeetechFollower(str(root / "follower"), reference_calibration("follower")),
    )
    cycles = Cycles(daemon.loop)
    daemon.loop.add_hook(cycles)

    class CamFeed:  # the virtual camera draws the follower's measured pose
        def on_cycle(self, now, state, action, raw):
            cam.set_state(state)

    daemon.loop.add_hook(CamFeed())
    cam.start()
    attach_policy(daemon, cameras={"front": cam})
    daemon.start()
    return daemon, cycles, [daemon.stop, cam.stop, lb.stop, fb.stop]


def sample_modes(sock: str, seconds: float, period_s: float = 0.05) -> list[str]:
    """`status` every 50 ms, as the issue's reporter sampled it."""
    modes = []
    with ControlClient(sock, timeout_s=10) as c:
        end = time.monotonic() + seconds
        nxt = time.monotonic()
        while nxt < end:
            modes.append(c.request("status")["mode"])
            nxt += period_s
            time.sleep(max(0.0, nxt - time.monotonic()))
    return modes


@pytest.mark.parametrize("merge", ["latest", "average"])
def test_default_chunk_with_slow_inference_drives_without_gaps(ckpt: Path, monkeypatch, merge: str) -> None:
    monkeypatch.setenv(FORWARD_DELAY_ENV, "0.15")
    with tempfile.TemporaryDirectory(prefix="so101d-keepup-") as d:
        root = Path(d)
        daemon, cycles, cleanup = make_bench(root, {"action_fps": 30.0, "merge": merge})
        try:
            loop = daemon.loop
            sock = str(root / "c.sock")
            wait_for(lambda: loop.follower_link.connected and loop.measured is not None, 15, "follower connected")
            with ControlClient(sock, timeout_s=100) as c:
                assert c.request("policy.load", path=str(ckpt), wait_s=90)["state"] == "ready"
                assert c.request("policy.start", record=False)["ok"]
                wait_for(lambda: c.request("policy.status")["results"] >= 1, 30, "the first chunk")
                wait_for(
                    lambda: loop.state.mode == "policy", 30, f"policy mode (now {loop.state.mode}: {loop.state.reason})"
                )
                before = c.request("policy.status")
                first = len(cycles.rows)
            modes = sample_modes(sock, 10.0)
            last = len(cycles.rows)
            with ControlClient(sock, timeout_s=10) as c:
                st = c.request("policy.status")
                assert c.request("policy.stop")["message"] == "policy stopped: holding"
        finally:
            for fn in cleanup:
                fn()
    in_policy = sum(m == "policy" for m in modes) / len(modes)
    assert len(modes) >= 150, len(modes)
    assert in_policy >= 0.99, (in_policy, [m for m in modes if m != "policy"])
    # forward ~150 ms measured as such; chunks came back again and again, the newest never ran out
    assert st["stages_ms"]["forward"]["p50"] >= 150.0
    # the overhead beyond the forward pass, split by stage (issue 16: where did 15 ms go?); the
    # stages add up chunk by chunk (tests/test_policy_latency.py), the medians roughly
    for stage in STAGE_KEYS:
        if stage not in ("forward", "gc"):  # forward has its own check above; gc was never counted here
            assert st["stages_ms"][stage]["n"] >= 8, stage
    parts = sum(st["stages_ms"][k]["p50"] for k in st["overhead_stages"])
    assert abs(parts - st["overhead_ms"]["p50"]) < 0.5 * st["overhead_ms"]["p50"] + 2.0, (parts, st["overhead_ms"])
    assert st["results"] - before["results"] >= 8
    assert st["chunks_expired"] == before["chunks_expired"] == 0
    assert st["warning"] is None
    # per-cycle steps counted from the loop's own command history
    params = loop.params
    modes_c = [r[1] for r in cycles.rows[first:last]]
    raws = np.array([r[2] for r in cycles.rows[first:last]])
    cmds = np.array([r[3] for r in cycles.rows[first:last]])
    assert len(cmds) > 500
    cmd_steps = np.abs(np.diff(cmds, axis=0))
    assert np.all(cmd_steps <= params.max_step + 1e-9), cmd_steps.max(axis=0)
    # and the policy's own target did not step at a chunk boundary more than the limit allows:
    # the safety layer had nothing to hide
    both = np.array([a == "policy" and b == "policy" for a, b in itertools.pairwise(modes_c)])
    raw_steps = np.abs(np.diff(raws, axis=0))[both]
    assert both.sum() > 500
    assert np.all(raw_steps <= params.max_step + 1e-9), raw_steps.max(axis=0)


def test_policy_slower_than_its_usable_horizon_is_explained_and_holds(ckpt: Path, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(FORWARD_DELAY_ENV, "0.7")
    with tempfile.TemporaryDirectory(prefix="so101d-slow-") as d:
        root = Path(d)
        daemon, cycles, cleanup = make_bench(root, {"action_fps": 30.0, "max_obs_age_s": 0.5})
        try:
            loop = daemon.loop
            sock = str(root / "c.sock")
            wait_for(lambda: loop.follower_link.connected and loop.measured is not None, 15, "follower connected")
            with ControlClient(sock, timeout_s=100) as c:
                assert c.request("policy.load", path=str(ckpt), wait_s=90)["state"] == "ready"
                assert c.request("policy.start", record=False)["ok"]
                start = len(cycles.rows)
                held_at = np.array(loop.measured)
                wait_for(lambda: c.request("policy.status")["results"] >= 2, 30, "two (too late) chunks")
                st = c.request("status")
            r = subprocess.run(
                [sys.executable, "-m", "daemon.apps.cli", "policy", "status", "--socket", sock],
                capture_output=True,
                text=True,
                timeout=60,
            )
            wide = dict(os.environ, COLUMNS="200")  # the status table's width, not a terminal's
            r_all = subprocess.run(
                [sys.executable, "-m", "daemon.apps.cli", "status", "--socket", sock],
                capture_output=True,
                text=True,
                timeout=60,
                env=wide,
            )
            end = len(cycles.rows)
            measured_end = np.array(loop.measured)
        finally:
            for fn in cleanup:
                fn()
    warning = st["policy"]["warning"]
    assert warning is not None and warning.startswith("policy: inference 0.7")
    assert warning.endswith("> usable horizon 0.50 s: raise max_obs_age_s or use a faster policy"), warning
    assert f"WARNING    {warning}" in r.stdout, r.stdout
    assert warning in r_all.stdout, r_all.stdout  # `so101d status` says it too
    # holds safely: never followed the late chunks, the follower stayed where it was
    assert st["mode"] == "hold" and "policy stale" in st["reason"]
    assert {m for _, m, _, _ in cycles.rows[start:end]} <= {"hold"}
    assert np.abs(measured_end - held_at).max() < 1.0
    assert st["policy"]["chunks_rejected"] >= 2


def test_policy_check_warns_about_a_configuration_that_cannot_keep_up(ckpt: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "so101d.toml"
    cfg.write_text(f'[cameras.front]\nkind = "virtual"\nwidth = {W}\nheight = {H}\n[policy]\nmax_obs_age_s = 0.5\n')

    def check(delay_s: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, HF_HUB_OFFLINE="1", **{FORWARD_DELAY_ENV: delay_s})
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "daemon.apps.cli",
                "policy",
                "check",
                str(ckpt),
                "--config",
                str(cfg),
                "--repeats",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    r = check("0.6")
    assert r.returncode == 0 and "ok: act policy" in r.stdout, r.stderr
    assert "one chunk drives 0.50 s (100 actions at 30 fps, max_obs_age_s 0.5)" in r.stdout, r.stdout
    # the forward pass lasts at least the 0.6 s asked (more on a loaded machine)
    warned = re.search(
        r"warning: policy: inference (\d+\.\d+) s > usable horizon 0\.50 s: raise max_obs_age_s", r.stderr
    )
    assert warned and float(warned.group(1)) >= 0.6, r.stderr
    r = check("0")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
