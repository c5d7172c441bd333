"""`so101d setup-motors` on a new kit from the box (the emulator's new-kit preset, `so101d emulate`
in its own process): the operator plugs one servo at a time (the `connect_servos` control
command), the command gives each its id and 1 Mbaud, refuses what a real bench gets wrong, and
ends in the same registers as LeRobot's own `SOFollower.setup_motors()` on a second fresh kit.
"""

from __future__ import annotations

import builtins
import io
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from setup_motors_support import SetupSession, plug_only, set_up_arm

from calibration.conventions import JOINT_IDS, JOINT_NAMES
from daemon.apps.commands.setup_motors import SetupRun
from drivers.emulator.process import EmulatorProcess
from drivers.feetech_bus import FeetechBus
from drivers.sts3215_table import CONTROL_TABLE, EEPROM_END

KIT_BAUD = "500000"  # a batch shipped at another rate than the 1 Mbaud the arm runs at


def new_kit(directory: Path) -> EmulatorProcess:
    return EmulatorProcess(directory, leader=False, preset="new-kit", extra_args=["--baud", KIT_BAUD])


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[EmulatorProcess]:
    with new_kit(tmp_path / "kit") as emu:
        yield emu


def servos(emu: EmulatorProcess) -> dict[str, dict]:
    return emu.control({"cmd": "snapshot", "arm": "follower"})["servos"]


def eeprom(emu: EmulatorProcess) -> dict[str, list[int]]:
    return emu.control({"cmd": "saved_eeprom", "arm": "follower"})["eeprom"]


def test_the_new_kit_servos_all_answer_as_id_1_at_their_batch_rate(kit: EmulatorProcess) -> None:
    got = servos(kit)
    assert {s["id"] for s in got.values()} == {1}
    assert {s["baud_rate"] for s in got.values()} == {int(KIT_BAUD)}
    assert all(s["cabled"] for s in got.values())


