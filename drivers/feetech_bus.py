"""Low-level Feetech protocol-0 bus (STS3215) for the daemon: one port, bounded retries, no stale data.

Feetech protocol 0 spoken here on pyserial rather than through scservo_sdk or LeRobot's
FeetechMotorsBus: one ``select`` wait per transaction instead of a busy poll (which competes on a
small machine for the CPU the reply needs), input drained before each request and the replies
still owed to a timed-out attempt swallowed before the next (so a late reply is never taken for a
new one's), all replies of a sync read parsed from one buffer, and every reply checked (header,
id, length, checksum): a transaction either returns fresh values for *every* servo asked or
raises. Packets are built and cut by ``drivers/protocol.py``, the codec the emulator uses too;
this module is the transport around it: when to send, how long to wait, what to retry. The
measurement that chose this over the SDK and LeRobot's bus is in docs/design/feetech-bus.md
(``bench/bench_bus.py`` reruns it).

Failure semantics (what the control loop relies on)
---------------------------------------------------
* No reply / corrupt reply -> retried (counted in ``counters.retries``) as soon as the bus has
  gone quiet (every reply byte is in but one, or bytes came and then none for ``quiet_s``) rather than
  after the full reply deadline; only an attempt that got no byte at all waits the deadline. A
  retry of a sync read asks only the servos still missing (after noise) and keeps the whole
  replies already in. Damaged replies get ``NOISE_RETRIES`` extra attempts on top of ``retries``
  (a noisy cable's 2 % damaged packets must never fail a read); silence gets ``retries``. Then
  ``ServoNoReplyError`` (a ``BusTimeoutError``) naming the servo ids that stayed silent and
  the port; ``counters.failures`` counts it. A partial sync read is never returned as a whole.
* The port vanished -> ``PortGoneError``; the port is closed and ``open()`` may be called again.
  What a vanished port looks like (checked on a pty whose master closed; pyserial's comments say a
  disconnected USB device behaves the same): ``select`` reports it readable and ``read`` returns no data (pyserial raises
  ``SerialException("device reports readiness to read but returned no data ...")``), ``write``
  fails with EIO (pyserial: ``SerialException("write failed: [Errno 5] ...")``), ``in_waiting``
  raises ``OSError(EIO)``, and reopening fails with ENOENT ("could not open port"). All of these,
  and a device node that disappeared while the fd stays quiet, map to PortGoneError.
* Status-packet error bits (overload, overheat, ...) do not fail a transaction (LeRobot's
  read()/write() raise on them, which turns an overloaded gripper into a dropped arm); they are kept in
  ``last_error_bits`` for the health report.
* Bad values (wrong register, out of range, magnitude beyond a sign bit) raise ``ValueError``
  before anything is written.
"""

from __future__ import annotations

import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import serial

from drivers import protocol as P
from drivers.arm_interface import BusCounters, BusTimeoutError, PortGoneError
from drivers.protocol import MAX_ID, STATUS_OVERHEAD_BYTES, Packet, ParserStats, take_packets, wire_time_s
from drivers.sts3215_table import CONTROL_TABLE, SIGN_BIT, decode_sign_magnitude, encode_sign_magnitude

log = logging.getLogger("drivers.feetech_bus")

DEFAULT_BAUDRATE = 1_000_000
# Extra time a reply may take beyond its wire time: LeRobot's patched SDK timeout (50 ms + wire).
# Real USB adapters add their own latency (FTDI's default latency timer is 16 ms) and a loaded
# 2-core machine can deschedule the emulator for tens of ms; a healthy reply costs nothing extra,
# only a silent servo waits the full margin per try. Lower it (with latency_timer 1 ms via udev)
# for faster fault detection.
DEFAULT_REPLY_MARGIN_S = 0.05
DEFAULT_RETRIES = 2  # LeRobot 0.6.1's SOFollower num_read_retries
# After a corrupt packet, the bus counts as quiet (the rest of the replies are not coming) once no
# byte arrived this long: longer than a USB adapter's gap between transfers of one reply (1 ms
# frames plus CH343-like jitter). An FTDI adapter's latency timer adds to it (``latency_timer_s``).
DEFAULT_QUIET_S = 0.005
# Extra attempts for replies damaged on the wire (bad checksum or LEN, a lost or stray byte). Noise
# is not a silent servo: each such attempt ends as soon as the bus is quiet (about one reply's wire
# time, ~1 ms for six positions), and re-asks only the damaged replies. At 2 % damaged status
# packets a six-servo read sees ~11 % damaged attempts; with 2 retries alone one read in ~700
# would still fail (a cycle without a fresh pose, 1.5 per 10 s at 100 Hz); with 6 more re-asks
# of the damaged servo alone (2 % each) giving up on noise is ~1e-14 per read, and the worst case
# costs ~6 short attempts.
NOISE_RETRIES = 6
SEND_TIMEOUT_S = 0.5  # a request that cannot be written this long: the adapter is wedged or gone


