"""`so101d status`: the safety, policy and recording sections of the table.

The safety section comes from a real daemon (in-process, emulated arms on ptys) whose leader is
held beyond the follower's shoulder_pan limit; the policy and recording sections are rendered from
status dicts shaped like those the policy and recording extras return.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from support import may_take_fifo, still_arm_on_pty, wait_for

from daemon.apps.commands.status import render
from daemon.config.settings import config_from_dict
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

SO101D = [sys.executable, "-m", "daemon.apps.cli"]
REPO = Path(__file__).resolve().parents[1]


def text_of(st: dict) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None, force_terminal=False).print(render(st))
    return buf.getvalue()


BASE = {"mode": "teleop", "reason": "tracking", "rate_hz": 99.0, "rate_hz_target": 100.0, "timing_ms": {}, "joints": {}}


def test_no_policy_or_recording_lines_without_those_extras() -> None:
    out = text_of(
        dict(BASE, safety={"fault_latched": "", "fault_now": "", "limited_cycles": 0, "limit_hits": {"gripper": 0}})
    )
    assert "no fault" in out and "limits hit: none" in out
    assert "policy" not in out and "recording" not in out
    # an old daemon without the safety section still renders
    assert "safety" not in text_of(dict(BASE))


def test_fault_latch_policy_and_recording_sections() -> None:
    st = dict(
        BASE,
        mode="fault",
        safety={
            "fault_latched": "elbow_flex: overload",
            "fault_now": "",
            "limited_cycles": 17,
            "limit_hits": {"shoulder_pan": 12, "gripper": 0, "wrist_flex": 3},
        },
        policy={
            "state": "running",
            "driving": True,
            "inference_latency_ms": {"p50": 41.25, "p99": 88.5, "max": 90.0, "n": 50},
            "chunk_age_ms": 123.4,
            "queue_depth": 37,
            "takeover": None,
            "last_error": None,
            "error": None,
        },
        recording={
            "phase": "recording",
            "episode": 4,
            "elapsed_s": 12.34,
            "frames": 370,
            "episodes_in_dataset": 3,
            "writer_backlog_frames": 2,
            "error": None,
        },
    )
    out = text_of(st)
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert "fault latched: elbow_flex: overload  now: -" in lines["safety"]
    assert "step-limited 17" in lines["safety"] and "limits hit: shoulder_pan 12, wrist_flex 3" in lines["safety"]
    assert "gripper" not in lines["safety"]
    pol = lines["policy"]
    assert "DRIVING" in pol and "41.2/  88.5 ms" in pol and "chunk age    123 ms" in pol and "queue  37" in pol
    rec = lines["recording"]
    assert "recording" in rec and "episode    4" in rec and "elapsed   12.3 s" in rec and "frames   370" in rec
    # a policy on standby with a failed take-over, a recorder waiting between episodes
    st["policy"].update(driving=False, takeover={"phase": "failed", "error": "timeout", "max_error": 9.0})
    st["recording"].update(phase="idle", elapsed_s=0.0, frames=0)
    out2 = text_of(st)
    assert "standby" in out2 and "take-over failed" in out2 and "idle" in out2
    # same layout, same line count: --watch redraws in place without the table jumping
    assert len(out2.splitlines()) == len(out.splitlines())
    # a policy extra that failed is shown as an error, not as a crash
    st["policy"] = {"error": "RuntimeError: worker gone"}
    assert "RuntimeError: worker gone" in text_of(st)


@pytest.fixture
def limit_bench(tmp_path: Path):
    # leader shoulder_pan at 114 deg: inside the leader's range, beyond the follower's (about 111)
    pose = np.array([114.0, -40.0, 45.0, 30.0, 0.0, 50.0])
    _la, lb = still_arm_on_pty(tmp_path / "leader", "leader", pose)
    _fa, fb = still_arm_on_pty(tmp_path / "follower", "follower", np.array([100.0, -40.0, 45.0, 30.0, 0.0, 50.0]))
    cfg = config_from_dict(
        {
            "socket": {"path": str(tmp_path / "c.sock")},
            "safety": {"align_speed_deg_s": 90.0, "align_gripper_speed_pct_s": 100.0},
            "control": {"reconnect_backoff_min_s": 0.05, "reconnect_backoff_max_s": 0.2},
        }
    )
    daemon = Daemon(
        cfg,
        FeetechLeader(str(tmp_path / "leader"), reference_calibration("leader")),
        FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower")),
    )
    daemon.start()
    yield daemon, tmp_path / "c.sock"
    daemon.stop()
    lb.stop()
    fb.stop()


def test_status_command_shows_the_joint_whose_limit_clamped_the_leader(limit_bench) -> None:
    daemon, sock = limit_bench
    loop = daemon.loop
    wait_for(lambda: loop.status()["safety"]["limit_hits"]["shoulder_pan"] > 5, 30, "shoulder_pan limit hits")
    st = loop.status()["safety"]
    assert all(v == 0 for k, v in st["limit_hits"].items() if k != "shoulder_pan")
    assert st["fault_latched"] == "" and st["limited_cycles"] >= st["limit_hits"]["shoulder_pan"]
    r = subprocess.run([*SO101D, "status", "--socket", str(sock)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    safety = [ln for ln in r.stdout.splitlines() if ln.startswith("safety")]
    assert len(safety) == 1 and "no fault" in safety[0] and "limits hit: shoulder_pan" in safety[0], r.stdout


def test_what_the_operator_must_act_on_is_shown_in_the_table_and_the_line() -> None:
    """A dead writer lost an episode, a sim camera waits for its size, frames were refused, the
    adapters cannot reach the rate, a servo refused a timing register, an overload needs a power
    cycle: each shows in the live table and in the one-line form a pipe gets."""
    from daemon.apps.commands.status import one_line

    st = dict(
        BASE,
        rate_warning="100 Hz is impossible here: follower read p50 16.5 ms (FTDI latency timer 16 ms)",
        power_cycle_required="gripper overload latched: power-cycle the arm",
        fault="",
        follower={"connected": True, "configure_warnings": ["Return_Delay_Time kept at 50 (wrote 0)"]},
        recording={
            "phase": "error",
            "episode": 2,
            "frames": 0,
            "episodes_in_dataset": 1,
            "error": "writer process died (SIGKILL)",
            "waiting_for": "camera front: waiting for the simulator to announce its image size",
            "frames_refused": {"wrist": {"count": 7, "last": "shape (240, 320, 3) != (480, 640, 3)"}},
            "lost_episodes": ["episode 1 'pick the cube': saved but never written"],
        },
    )
    for out in (text_of(st), one_line(st)):
        assert "100 Hz is impossible here" in out
        assert "gripper overload latched: power-cycle the arm" in out
        assert "follower: Return_Delay_Time kept at 50" in out
        assert "waiting for the simulator to announce its image size" in out
        assert "wrist: 7 frames refused (shape (240, 320, 3) != (480, 640, 3))" in out
        assert "LOST: episode 1 'pick the cube': saved but never written" in out
    # the power-cycle text is not repeated when the fault already says it
    st["fault"] = st["power_cycle_required"] + " (gripper: overload)"
    assert text_of(st).count("power-cycle the arm") == 1


def test_a_remote_policy_server_line_keeps_round_trip_network_and_server_time_apart() -> None:
    from daemon.apps.commands.status import one_line

    srv = {
        "address": "127.0.0.1:8080",
        "connected": False,
        "error": "UNAVAILABLE: connection refused",
        "round_trip_ms": {"p50": 61.2},
        "network_ms": {"p50": 3.4},
        "get_actions_ms": {"p50": 55.0},
        "server_compute_ms": None,
    }
    st = dict(BASE, policy={"state": "running", "driving": False, "backend": "lerobot-server", "server": srv})
    out = text_of(st)
    assert "server 127.0.0.1:8080 NOT connected" in out and "UNAVAILABLE: connection refused" in out
    assert "round trip p50 61.2 ms  network p50 3.4 ms  GetActions p50 55.0 ms  server compute unknown" in out
    assert "policy server 127.0.0.1:8080 NOT connected: UNAVAILABLE" in one_line(st)


# The `status` verb's loop part, key by key: the CLI, the README and the browser console read it.
LOOP_KEYS = {
    "mode", "intent", "reason", "fault", "torque_wanted", "follower_kind", "uptime_s", "rate_hz_target", "rate_hz",
    "cycles", "overruns", "missed_cycles", "limited_cycles", "leader_errors", "follower_errors", "hook_errors",
    "overlap_io", "rate_warning", "scheduling", "power_cycle_required", "safety", "timing_ms", "leader", "follower",
    "leader_age_s", "joints", "servos", "missing_servos", "health_age_s", "arms", "worst_calls_ms",
}  # fmt: skip
SAFETY_KEYS = {
    "align_speed_deg_s", "max_step_deg", "leader_stale_s", "on_fault", "fault_latched", "fault_now",
    "limited_cycles", "limit_hits",
}  # fmt: skip
LINK_KEYS = {
    "connected", "port", "since_s", "connects", "losses", "last_error", "configure_warnings", "bus",
    "missing_servos", "next_try_in_s", "waiting",
}  # fmt: skip
SERVO_KEYS = {"temperature_c", "voltage_v", "load_pct", "current_ma", "status", "torque"}


def test_the_status_shape_is_the_one_its_readers_know(limit_bench) -> None:
    daemon, _sock = limit_bench
    loop = daemon.loop
    wait_for(
        lambda: loop.status()["servos"] is not None and loop.leader_units is not None, 30, "health and leader read"
    )
    st = daemon.status()
    assert set(st) >= LOOP_KEYS and {"socket", "config", "reloads", "verbs"} <= set(st)
    assert set(loop.status()) == LOOP_KEYS
    assert set(st["safety"]) == SAFETY_KEYS
    assert set(st["leader"]) == LINK_KEYS and set(st["follower"]) == LINK_KEYS
    assert set(st["follower"]["bus"]) == {"transactions", "retries", "failures", "reconnects"}
    assert set(st["joints"]) == {"leader", "follower", "command"}
    assert set(st["joints"]["follower"]) == set(st["safety"]["limit_hits"]) == {
        "shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper",
    }  # fmt: skip
    assert all(set(s) == SERVO_KEYS for s in st["servos"].values()) and len(st["servos"]) == 6
    # values keep their types and units: the loop really runs at its target, the leader is young
    assert st["rate_hz_target"] == 100.0 and st["cycles"] > 0 and st["overlap_io"] is True
    assert 0.0 <= st["leader_age_s"] < 1.0 and st["health_age_s"] is not None
    assert (
        st["leader"]["connected"] is True and st["leader"]["connects"] == 1 and st["leader"]["bus"]["transactions"] > 0
    )
    assert isinstance(st["missing_servos"], list) and isinstance(st["fault"], str)
    assert set(st["timing_ms"]) == {
        "leader_read", "follower_read", "update", "follower_write", "hooks", "cycle", "period", "jitter",
    }  # fmt: skip


def test_status_says_which_scheduling_the_loop_thread_really_got(tmp_path: Path) -> None:
    pose = np.array([0.0, -40.0, 45.0, 30.0, 0.0, 50.0])
    _la, lb = still_arm_on_pty(tmp_path / "leader", "leader", pose)
    _fa, fb = still_arm_on_pty(tmp_path / "follower", "follower", pose)
    cfg = config_from_dict({"socket": {"path": str(tmp_path / "c.sock")}, "control": {"realtime_priority": 7}})
    daemon = Daemon(
        cfg,
        FeetechLeader(str(tmp_path / "leader"), reference_calibration("leader")),
        FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower")),
    )
    daemon.start()
    try:
        wait_for(lambda: daemon.loop.status()["cycles"] > 0, 30, "the loop running")
        expected = "fifo:7" if may_take_fifo(7) else "(fifo:7 refused)"
        assert expected in daemon.loop.status()["scheduling"]
        r = subprocess.run(
            [*SO101D, "status", "--socket", str(tmp_path / "c.sock")],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert r.returncode == 0, r.stderr
        assert f"sched {daemon.loop.status()['scheduling']}" in r.stdout, r.stdout
    finally:
        daemon.stop()
        lb.stop()
        fb.stop()
