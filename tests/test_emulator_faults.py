"""Fault injection, unplug/replug and wire time, seen through the unmodified Feetech SDK."""

from __future__ import annotations

import os
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import scservo_sdk as scs
import serial
from support import sdk_port_on_emulated_follower
from test_emulator_sdk import ok

from drivers import protocol as P
from drivers.emulator import BusEmulator, EmulatedArm
from drivers.emulator.realism import realism_from_spec
from drivers.sts3215_table import ERR_OVERHEAT, ERR_OVERLOAD, ERR_VOLTAGE

ADDR_PRESENT = 56


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[EmulatedArm, BusEmulator, scs.PortHandler, scs.PacketHandler]]:
    with sdk_port_on_emulated_follower(tmp_path) as r:
        yield r


def _sync_reader(port, ph, ids=range(1, 7)) -> scs.GroupSyncRead:
    reader = scs.GroupSyncRead(port, ph, ADDR_PRESENT, 2)
    for i in ids:
        reader.addParam(i)
    return reader


def test_drop_next_replies_then_recover(rig) -> None:
    _arm, bus, port, ph = rig
    bus.drop_replies(1)
    assert ph.read2ByteTxRx(port, 1, ADDR_PRESENT)[1] == scs.COMM_RX_TIMEOUT
    assert bus.stats.dropped_replies == 1
    assert ok(port, ph.read2ByteTxRx, port, 1, ADDR_PRESENT)[1] == scs.COMM_SUCCESS


def test_corrupted_checksums_are_reported_corrupt_by_the_sdk(rig) -> None:
    _arm, bus, port, ph = rig
    bus.corrupt_checksums(1.0)
    assert ph.read2ByteTxRx(port, 2, ADDR_PRESENT)[1] == scs.COMM_RX_CORRUPT
    bus.corrupt_checksums(0.0)
    assert ok(port, ph.read2ByteTxRx, port, 2, ADDR_PRESENT)[1] == scs.COMM_SUCCESS
    with pytest.raises(ValueError):
        bus.corrupt_checksums(1.5)


def test_added_latency_delays_every_reply(rig) -> None:
    _arm, bus, port, ph = rig
    bus.set_latency(0.02)
    t0 = time.perf_counter()
    assert ok(port, ph.read2ByteTxRx, port, 3, ADDR_PRESENT)[1] == scs.COMM_SUCCESS
    assert time.perf_counter() - t0 >= 0.02
    bus.clear_faults()
    assert bus.faults.latency_s == 0.0


def test_servo_off_the_bus_is_silent_and_breaks_the_sync_read(rig) -> None:
    arm, _bus, port, ph = rig
    arm.set_online("wrist_flex", False)
    assert ph.ping(port, 4)[1] == scs.COMM_RX_TIMEOUT
    # The SDK waits for id 4's reply in order: the whole group read fails (LR#3131's symptom).
    assert _sync_reader(port, ph).txRxPacket() == scs.COMM_RX_TIMEOUT
    time.sleep(0.05)
    port.ser.reset_input_buffer()  # id 5 and 6 did answer: drain them like a careful client
    assert ok(port, _sync_reader(port, ph, [1, 2, 3, 5, 6]).txRxPacket) == scs.COMM_SUCCESS
    arm.set_online("wrist_flex", True)
    assert ok(port, ph.ping, port, 4)[1] == scs.COMM_SUCCESS


def _broadcast_ping(port) -> list[P.Packet]:
    port.ser.reset_input_buffer()
    port.writePort(P.ping(P.BROADCAST_ID))
    time.sleep(0.05)  # every answer (or the collision) is in by now
    return P.PacketParser().feed(port.ser.read(512))


def test_broadcast_ping_finds_the_one_servo_attached_as_in_lerobots_motor_setup(rig) -> None:
    arm, _bus, port, _ph = rig
    for joint in (1, 2, 3, 4, 5):
        arm.set_online(joint, False)
    packets = _broadcast_ping(port)
    assert [(p.servo_id, p.code, p.params) for p in packets] == [(6, 0, b"")]


def test_broadcast_ping_with_several_servos_collides_under_realism(rig) -> None:
    """On a real half-duplex bus six servos answering one broadcast ping talk over each other;
    nobody may rely on a clean answer (our driver pings by id)."""
    arm, bus, port, ph = rig
    bus.set_realism(realism_from_spec("collisions").bus)
    assert _broadcast_ping(port) == []
    assert bus.stats.collisions == 1
    # one servo alone still answers cleanly, and pinging by id works with all of them
    for joint in (2, 3, 4, 5, 6):
        arm.set_online(joint, False)
    assert [p.servo_id for p in _broadcast_ping(port)] == [1]
    for joint in (2, 3, 4, 5, 6):
        arm.set_online(joint, True)
    assert all(ok(port, ph.ping, port, i)[1] == scs.COMM_SUCCESS for i in range(1, 7))


def test_error_bits_reach_the_status_packet(rig) -> None:
    arm, _bus, port, ph = rig
    arm.set_error_bits("elbow_flex", ERR_VOLTAGE)
    _, comm, err = ok(port, ph.read2ByteTxRx, port, 3, ADDR_PRESENT)
    assert comm == scs.COMM_SUCCESS and err == ERR_VOLTAGE
    assert "voltage" in ph.getRxPacketError(err).lower()
    arm.set_error_bits("elbow_flex", 0)
    arm.set_temperature("elbow_flex", 80.0)
    assert ok(port, ph.ping, port, 3)[2] & ERR_OVERHEAT
    arm.set_supply_voltage(3.0)
    assert ok(port, ph.ping, port, 1)[2] & ERR_VOLTAGE


