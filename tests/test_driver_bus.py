"""FeetechBus against the STS3215 bus emulator: protocol, retries, counters, no stale data, unplug."""

from __future__ import annotations

import os
import time

import pytest

from drivers.arm_interface import BusTimeoutError, PortGoneError
from drivers.emulator import BusEmulator, EmulatedArm
from drivers.feetech_bus import FeetechBus, ServoNoReplyError
from drivers.protocol import encode_instruction
from drivers.sts3215_table import MODEL_NUMBER_STS3215

IDS = [1, 2, 3, 4, 5, 6]


@pytest.fixture
def emu(tmp_path):
    arm = EmulatedArm("follower")
    bus = BusEmulator(tmp_path / "follower", arm, wire_time=False)
    bus.start()
    yield bus
    bus.stop()


@pytest.fixture
def bus(emu):
    b = FeetechBus(str(emu.link_path))
    b.open()
    yield b
    b.close()


def test_ping_reads_model_and_firmware(bus):
    for sid in IDS:
        assert bus.ping(sid) == MODEL_NUMBER_STS3215
    assert bus.read("Firmware_Major_Version", 1) == 3
    assert bus.read("Firmware_Minor_Version", 1) == 10


def test_sync_read_matches_emulator_ticks_and_sign_magnitude(emu, bus):
    arm = emu.arm
    arm.set_pose_units([10.0, -20.0, 30.0, -5.0, 45.0, 40.0])
    expected = arm.present_ticks()
    got = bus.sync_read("Present_Position", IDS)
    assert list(got) == IDS  # in request order
    assert [got[i] for i in IDS] == expected.tolist()
    # Homing_Offset is 11-bit sign-magnitude: shoulder_pan's reference offset is negative
    assert bus.read("Homing_Offset", 1) == arm.reference["shoulder_pan"].homing_offset < 0
    assert bus.sync_read("Homing_Offset", IDS) == {i: arm.servo(i).homing_offset for i in IDS}


def test_write_and_sync_write_reach_the_servos(emu, bus):
    bus.write("Lock", 2, 0)
    bus.write("Return_Delay_Time", 2, 7)
    assert emu.arm.servo(2).reg("Return_Delay_Time") == 7
    lo = [emu.arm.reference[n].range_min for n in emu.arm.reference.motors]
    goals = {sid: lo[sid - 1] + 100 + sid for sid in IDS}
    assert len(bus.sync_write_packet("Goal_Position", goals)) == 26  # the wire-time budget of the benchmark
    bus.sync_write("Goal_Position", goals)
    assert bus.sync_read("Goal_Position", IDS) == goals
    assert emu.arm.goal_ticks().tolist() == [goals[i] for i in IDS]


@pytest.mark.parametrize(
    "register, value",
    [
        ("Goal_Position", 1 << 15),
        ("Homing_Offset", 2048),
        ("Lock", 256),
        ("Lock", -1),
        ("Lock", 1.5),
        ("No_Such_Register", 1),
    ],
)
def test_bad_values_raise_before_the_bus(emu, bus, register, value):
    before = (bus.counters.transactions, emu.stats.requests)
    with pytest.raises(ValueError):
        bus.write(register, 1, value)
    with pytest.raises(ValueError):
        bus.sync_write(register, {1: value})
    assert (bus.counters.transactions, emu.stats.requests) == before


def test_dropped_reply_is_retried_and_counted(emu, bus):
    emu.arm.set_pose_units([0, 0, 0, 0, 0, 50])
    emu.drop_replies(1)  # servo 1's reply of the first attempt
    got = bus.sync_read("Present_Position", IDS)
    assert [got[i] for i in IDS] == emu.arm.present_ticks().tolist()
    assert bus.counters.retries == 1
    assert bus.counters.failures == 0


def test_dropped_replies_exhaust_bounded_retries(emu, bus):
    tries = 1 + bus.retries
    emu.drop_replies(6 * tries)
    t0 = time.monotonic()
    with pytest.raises(ServoNoReplyError) as ei:
        bus.sync_read("Present_Position", IDS)
    elapsed = time.monotonic() - t0
    assert isinstance(ei.value, BusTimeoutError)
    assert ei.value.missing_ids == tuple(IDS)
    assert str(emu.link_path) in str(ei.value)
    assert bus.counters.retries == tries - 1
    assert bus.counters.failures == 1
    assert elapsed < 5.0  # bounded (3 x ~50 ms), never a hang
    # the bus works again right after
    assert len(bus.sync_read("Present_Position", IDS)) == 6


def test_no_stale_values_when_one_servo_is_silent(emu, bus):
    """scservo_sdk's GroupSyncRead would hand back last cycle's bytes for the servos after the silent one."""
    arm = emu.arm
    first = bus.sync_read("Present_Position", IDS)
    arm.set_online(3, False)
    arm.set_pose_units([30.0, 30.0, 30.0, 30.0, 30.0, 80.0])
    with pytest.raises(ServoNoReplyError) as ei:
        bus.sync_read("Present_Position", IDS)
    assert ei.value.missing_ids == (3,)
    assert "3" in str(ei.value)
    # the others answered: asking only them gives their fresh (moved) values, not `first`
    others = [i for i in IDS if i != 3]
    fresh = bus.sync_read("Present_Position", others)
    assert all(fresh[i] != first[i] for i in others)
    assert [fresh[i] for i in others] == [arm.present_ticks()[i - 1] for i in others]


