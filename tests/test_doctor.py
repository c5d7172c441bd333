"""`so101d doctor` end to end on the virtual bench: `so101d emulate` in its own process, the doctor
as the operator runs it (a subprocess, prompts answered on its stdin). The emulator's realism
presets make it pass or fail for the right reasons; its `power_cycle` control command stands in
for the operator unplugging the arm's power.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.emulator.process import EmulatorProcess

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[EmulatorProcess]:
    with EmulatorProcess(tmp_path, leader_motion="still", calibration_out=tmp_path / "cal") as ep:
        yield ep


def _argv(ep: EmulatorProcess, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "daemon.apps.cli",
        "doctor",
        "--leader",
        str(ep.leader_path),
        "--follower",
        str(ep.follower_path),
        "--calibration-root",
        str(ep.directory / "cal"),
        "--leader-id",
        "emulated_leader",
        "--follower-id",
        "emulated_follower",
        "--round-trips",
        "60",
        *extra,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def doctor(ep: EmulatorProcess, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(_argv(ep, *extra), capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)


def checks(report: str, arm: str) -> dict[str, str]:
    """check name -> status, for one arm's section of the text report."""
    section = report.split(f"[{arm}]", 1)[1].split("\n\n", 1)[0]
    out = {}
    for line in section.splitlines():
        parts = line.strip().split(" ", 1)
        if parts[0] in ("PASS", "WARN", "FAIL", "INFO"):
            out[parts[1].split(":", 1)[0].strip()] = parts[0]
    return out


def test_a_healthy_bench_passes_every_check_and_changes_nothing(bench: EmulatorProcess) -> None:
    before = bench.control({"cmd": "snapshot", "arm": "follower"})["servos"]
    r = doctor(bench)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("result: PASS")
    for arm in ("leader", "follower"):
        got = checks(r.stdout, arm)
        assert set(got.values()) == {"PASS"}, got
        assert {
            "servos answer",
            "firmware",
            "dry run is read-only",
            "health block read",
            "round trip",
            "calibration",
        } <= set(got)
    after = bench.control({"cmd": "snapshot", "arm": "follower"})["servos"]
    assert [s["torque_enabled"] for s in after.values()] == [s["torque_enabled"] for s in before.values()]
    assert "lerobot=0.6.1" in r.stdout  # what a bug report needs
    j = json.loads(doctor(bench, "--json", "--only", "follower").stdout)
    assert j["result"] == "PASS" and j["arms"][0]["servos"]["gripper"]["firmware"] == "3.10"


def test_ftdi_latency_timer_fails_the_round_trip_check(bench: EmulatorProcess) -> None:
    bench.control({"cmd": "realism", "arm": "follower", "usb": "ftdi"})
    r = doctor(bench)
    assert r.returncode == 1, r.stdout + r.stderr
    assert checks(r.stdout, "follower")["round trip"] == "FAIL", r.stdout
    assert "100 Hz is impossible on this adapter" in r.stdout
    # per adapter: the leader's has no such latency. (WARN rather than PASS is possible when the
    # shared machine is loaded enough to push the median read past half the period.)
    assert checks(r.stdout, "leader")["round trip"] in ("PASS", "WARN"), r.stdout
    bench.control({"cmd": "realism", "arm": "follower", "usb": "ch343"})
    r = doctor(bench, "--only", "follower")
    assert checks(r.stdout, "follower")["round trip"] in ("PASS", "WARN"), r.stdout
    assert "impossible" not in r.stdout


def test_a_latched_overload_and_a_calibration_mismatch_fail_for_their_reasons(bench: EmulatorProcess) -> None:
    bench.control({"cmd": "error_bits", "arm": "follower", "joint": "gripper", "bits": 0x20})
    bench.control(
        {"cmd": "set_register", "arm": "follower", "joint": "elbow_flex", "name": "Homing_Offset", "value": 5}
    )
    r = doctor(bench, "--only", "follower")
    assert r.returncode == 1
    got = checks(r.stdout, "follower")
    assert got["protections"] == "FAIL" and "gripper (status 0x20): power-cycle the arm" in r.stdout
    assert got["calibration"] == "FAIL" and "motor 'elbow_flex' (id 3): Homing_Offset is 5 on the servo" in r.stdout


