"""Give one servo of a new kit its final id and the bus baud rate, the servo alone on the bus.

The story is LeRobot 0.6.1's (``motors/motors_bus.py::setup_motor``,
``motors/feetech/feetech.py::_find_single_motor_p0``): the operator connects one servo only; the
bus is searched at every baud rate with a broadcast PING (one request that every id answers);
the one servo found must be an STS3215 (model 777); torque off and EEPROM unlocked (Lock 0), its
ID and then its Baud_Rate are written. Stricter than LeRobot where a real bench goes wrong:

* every rate is asked, and every reply kept (``FeetechBus.collect_replies``): two servos on the
  chain show up as two replies, as replies at two rates, or as bytes no packet accounts for
  (answers colliding on the wire), and READs by the found id must each get exactly one clean
  reply: Model_Number, then each servo's own present position and state
  (``shared_id_evidence``), where servos sharing one id, answering together, disagree and their
  bits collide. LeRobot takes the first id it sees.
* the rates are the union of the STS3215 datasheet's table (``BAUD_RATE_BY_CODE``) and LeRobot's
  (which has 19200 instead of 76800): the two disagree, and a search costs ~0.1 s per silent rate.
* after the writes the EEPROM is locked again (Lock 1) at the new rate, and ID and Baud_Rate are
  read back there. A write that fails leaves the servo somewhere a later ping finds: ``locate``
  asks the places the acknowledged writes can have left it, then searches every rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from drivers import protocol as P
from drivers.arm_interface import BusTimeoutError
from drivers.feetech_bus import FeetechBus, decode_value, register_spec
from drivers.sts3215_table import BAUD_RATE_BY_CODE, MODEL_NUMBER_STS3215

TARGET_BAUDRATE = 1_000_000  # what LeRobot and the daemon speak (Baud_Rate code 0)
SCAN_BAUDRATES: tuple[int, ...] = tuple(
    sorted(set(BAUD_RATE_BY_CODE.values()) | {19_200}, reverse=True)  # LeRobot's table has 19200
)
# A reply starts within the servo's return delay (factory 500 us) plus the USB adapter's latency
# (FTDI's default latency timer is 16 ms); then the rest of a chain answers back to back.
FIRST_BYTE_S = 0.1
QUIET_S = 0.02


class SetupRefused(Exception):
    """What is on the bus is not one servo ready to be set up; the message says what was seen
    and what to do."""


class NoServo(SetupRefused):
    pass


class SeveralServos(SetupRefused):
    pass


class WrongModel(SetupRefused):
    pass


class IdTaken(SetupRefused):
    pass


@dataclass(frozen=True)
class Sighting:
    """What answered a broadcast PING at one baud rate."""

    baudrate: int
    ids: tuple[int, ...]  # of the whole replies, in arrival order
    noise_bytes: int  # bytes no whole reply accounts for (answers colliding)

    def describe(self) -> str:
        seen = ", ".join(f"id {i}" for i in self.ids) or "no whole reply"
        garbled = f" and {self.noise_bytes} garbled bytes (answers colliding)" if self.noise_bytes else ""
        return f"{seen}{garbled} at {self.baudrate} baud"


@dataclass(frozen=True)
class Place:
    """Where a servo answers: its id at a baud rate."""

    servo_id: int
    baudrate: int

    def __str__(self) -> str:
        return f"id {self.servo_id} at {self.baudrate} baud"


def baud_code(baudrate: int) -> int:
    codes = {b: c for c, b in BAUD_RATE_BY_CODE.items()}
    if baudrate not in codes:
        raise ValueError(f"the STS3215 has no Baud_Rate code for {baudrate}; known: {sorted(codes)}")
    return codes[baudrate]


def scan(bus: FeetechBus, baudrates: tuple[int, ...] = SCAN_BAUDRATES) -> list[Sighting]:
    """A broadcast PING at every rate; the rates where anything answered."""
    seen = []
    for baud in baudrates:
        bus.set_baudrate(baud)
        replies = bus.collect_replies(P.ping(P.BROADCAST_ID), FIRST_BYTE_S, QUIET_S)
        if replies.packets or replies.noise_bytes:
            seen.append(Sighting(baud, tuple(replies.ids), replies.noise_bytes))
    return seen


def find_single_servo(bus: FeetechBus, joint: str) -> tuple[Place, int]:
    """The one servo on the bus: where it answers and its model number, or SetupRefused."""
    sightings = scan(bus)
    alone = f"unplug every servo but the {joint}: its 3-pin cable alone into the controller board"
    if not sightings:
        raise NoServo(
            f"no servo answered on {bus.port} at any baud rate ({', '.join(map(str, SCAN_BAUDRATES))}): plug the "
            f"{joint} servo's 3-pin cable into the controller board and check the board's power supply "
            "(USB alone does not power the servos)"
        )
    if len(sightings) > 1 or len(sightings[0].ids) != 1 or sightings[0].noise_bytes:
        raise SeveralServos(
            f"two or more servos answer at once ({'; '.join(s.describe() for s in sightings)}): the daisy chain "
            f"is still connected; {alone}"
        )
    place = Place(sightings[0].ids[0], sightings[0].baudrate)
    bus.set_baudrate(place.baudrate)
    addr, size = register_spec("Model_Number")
    replies = bus.collect_replies(P.read(place.servo_id, addr, size), FIRST_BYTE_S, QUIET_S)
    if len(replies.packets) != 1 or replies.noise_bytes:
        # One broadcast answer can hide servos sharing an id whose answers were identical.
        raise SeveralServos(
            f"a read of id {place.servo_id} at {place.baudrate} baud got {len(replies.packets)} replies"
            f"{f' and {replies.noise_bytes} garbled bytes' if replies.noise_bytes else ''}: several servos share "
            f"that id, the daisy chain is still connected; {alone}"
        )
    model = decode_value("Model_Number", replies.packets[0][2])
    shared = shared_id_evidence(bus, place)
    if shared is not None:
        raise SeveralServos(f"{shared}: several servos share {place}, the daisy chain is still connected; {alone}")
    if model != MODEL_NUMBER_STS3215:
        raise WrongModel(
            f"the servo at {place} reports model number {model}, not an STS3215 ({MODEL_NUMBER_STS3215}): the "
            f"SO-101 uses STS3215 servos; connect the {joint}'s STS3215 instead"
        )
    return place, model


# Registers each servo holds for itself (Present_Position .. Present_Temperature): read in a few
# windows, so that a collision whose merged bytes happen to pass the checksum in one window is
# unlikely to pass in all of them.
_PER_SERVO_WINDOWS: tuple[tuple[int, int], ...] = ((56, 2), (56, 8), (58, 6), (56, 8))


def shared_id_evidence(bus: FeetechBus, place: Place) -> str | None:
    """None when one servo answers reads at ``place``; else what showed that several do.

    Servos sharing an id all hear one READ and start answering after the same return delay, so
    on a shared half-duplex wire their replies overlap bit for bit. Registers every servo of a
    model holds alike (Model_Number, a factory EEPROM) merge into one clean packet, which is why a
    broadcast PING or a Model_Number READ cannot tell one servo from several. A servo's own state
    (its present position, to the tick, and its speed, load, voltage, temperature) differs from
    its neighbour's: the overlapping bits then give bytes whose checksum fails (or, on a kinder
    adapter, two replies back to back). Only servos identical in every byte of every window would
    go unseen."""
    bus.set_baudrate(place.baudrate)
    for addr, size in _PER_SERVO_WINDOWS:
        replies = bus.collect_replies(P.read(place.servo_id, addr, size), FIRST_BYTE_S, QUIET_S)
        if len(replies.packets) != 1 or replies.noise_bytes:
            garbled = f" and {replies.noise_bytes} garbled bytes" if replies.noise_bytes else ""
            return (
                f"a read of registers {addr}..{addr + size - 1} (each servo's own present position and state) "
                f"at {place} got {len(replies.packets)} whole replies{garbled}"
            )
    return None


FACTORY_CALIBRATION = {"Homing_Offset": 0, "Min_Position_Limit": 0, "Max_Position_Limit": 4095}


@dataclass(frozen=True)
class LoneIdOne:
    """Why only id 1 answers on an arm that should answer at 1..6."""

    new_kit: bool  # the servos still have the factory id (else: a chain cut after servo 1)
    why: str


def diagnose_lone_id_one(bus: FeetechBus) -> LoneIdOne:
    """Only id 1 answers at the bus's rate: a new kit (every servo at the factory id 1) or an arm
    set up before whose daisy chain is cut after servo 1? Several replies or garbled bytes to a
    ping, reads that collide, or a servo holding the factory calibration say new kit; one servo
    holding a calibration says the cable."""
    here = Place(1, bus.baudrate)
    ping = bus.collect_replies(P.ping(P.BROADCAST_ID), FIRST_BYTE_S, QUIET_S)
    if len(ping.packets) > 1 or ping.noise_bytes:
        garbled = f" and {ping.noise_bytes} garbled bytes" if ping.noise_bytes else ""
        return LoneIdOne(True, f"{len(ping.packets)} replies{garbled} to one ping: several servos share id 1")
    shared = shared_id_evidence(bus, here)
    if shared is not None:
        return LoneIdOne(True, f"{shared}: several servos share id 1")
    held = {name: bus.read(name, 1) for name in FACTORY_CALIBRATION}
    if held == FACTORY_CALIBRATION:
        return LoneIdOne(True, "one servo answers as id 1 and holds the factory settings (offset 0, limits 0..4095)")
    listing = ", ".join(f"{k} {v}" for k, v in held.items())
    return LoneIdOne(
        False,
        f"one servo answers as id 1 and holds a calibration ({listing}), not a new kit's factory settings; "
        "the servos after it do not answer: check the 3-pin cable from servo 1 to servo 2 and the next ones",
    )


def assign(
    bus: FeetechBus,
    found: Place,
    target: Place,
    on_step: Callable[[str, Place], None] = lambda what, now: None,
) -> None:
    """Write the target id and baud rate into the servo found alone on the bus, EEPROM unlocked
    and relocked, then read both back at the target. ``on_step(what, place)`` hears where the
    servo answers after each acknowledged write. Raises ``ArmError`` on a failed write or read
    back (``SetupFailed`` when the values read back differ)."""
    bus.set_baudrate(found.baudrate)
    bus.write("Torque_Enable", found.servo_id, 0)
    bus.write("Lock", found.servo_id, 0)
    on_step("torque off, EEPROM unlocked", found)
    now = found
    if found.servo_id != target.servo_id:
        bus.write("ID", found.servo_id, target.servo_id)
        now = Place(target.servo_id, found.baudrate)
        on_step(f"ID {found.servo_id} -> {target.servo_id}", now)
    if found.baudrate != target.baudrate:
        bus.write("Baud_Rate", now.servo_id, baud_code(target.baudrate))
        now = target
        on_step(f"Baud_Rate {found.baudrate} -> {target.baudrate}", now)
    bus.set_baudrate(target.baudrate)
    bus.write("Lock", target.servo_id, 1)
    on_step("EEPROM locked", target)
    read_id = bus.read("ID", target.servo_id)
    read_code = bus.read("Baud_Rate", target.servo_id)
    if read_id != target.servo_id or read_code != baud_code(target.baudrate):
        raise SetupFailed(
            f"read back ID {read_id}, Baud_Rate code {read_code}; wanted ID {target.servo_id}, code "
            f"{baud_code(target.baudrate)}"
        )


class SetupFailed(BusTimeoutError):
    """The servo answered, but did not keep what was written."""


def answers_at(bus: FeetechBus, place: Place) -> bool:
    bus.set_baudrate(place.baudrate)
    replies = bus.collect_replies(P.ping(place.servo_id), FIRST_BYTE_S, QUIET_S)
    return place.servo_id in replies.ids


def locate(bus: FeetechBus, candidates: list[Place]) -> Place | None:
    """Where the servo alone on the bus answers now: the candidates first, then every rate."""
    for place in dict.fromkeys(candidates):
        if answers_at(bus, place):
            return place
    sightings = scan(bus)
    if len(sightings) == 1 and len(sightings[0].ids) == 1:
        return Place(sightings[0].ids[0], sightings[0].baudrate)
    return None