def test_late_reply_to_an_earlier_request_is_not_taken_for_a_new_one(tmp_path):
    """A slow bridge answers after our timeout: the retry gets the first reply, the second reply
    is still on its way when the next read starts. It must be swallowed, not returned as fresh."""
    arm = EmulatedArm("follower")
    with BusEmulator(tmp_path / "f", arm, wire_time=True) as emu:
        b = FeetechBus(str(emu.link_path), reply_margin_s=0.05)
        b.open()
        try:
            arm.set_pose_units([0.0, 0.0, 0.0, 0.0, 0.0, 10.0])
            pose_a = arm.present_ticks().tolist()
            # replies 80 ms late: attempt 1 (50 ms) times out, attempt 2 takes reply 1
            emu.set_latency(0.08)
            first = b.sync_read("Present_Position", IDS)
            assert [first[i] for i in IDS] == pose_a
            assert b.counters.retries >= 1
            emu.clear_faults()
            arm.set_pose_units([40.0, 40.0, 40.0, 40.0, 40.0, 90.0])
            pose_b = arm.present_ticks().tolist()
            assert pose_b != pose_a
            second = b.sync_read("Present_Position", IDS)
            assert [second[i] for i in IDS] == pose_b
        finally:
            b.close()


def test_corrupt_checksums_are_rejected_not_returned(emu, bus):
    emu.corrupt_checksums(1.0)
    with pytest.raises(ServoNoReplyError) as ei:
        bus.read("Present_Position", 1)
    assert ei.value.corrupt
    emu.clear_faults()
    assert bus.read("Present_Position", 1) == emu.arm.present_ticks()[0]


def test_stray_input_is_discarded_before_a_request(emu, bus):
    # a reply to a request nobody waits for (e.g. a timed-out earlier one) sits in the input
    raw = os.open(str(emu.link_path), os.O_RDWR | os.O_NOCTTY)
    try:
        os.write(raw, encode_instruction(2, 0x02, bytes((56, 2))))
        time.sleep(0.05)  # the emulator answers into the shared pty input
    finally:
        os.close(raw)
    got = bus.sync_read("Present_Position", IDS)
    assert [got[i] for i in IDS] == emu.arm.present_ticks().tolist()
    assert bus.discarded_bytes == 8  # the stray status packet, thrown away, not parsed as a reply
    assert bus.counters.retries == 0


def test_unplug_raises_port_gone_and_reopen_after_replug(emu, bus):
    assert bus.ping(1) == MODEL_NUMBER_STS3215
    emu.unplug()
    with pytest.raises(PortGoneError) as ei:
        bus.sync_read("Present_Position", IDS)
    assert str(emu.link_path) in str(ei.value)
    assert not bus.is_open
    with pytest.raises(PortGoneError):
        bus.open()  # link removed: nothing to open
    emu.replug()
    bus.open()
    assert bus.ping(6) == MODEL_NUMBER_STS3215


def test_open_missing_port_is_port_gone(tmp_path):
    with pytest.raises(PortGoneError) as ei:
        FeetechBus(str(tmp_path / "nothing")).open()
    assert "nothing" in str(ei.value)


def test_wire_time_is_respected(tmp_path):
    """With wire time modelled, a six-servo sync read cannot beat 62 bytes at 1 Mbaud."""
    arm = EmulatedArm("follower")
    with BusEmulator(tmp_path / "f", arm, wire_time=True) as emu:
        b = FeetechBus(str(emu.link_path))
        b.open()
        try:
            samples = []
            for _ in range(20):
                t0 = time.perf_counter()
                b.sync_read("Present_Position", IDS)
                samples.append(time.perf_counter() - t0)
        finally:
            b.close()
    assert min(samples) >= 0.62e-3 * 0.95


def test_a_read_interrupted_by_ctrl_c_leaves_no_stale_reply_for_the_next_one(emu, bus, monkeypatch):
    """Ctrl-C lands while a sync read's replies are still on the wire (here: 20 ms of latency).
    The next request must not take those late Present_Position replies (2 bytes, like
    Min_Position_Limit) as its own answer: `so101d calibrate` restores the servos after Ctrl-C by
    writing and reading back exactly such registers."""
    emu.arm.set_pose_units([10.0, -20.0, 30.0, -5.0, 45.0, 40.0])
    emu.set_latency(0.02)

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt  # the signal arrives right after the request went out

    with monkeypatch.context() as m:
        m.setattr(bus, "_receive", interrupted)
        with pytest.raises(KeyboardInterrupt):
            bus.sync_read("Present_Position", IDS)
    assert bus.read("Min_Position_Limit", 1) == emu.arm.servo(1).reg("Min_Position_Limit")
    assert bus.read("Max_Position_Limit", 1) == emu.arm.servo(1).reg("Max_Position_Limit")