class Operator:
    """The operator at the terminal: reads the doctor's prompts, answers them."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), cwd=REPO
        )
        self.seen = b""

    def wait_for(self, text: str, timeout_s: float = 60.0) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no prompt {text!r}; output so far:\n{self.seen.decode(errors='replace')}"
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 4096)
                assert chunk, f"doctor exited before {text!r}:\n{self.seen.decode(errors='replace')}"
                self.seen += chunk

    def answer(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, str]:
        assert self.proc.stdout is not None
        rest, _ = self.proc.communicate(timeout=120)
        return self.proc.returncode, (self.seen + rest).decode(errors="replace")


def test_power_cycle_walkthrough_proves_configuration_persists_on_strict_servos(bench: EmulatorProcess) -> None:
    bench.control({"cmd": "realism", "preset": "strict"})
    # like a fresh servo: factory return delay, which real units clamp to 50 when we ask for 0
    bench.control(
        {"cmd": "set_register", "arm": "follower", "joint": "wrist_flex", "name": "Return_Delay_Time", "value": 250}
    )
    op = Operator(_argv(bench, "--only", "follower", "--power-cycle"))
    op.wait_for("Continue? [y/N]")
    op.answer("y")
    op.wait_for("then press Enter")
    bench.control({"cmd": "power_cycle", "arm": "follower"})  # the operator unplugs the power
    op.answer("")
    rc, out = op.finish()
    got = checks(out, "follower")
    assert got["configure"] == "WARN" and "'wrist_flex' (id 4) keeps Return_Delay_Time=50 (asked 0" in out
    assert got["power cycle"] == "PASS", out
    assert rc == 0 and out.rstrip().endswith("result: WARN")
    assert bench.control({"cmd": "snapshot", "arm": "follower"})["servos"]["gripper"]["power_cycles"] == 1


def test_power_cycle_that_did_not_happen_is_caught(bench: EmulatorProcess) -> None:
    op = Operator(_argv(bench, "--only", "follower", "--power-cycle"))
    op.wait_for("Continue? [y/N]")
    op.answer("yes")
    op.wait_for("then press Enter")
    op.answer("")  # the operator pulled the USB cable, or nothing at all: the servos kept power
    rc, out = op.finish()
    assert rc == 1
    assert "Lock is still 0: the servos did not lose power" in out


def test_declining_the_power_cycle_writes_nothing(bench: EmulatorProcess) -> None:
    bench.control(
        {"cmd": "set_register", "arm": "follower", "joint": "wrist_flex", "name": "Return_Delay_Time", "value": 250}
    )
    op = Operator(_argv(bench, "--only", "follower", "--power-cycle"))
    op.wait_for("Continue? [y/N]")
    op.answer("n")
    rc, out = op.finish()
    assert rc == 0 and "skipped: the operator declined" in out
    assert "connect would write wrist_flex: Return_Delay_Time 250->0" in out
    snap = bench.control({"cmd": "snapshot", "arm": "follower"})["servos"]
    assert snap["wrist_flex"]["lock"] == 1


# -------------------------------------------------------------------------------------------------
# the first run: the doctor names the step that is missing
# -------------------------------------------------------------------------------------------------
def _follower_only(ep: EmulatorProcess, *extra: str) -> subprocess.CompletedProcess:
    argv = [
        sys.executable,
        "-m",
        "daemon.apps.cli",
        "doctor",
        "--only",
        "follower",
        "--follower",
        str(ep.follower_path),
        "--calibration-root",
        str(ep.directory / "cal"),
        "--follower-id",
        "emulated_follower",
        "--round-trips",
        "20",
        *extra,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)


def test_a_new_kit_fails_on_its_factory_ids_and_names_setup_motors(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path, leader=False, preset="new-kit") as ep:
        r = _follower_only(ep)
    assert r.returncode == 1, r.stdout + r.stderr
    got = checks(r.stdout, "follower")
    assert got["servos answer"] == "FAIL" and got["servo ids"] == "FAIL", r.stdout
    assert "only id 1 answers" in r.stdout and "factory id of a new kit" in r.stdout
    assert f"next: so101d setup-motors follower --port {ep.follower_path}\n" in r.stdout


def test_servos_at_another_baud_rate_fail_and_name_setup_motors(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path, leader=False, extra_args=["--baud", "115200"]) as ep:
        r = _follower_only(ep)
    assert r.returncode == 1, r.stdout + r.stderr
    assert checks(r.stdout, "follower")["baud rate"] == "FAIL", r.stdout
    assert "id 1, id 2, id 3, id 4, id 5, id 6 at 115200 baud" in r.stdout
    assert f"next: so101d setup-motors follower --port {ep.follower_path}\n" in r.stdout


def test_a_missing_calibration_names_calibrate_and_a_clean_arm_names_run(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path, leader=False, calibration_out=tmp_path / "cal") as ep:
        clean = _follower_only(ep)
        missing = _follower_only(ep, "--follower-id", "not_calibrated_yet")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "next: so101d run --config so101d.toml\nresult: PASS" in clean.stdout
    assert checks(missing.stdout, "follower")["calibration"] == "WARN", missing.stdout
    assert f"next: so101d calibrate follower --port {ep.follower_path} --id not_calibrated_yet\n" in missing.stdout, (
        missing.stdout
    )