# Unix98 pseudo-terminal slaves (/dev/pts/N) have device majors 136..143 (the kernel's
# Documentation/admin-guide/devices.txt); a USB serial adapter (ttyACM 166, ttyUSB 188) never does.
_PTY_SLAVE_MAJORS = range(136, 144)


def is_pseudo_terminal(port: str) -> bool:
    """The port is a pseudo-terminal (our bus emulator, `so101d emulate`), by its device number."""
    try:
        st = os.stat(port)  # follows the emulator's link to its /dev/pts/N
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in _PTY_SLAVE_MAJORS


def latency_timer_ms(port: str) -> int | None:
    """The ftdi_sio latency timer of the adapter behind ``port`` (sysfs), or None where there is
    none (cdc_acm adapters such as the CH343, a pty). FTDI's default is 16 ms: every short reply
    then waits up to 16 ms in the adapter, which no 100 Hz loop survives."""
    try:
        dev = os.path.basename(os.path.realpath(port))
        with open(f"/sys/bus/usb-serial/devices/{dev}/latency_timer") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


class ServoNoReplyError(BusTimeoutError):
    """No valid reply within the retries; ``missing_ids`` lists the servos that stayed silent."""

    def __init__(self, message: str, port: str, missing_ids: Sequence[int], corrupt: bool = False) -> None:
        super().__init__(message)
        self.port = port
        self.missing_ids: tuple[int, ...] = tuple(missing_ids)
        self.corrupt = corrupt


@dataclass(frozen=True)
class BusReplies:
    """What came back to one request: whole status packets in arrival order (id, error byte,
    data) and the bytes no whole packet accounts for (a collision, damage)."""

    packets: tuple[tuple[int, int, bytes], ...]
    noise_bytes: int

    @property
    def ids(self) -> list[int]:
        return [p[0] for p in self.packets]


class _Incomplete(Exception):
    """Internal: one attempt of a transaction did not get every reply."""

    def __init__(
        self, missing: list[int], corrupt: bool, quiet: bool = False, got: dict[int, tuple[int, bytes]] | None = None
    ) -> None:
        super().__init__(missing, corrupt)
        self.missing = missing
        self.corrupt = corrupt
        self.quiet = quiet  # ended because the bus went quiet: nothing of it is still on its way
        self.got = got or {}  # the replies that did arrive whole (fresh: kept by the next attempt)


def register_spec(name: str) -> tuple[int, int]:
    """(address, size) of a control-table register; a clear error for a name that is not in it."""
    try:
        return CONTROL_TABLE[name]
    except KeyError:
        raise ValueError(f"unknown STS3215 register {name!r}") from None


