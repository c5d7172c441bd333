"""`so101d run` and `so101d demo` as real processes: start, serve the socket, SIGTERM -> exit 0.

The emulated arms run in this test process (threads on pseudo-terminals); the daemon is a separate
`so101d run` process reading its TOML configuration, exactly as systemd runs it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import wait_status  # also imported from here by other test files

from calibration.calibration_file import save_calibration
from daemon.api.client import ControlClient
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration

SO101D = [sys.executable, "-m", "daemon.apps.cli"]


@pytest.fixture
def run_dir():
    with tempfile.TemporaryDirectory(prefix="so101d-") as d:
        yield Path(d)


def test_run_serves_then_sigterm_stops_cleanly(run_dir):
    la = EmulatedArm("leader")
    fa = EmulatedArm("follower")
    cal_root = run_dir / "cal"
    save_calibration(reference_calibration("leader"), "leader", "l1", cal_root)
    save_calibration(reference_calibration("follower"), "follower", "f1", cal_root)
    sock = run_dir / "control.sock"
    cfg = run_dir / "so101d.toml"
    cfg.write_text(
        f'[leader]\nport = "{run_dir / "leader"}"\nid = "l1"\n'
        f'[follower]\nport = "{run_dir / "follower"}"\nid = "f1"\ntorque_off_on_shutdown = true\n'
        f'[calibration]\nroot = "{cal_root}"\n[socket]\npath = "{sock}"\n'
    )
    with BusEmulator(run_dir / "leader", la), BusEmulator(run_dir / "follower", fa):
        proc = subprocess.Popen(
            [*SO101D, "run", "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            st = wait_status(sock, lambda s: s["mode"] == "teleop", proc=proc)
            assert st["follower_kind"] == "feetech"
            assert oct(os.stat(sock).st_mode & 0o777) == oct(0o660)
            assert all(s.reg("Torque_Enable") == 1 for s in fa.servos)
            # SIGHUP: a live key (safety) is applied, a restart-only key (rate) is kept and named
            cfg.write_text(cfg.read_text() + "[safety]\nmax_step_deg = 4.5\n[control]\nrate_hz = 50.0\n")
            proc.send_signal(signal.SIGHUP)
            st = wait_status(sock, lambda s: s["reloads"] == 1, proc=proc)
            assert st["safety"]["max_step_deg"] == 4.5 and st["rate_hz_target"] == 100.0
            cfg.write_text("[safety\n")  # a broken file changes nothing, the daemon keeps running
            with ControlClient(sock) as c:
                r = c.request("config.reload")
            assert "reload failed" in r["message"] and proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err = proc.stderr.read()
        assert rc == 0, err
        assert not sock.exists()
        # torque_off_on_shutdown = true: the follower went limp; the leader was left alone
        assert all(s.reg("Torque_Enable") == 0 for s in fa.servos)
        assert "daemon stopped" in err
        assert "restart needed for control.rate_hz" in err


def test_run_config_error_names_the_key(run_dir):
    cfg = run_dir / "bad.toml"
    cfg.write_text("[safety]\nmax_step_degs = 3\n")
    r = subprocess.run([*SO101D, "run", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "safety.max_step_degs: unknown key" in r.stderr


def test_run_missing_calibration_is_a_clear_error(run_dir):
    cfg = run_dir / "c.toml"
    cfg.write_text(f'[calibration]\nroot = "{run_dir / "empty"}"\n[socket]\npath = "{run_dir / "s.sock"}"\n')
    r = subprocess.run([*SO101D, "run", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "no calibration for leader 'leader'" in r.stderr


def test_demo_runs_the_virtual_bench_and_cli_verbs_talk_to_it(run_dir):
    sock = run_dir / "demo.sock"
    proc = subprocess.Popen(
        [*SO101D, "demo", "--duration", "60", "--dir", str(run_dir / "bench"), "--socket", str(sock), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_status(sock, lambda s: s["mode"] == "teleop" and s["cycles"] > 50, timeout_s=40, proc=proc)
        r = subprocess.run(
            [*SO101D, "status", "--json", "--socket", str(sock)], capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["follower"]["connected"] and st["leader"]["connected"]
        r = subprocess.run(
            [*SO101D, "teleop", "stop", "--socket", str(sock)], capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 0 and "holding" in r.stdout
        r = subprocess.run([*SO101D, "status", "--socket", str(sock)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "hold" in r.stdout
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
        assert rc == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (run_dir / "bench" / "leader").exists()  # the emulator removed its links


def test_cli_verbs_without_daemon_exit_2(run_dir):
    r = subprocess.run(
        [*SO101D, "teleop", "start", "--socket", str(run_dir / "none.sock")], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2 and "no daemon socket" in r.stderr