def test_ours_and_lerobots_setup_motors_leave_the_same_ids_baud_rate_and_eeprom(
    kit: EmulatorProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = set_up_arm(kit, "follower", kit.follower_path, tmp_path)  # type: ignore[arg-type]
    assert re.search(r"Next: so101d calibrate follower --port \S+ --id follower", session.text), session.text
    ours = servos(kit)
    assert {j: s["id"] for j, s in ours.items()} == JOINT_IDS
    assert {s["baud_rate"] for s in ours.values()} == {1_000_000}
    assert {s["lock"] for s in ours.values()} == {1}  # relocked

    from lerobot.robots.so_follower import SOFollower
    from lerobot.robots.so_follower.config_so_follower import SOFollowerRobotConfig

    with new_kit(tmp_path / "lerobot-kit") as theirs:
        prompts: list[str] = []

        def operator(prompt: str = "") -> str:
            # LeRobot: "Connect the controller board to the 'gripper' motor only and press enter."
            joint = re.search(r"'(\w+)' motor only", prompt)
            assert joint, prompt
            prompts.append(joint.group(1))
            plug_only(theirs, "follower", [joint.group(1)])
            return ""

        monkeypatch.setattr(builtins, "input", operator)
        robot = SOFollower(SOFollowerRobotConfig(port=str(theirs.follower_path), calibration_dir=tmp_path / "cal"))
        robot.setup_motors()
        assert prompts == list(reversed(JOINT_NAMES))  # gripper first, as ours
        plug_only(theirs, "follower", None)
        lerobot = servos(theirs)
        assert {j: s["id"] for j, s in lerobot.items()} == JOINT_IDS
        assert {s["baud_rate"] for s in lerobot.values()} == {1_000_000}
        # Every EEPROM byte alike (what a power cycle brings back), ID and Baud_Rate included.
        assert eeprom(theirs) == eeprom(kit)
        mine = eeprom(kit)
        assert [mine[j][CONTROL_TABLE["ID"][0]] for j in JOINT_NAMES] == [1, 2, 3, 4, 5, 6]
        assert all(len(v) == EEPROM_END for v in mine.values())


def test_refusals_name_what_was_seen_and_the_prompt_comes_again(kit: EmulatorProcess, tmp_path: Path) -> None:
    s = SetupSession(["follower", "--port", str(kit.follower_path)], tmp_path)
    try:
        s.until(r"\[1/6\] Connect ONLY the gripper servo \(it becomes id 6\)")
        s.enter()  # the whole chain still plugged in: six servos at id 1
        m = s.until(r"refused: (.*)")
        assert "two or more servos answer at once" in m.group(1) and "daisy chain is still connected" in m.group(1)
        assert f"at {KIT_BAUD} baud" in m.group(1)

        s.until(r"\[1/6\] Connect ONLY the gripper")
        plug_only(kit, "follower", [])  # nothing plugged in
        s.enter()
        m = s.until(r"refused: (.*)")
        assert "no servo answered" in m.group(1) and "at any baud rate" in m.group(1)

        s.until(r"\[1/6\] Connect ONLY the gripper")
        plug_only(kit, "follower", ["gripper"])
        kit.control(
            {"cmd": "set_register", "arm": "follower", "joint": "gripper", "name": "Model_Number", "value": 1284}
        )
        s.enter()
        m = s.until(r"refused: (.*)")
        assert "reports model number 1284, not an STS3215 (777)" in m.group(1)

        s.until(r"\[1/6\] Connect ONLY the gripper")
        kit.control(
            {"cmd": "set_register", "arm": "follower", "joint": "gripper", "name": "Model_Number", "value": 777}
        )
        s.enter()
        s.until(r"gripper: id 6, 1000000 baud, read back")

        s.until(r"\[2/6\] Connect ONLY the wrist_roll servo \(it becomes id 5\)")
        s.enter()  # the operator forgot to swap: the gripper is still the one plugged in
        m = s.until(r"refused: (.*)")
        assert "answers as id 6 at 1000000 baud, the id the gripper got in this run" in m.group(1)

        s.until(r"\[2/6\] Connect ONLY the wrist_roll")
        plug_only(kit, "follower", ["wrist_roll", "wrist_flex"])  # two factory servos at once
        s.enter()
        m = s.until(r"refused: (.*)")
        assert "two or more servos answer at once" in m.group(1)

        s.until(r"\[2/6\] Connect ONLY the wrist_roll")
        s.proc.stdin.close()  # type: ignore[union-attr]  # the operator stops (end of input)
        assert s.finish() == 2, s.text
        assert "Resume: so101d setup-motors follower" in s.text and "--from wrist_roll" in s.text
    finally:
        s.close()
    got = servos(kit)
    assert got["gripper"]["id"] == 6 and got["gripper"]["baud_rate"] == 1_000_000
    assert got["wrist_roll"]["id"] == 1 and got["wrist_roll"]["baud_rate"] == int(KIT_BAUD)  # untouched


def test_ctrl_c_mid_write_finishes_that_servo_says_where_it_is_and_from_resumes(
    kit: EmulatorProcess, tmp_path: Path
) -> None:
    s = SetupSession(["follower", "--port", str(kit.follower_path)], tmp_path)
    try:
        s.until(r"\[1/6\] Connect ONLY the gripper")
        plug_only(kit, "follower", ["gripper"])
        s.enter()
        s.until(r"found one STS3215 alone at id 1")
        # Slow every reply (below the command's reply timeout) so the writes take a while, and
        # press Ctrl-C once the first of them was acknowledged.
        kit.control({"cmd": "latency", "arm": "follower", "seconds": 0.25})
        s.until(r"torque off, EEPROM unlocked")
        s.interrupt()
        assert s.finish() == 130, s.text
    finally:
        s.close()
    kit.control({"cmd": "latency", "arm": "follower", "seconds": 0.0})
    assert "Ctrl-C: finishing this servo's writes first" in s.text
    assert (
        "stopped after the gripper servo was set up (it answers as id 6 at 1000000 baud). "
        "Resume: so101d setup-motors follower" in s.text
    ), s.text
    assert "--from wrist_roll" in s.text
    got = servos(kit)["gripper"]
    assert (got["id"], got["baud_rate"], got["lock"]) == (6, 1_000_000, 1)

    # The rerun, as the output says: the five servos left.
    resume = SetupSession(["follower", "--port", str(kit.follower_path), "--from", "wrist_roll"], tmp_path)
    try:
        code = resume.run_story(
            lambda joint, _id: plug_only(kit, "follower", [joint]), on_chain=lambda: plug_only(kit, "follower", None)
        )
    finally:
        resume.close()
    assert code == 0, resume.text
    assert "Connect ONLY the gripper" not in resume.text  # not asked again
    assert "All six follower servos answer at their ids (1..6) at 1000000 baud on the chain (checked" in resume.text
    assert {j: s["id"] for j, s in servos(kit).items()} == JOINT_IDS


def test_a_write_the_servo_does_not_keep_ends_the_run_saying_where_it_answers(
    kit: EmulatorProcess, tmp_path: Path
) -> None:
    plug_only(kit, "follower", ["gripper"])
    kit.control({"cmd": "refuse_writes", "arm": "follower", "joint": "gripper", "name": "Baud_Rate"})
    s = SetupSession(["follower", "--port", str(kit.follower_path)], tmp_path)
    try:
        code = s.run_story(lambda joint, _id: None)
    finally:
        s.close()
    assert code == 3, s.text
    assert "the gripper servo's setup failed" in s.text
    assert f"the gripper servo answers as id 6 at {KIT_BAUD} baud. Resume:" in s.text, s.text
    assert "--from gripper" in s.text


def test_answers_colliding_on_the_wire_are_refused_as_two_servos(tmp_path: Path) -> None:
    # Real servos answer a broadcast ping together: the bits fight and the host reads garbage.
    extra = ["--baud", KIT_BAUD, "--realism", "collisions"]
    with EmulatorProcess(tmp_path / "kit", leader=False, preset="new-kit", extra_args=extra) as emu:
        emu.control({"cmd": "set_register", "arm": "follower", "joint": "gripper", "name": "ID", "value": 6})
        plug_only(emu, "follower", ["gripper", "wrist_roll"])  # one set up before, one from the box
        s = SetupSession(["follower", "--port", str(emu.follower_path)], tmp_path)
        try:
            s.until(r"\[1/6\] Connect ONLY the gripper")
            s.enter()
            m = s.until(r"refused: (.*)")
            s.until(r"\[1/6\] Connect ONLY the gripper")
            s.proc.stdin.close()  # type: ignore[union-attr]
            assert s.finish() == 2, s.text
        finally:
            s.close()
    assert "two or more servos answer at once" in m.group(1) and "garbled bytes (answers colliding)" in m.group(1)


def test_from_checks_the_joints_before_it_on_the_chain_and_names_the_ones_not_set_up(
    kit: EmulatorProcess, tmp_path: Path
) -> None:
    # A guessed --from on a kit where nothing was set up: only the last joint is done here.
    s = SetupSession(["follower", "--port", str(kit.follower_path), "--from", "shoulder_pan"], tmp_path)
    try:
        code = s.run_story(
            lambda joint, _id: plug_only(kit, "follower", [joint]), on_chain=lambda: plug_only(kit, "follower", None)
        )
    finally:
        s.close()
    assert code == 4, s.text
    assert "All six" not in s.text and "Next: so101d calibrate" not in s.text, s.text
    for joint, sid in (("gripper", 6), ("wrist_roll", 5), ("shoulder_lift", 2)):
        assert f"the {joint} servo (id {sid}) does not answer at 1000000 baud: it was not set up" in s.text, s.text
    assert f"Set up the ones missing: so101d setup-motors follower --port {kit.follower_path} --from gripper" in s.text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_mid_write_finish_that_servo_and_say_how_to_resume(
    kit: EmulatorProcess, tmp_path: Path, sig: int
) -> None:
    s = SetupSession(["follower", "--port", str(kit.follower_path)], tmp_path)
    try:
        s.until(r"\[1/6\] Connect ONLY the gripper")
        plug_only(kit, "follower", ["gripper"])
        s.enter()
        s.until(r"found one STS3215 alone at id 1")
        kit.control({"cmd": "latency", "arm": "follower", "seconds": 0.25})
        s.until(r"torque off, EEPROM unlocked")
        s.interrupt(sig)
        assert s.finish() == 128 + sig, s.text
    finally:
        s.close()
    kit.control({"cmd": "latency", "arm": "follower", "seconds": 0.0})
    name = signal.Signals(sig).name
    assert f"{name}: finishing this servo's writes first" in s.text, s.text
    assert f"{name}: stopped after the gripper servo was set up (it answers as id 6 at 1000000 baud)" in s.text
    assert "--from wrist_roll" in s.text
    got = servos(kit)["gripper"]
    assert (got["id"], got["baud_rate"], got["lock"]) == (6, 1_000_000, 1)


def test_ctrl_c_while_looking_for_a_servo_after_a_failed_write_still_says_how_to_resume(
    kit: EmulatorProcess, tmp_path: Path
) -> None:
    s = SetupSession(["follower", "--port", str(kit.follower_path)], tmp_path)
    try:
        s.until(r"\[1/6\] Connect ONLY the gripper")
        plug_only(kit, "follower", ["gripper"])
        s.enter()
        s.until(r"found one STS3215 alone at id 1")
        kit.control({"cmd": "latency", "arm": "follower", "seconds": 0.3})
        s.until(r"torque off, EEPROM unlocked")
        plug_only(kit, "follower", [])  # the servo's cable falls out mid-write
        s.until(r"looking for the gripper servo")
        s.interrupt()
        assert s.finish() == 3, s.text
    finally:
        s.close()
    assert "Ctrl-C while looking for it; the last acknowledged write should have left it answering as" in s.text
    assert f"setup-motors searches every id and rate: so101d setup-motors follower --port {kit.follower_path}" in s.text


def test_a_step_line_claims_only_what_was_read_back(kit: EmulatorProcess, tmp_path: Path) -> None:
    plug_only(kit, "follower", ["gripper"])
    kit.control({"cmd": "refuse_writes", "arm": "follower", "joint": "gripper", "name": "ID"})
    s = SetupSession(["follower", "--port", str(kit.follower_path)], tmp_path)
    try:
        code = s.run_story(lambda joint, _id: None)
    finally:
        s.close()
    assert code == 3, s.text
    assert "ID 1 -> 6: acknowledged" in s.text
    assert "answers as id 6" not in s.text, s.text  # it kept id 1: nothing may say otherwise
    assert f"the gripper servo answers as id 1 at {KIT_BAUD} baud. Resume:" in s.text, s.text


def test_port_errors_say_what_is_wrong_and_the_daemon_only_for_a_held_port(
    kit: EmulatorProcess, tmp_path: Path
) -> None:
    def run_on(port: str) -> str:
        out = io.StringIO()
        assert SetupRun("follower", port, None, io.StringIO(""), out).run() == 3
        return out.getvalue()

    regular = tmp_path / "regular"
    regular.write_text("x")
    missing = run_on(str(tmp_path / "ttyACM9"))
    assert "does not exist: is the controller board's USB cable plugged in?" in missing and "so101d" not in missing
    assert "is a regular file, not a serial port" in run_on(str(regular))
    assert "is a device but not a serial port" in run_on("/dev/null")
    holder = FeetechBus(str(kit.follower_path), 1_000_000)
    holder.open()
    try:
        held = run_on(str(kit.follower_path))
    finally:
        holder.close()
    assert "another program holds this port: is so101d running on it? stop it first" in held, held


def test_connect_servos_refuses_a_misspelt_or_missing_joints_key(kit: EmulatorProcess) -> None:
    with pytest.raises(Exception, match=r"unknown key\(s\) \['joint'\]"):
        kit.control({"cmd": "connect_servos", "arm": "follower", "joint": ["gripper"]})
    with pytest.raises(Exception, match="needs 'joints'"):
        kit.control({"cmd": "connect_servos", "arm": "follower"})
    assert all(s["cabled"] for s in servos(kit).values())  # nothing was unplugged