def encode_value(name: str, value: int) -> bytes:
    """Register value -> little-endian bytes, sign-magnitude where the register uses it."""
    _, size = register_spec(name)
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            as_int = int(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{name}: value {value!r} is not an integer") from None
        if as_int != value:
            raise ValueError(f"{name}: value {value!r} is not an integer")
        value = as_int
    if name in SIGN_BIT:
        raw = encode_sign_magnitude(value, SIGN_BIT[name])
    else:
        raw = value
    if not 0 <= raw < (1 << (8 * size)):
        raise ValueError(f"{name}: value {value} does not fit in {size} byte(s)")
    return raw.to_bytes(size, "little")


def decode_value(name: str, data: bytes | bytearray) -> int:
    raw = int.from_bytes(data, "little")
    if name in SIGN_BIT:
        return decode_sign_magnitude(raw, SIGN_BIT[name])
    return raw


class FeetechBus:
    """One Feetech protocol-0 serial bus. Thread-safe: one transaction at a time."""

    def __init__(
        self,
        port: str,
        baudrate: int = DEFAULT_BAUDRATE,
        *,
        retries: int = DEFAULT_RETRIES,
        reply_margin_s: float = DEFAULT_REPLY_MARGIN_S,
        exclusive: bool = True,
        quiet_s: float = DEFAULT_QUIET_S,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.quiet_s = quiet_s
        self.latency_timer_ms: int | None = None  # ftdi_sio's, read at open (None: not an FTDI)
        self.port = port
        self.baudrate = baudrate
        self.retries = retries
        self.reply_margin_s = reply_margin_s
        self.exclusive = exclusive
        self.counters = BusCounters()
        self.discarded_bytes = 0  # stray input thrown away before a request (echo, late replies)
        self.reply_stats = ParserStats()  # status packets taken, damaged ones, noise bytes skipped
        self.last_error_bits: dict[int, int] = {}  # servo id -> error byte of its latest status packet
        self._ser: serial.Serial | None = None
        self._fd = -1
        self._lock = threading.Lock()
        self._buf = bytearray()
        self._rx_bytes = 0  # bytes read from the port (replies, strays), for the settle accounting
        # After a timed-out attempt its replies may still be on their way; the next transaction
        # first waits (bounded) for that many bytes and throws them away, so a late reply to an
        # earlier request is never taken for the answer to a new one.
        self._settle_bytes = 0
        self._settle_deadline = 0.0

    # ------------------------------------------------------------------------------------------
    # port
    # ------------------------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self._ser is not None

    def open(self) -> None:
        """Open the port (8N1, non-blocking). A missing device raises PortGoneError."""
        with self._lock:
            if self._ser is not None:
                return
            try:
                ser = serial.Serial(self.port, self.baudrate, timeout=0, write_timeout=None, exclusive=self.exclusive)
            except (serial.SerialException, OSError, ValueError) as exc:
                raise PortGoneError(f"{self.port}: cannot open serial port: {exc}") from exc
            try:
                # USB-serial adapters: ask the kernel for low latency (no-op error on a pty).
                ser.set_low_latency_mode(True)
            except (OSError, ValueError, AttributeError, NotImplementedError, serial.SerialException):
                pass
            try:
                ser.reset_input_buffer()
            except (serial.SerialException, OSError, Exception):  # termios.error is not an OSError
                pass
            self._ser = ser
            self._fd = ser.fd
            self._buf.clear()
            self.latency_timer_ms = latency_timer_ms(self.port)
            if self.latency_timer_ms:
                # A reply can pause this long between USB transfers: not "quiet" before that.
                self.quiet_s = max(self.quiet_s, self.latency_timer_ms / 1000.0 + 0.002)

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        ser, self._ser, self._fd = self._ser, None, -1
        if ser is not None:
            try:
                ser.close()
            except Exception:  # closing a vanished device may fail; it is closed either way
                pass

    def __enter__(self) -> FeetechBus:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_some(self, fd: int, max_bytes: int, what: str) -> bytes | None:
        """Up to ``max_bytes`` from the port, counted; None when nothing is there yet (EAGAIN);
        a read error or end of file is the port gone."""
        try:
            chunk = os.read(fd, max_bytes)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise self._gone(what, exc) from exc
        if not chunk:
            raise self._gone(what, None)
        self._rx_bytes += len(chunk)
        return chunk

    def _gone(self, what: str, exc: BaseException | None) -> PortGoneError:
        self._close_locked()
        detail = f": {exc}" if exc is not None else ""
        return PortGoneError(f"{self.port}: serial port vanished during {what}{detail}")

    # ------------------------------------------------------------------------------------------
    # raw I/O
    # ------------------------------------------------------------------------------------------
    def _discard_input(self, what: str, wait_s: float) -> int | None:
        """Read what the port holds (or what arrives within ``wait_s``) and throw it away.

        Returns the byte count, 0 for a readiness that read nothing yet (EAGAIN), None when
        nothing came. A raw tty with VMIN=0 returns b"" both when empty and when hung up, so
        select is asked first: "readable but no data" is how Linux reports a vanished device
        (as pyserial does).
        """
        fd = self._fd
        try:
            ready, _, _ = select.select((fd,), (), (), wait_s)
            if not ready:
                return None
            junk = os.read(fd, 4096)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise self._gone(what, exc) from exc
        if not junk:
            raise self._gone(what, None)
        self.discarded_bytes += len(junk)
        self._rx_bytes += len(junk)
        return len(junk)

    def _drain_input(self, what: str) -> None:
        """Throw away stray bytes (a late reply, an echo) so they cannot corrupt the next reply."""
        while self._discard_input(what, 0):
            pass

    def _settle(self, what: str) -> None:
        """Swallow the replies still owed to an earlier timed-out attempt (bounded wait)."""
        while self._settle_bytes > 0:
            remaining = self._settle_deadline - time.monotonic()
            if remaining <= 0:
                break
            n = self._discard_input(what, remaining)
            if n is None:
                break
            self._settle_bytes -= n
        self._settle_bytes = 0

    def _send(self, packet: bytes, what: str) -> None:
        view = memoryview(packet)
        # A wedged adapter that never drains its output must not stall the control loop forever:
        # a request is a few dozen bytes, so 0.5 s without room to write means the port is gone.
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise self._gone(what, TimeoutError(f"output not drained within {SEND_TIMEOUT_S} s")) from None
                select.select([], [self._fd], [], 0.01)
                continue
            except OSError as exc:
                raise self._gone(what, exc) from exc
            view = view[n:]

    def _receive(
        self, expected_ids: Sequence[int], data_len: int, deadline: float, what: str
    ) -> dict[int, tuple[int, bytes]]:
        """Collect one status packet per expected id until all arrived, the bus went quiet, or the
        deadline passed.

        Replies are accepted in any order (the bus answers in request order; a missing servo must
        not make us drop the ones after it, unlike the SDK). Raises _Incomplete otherwise.

        "Quiet": once bytes of this attempt have started to arrive, the replies of one request
        come back to back (a servo answers within its Return_Delay_Time, <= 0.5 ms, of the one
        before it; a USB adapter delivers on 1 ms frames). So when ``quiet_s`` passes without a
        byte, whatever is still missing (a damaged or lost byte, a silent servo) is not coming,
        and waiting out the reply deadline (wire time + 50 ms) would only cost the loop its rate.
        Only an attempt that got no byte at all waits for the deadline: a slow adapter may still
        be delivering it.
        """
        buf = self._buf
        buf.clear()
        pending = set(expected_ids)
        got: dict[int, tuple[int, bytes]] = {}
        corrupt = False
        want = len(pending) * (STATUS_OVERHEAD_BYTES + data_len)
        received = 0
        last_rx = 0.0
        quiet = False
        fd = self._fd
        while pending:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                break
            if received >= want - 1:
                # Every byte owed is in (or all but one: a byte lost on the wire) and a reply is
                # still missing: retry at once. Were that one byte only late, it is the last of
                # the last reply, already off the wire (no collision with the retry), and alone
                # it can never complete a packet, so the parser skips it as a stray.
                quiet = True
                break
            if received:
                # The rest may still be on the wire (a new request now would collide with it on
                # the half-duplex bus): wait for quiet, not the deadline. select() with a zero
                # timeout still looks, so our own descheduling is never taken for quiet.
                remaining = max(0.0, min(remaining, last_rx + self.quiet_s - now))
            try:
                ready, _, _ = select.select((fd,), (), (), remaining)
            except OSError as exc:
                raise self._gone(what, exc) from exc
            if not ready:
                quiet = received > 0 and time.monotonic() < deadline
                break
            chunk = self._read_some(fd, max(want - len(buf), 64), what)
            if chunk is None:
                continue
            received += len(chunk)
            last_rx = time.monotonic()
            buf += chunk
            corrupt |= self._parse(buf, pending, got, data_len)
        if pending:
            # Bytes that no whole reply accounts for (a lost header byte, a torn last packet):
            # noise on the wire, not a servo that stayed silent.
            whole = len(got) * (STATUS_OVERHEAD_BYTES + data_len)
            corrupt |= received > whole
            raise _Incomplete(sorted(pending, key=list(expected_ids).index), corrupt, quiet, got)
        return got

    def _parse(self, buf: bytearray, pending: set[int], got: dict[int, tuple[int, bytes]], data_len: int) -> bool:
        """Consume complete status packets from ``buf``; returns True if a damaged one was seen.

        Every reply this transaction waits for has LEN ``data_len + 2`` and follows the one
        before it back to back: ``take_packets`` holds them to both (see its docstring)."""
        packets: list[Packet] = []
        damaged = take_packets(buf, packets, self.reply_stats, max_id=MAX_ID, expect_len=data_len + 2, framed=True)
        for pkt in packets:
            if pkt.servo_id in pending:
                got[pkt.servo_id] = (pkt.code, pkt.params)
                pending.discard(pkt.servo_id)
            else:
                self.discarded_bytes += pkt.wire_length  # a stray reply (another id, an echo)
        return damaged > 0

    def _transaction(
        self,
        packet: bytes | Callable[[Sequence[int]], bytes],
        expected_ids: Sequence[int],
        data_len: int,
        what: str,
        retries: int | None = None,
    ) -> dict[int, tuple[int, bytes]]:
        """Send a request and wait for a status packet from every id, with bounded retries.

        ``packet`` is the request, or (sync read) a function building it for a subset of ids: a
        retry then asks only the servos whose reply is still missing, keeping the whole replies
        the earlier attempt got (they answer this transaction's request: fresh).

        Two budgets, because two causes look alike on the wire (see ``NOISE_RETRIES``):
        ``retries`` for attempts that met silence (nothing at all, or a servo that stayed silent
        while the others answered cleanly), ``NOISE_RETRIES`` more for attempts that saw damaged
        bytes and ended as soon as the bus went quiet (each costs about one reply's wire time).
        """
        tries = 1 + (self.retries if retries is None else retries)
        build = packet if callable(packet) else (lambda _ids, _p=packet: _p)
        reply_size = STATUS_OVERHEAD_BYTES + data_len
        with self._lock:
            if self._ser is None:
                raise PortGoneError(f"{self.port}: port is not open ({what})")
            self.counters.transactions += 1
            if self._settle_bytes > 0:
                self._settle(what)
            last: _Incomplete | None = None
            in_flight = False  # an attempt timed out with bytes possibly still on their way
            rx_start = self._rx_bytes
            asked_bytes = 0  # reply bytes requested over all attempts
            window_s = 0.0
            got: dict[int, tuple[int, bytes]] = {}
            ask: list[int] = list(expected_ids)
            silent_left, noise_left = tries, NOISE_RETRIES
            attempt = 0
            budget_s = 0.0
            try:
                while True:
                    if attempt:
                        self.counters.retries += 1
                    attempt += 1
                    request = build(ask)
                    reply_bytes = len(ask) * reply_size
                    budget_s = wire_time_s(len(request) + reply_bytes, self.baudrate) + self.reply_margin_s
                    self._drain_input(what)
                    self._send(request, what)
                    if not expected_ids:
                        return {}
                    asked_bytes += reply_bytes
                    try:
                        got.update(self._receive(ask, data_len, time.monotonic() + budget_s, what))
                    except _Incomplete as inc:
                        last = inc
                        got.update(inc.got)
                        if not inc.quiet:
                            # only an attempt that met its deadline may still deliver late; the next
                            # transaction's settle wait stays within ``tries`` reply budgets, however
                            # many quick noise attempts there were
                            in_flight = True
                            window_s = max(window_s, tries * budget_s)
                        log.debug("%s: %s: no reply from %s (try %d)", self.port, what, inc.missing, attempt)
                        if inc.quiet and inc.corrupt and noise_left > 0:
                            noise_left -= 1
                            ask = list(inc.missing)  # only the damaged ones: fewer bytes to be hit again
                        else:
                            silent_left -= 1
                            if silent_left <= 0:
                                break
                            # A servo that stayed silent: ask everyone again, so the others' replies
                            # mark when the bus went quiet (asked alone, a silent servo costs the
                            # whole deadline) and a servo silenced by an earlier one gets its turn.
                            ask = [i for i in expected_ids] if inc.quiet and inc.got else list(inc.missing)
                        continue
                    for sid, (err, _) in got.items():
                        self.last_error_bits[sid] = err
                    if attempt > 1 and in_flight:
                        self._owe(asked_bytes, rx_start, window_s)
                    return {i: got[i] for i in expected_ids}
            except (ServoNoReplyError, PortGoneError):
                raise
            except BaseException:
                # Interrupted mid-transaction (Ctrl-C, a signal handler's exception): replies may
                # still be on their way. Owed, they are swallowed before the next request instead
                # of being taken as its answer (a stale Present_Position has the same length as
                # a Min_Position_Limit read).
                self._owe(asked_bytes, rx_start, max(window_s, budget_s))
                raise
            assert last is not None
            # servos that stayed silent through every attempt are not expected to answer late
            silent_bytes = len(last.missing) * reply_size * attempt
            if in_flight:
                self._owe(asked_bytes - silent_bytes, rx_start, window_s)
            self.counters.failures += 1
            if not os.path.exists(self.port):
                # the device node went away but the fd still "works" (e.g. a removed symlink)
                raise self._gone(what, None)
            kind = "corrupt or no reply" if last.corrupt else "no reply"
            raise ServoNoReplyError(
                f"{self.port}: {what}: {kind} from servo id(s) {', '.join(map(str, last.missing))} after {attempt} tries",
                self.port,
                last.missing,
                last.corrupt,
            )

    def _owe(self, asked_bytes: int, rx_start: int, window_s: float) -> None:
        """Remember how many reply bytes the attempts of this transaction may still deliver.

        The next transaction waits for them at most ``window_s`` (and not at all once they came).
        """
        owed = asked_bytes - (self._rx_bytes - rx_start)
        if owed > 0:
            self._settle_bytes = owed
            self._settle_deadline = time.monotonic() + window_s

    # ------------------------------------------------------------------------------------------
    # protocol operations
    # ------------------------------------------------------------------------------------------
    @staticmethod
    def _check_id(servo_id: int) -> int:
        if isinstance(servo_id, bool) or not isinstance(servo_id, int) or not 0 <= servo_id <= MAX_ID:
            raise ValueError(f"servo id {servo_id!r} outside 0..{MAX_ID}")
        return servo_id

    def ping(self, servo_id: int, *, retries: int | None = None) -> int:
        """PING, then READ of Model_Number (as the SDK does). Returns the model number (777 = STS3215)."""
        self._check_id(servo_id)
        self._transaction(P.ping(servo_id), (servo_id,), 0, f"PING id {servo_id}", retries)
        return self.read("Model_Number", servo_id, retries=retries)

    def read_bytes(self, address: int, length: int, servo_id: int, *, retries: int | None = None) -> bytes:
        self._check_id(servo_id)
        pkt = P.read(servo_id, address, length)
        got = self._transaction(pkt, (servo_id,), length, f"READ @{address}+{length} id {servo_id}", retries)
        return got[servo_id][1]

    def read(self, register_name: str, servo_id: int, *, retries: int | None = None) -> int:
        addr, size = register_spec(register_name)
        self._check_id(servo_id)
        pkt = P.read(servo_id, addr, size)
        got = self._transaction(pkt, (servo_id,), size, f"READ {register_name} id {servo_id}", retries)
        return decode_value(register_name, got[servo_id][1])

    def write(self, register_name: str, servo_id: int, value: int, *, retries: int | None = None) -> None:
        """WRITE with a status reply (so we know it arrived); used for configuration, not per cycle."""
        addr, _ = register_spec(register_name)
        self._check_id(servo_id)
        data = encode_value(register_name, value)
        pkt = P.write(servo_id, addr, data)
        self._transaction(pkt, (servo_id,), 0, f"WRITE {register_name}={value} id {servo_id}", retries)

    def sync_read_bytes(
        self, address: int, length: int, ids: Sequence[int], *, retries: int | None = None, what: str | None = None
    ) -> dict[int, bytes]:
        """SYNC_READ a block of ``length`` bytes from every id; all of them or ServoNoReplyError."""
        ids = [self._check_id(i) for i in ids]
        if not ids:
            return {}
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate servo ids in {ids}")

        def request(ask: Sequence[int]) -> bytes:
            return P.sync_read(address, length, ask)

        got = self._transaction(request, ids, length, what or f"SYNC_READ @{address}+{length}", retries)
        return {i: got[i][1] for i in ids}

    def sync_read(self, register_name: str, ids: Sequence[int], *, retries: int | None = None) -> dict[int, int]:
        addr, size = register_spec(register_name)
        raw = self.sync_read_bytes(addr, size, ids, retries=retries, what=f"SYNC_READ {register_name}")
        return {i: decode_value(register_name, data) for i, data in raw.items()}

    def sync_write(self, register_name: str, values: Mapping[int, int]) -> None:
        """SYNC_WRITE (broadcast, no reply): one packet for every servo."""
        if not values:
            return
        self._transaction(self.sync_write_packet(register_name, values), (), 0, f"SYNC_WRITE {register_name}")

    def sync_write_packet(self, register_name: str, values: Mapping[int, int]) -> bytes:
        """The SYNC_WRITE packet ``sync_write`` sends (the benchmark counts its bytes)."""
        addr, size = register_spec(register_name)
        return P.sync_write(
            addr, size, {self._check_id(sid): encode_value(register_name, v) for sid, v in values.items()}
        )

    def set_baudrate(self, baudrate: int) -> None:
        """Change the line speed of the open port (a servo hears only requests at its own rate).

        Input still queued at the old rate is thrown away: it would be noise at the new one.
        """
        with self._lock:
            if self._ser is None:
                raise PortGoneError(f"{self.port}: port is not open (set baud rate {baudrate})")
            try:
                self._ser.baudrate = baudrate
            except (serial.SerialException, OSError, ValueError) as exc:
                raise self._gone(f"set baud rate {baudrate}", exc) from exc
            self.baudrate = baudrate
            self._settle_bytes = 0
            self._drain_input(f"set baud rate {baudrate}")

    def collect_replies(self, request: bytes, first_byte_s: float, quiet_s: float) -> BusReplies:
        """Send ``request`` once and keep every status packet that comes back, however many.

        The transactions above expect one reply per asked id and throw extra ones away; setting
        up servos needs to see them: two servos answering one id (back to back, or colliding
        into bytes no packet accounts for) mean the chain is still connected. Waits up to
        ``first_byte_s`` for the first byte, then until no byte came for ``quiet_s``.
        """
        with self._lock:
            if self._ser is None:
                raise PortGoneError(f"{self.port}: port is not open (collect replies)")
            what = "collect replies"
            if self._settle_bytes > 0:
                self._settle(what)
            self._drain_input(what)
            self._send(request, what)
            buf = bytearray()
            deadline = time.monotonic() + wire_time_s(len(request), self.baudrate) + first_byte_s
            while True:
                wait_s = deadline - time.monotonic()
                if wait_s <= 0:
                    break
                try:
                    ready, _, _ = select.select((self._fd,), (), (), wait_s)
                except OSError as exc:
                    raise self._gone(what, exc) from exc
                if not ready:
                    break
                chunk = self._read_some(self._fd, 4096, what)
                if chunk is None:
                    continue
                buf += chunk
                deadline = time.monotonic() + quiet_s
            received = len(buf)
            packets: list[Packet] = []
            stats = ParserStats()
            take_packets(buf, packets, stats, max_id=MAX_ID)
            whole = sum(p.wire_length for p in packets)
            return BusReplies(tuple((p.servo_id, p.code, p.params) for p in packets), received - whole)

    def scan(self, ids: Iterable[int], *, retries: int = 0) -> dict[int, int]:
        """Ping each id once (no retries by default); id -> model number for those that answered."""
        found: dict[int, int] = {}
        for sid in ids:
            try:
                found[sid] = self.ping(sid, retries=retries)
            except BusTimeoutError:
                continue
        return found


__all__ = [
    "BusReplies",
    "FeetechBus",
    "ServoNoReplyError",
    "decode_value",
    "encode_value",
    "is_pseudo_terminal",
    "latency_timer_ms",
    "register_spec",
]
