"""Only id 1 answers: a new kit (every servo still at the factory id 1) or an arm set up before
whose daisy chain is cut after servo 1? And two servos sharing one id on a real wire, where
their answers to one request collide (the emulator's ``collisions`` realism: the host reads the
AND of the replies, clean where they agree byte for byte).

`so101d emulate` runs in its own process; doctor and calibrate run as the operator types them.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.apps.commands.setup_motors import EXIT_STOPPED, SetupRun
from drivers import protocol as P
from drivers.arm_interface import HandshakeError
from drivers.emulator import reference_calibration
from drivers.emulator.process import EmulatorProcess
from drivers.feetech_arm import FeetechFollower
from drivers.feetech_bus import FeetechBus, register_spec

REPO = Path(__file__).resolve().parents[1]
COLLISIONS = ["--realism", "collisions"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _so101d(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )


def _doctor(ep: EmulatorProcess) -> subprocess.CompletedProcess:
    return _so101d(
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
    )


def _two_factory_servos_at_rest_apart(ep: EmulatorProcess) -> None:
    """Two servos from the box on the chain, both id 1, resting at different positions (as any
    two servos do, to the tick)."""
    ep.control({"cmd": "connect_servos", "arm": "follower", "joints": ["gripper", "wrist_roll"]})
    ep.control({"cmd": "set_joint_ticks", "arm": "follower", "joint": "gripper", "ticks": 1900})
    ep.control({"cmd": "set_joint_ticks", "arm": "follower", "joint": "wrist_roll", "ticks": 2300})


def test_servos_sharing_an_id_collide_on_a_read_as_on_a_broadcast_ping(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path, leader=False, preset="new-kit", extra_args=COLLISIONS) as ep:
        _two_factory_servos_at_rest_apart(ep)
        bus = FeetechBus(str(ep.follower_path), 1_000_000)
        bus.open()
        try:
            ping = bus.collect_replies(P.ping(P.BROADCAST_ID), 0.1, 0.02)
            model = bus.collect_replies(P.read(1, *register_spec("Model_Number")), 0.1, 0.02)
            position = bus.collect_replies(P.read(1, *register_spec("Present_Position")), 0.1, 0.02)
        finally:
            bus.close()
    # Identical answers merge into one clean packet on the wire: a ping or Model_Number cannot tell.
    assert (ping.ids, ping.noise_bytes) == ([1], 0)
    assert (model.ids, model.noise_bytes) == ([1], 0)
    # Each servo's own position differs: the merged bytes fail their checksum.
    assert position.ids == [] and position.noise_bytes > 0, position


def test_setup_motors_refuses_two_factory_servos_whose_ping_answers_merged(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path, leader=False, preset="new-kit", extra_args=COLLISIONS) as ep:
        _two_factory_servos_at_rest_apart(ep)
        out = io.StringIO()
        code = SetupRun("follower", str(ep.follower_path), None, io.StringIO("\n"), out).run()
        snapshot = ep.control({"cmd": "snapshot", "arm": "follower"})["servos"]
    assert code == EXIT_STOPPED, out.getvalue()
    refusal = next(line for line in out.getvalue().splitlines() if "refused:" in line)
    assert "several servos share id 1 at 1000000 baud" in refusal and "present position" in refusal, refusal
    assert {snapshot[j]["id"] for j in ("gripper", "wrist_roll")} == {1}  # nothing written


def test_a_chain_cut_after_servo_1_is_a_cable_fault_not_a_new_kit(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path, leader=False, calibration_out=tmp_path / "cal", leader_motion="still") as ep:
        ep.control({"cmd": "connect_servos", "arm": "follower", "joints": ["shoulder_pan"]})
        r = _doctor(ep)
        follower = FeetechFollower(str(ep.follower_path), reference_calibration("follower"))
        with pytest.raises(HandshakeError) as fault:
            follower.connect()
        follower.bus.close()
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if "servo ids" in x)
    assert "FAIL" in line and "check the 3-pin cable from servo 1 to servo 2" in line, r.stdout
    assert "factory id of a new kit" not in r.stdout and "setup-motors" not in r.stdout, r.stdout
    # The daemon's fault (status and console show it) says the same.
    assert "only id 1 answers: one servo answers as id 1 and holds a calibration" in str(fault.value)
    assert "check the 3-pin cable from servo 1 to servo 2" in str(fault.value)
    assert "setup-motors" not in str(fault.value)


def test_a_new_kit_whose_ping_answers_merge_on_the_wire_is_still_a_new_kit(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path, leader=False, preset="new-kit", extra_args=COLLISIONS) as ep:
        r = _doctor(ep)
        follower = FeetechFollower(str(ep.follower_path), reference_calibration("follower"))
        with pytest.raises(HandshakeError) as fault:
            follower.connect()
        follower.bus.close()
    assert "id 1 at 1000000 baud" in r.stdout  # one clean reply to the broadcast ping
    assert "factory id of a new kit" in r.stdout, r.stdout
    assert f"next: so101d setup-motors follower --port {ep.follower_path}\n" in r.stdout
    assert "as on a new kit (" in str(fault.value)
    assert f"run so101d setup-motors follower --port {ep.follower_path}" in str(fault.value)


def test_calibrate_on_a_new_kit_names_setup_motors(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path, leader=False, preset="new-kit") as ep:
        r = _so101d(
            "calibrate",
            "follower",
            "--port",
            str(ep.follower_path),
            "--id",
            "follower",
            "--calibration-dir",
            str(tmp_path),
        )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "only id 1 answers" in r.stderr, r.stderr
    assert f"Next: so101d setup-motors follower --port {ep.follower_path}" in r.stderr, r.stderr
