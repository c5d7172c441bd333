"""Feetech protocol 0 (the STS3215's serial protocol): packet codec and a streaming parser.

Both directions share one framing::

    instruction: FF FF ID LEN INSTR params... CHK     (LEN = len(params) + 2)
    status:      FF FF ID LEN ERROR data...   CHK     (LEN = len(data) + 2)

with CHK the bitwise NOT of the low byte of ``ID + LEN + INSTR/ERROR + sum(params)``. Multi-byte
register values are little-endian on the STS series.

The emulator uses the parser on the servo side (a real servo ignores packets with a bad checksum
and resynchronises on the next ``FF FF`` header); the driver can use the same parser to decode
status packets. Everything here is pure and allocation-light: it sits in every bus transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER = b"\xff\xff"
BROADCAST_ID = 0xFE
MAX_ID = 0xFC

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

# Bits per byte on the wire: start + 8 data + stop.
BITS_PER_BYTE = 10


def checksum(body: bytes | bytearray | memoryview) -> int:
    """Protocol-0 checksum of ``ID LEN INSTR/ERR params...`` (everything between header and CHK)."""
    return (~sum(body)) & 0xFF


def _frame(servo_id: int, code: int, payload: bytes | bytearray) -> bytes:
    if not 0 <= servo_id <= 0xFE:
        raise ValueError(f"servo id {servo_id} outside 0..254")
    if not 0 <= code <= 0xFF:
        raise ValueError(f"instruction/error byte {code} outside 0..255")
    length = len(payload) + 2
    if length + 4 > MAX_PACKET_LEN:
        raise ValueError(f"packet of {length + 4} bytes exceeds the protocol maximum of {MAX_PACKET_LEN}")
    body = bytes((servo_id, length, code)) + bytes(payload)
    return HEADER + body + bytes((checksum(body),))


def encode_instruction(servo_id: int, instruction: int, params: bytes | bytearray | list[int] = b"") -> bytes:
    """An instruction packet (host -> servo)."""
    return _frame(servo_id, instruction, bytes(params))


def encode_status(servo_id: int, error: int, data: bytes | bytearray | list[int] = b"") -> bytes:
    """A status packet (servo -> host)."""
    return _frame(servo_id, error, bytes(data))


def wire_time_s(n_bytes: int, baudrate: int) -> float:
    """Time ``n_bytes`` occupy a UART line at ``baudrate`` (10 bits per byte)."""
    return n_bytes * BITS_PER_BYTE / baudrate


# --- convenience encoders for the instructions the host sends ------------------------------------
def ping(servo_id: int) -> bytes:
    return encode_instruction(servo_id, INST_PING)


def read(servo_id: int, address: int, length: int) -> bytes:
    return encode_instruction(servo_id, INST_READ, (address, length))


def write(servo_id: int, address: int, data: bytes | bytearray | list[int]) -> bytes:
    return encode_instruction(servo_id, INST_WRITE, bytes((address,)) + bytes(data))


def reg_write(servo_id: int, address: int, data: bytes | bytearray | list[int]) -> bytes:
    return encode_instruction(servo_id, INST_REG_WRITE, bytes((address,)) + bytes(data))


def action(servo_id: int = BROADCAST_ID) -> bytes:
    return encode_instruction(servo_id, INST_ACTION)


def sync_read(address: int, length: int, ids: list[int] | tuple[int, ...]) -> bytes:
    return encode_instruction(BROADCAST_ID, INST_SYNC_READ, bytes((address, length)) + bytes(ids))


def sync_write(address: int, length: int, values: dict[int, bytes | bytearray | list[int]]) -> bytes:
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


@dataclass(frozen=True, slots=True)
class Packet:
    """One framed packet. ``code`` is the instruction (host->servo) or the error byte (servo->host)."""

    servo_id: int
    code: int
    params: bytes

    @property
    def wire_length(self) -> int:
        return len(self.params) + 6

    def encode(self) -> bytes:
        return _frame(self.servo_id, self.code, self.params)


@dataclass
class ParserStats:
    packets: int = 0
    bad_checksums: int = 0
    skipped_bytes: int = 0  # bytes thrown away while hunting for a header


class PacketParser:
    """Streaming parser: feed it bytes as they arrive, get complete, checksum-valid packets.

    Resynchronisation follows the servo's behaviour: bytes before an ``FF FF`` header are
    skipped; a packet with a bad checksum or an impossible LEN is dropped by discarding one
    byte and hunting for the next header (so a real header inside garbage is still found).
    ``FF FF FF`` is read as a header preceded by one stray 0xFF, as the SDK does.
    """

    __slots__ = ("_buf", "_last_feed_s", "max_id", "stale_s", "stats")

    def __init__(self, max_id: int = 0xFE, stale_s: float = 0.005) -> None:
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
        stats = self.stats
        while True:
            start = buf.find(HEADER)
            if start < 0:
                # Keep a trailing 0xFF: it may be the first half of the next header.
                keep = 1 if buf and buf[-1] == 0xFF else 0
                stats.skipped_bytes += len(buf) - keep
                del buf[: len(buf) - keep]
                return out
            if start:
                stats.skipped_bytes += start
                del buf[:start]
            if len(buf) < 4:
                return out
            servo_id = buf[2]
            length = buf[3]
            if servo_id == 0xFF or servo_id > self.max_id or length < MIN_LEN_FIELD or length + 4 > MAX_PACKET_LEN:
                # Not a plausible packet start: drop one byte and hunt again.
                stats.skipped_bytes += 1
                del buf[0]
                continue
            total = length + 4
            if len(buf) < total:
                return out
            body = buf[2 : total - 1]
            if checksum(body) != buf[total - 1]:
                stats.bad_checksums += 1
                stats.skipped_bytes += 1
                del buf[0]
                continue
            out.append(Packet(servo_id, buf[4], bytes(buf[5 : total - 1])))
            stats.packets += 1
            del buf[:total]