def test_overload_bit_and_torque_cut_over_the_bus(rig) -> None:
    arm, _bus, port, ph = rig
    g = 6
    start = ok(port, ph.read2ByteTxRx, port, g, ADDR_PRESENT)[0]
    ok(port, ph.write1ByteTxRx, port, g, 55, 0)
    ok(port, ph.write1ByteTxRx, port, g, 35, 20)  # Protection_Time 200 ms
    arm.block_joint("gripper", start + 100)  # something in the gripper
    ok(port, ph.write1ByteTxRx, port, g, 40, 1)
    ok(port, ph.write2ByteTxRx, port, g, 42, start + 700)
    deadline = time.monotonic() + 3.0
    err = 0
    while time.monotonic() < deadline:
        _, _comm, err = ok(port, ph.read1ByteTxRx, port, g, 40)
        if err & ERR_OVERLOAD:
            break
        time.sleep(0.02)
    assert err & ERR_OVERLOAD
    assert ok(port, ph.read1ByteTxRx, port, g, 40)[0] == 0  # torque was cut
    assert ok(port, ph.read1ByteTxRx, port, g, 65)[0] & ERR_OVERLOAD  # Status register too
    ok(port, ph.write1ByteTxRx, port, g, 40, 0)
    assert ok(port, ph.ping, port, g)[2] == 0  # a Torque_Enable write clears it


def test_unplug_errors_the_client_and_replug_serves_a_fresh_pty(rig) -> None:
    _arm, bus, port, ph = rig
    old = bus.slave_name
    bus.unplug()
    assert not os.path.lexists(bus.link_path)
    with pytest.raises(serial.SerialException):
        port.ser.write(P.ping(1))
    with pytest.raises(serial.SerialException):
        port.ser.read(1)
    with pytest.raises((OSError, termios.error)):  # the SDK's own path: flush() -> tcdrain -> EIO
        ph.ping(port, 1)
    bus.replug()
    assert os.path.islink(bus.link_path) and os.readlink(bus.link_path) == bus.slave_name
    try:
        port.closePort()
    except OSError:
        pass
    fresh = scs.PortHandler(str(bus.link_path))
    assert fresh.openPort()
    try:
        assert ok(fresh, ph.ping, fresh, 1)[:2] == (777, scs.COMM_SUCCESS)
    finally:
        fresh.closePort()
    assert bus.stats.unplugs == 1 and old  # state (the arm) survived the unplug


@pytest.mark.parametrize("baud", [1_000_000, 115_200])
def test_sync_read_takes_at_least_the_wire_time(tmp_path: Path, baud: int) -> None:
    arm = EmulatedArm("follower", baudrate=baud)
    for s in arm.servos:
        s.set_register("Return_Delay_Time", 50)  # 100 us per reply
    with BusEmulator(tmp_path / "f", arm) as bus:
        port = scs.PortHandler(str(bus.link_path))
        assert port.openPort() and port.setBaudRate(baud)
        ph = scs.PacketHandler(0)
        reader = _sync_reader(port, ph)
        wire_s = P.wire_time_s(14 + 6 * 8, baud) + 6 * 100e-6
        times = []
        for _ in range(200):  # 10 timed replies; a try lost to a descheduled process is retried
            if len(times) >= 10:
                break
            t0 = time.perf_counter()
            if reader.txRxPacket() == scs.COMM_SUCCESS:
                times.append(time.perf_counter() - t0)
            else:
                time.sleep(0.05)
                port.ser.reset_input_buffer()
        port.closePort()
    assert len(times) >= 10
    assert min(times) >= wire_s * 0.98, (min(times), wire_s)


def test_no_wire_time_mode_answers_faster_than_the_wire(tmp_path: Path) -> None:
    arm = EmulatedArm("follower", baudrate=115_200)
    with BusEmulator(tmp_path / "f", arm, wire_time=False) as bus:
        port = scs.PortHandler(str(bus.link_path))
        assert port.openPort() and port.setBaudRate(115_200)
        reader = _sync_reader(port, scs.PacketHandler(0))
        times = []
        wire_s = P.wire_time_s(62, 115_200)
        for _ in range(200):  # one reply beating the wire proves it; a loaded machine may need tries
            t0 = time.perf_counter()
            if reader.txRxPacket() == scs.COMM_SUCCESS:
                times.append(time.perf_counter() - t0)
                if len(times) >= 20 or min(times) < wire_s:
                    break
        port.closePort()
    assert times and min(times) < wire_s  # 5.4 ms of wire skipped


def test_link_over_a_real_file_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "ttyACM0"
    victim.write_text("not a pty")
    with pytest.raises(FileExistsError, match="not a symlink"):
        BusEmulator(victim, EmulatedArm("follower")).start()
    assert victim.read_text() == "not a pty"
    stale = tmp_path / "stale"
    stale.symlink_to("/dev/pts/does-not-exist")
    with BusEmulator(stale, EmulatedArm("follower")) as bus:
        assert os.readlink(stale) == bus.slave_name


def test_servos_at_a_custom_baud_answer_a_client_at_that_baud(tmp_path: Path) -> None:
    # 128000 is no termios constant: pyserial sets it as a custom (BOTHER) rate.
    arm = EmulatedArm("follower", baudrate=128_000)
    with BusEmulator(tmp_path / "f", arm) as bus:
        port = scs.PortHandler(str(bus.link_path))
        assert port.openPort()
        ph = scs.PacketHandler(0)
        assert ph.ping(port, 1)[1] == scs.COMM_RX_TIMEOUT  # client at 1 Mbaud hears nothing
        assert port.setBaudRate(128_000)
        assert ok(port, ph.ping, port, 1)[:2] == (777, scs.COMM_SUCCESS)
        port.closePort()
