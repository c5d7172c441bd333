"""The bare Feetech SDK (scservo_sdk), unmodified, against the emulator on a pty."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import scservo_sdk as scs
from support import sdk_port_on_emulated_follower

from drivers import protocol as P
from drivers.emulator import BusEmulator, EmulatedArm
from drivers.sts3215_table import MODEL_NUMBER_STS3215

ADDR_PRESENT = 56
ADDR_GOAL = 42
ADDR_TORQUE = 40


def ok(port: scs.PortHandler, fn, *args):
    """Run one SDK transaction that must succeed, retrying after a *client-side* timeout.

    In-process, the emulator shares the GIL with this busy-polling client; on a loaded 2-core
    machine either can be descheduled past the SDK's 34 ms timeout. A retry (after draining a
    late reply, which the SDK would otherwise take for the next answer) keeps the test about
    behaviour. A wrong answer is never retried away: only COMM_RX_TIMEOUT / COMM_RX_CORRUPT.
    """
    for attempt in range(6):
        result = fn(*args)
        comm = result if isinstance(result, int) else result[-2] if len(result) == 3 else result[0]
        if comm not in (scs.COMM_RX_TIMEOUT, scs.COMM_RX_CORRUPT) or attempt == 5:
            return result
        time.sleep(0.1)
        port.ser.reset_input_buffer()
    return result


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[tuple[EmulatedArm, BusEmulator, scs.PortHandler, scs.PacketHandler]]:
    with sdk_port_on_emulated_follower(tmp_path) as rig:
        yield rig


def test_ping_every_servo_answers_with_model_777(follower) -> None:
    _arm, _bus, port, ph = follower
    for servo_id in range(1, 7):
        model, comm, err = ok(port, ph.ping, port, servo_id)
        assert (model, comm, err) == (MODEL_NUMBER_STS3215, scs.COMM_SUCCESS, 0)
    model, comm, _ = ph.ping(port, 7)
    assert comm == scs.COMM_RX_TIMEOUT


def test_firmware_is_3_10(follower) -> None:
    _, _, port, ph = follower
    assert ok(port, ph.read1ByteTxRx, port, 1, 0)[0] == 3
    assert ok(port, ph.read1ByteTxRx, port, 1, 1)[0] == 10


def test_read_present_position_matches_the_arm(follower) -> None:
    arm, _, port, ph = follower
    expected = arm.present_ticks()
    for servo_id in range(1, 7):
        value, comm, err = ok(port, ph.read2ByteTxRx, port, servo_id, ADDR_PRESENT)
        assert comm == scs.COMM_SUCCESS and err == 0
        assert value == expected[servo_id - 1]


def test_group_sync_read_and_sync_write_move_the_follower(follower) -> None:
    arm, _, port, ph = follower
    reader = scs.GroupSyncRead(port, ph, ADDR_PRESENT, 2)
    for servo_id in range(1, 7):
        assert reader.addParam(servo_id)
    assert ok(port, reader.txRxPacket) == scs.COMM_SUCCESS
    assert [reader.getData(i, ADDR_PRESENT, 2) for i in range(1, 7)] == arm.present_ticks().tolist()

    start = arm.present_ticks()
    commanded = [int(t) + 100 for t in start]
    # Goals beyond Max_Position_Limit are clamped by the servo (the elbow's rest is near its max).
    limits = arm.eeprom_calibration()
    goals = [min(c, limits[n].range_max) for c, n in zip(commanded, limits.motors)]
    assert goals != commanded
    writer = scs.GroupSyncWrite(port, ph, ADDR_TORQUE, 1)
    for servo_id in range(1, 7):
        writer.addParam(servo_id, [1])
    assert ok(port, writer.txPacket) == scs.COMM_SUCCESS
    writer = scs.GroupSyncWrite(port, ph, ADDR_GOAL, 2)
    for servo_id, goal in zip(range(1, 7), commanded):
        writer.addParam(servo_id, [scs.SCS_LOBYTE(goal), scs.SCS_HIBYTE(goal)])
    assert ok(port, writer.txPacket) == scs.COMM_SUCCESS
    # No stray bytes after a broadcast: the next transaction parses cleanly.
    assert ok(port, ph.read2ByteTxRx, port, 3, ADDR_GOAL)[:2] == (goals[2], scs.COMM_SUCCESS)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert ok(port, reader.txRxPacket) == scs.COMM_SUCCESS
        now = [reader.getData(i, ADDR_PRESENT, 2) for i in range(1, 7)]
        if all(abs(n - g) <= 2 for n, g in zip(now, goals)):
            break
        time.sleep(0.01)
    assert all(abs(n - g) <= 2 for n, g in zip(now, goals)), (now, goals)


def test_write_then_read_back_sram_and_eeprom_lock(follower) -> None:
    _arm, _, port, ph = follower
    assert ok(port, ph.write1ByteTxRx, port, 2, 41, 77) == (scs.COMM_SUCCESS, 0)  # Acceleration (SRAM)
    assert ok(port, ph.read1ByteTxRx, port, 2, 41)[0] == 77
    # Lock is 1 at power-on: the default emulator acknowledges an EEPROM write and ignores it (a
    # real servo applies it without saving it: realism 'strict', tests/test_emulator_realism.py).
    assert ok(port, ph.write1ByteTxRx, port, 2, 21, 5) == (scs.COMM_SUCCESS, 0)
    assert ok(port, ph.read1ByteTxRx, port, 2, 21)[0] == 16
    assert ok(port, ph.write1ByteTxRx, port, 2, 55, 0) == (scs.COMM_SUCCESS, 0)
    assert ok(port, ph.write1ByteTxRx, port, 2, 21, 5) == (scs.COMM_SUCCESS, 0)
    assert ok(port, ph.read1ByteTxRx, port, 2, 21)[0] == 5
    # Read-only registers ignore writes.
    ok(port, ph.write2ByteTxRx, port, 2, 3, 1234)
    assert ok(port, ph.read2ByteTxRx, port, 2, 3)[0] == MODEL_NUMBER_STS3215


def test_reg_write_waits_for_action(follower) -> None:
    _arm, _, port, ph = follower
    assert ok(port, ph.regWriteTxRx, port, 3, 41, 1, [99]) == (scs.COMM_SUCCESS, 0)
    assert ok(port, ph.read1ByteTxRx, port, 3, 41)[0] == 254
    assert ok(port, ph.action, port, scs.BROADCAST_ID) == scs.COMM_SUCCESS
    assert ok(port, ph.read1ByteTxRx, port, 3, 41)[0] == 99


def test_response_status_level_zero_answers_reads_only(follower) -> None:
    _arm, _, port, ph = follower
    assert ok(port, ph.write1ByteTxRx, port, 4, 55, 0)[0] == scs.COMM_SUCCESS
    assert ok(port, ph.write1ByteTxRx, port, 4, 8, 0)[0] == scs.COMM_SUCCESS  # this reply still comes
    comm, _ = ph.write1ByteTxRx(port, 4, 41, 10)
    assert comm == scs.COMM_RX_TIMEOUT  # no status packet for a WRITE now
    assert ok(port, ph.read1ByteTxRx, port, 4, 41)[:2] == (10, scs.COMM_SUCCESS)
    assert ok(port, ph.ping, port, 4)[1] == scs.COMM_SUCCESS


def test_id_change_replies_with_the_old_id_then_answers_to_the_new(follower) -> None:
    _arm, _, port, ph = follower
    assert ok(port, ph.write1ByteTxRx, port, 6, 55, 0)[0] == scs.COMM_SUCCESS
    assert ok(port, ph.write1ByteTxRx, port, 6, 5, 9) == (scs.COMM_SUCCESS, 0)
    assert ok(port, ph.ping, port, 9)[:2] == (MODEL_NUMBER_STS3215, scs.COMM_SUCCESS)
    assert ph.ping(port, 6)[1] == scs.COMM_RX_TIMEOUT


def test_bad_checksum_request_is_ignored_and_bus_recovers(follower) -> None:
    _arm, bus, port, ph = follower
    bad = bytearray(P.read(1, ADDR_PRESENT, 2))
    bad[-1] ^= 0x0F
    port.writePort(bytes(bad))
    time.sleep(0.05)
    assert port.ser.in_waiting == 0  # no reply, no echo
    assert bus.stats.bad_checksums >= 1
    assert ok(port, ph.read2ByteTxRx, port, 1, ADDR_PRESENT)[1] == scs.COMM_SUCCESS


def test_wrong_client_baud_gets_no_answer(follower) -> None:
    _arm, _, port, ph = follower
    assert port.setBaudRate(500_000)
    assert ph.ping(port, 1)[1] == scs.COMM_RX_TIMEOUT
    assert port.setBaudRate(1_000_000)
    assert ok(port, ph.ping, port, 1)[1] == scs.COMM_SUCCESS
