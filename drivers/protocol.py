"""Feetech protocol 0 (the STS3215's serial protocol): packet codec and a streaming parser.

Both directions share one framing::

    instruction: FF FF ID LEN INSTR params... CHK     (LEN = len(params) + 2)
    status:      FF FF ID LEN ERROR data...   CHK     (LEN = len(data) + 2)

with CHK the bitwise NOT of the low byte of ``ID + LEN + INSTR/ERROR + sum(params)``. Multi-byte
register values are little-endian on the STS series.

This is the one codec of the project: the bus client (``drivers.feetech_bus``) builds its requests
with ``encode_instruction`` and cuts status packets out of its receive buffer with
``take_packets``; the emulator (``drivers.emulator``) decodes requests with ``PacketParser`` (the
same ``take_packets`` behind a servo's receive timeout) and answers with ``encode_status``. A real
servo ignores packets with a bad checksum and resynchronises on the next ``FF FF`` header; so do
both sides here. Everything is pure and allocation-light: it sits in every bus transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

HEADER = b"\xff\xff"
BROADCAST_ID = 0xFE  # instruction to every servo; none answers (but a SYNC_READ's listed ids)
MAX_ID = 0xFC  # highest id a servo can hold (0xFD is reserved, 0xFE broadcast, 0xFF never an id)

INST_PING = 0x01
INST_READ = 0x02
INST_WRITE = 0x03
INST_REG_WRITE = 0x04
INST_ACTION = 0x05
INST_SYNC_READ = 0x82
INST_SYNC_WRITE = 0x83

INSTRUCTION_NAMES = {
    INST_PING: "PING",
    INST_READ: "READ",
    INST_WRITE: "WRITE",
    INST_REG_WRITE: "REG_WRITE",
    INST_ACTION: "ACTION",
    INST_SYNC_READ: "SYNC_READ",
    INST_SYNC_WRITE: "SYNC_WRITE",
}

# The SDK refuses packets longer than this (TXPACKET_MAX_LEN / RXPACKET_MAX_LEN = 250), and a
# LEN byte above it is treated as noise by the parser below.
MAX_PACKET_LEN = 250
MIN_LEN_FIELD = 2  # LEN counts INSTR/ERROR + CHK at least
STATUS_OVERHEAD_BYTES = 6  # FF FF ID LEN ERR ... CHK: a status packet is this plus its data

# Bits per byte on the wire: start + 8 data + stop.
BITS_PER_BYTE = 10


def checksum(body: bytes | bytearray | memoryview) -> int:
    """Protocol-0 checksum of ``ID LEN INSTR/ERR params...`` (everything between header and CHK)."""
    return (~sum(body)) & 0xFF


def _frame(servo_id: int, code: int, payload: bytes | bytearray) -> bytes:
    if not 0 <= servo_id <= BROADCAST_ID:
        raise ValueError(f"servo id {servo_id} outside 0..{BROADCAST_ID}")
    if not 0 <= code <= 0xFF:
        raise ValueError(f"instruction/error byte {code} outside 0..255")
    length = len(payload) + 2
    if length + 4 > MAX_PACKET_LEN:
        raise ValueError(f"packet of {length + 4} bytes exceeds the protocol maximum of {MAX_PACKET_LEN}")
    body = bytes((servo_id, length, code)) + payload
    return HEADER + body + bytes((checksum(body),))


def encode_instruction(servo_id: int, instruction: int, params: bytes | bytearray | list[int] = b"") -> bytes:
    """An instruction packet (host -> servo)."""
    return _frame(servo_id, instruction, params if isinstance(params, bytes) else bytes(params))


def encode_status(servo_id: int, error: int, data: bytes | bytearray | list[int] = b"") -> bytes:
    """A status packet (servo -> host)."""
    return _frame(servo_id, error, data if isinstance(data, bytes) else bytes(data))


def wire_time_s(n_bytes: int, baudrate: int) -> float:
    """Time ``n_bytes`` occupy a UART line at ``baudrate`` (10 bits per byte)."""
    return n_bytes * BITS_PER_BYTE / baudrate


# --- convenience encoders for the instructions the host sends ------------------------------------
def ping(servo_id: int) -> bytes:
    return encode_instruction(servo_id, INST_PING)


def read(servo_id: int, address: int, length: int) -> bytes:
    return encode_instruction(servo_id, INST_READ, bytes((address, length)))


def write(servo_id: int, address: int, data: bytes | bytearray | list[int]) -> bytes:
    return encode_instruction(servo_id, INST_WRITE, bytes((address,)) + bytes(data))


def reg_write(servo_id: int, address: int, data: bytes | bytearray | list[int]) -> bytes:
    return encode_instruction(servo_id, INST_REG_WRITE, bytes((address,)) + bytes(data))


def action(servo_id: int = BROADCAST_ID) -> bytes:
    return encode_instruction(servo_id, INST_ACTION)


def sync_read(address: int, length: int, ids: Sequence[int]) -> bytes:
    return encode_instruction(BROADCAST_ID, INST_SYNC_READ, bytes((address, length)) + bytes(ids))


def sync_write(address: int, length: int, values: Mapping[int, bytes | bytearray | list[int]]) -> bytes:
    """``values``: servo id -> exactly ``length`` data bytes."""
    params = bytearray((address, length))
    for servo_id, data in values.items():
        data = bytes(data)
        if len(data) != length:
            raise ValueError(f"sync write to id {servo_id}: {len(data)} data bytes, expected {length}")
        params.append(servo_id)
        params += data
    return encode_instruction(BROADCAST_ID, INST_SYNC_WRITE, params)


def le_bytes(value: int, size: int) -> bytes:
    """Register value -> little-endian bytes (``size`` 1, 2 or 4)."""
    return int(value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def le_int(data: bytes | bytearray | memoryview) -> int:
    return int.from_bytes(data, "little")


class Packet(NamedTuple):
    """One framed packet. ``code`` is the instruction (host->servo) or the error byte (servo->host).

    A NamedTuple rather than a frozen dataclass: immutable alike, and built several times per
    bus transaction, where a frozen dataclass's __init__ costs twice as much (bench/bench_bus.py).
    """

    servo_id: int
    code: int
    params: bytes

    @property
    def wire_length(self) -> int:
        return len(self.params) + 6

    def encode(self) -> bytes:
        return _frame(self.servo_id, self.code, self.params)


_new_tuple = tuple.__new__


@dataclass
class ParserStats:
    packets: int = 0
    bad_checksums: int = 0  # a whole packet whose checksum (or, framed, whose framing) is wrong
    bad_headers: int = 0  # an FF FF followed by an impossible id or LEN (or, for replies, not the LEN asked)
    skipped_bytes: int = 0  # bytes thrown away while hunting for a header


def take_packets(
    buf: bytearray,
    out: list[Packet],
    stats: ParserStats,
    *,
    max_id: int = BROADCAST_ID,
    expect_len: int | None = None,
    framed: bool = False,
) -> int:
    """Cut every complete, valid packet out of ``buf`` into ``out``; returns how many damaged ones
    were seen (bad header or checksum). What cannot be a packet yet (a partial one, a trailing
    0xFF that may start the next header) stays in ``buf``.

    Bytes before an ``FF FF`` header are skipped; a damaged packet is dropped by hunting for the
    next header just past its ``FF FF`` (so a real header inside garbage is still found), and
    ``FF FF FF`` reads as a header after one stray 0xFF, as the SDK does. For status packets
    the bus client narrows this down:

    * ``expect_len``: every reply of one request has the same LEN. Any other is a damaged byte
      (or a stray packet); trusting it would wait for bytes that are really the next servos'
      replies, up to the deadline, so it counts as damaged at once.
    * ``framed``: the 8-bit checksum passes one damaged packet in 256; a packet shifted by a lost
      or stray byte is also followed by something that is not the next header. Such a false
      pass once fed a 180 deg wrist_roll "measurement" to the loop in the fault soak.
    """
    bad_headers = bad_checksums = skipped = taken = 0
    pos = 0
    n = len(buf)
    append = out.append
    while True:
        k = buf.find(HEADER, pos)
        if k < 0:
            # Keep a trailing 0xFF: it may be the first half of the next header.
            end = n - 1 if n > pos and buf[n - 1] == 0xFF else n
            skipped += end - pos
            pos = end
            break
        skipped += k - pos
        pos = k
        if k + 4 > n:
            break
        servo_id = buf[k + 2]
        length = buf[k + 3]
        if servo_id == 0xFF:  # FF FF FF ...: the header starts one byte later
            skipped += 1
            pos = k + 1
            continue
        if (
            servo_id > max_id
            or length < MIN_LEN_FIELD
            or length + 4 > MAX_PACKET_LEN
            or (expect_len is not None and length != expect_len)
        ):
            bad_headers += 1
            skipped += 2
            pos = k + 2
            continue
        end = k + 4 + length
        if end > n:
            break
        if buf[end - 1] != (~sum(buf[k + 2 : end - 1])) & 0xFF or (
            # framed: what follows (when already here) is the next FF FF header, or nothing
            framed and end < n and (buf[end] != 0xFF or (end + 1 < n and buf[end + 1] != 0xFF))
        ):
            bad_checksums += 1
            skipped += 2
            pos = k + 2
            continue
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (half the cost, same object)
        append(_new_tuple(Packet, (servo_id, buf[k + 4], bytes(buf[k + 5 : end - 1]))))
        taken += 1
        pos = end
    if pos:
        del buf[:pos]
    stats.packets += taken
    stats.bad_headers += bad_headers
    stats.bad_checksums += bad_checksums
    stats.skipped_bytes += skipped
    return bad_headers + bad_checksums


class PacketParser:
    """Streaming parser: feed it bytes as they arrive, get complete, checksum-valid packets.

    ``take_packets`` does the cutting; this adds the servo's receive state machine timeout.
    """

    __slots__ = ("_buf", "_last_feed_s", "max_id", "stale_s", "stats")

    def __init__(self, max_id: int = BROADCAST_ID, stale_s: float = 0.005) -> None:
        self._buf = bytearray()
        self.stats = ParserStats()
        self.max_id = max_id
        # A partial packet older than this when new bytes arrive is abandoned (a servo's receive
        # state machine times out between bytes too); otherwise a garbage LEN byte would swallow
        # the next several real requests.
        self.stale_s = stale_s
        self._last_feed_s = 0.0

    @property
    def pending(self) -> int:
        """Bytes buffered but not yet part of a complete packet."""
        return len(self._buf)

    def reset(self) -> None:
        self._buf.clear()

    def feed(self, data: bytes | bytearray | memoryview, now_s: float | None = None) -> list[Packet]:
        """Add received bytes; return the packets they complete.

        ``now_s`` (monotonic seconds) enables the inter-byte timeout: bytes arriving more than
        ``stale_s`` after the previous feed abandon whatever is still buffered (a servo's
        receiver resets between packets the same way).
        """
        buf = self._buf
        if now_s is not None:
            if buf and now_s - self._last_feed_s > self.stale_s:
                self.stats.skipped_bytes += len(buf)
                buf.clear()
            self._last_feed_s = now_s
        buf += data
        out: list[Packet] = []
        take_packets(buf, out, self.stats, max_id=self.max_id)
        return out
