"""Fault classification (daemon/control/faults.py) with plain data: what a failed read or write, or a
health reading, means for the operator standing next to the arm."""

from __future__ import annotations

from daemon.config.settings import SafetyConfig
from daemon.control.faults import (
    classify_read_failure,
    classify_write_failure,
    describe_faults,
    fault_text,
    handshake_fault,
    judge_health,
    read_failure_lost,
)
from drivers.arm_interface import (
    ArmError,
    ArmHealth,
    BusTimeoutError,
    HandshakeError,
    OverloadLatchedError,
    PortGoneError,
    ServoHealth,
)
from drivers.feetech_bus import ServoNoReplyError
from drivers.sts3215_table import ERR_ANGLE_SENSOR, ERR_OVERHEAT, ERR_OVERLOAD

SAFETY = SafetyConfig()
JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")


def servo(status: int = 0, temperature_c: float = 35.0) -> ServoHealth:
    return ServoHealth(
        temperature_c=temperature_c,
        voltage_v=12.0,
        load_pct=5.0,
        current_ma=100.0,
        status_bits=status,
        torque_enabled=True,
    )


def health(missing: tuple[str, ...] = (), **overrides: ServoHealth) -> ArmHealth:
    servos = {n: overrides.get(n, servo()) for n in JOINTS if n not in missing}
    return ArmHealth(servos=servos, read_at_s=1.0, missing=missing)


def test_a_healthy_arm_has_no_fault() -> None:
    assert describe_faults(health(), SAFETY.fault_bits, SAFETY.max_temperature_c) == ""


def test_overload_overheat_and_a_silent_servo_are_named_by_joint() -> None:
    h = health(("wrist_flex",), elbow_flex=servo(ERR_OVERLOAD), gripper=servo(temperature_c=81.0))
    text = describe_faults(h, SAFETY.fault_bits, SAFETY.max_temperature_c)
    assert text == ("servo(s) not answering: wrist_flex; elbow_flex: overload (status 0x20); gripper: 81 C > 70 C")


def test_status_bits_outside_the_configured_fault_bits_are_not_a_fault() -> None:
    # the angle-sensor bit is not in the default fault_bits: it is shown in status, not acted on
    h = health(shoulder_pan=servo(ERR_ANGLE_SENSOR))
    assert describe_faults(h, SAFETY.fault_bits, SAFETY.max_temperature_c) == ""
    assert "angle_sensor" in describe_faults(h, 0xFF, SAFETY.max_temperature_c)


def test_one_servo_silent_while_the_others_answer_is_that_servo_off_the_bus() -> None:
    f = classify_read_failure(ServoNoReplyError("no reply", "/dev/x", [4]))
    assert not f.gone and f.silent_joints == ("wrist_flex",)
    assert f.missing_fault() == "servo(s) not answering: wrist_flex"


def test_every_servo_silent_or_a_corrupt_reply_names_no_servo() -> None:
    all_silent = classify_read_failure(ServoNoReplyError("no reply", "/dev/x", [1, 2, 3, 4, 5, 6]))
    corrupt = classify_read_failure(ServoNoReplyError("bad checksum", "/dev/x", [4], corrupt=True))
    for f in (all_silent, corrupt):
        assert not f.gone and f.silent_joints == () and f.missing_fault() == ""


def test_a_port_gone_or_a_foreign_exception_loses_the_link_at_once() -> None:
    for exc in (PortGoneError("unplugged"), OSError(5, "Input/output error")):
        f = classify_read_failure(exc)
        assert f.gone and read_failure_lost(f, failing_s=0.0, stale_s=0.1)


def test_bus_timeouts_lose_the_link_only_once_they_last() -> None:
    f = classify_read_failure(BusTimeoutError("no reply"))
    assert not f.gone
    assert not read_failure_lost(f, failing_s=0.4, stale_s=0.1)  # half a second at least
    assert read_failure_lost(f, failing_s=0.6, stale_s=0.1)
    assert not read_failure_lost(f, failing_s=0.9, stale_s=0.2)  # five stale periods when longer
    assert read_failure_lost(f, failing_s=1.1, stale_s=0.2)


def test_write_failures_latched_gone_or_transient() -> None:
    assert classify_write_failure(OverloadLatchedError("power cycle the arm", ["elbow_flex"])) == "latched"
    assert classify_write_failure(PortGoneError("unplugged")) == "gone"
    assert classify_write_failure(ValueError("not an arm error")) == "gone"
    assert classify_write_failure(ArmError("no ack")) == "transient"


def test_a_handshake_with_some_servos_missing_is_a_fault_nothing_answering_is_not() -> None:
    partial = HandshakeError("/dev/x: expected ids 1-6, ids answering: 1, 2, 3, 5, 6")
    assert handshake_fault(partial) == str(partial)
    assert handshake_fault(HandshakeError("/dev/x: expected ids 1-6, ids answering: none")) == ""
    assert handshake_fault(PortGoneError("no port")) == ""


def test_a_needed_power_cycle_stays_until_the_latch_is_gone() -> None:
    need = "elbow_flex: overload latched; power cycle the follower"
    still = judge_health(health(elbow_flex=servo(ERR_OVERLOAD)), SAFETY.fault_bits, SAFETY.max_temperature_c, need)
    assert still.power_cycle_required == need and not still.power_cycled
    assert still.fault.startswith(need) and "overload (status 0x20)" in still.fault
    # power off: the servos do not answer at all, which is not the power cycle being done yet
    off = judge_health(health(JOINTS), SAFETY.fault_bits, SAFETY.max_temperature_c, need)
    assert off.power_cycle_required == need and not off.power_cycled
    done = judge_health(health(), SAFETY.fault_bits, SAFETY.max_temperature_c, need)
    assert done == type(done)(fault="", power_cycle_required="", power_cycled=True)


def test_an_overheat_alone_never_asks_for_a_power_cycle() -> None:
    v = judge_health(health(gripper=servo(ERR_OVERHEAT)), SAFETY.fault_bits, SAFETY.max_temperature_c, "")
    assert v.fault == "gripper: overheat (status 0x04)" and v.power_cycle_required == "" and not v.power_cycled


def test_the_operator_reads_the_needed_power_cycle_first() -> None:
    need = "power cycle the follower"
    assert fault_text("", need) == need
    assert fault_text("elbow_flex: overload", need) == f"{need} (elbow_flex: overload)"
    assert fault_text(f"{need} (elbow_flex: overload)", need) == f"{need} (elbow_flex: overload)"
    assert fault_text("elbow_flex: overload", "") == "elbow_flex: overload"
