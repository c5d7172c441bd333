"""`so101d run` (subprocess) on emulated arms with a virtual camera and [recording], driven by the
`so101d policy` CLI: check, load, start (an evaluation episode is recorded), status, stop; the
evaluation episode lands in the dataset, tagged."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from policy_support import tiny_act
from support import wait_status

from calibration.calibration_file import save_calibration
from daemon.data.schema import read_episode_tags
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration

SO101D = [sys.executable, "-m", "daemon.apps.cli"]
H, W = 48, 64


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SO101D, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_act(tmp_path_factory, {"front": (H, W)})


def test_policy_cli_against_so101d_run(ckpt: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="so101d-polcli-") as d:
        run_dir = Path(d)
        la, fa = EmulatedArm("leader"), EmulatedArm("follower")
        cal = run_dir / "cal"
        save_calibration(reference_calibration("leader"), "leader", "l1", cal)
        save_calibration(reference_calibration("follower"), "follower", "f1", cal)
        sock = run_dir / "control.sock"
        cfg = run_dir / "so101d.toml"
        root = run_dir / "datasets" / "eval" / "act"
        cfg.write_text(
            f'[leader]\nport = "{run_dir / "leader"}"\nid = "l1"\n'
            f'[follower]\nport = "{run_dir / "follower"}"\nid = "f1"\n'
            f'[calibration]\nroot = "{cal}"\n[socket]\npath = "{sock}"\n'
            f'[recording]\nenabled = true\ndataset_root = "{run_dir / "datasets"}"\nrepo_id = "eval/act"\n'
            f'[cameras.front]\nkind = "virtual"\nwidth = {W}\nheight = {H}\n'
            '[policy]\nmax_obs_age_s = 5.0\nrefill_below = 4\ntask = "reach"\n'
        )
        # offline check against the configuration: fits; and against a config without the camera
        r = cli("policy", "check", str(ckpt), "--config", str(cfg))
        assert r.returncode == 0 and "ok: act policy" in r.stdout and "front 64x48" in r.stdout, r.stderr
        bare = run_dir / "bare.toml"
        bare.write_text(f'[socket]\npath = "{sock}"\n')
        r = cli("policy", "check", str(ckpt), "--config", str(bare))
        assert r.returncode == 1 and "camera 'front' (64x48) expected by the policy is not configured" in r.stderr
        with BusEmulator(run_dir / "leader", la), BusEmulator(run_dir / "follower", fa):
            proc = subprocess.Popen(
                [*SO101D, "run", "--config", str(cfg)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(os.environ, HF_HUB_OFFLINE="1"),
            )
            try:
                wait_status(
                    sock,
                    lambda s: (
                        s["mode"] == "teleop"
                        and s.get("recording", {}).get("phase") == "idle"
                        and s.get("policy", {}).get("state") == "none"
                    ),
                    timeout_s=180,
                    proc=proc,
                )
                s = ["--socket", str(sock)]
                r = cli("policy", "start", *s)
                assert r.returncode == 1 and "no policy loaded" in r.stderr
                r = cli("policy", "load", str(ckpt), "--wait", "120", *s, timeout=180)
                assert r.returncode == 0 and "loading act policy" in r.stdout, r.stderr
                r = cli("policy", "start", *s)
                # the answer says what the arm does: it holds while the first chunk is computed
                assert r.returncode == 0 and r.stdout.startswith(
                    ("policy started: the follower holds until the first chunk", "policy driving the follower")
                ), r.stdout
                wait_status(  # a few chunks in: the latency and queue figures have samples
                    sock, lambda st: st["mode"] == "policy" and st["policy"]["results"] >= 4, timeout_s=60, proc=proc
                )
                r = cli("policy", "status", *s)
                assert r.returncode == 0, r.stderr
                assert "(driving the follower)" in r.stdout and "latency    p50" in r.stdout and "queue " in r.stdout
                # a correction inside the episode: out of turn refused, then correct ... resume
                r = cli("policy", "resume", *s)
                assert r.returncode == 1 and "not in a correction" in r.stderr, r.stderr
                r = cli("policy", "correct", *s)
                assert r.returncode == 0 and r.stdout.startswith("correction 1:"), (r.stdout, r.stderr)
                wait_status(
                    sock,
                    lambda st: (st["policy"].get("correction") or {}).get("phase") == "operator",
                    timeout_s=60,
                    proc=proc,
                )
                r = cli("policy", "correct", *s)
                assert r.returncode == 1 and "already correcting" in r.stderr, r.stderr
                r = cli("policy", "status", *s)
                assert r.returncode == 0 and "correction 1 operator" in r.stdout, r.stdout
                r = cli("policy", "resume", *s)
                assert r.returncode == 0 and "correction 1 over" in r.stdout, (r.stdout, r.stderr)
                wait_status(sock, lambda st: st["mode"] == "policy", timeout_s=60, proc=proc)
                r = cli("policy", "stop", "--success", *s)
                assert r.returncode == 0 and "holding" in r.stdout, r.stderr
                st = wait_status(
                    sock,
                    lambda st: (
                        st["mode"] == "hold"
                        and st["recording"]["saves_pending"] == 0
                        and st["recording"]["episodes_in_dataset"] == 1
                    ),
                    timeout_s=120,
                    proc=proc,
                )
                assert not st["policy"]["driving"]
            finally:
                proc.send_signal(signal.SIGTERM)
                rc = proc.wait(timeout=120)
            assert rc == 0, proc.stderr.read()[-2000:]
        tags = read_episode_tags(root)
        assert len(tags) == 1 and tags[0].success is True and tags[0].frames > 20
        from daemon.data.recorder import Recorder

        if "origin" in inspect.signature(Recorder.start_episode).parameters:
            assert tags[0].origin == "policy"
        assert tags[0].interventions == 1 and tags[0].intervention_s > 0, tags[0]
