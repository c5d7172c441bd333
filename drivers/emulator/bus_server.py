"""Serve one emulated arm on a pseudo-terminal, as its USB serial adapter would.

``BusEmulator(link_path, arm).start()`` opens a pty, makes both ends raw (no echo: the SDK never
flushes its input, so one echoed byte would corrupt the next reply), links the slave at
``link_path`` and answers protocol-0 packets from a thread that sleeps in ``poll`` while the bus
is idle. The slave fd stays open in here so the pty survives clients opening and closing it.

Wire time: a reply is written when it would have *finished* arriving on a real half-duplex bus:
request bytes + the servo's Return_Delay_Time (2 us units) + reply bytes, at 10 bits per byte,
queued behind anything still "on the wire". Waiting is a sleep up to ~200 us before the
deadline, then a spin, which keeps the error well under 0.1 ms on an idle machine.

Protocol rules (facts file section 2): replies only from the addressed online servo, never to a
broadcast except PING (every servo answers, back to back in id order) and SYNC_READ (each listed
servo in the request's order); Response_Status_Level 0 restricts replies to PING and READ;
a servo whose baud rate differs from the client's line setting hears only noise.

Baud rate on a pty: there is no wire, so the client's rate is the line speed it set on the pty,
which both ends share (pyserial's ``baudrate``, the SDK's ``setBaudRate``): read from the slave
with TCGETS2 before each batch of requests (custom rates such as 76800 or 128000 included). A
servo answers only when that rate is the one its Baud_Rate register names; a request at another
rate is not heard at all, as a real servo hears framing garbage (so a new kit at 500000 baud is
found only by scanning rates, and a servo's new Baud_Rate takes effect at its next request).

Scheduling: the serving thread asks for SCHED_RR (falling back to nice -5) and, in-process, the
GIL switch interval is lowered to 0.5 ms; even so, an emulator sharing a process (and its GIL)
with a busy-polling client on a loaded machine can be late by milliseconds. Timing-sensitive
clients (benchmarks, LeRobot's single-try handshake) should use ``EmulatorProcess``.

Faults: drop the next N replies, corrupt replies at a rate (the checksum, any byte, a dropped or
an inserted byte), add latency, take a servo off the bus (``arm.set_online``), force error bits
(``arm.set_error_bits``), unplug (link removed, pty closed: the client's next read/write fails
with EIO) and replug (fresh pty, same link path).

Realism (``drivers.emulator.realism.BusRealism``): USB-like delivery (chunks on 1 ms frames,
latency, jitter, an FTDI latency timer), collisions (a broadcast PING, or servos sharing the addressed id), a silent servo silencing the
later ones of a sync read.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import math
import os
import random
import select
import struct
import sys
import termios
import threading
import time
import tty
from dataclasses import asdict, dataclass
from pathlib import Path

from drivers import protocol as P
from drivers.emulator.arm import EmulatedArm
from drivers.emulator.realism import BusRealism
from drivers.emulator.servo import EmulatedServo
from drivers.sts3215_table import BAUD_RATE_BY_CODE, CONTROL_TABLE

log = logging.getLogger("so101d.emulator")

_ADDR_BAUD = CONTROL_TABLE["Baud_Rate"][0]
_ADDR_RETURN_DELAY = CONTROL_TABLE["Return_Delay_Time"][0]
_ADDR_STATUS_LEVEL = CONTROL_TABLE["Response_Status_Level"][0]
SPIN_S = 0.0002  # spin (instead of sleeping) for the last 200 us before a deadline
# A reply this late (a scheduler or GIL stall here) lands after the client's timeout (LeRobot's
# patched SDK and our driver wait ~50 ms) and would be read as the answer to its *next* request:
# a real servo never does that, so such a reply is dropped and counted instead. Lateness is
# measured from when the request was read, so the client has waited at least this long.
STALE_REPLY_S = 0.045
MAX_READ_LEN = P.MAX_PACKET_LEN - 6  # a status packet carries at most this many data bytes

# struct termios2 (asm-generic): 4 flags, c_line, 19 c_cc, c_ispeed, c_ospeed.
_TCGETS2 = 0x802C542A
_TERMIOS2_SIZE = 44
_TERMIOS2_OSPEED = 40
# termios speed constants -> baud rate, for the ones pyserial sets through plain termios.
_TERMIOS_BAUD = {
    getattr(termios, f"B{b}"): b
    for b in (9600, 19200, 38400, 57600, 115200, 230400, 460800, 500000, 576000, 921600, 1000000, 2000000)
    if hasattr(termios, f"B{b}")
}


@dataclass
class BusStats:
    requests: int = 0  # valid packets received
    replies: int = 0  # status packets sent
    dropped_replies: int = 0  # by fault injection
    corrupted_replies: int = 0
    bad_checksums: int = 0  # requests ignored for a bad checksum
    skipped_bytes: int = 0
    baud_mismatches: int = 0  # requests a servo could not hear (client line at another baud)
    overflows: int = 0  # reply bytes the pty would not take (client not reading)
    unplugs: int = 0
    handler_errors: int = 0  # packets whose handling raised (a bug: logged, packet skipped)
    ignored: int = 0  # well-framed packets a servo ignores (unknown instruction, bad parameters)
    collisions: int = 0  # requests whose answers collided on the wire (broadcast PING, a shared id)
    chained_silences: int = 0  # sync-read replies silenced by an earlier silent servo
    usb_transfers: int = 0  # USB transfers delivered (with a USB profile)
    late_replies: int = 0  # replies written more than 0.5 ms after their deadline
    stale_dropped: int = 0  # replies so late (STALE_REPLY_S) they were dropped
    max_lateness_s: float = 0.0


CORRUPT_MODES = ("checksum", "any", "len", "drop", "insert")


@dataclass
class Faults:
    drop_next: int = 0
    corrupt_rate: float = 0.0
    # checksum: the last byte; any: one random byte (LEN included); len: the LEN byte;
    # drop: one byte lost; insert: one stray byte added
    corrupt_mode: str = "checksum"
    corrupt_next: int = 0  # damage exactly the next N status packets (deterministic tests)
    latency_s: float = 0.0


class BusEmulator:
    """One arm on one pty, served by one thread. ``start()`` / ``stop()``; also a context manager."""

    def __init__(
        self,
        link_path: str | os.PathLike,
        arm: EmulatedArm,
        wire_time: bool = True,
        check_baud: bool = True,
        seed: int = 0,
        realtime: bool = True,
        gil_switch_interval_s: float | None = 0.0005,
        realism: BusRealism | None = None,
    ) -> None:
        self.link_path = Path(link_path)
        self.realism = realism or BusRealism()
        self._usb_last_flush = 0.0  # FTDI: when the adapter last sent a transfer to the host
        self.arm = arm
        self.wire_time = wire_time
        self.realtime = realtime
        self.gil_switch_interval_s = gil_switch_interval_s
        self.check_baud = check_baud
        self.faults = Faults()
        self.stats = BusStats()
        self._rng = random.Random(seed)
        self._master: int | None = None
        self._slave: int | None = None
        self._slave_name = ""
        self._wake_r: int | None = None
        self._wake_w: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lifecycle = threading.Lock()
        self._parser = P.PacketParser()
        self._bus_free_at = 0.0
        self._plugged = False

    # --- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> BusEmulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def plugged(self) -> bool:
        return self._plugged

    @property
    def slave_name(self) -> str:
        """The /dev/pts/N path the link points at (changes on replug)."""
        return self._slave_name

    def start(self) -> BusEmulator:
        with self._lifecycle:
            if self._plugged:
                return self
            self._open_pty()
            if self.gil_switch_interval_s and sys.getswitchinterval() > self.gil_switch_interval_s:
                # In-process use: a client busy-polling its port (the SDK does) holds the GIL;
                # the default 5 ms hand-over would delay replies by that much. Process-wide.
                sys.setswitchinterval(self.gil_switch_interval_s)
            self._stop.clear()
            self._thread = threading.Thread(target=self._serve, name=f"emulator:{self.link_path.name}", daemon=True)
            self._thread.start()
            self._plugged = True
            log.info("emulated %s arm on %s -> %s", self.arm.role, self.link_path, self._slave_name)
        return self

    def stop(self) -> None:
        """Stop serving, close the pty and remove the link (idempotent)."""
        with self._lifecycle:
            self._shutdown()

    def unplug(self) -> None:
        """Simulate pulling the USB cable: the link disappears and the client's port errors out."""
        with self._lifecycle:
            if self._plugged:
                self.stats.unplugs += 1
                self._shutdown()
                log.info("unplugged %s", self.link_path)

    def replug(self) -> None:
        """Plug back in: a fresh pty linked at the same path (clients must reopen the port)."""
        self.start()

    def _check_link_path(self) -> None:
        """Refuse to put a link over anything but an old link (a typo like --follower /dev/ttyACM0
        must never replace a real device node or a file)."""
        p = self.link_path
        if p.is_symlink():
            log.warning("replacing existing link %s -> %s", p, os.readlink(p))
            return
        if p.exists():
            raise FileExistsError(f"{p} exists and is not a symlink: refusing to replace it with an emulator link")

    def _open_pty(self) -> None:
        self._check_link_path()
        master, slave = os.openpty()
        try:
            tty.setraw(master)
            tty.setraw(slave)
            # Default line speed: what the servos speak, so a client that never sets it works.
            attrs = termios.tcgetattr(slave)
            speed = getattr(termios, "B1000000", attrs[4])
            attrs[4] = attrs[5] = speed
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            os.set_blocking(master, False)
            slave_name = os.ttyname(slave)
            self.link_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.link_path.with_name(f".{self.link_path.name}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            os.symlink(slave_name, tmp)
            os.replace(tmp, self.link_path)  # atomic: a client never sees a half-made link
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
        self._master, self._slave = master, slave
        self._slave_name = slave_name
        self._wake_r, self._wake_w = os.pipe()
        self._parser.reset()
        self._bus_free_at = 0.0

    def _shutdown(self) -> None:
        self._stop.set()
        if self._wake_w is not None:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        try:
            if self.link_path.is_symlink() and os.readlink(self.link_path) == self._slave_name:
                self.link_path.unlink()
        except OSError:
            pass
        for fd in (self._master, self._slave, self._wake_r, self._wake_w):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._master = self._slave = self._wake_r = self._wake_w = None
        self._plugged = False

    # --- fault injection --------------------------------------------------------------------
    def drop_replies(self, n: int) -> None:
        """Swallow the next ``n`` status packets (each servo's reply in a sync read counts)."""
        if n < 0:
            raise ValueError("drop count must be >= 0")
        with self.arm.lock:
            self.faults.drop_next = int(n)

    def corrupt_checksums(self, rate: float) -> None:
        """Send a wrong checksum on this fraction (0..1) of status packets."""
        self.corrupt(rate, "checksum")

    def corrupt(self, rate: float, mode: str = "checksum", next_n: int = 0) -> None:
        """Damage this fraction (0..1) of status packets, and the next ``next_n`` for certain:
        ``mode`` one of CORRUPT_MODES."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError("corruption rate must be within 0..1")
        if mode not in CORRUPT_MODES:
            raise ValueError(f"corruption mode {mode!r}; known: {', '.join(CORRUPT_MODES)}")
        if next_n < 0:
            raise ValueError("next_n must be >= 0")
        with self.arm.lock:
            self.faults.corrupt_rate = float(rate)
            self.faults.corrupt_mode = mode
            self.faults.corrupt_next = int(next_n)

    def set_realism(self, realism: BusRealism) -> None:
        """USB delivery, ping collisions, silence chains (``drivers.emulator.realism``)."""
        with self.arm.lock:
            self.realism = realism

    def set_latency(self, seconds: float) -> None:
        """Extra delay before every reply (a slow USB bridge, LR#1166)."""
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        with self.arm.lock:
            self.faults.latency_s = float(seconds)

    def clear_faults(self) -> None:
        with self.arm.lock:
            self.faults = Faults()

    def reference_calibration(self):
        """The served arm's reference calibration (``EmulatedArm.reference_calibration``)."""
        return self.arm.reference

    def stats_dict(self) -> dict:
        return asdict(self.stats)

    # --- serving ----------------------------------------------------------------------------
    def _client_baud(self) -> int | None:
        """The client's line speed in baud (0 if unknown; None if the line cannot be read).

        TCGETS2 gives the numeric rate, custom ones included (pyserial sets 128000 or 250000
        through BOTHER); plain termios constants are the fallback.
        """
        if self._slave is None:
            return None
        buf = bytearray(_TERMIOS2_SIZE)
        try:
            fcntl.ioctl(self._slave, _TCGETS2, buf)
            return struct.unpack_from("<I", buf, _TERMIOS2_OSPEED)[0]
        except OSError:
            pass
        try:
            speed = termios.tcgetattr(self._slave)[5]
        except termios.error:
            return None
        return _TERMIOS_BAUD.get(speed, 0)

    def _boost(self) -> None:
        """Ask for a real-time slot (SCHED_RR 1) so replies leave on time on a busy machine.

        Safe: the thread sleeps in poll() between requests and spins at most ~200 us per reply;
        the kernel's RT throttling still leaves CPU to everyone else. Falls back to nice -5,
        then to nothing, where the process may not raise its priority.
        """
        try:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
            return
        except (OSError, AttributeError):
            pass
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -5)
        except OSError:
            pass

    def _serve(self) -> None:
        if self.realtime:
            self._boost()
        master, wake = self._master, self._wake_r
        assert master is not None and wake is not None
        poller = select.poll()
        poller.register(master, select.POLLIN)
        poller.register(wake, select.POLLIN)
        while not self._stop.is_set():
            try:
                events = poller.poll()
            except InterruptedError:
                continue
            if self._stop.is_set():
                return
            for fd, _ev in events:
                if fd != master:
                    continue
                try:
                    data = os.read(master, 4096)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    if exc.errno == errno.EIO:
                        # No slave open at all (cannot happen while we hold it): avoid a spin.
                        time.sleep(0.01)
                        continue
                    raise
                if data:
                    self._on_bytes(data, time.perf_counter())

    def _on_bytes(self, data: bytes, t_rx: float) -> None:
        packets = self._parser.feed(data, t_rx)
        st = self.stats
        ps = self._parser.stats
        st.bad_checksums = ps.bad_checksums
        st.skipped_bytes = ps.skipped_bytes
        if not packets:
            return
        client_baud = self._client_baud() if self.check_baud else None
        for pkt in packets:
            st.requests += 1
            try:
                with self.arm.lock:
                    replies, reply_baud, delays = self._handle(pkt, client_baud)
                    latency = self.faults.latency_s
                    out = self._apply_reply_faults(replies)
            except Exception:  # a bug must cost one packet, never the serving thread
                st.handler_errors += 1
                log.exception("emulator failed on packet %r", pkt)
                continue
            self._schedule(pkt, out, replies, reply_baud, delays, latency, client_baud, t_rx)

    def _apply_reply_faults(self, replies: list[bytes]) -> list[bytes | None]:
        f = self.faults
        out: list[bytes | None] = []
        for r in replies:
            if f.drop_next > 0:
                f.drop_next -= 1
                self.stats.dropped_replies += 1
                out.append(None)
                continue
            if f.corrupt_next > 0 or (f.corrupt_rate > 0.0 and self._rng.random() < f.corrupt_rate):
                f.corrupt_next = max(0, f.corrupt_next - 1)
                r = self._damage(r, f.corrupt_mode)
                self.stats.corrupted_replies += 1
            out.append(r)
        return out

    def _damage(self, r: bytes, mode: str) -> bytes:
        rng = self._rng
        if mode == "checksum":
            return r[:-1] + bytes((r[-1] ^ 0x5A,))
        if mode == "len":
            # A LEN that promises more than was sent: a parser that trusts it waits for bytes
            # that are really the next servo's reply.
            return r[:3] + bytes((min(0xF0, r[3] + 1 + rng.randrange(40)),)) + r[4:]
        if mode == "any":
            k = rng.randrange(len(r))
            return r[:k] + bytes((r[k] ^ (1 << rng.randrange(8)),)) + r[k + 1 :]
        if mode == "drop":
            k = rng.randrange(len(r))
            return r[:k] + r[k + 1 :]
        if mode == "insert":
            k = rng.randrange(len(r) + 1)
            return r[:k] + bytes((rng.randrange(256),)) + r[k:]
        raise ValueError(mode)

    def _schedule(
        self,
        pkt: P.Packet,
        out: list[bytes | None],
        replies: list[bytes],
        reply_baud: int,
        delays: list[float],
        latency: float,
        client_baud: int | None,
        t_rx: float,
    ) -> None:
        if not self.wire_time:
            payload = b"".join(r for r in out if r is not None)
            if payload:
                self.stats.replies += sum(1 for r in out if r is not None)
                if latency:
                    time.sleep(latency)
                self._write(payload)
            return
        req_baud = client_baud or reply_baud
        # The request occupies the wire first (it may queue behind earlier traffic).
        t = max(t_rx, self._bus_free_at) + P.wire_time_s(pkt.wire_length, req_baud)
        segments: list[tuple[float, bytes]] = []  # (time its last byte leaves the wire, bytes)
        for r, o, delay in zip(replies, out, delays):
            t += delay + P.wire_time_s(len(r), reply_baud)
            if o is not None:
                segments.append((t, o))
        # A dropped reply never reached the wire: only delivered bytes take time.
        dropped_bytes = sum(len(r) for r, o in zip(replies, out) if o is None)
        t -= P.wire_time_s(dropped_bytes, reply_baud)
        self._bus_free_at = t
        payload = b"".join(r for r in out if r is not None)
        if not payload:
            return
        self.stats.replies += sum(1 for r in out if r is not None)
        usb = self.realism.usb
        if usb is not None:
            self._deliver_usb(segments, reply_baud, latency, t_rx, usb)
            return
        deadline = t + latency
        self._wait_until(deadline)
        late = time.perf_counter() - deadline
        if late > 0.0005:
            self.stats.late_replies += 1
        if late > self.stats.max_lateness_s:
            self.stats.max_lateness_s = late
        if late > STALE_REPLY_S:
            self.stats.stale_dropped += 1
            return
        self._write(payload)

    def _deliver_usb(self, segments: list[tuple[float, bytes]], baud: int, latency: float, t_rx: float, usb) -> None:
        """Hand the reply bytes over as a USB adapter would: transfers of at most
        ``usb.chunk_bytes``, each leaving on a 1 ms frame once its bytes are in (FTDI: a short
        one only when the latency timer ran out), plus the adapter's latency and jitter."""
        byte_s = P.wire_time_s(1, baud)
        timed: list[tuple[float, int]] = []  # (arrival of each byte at the adapter, byte)
        for end, data in segments:
            n = len(data)
            timed += [(end - (n - 1 - k) * byte_s + latency, b) for k, b in enumerate(data)]
        frame = usb.frame_s
        transfers: list[tuple[float, bytes]] = []
        i = 0
        while i < len(timed):
            chunk = timed[i : i + usb.chunk_bytes]
            if usb.latency_timer_s:
                # FTDI: a full buffer goes out at once; a partial one when the latency timer runs
                # out. The timer restarts at every transfer (an empty status-only one when there
                # is nothing to send), so it expires every latency_timer_s after the last one.
                ready = chunk[-1][0]
                if len(chunk) < usb.chunk_bytes:
                    timer = usb.latency_timer_s
                    ready = self._usb_last_flush + max(1, math.ceil((ready - self._usb_last_flush) / timer)) * timer
            else:
                # cdc_acm (CH343): what came in before the end of the current frame leaves then.
                ready = math.ceil(chunk[0][0] / frame) * frame if frame else chunk[-1][0]
                chunk = [c for c in chunk if c[0] <= ready] or chunk[:1]
                ready = max(ready, chunk[-1][0])
            when = (
                (math.ceil(ready / frame) * frame if frame else ready)
                + self._rng.uniform(0.0, usb.jitter_s)
                + usb.latency_s
            )
            if transfers and when < transfers[-1][0]:
                when = transfers[-1][0]  # transfers arrive in order
            self._usb_last_flush = when
            transfers.append((when, bytes(b for _, b in chunk)))
            i += len(chunk)
        for n, (when, data) in enumerate(transfers):
            self._wait_until(when)
            late = time.perf_counter() - when
            if n == 0:
                if late > self.stats.max_lateness_s:
                    self.stats.max_lateness_s = late
                if late > 0.0005:
                    self.stats.late_replies += 1
                if (
                    time.perf_counter() - t_rx
                    > STALE_REPLY_S + usb.latency_timer_s + usb.latency_s + usb.jitter_s + 0.005
                ):
                    self.stats.stale_dropped += 1
                    return
            self.stats.usb_transfers += 1
            self._write(data)

    @staticmethod
    def _wait_until(deadline: float) -> None:
        remaining = deadline - time.perf_counter()
        if remaining > SPIN_S:
            time.sleep(remaining - SPIN_S)
        while time.perf_counter() < deadline:
            pass

    def _write(self, payload: bytes) -> None:
        master = self._master
        if master is None:
            return
        try:
            n = os.write(master, payload)
            if n < len(payload):
                self.stats.overflows += len(payload) - n
        except BlockingIOError:
            self.stats.overflows += len(payload)
        except OSError as exc:
            log.debug("write to pty failed: %s", exc)

    # --- protocol ---------------------------------------------------------------------------
    @staticmethod
    def _hears(servo: EmulatedServo, client_baud: int) -> bool:
        return BAUD_RATE_BY_CODE.get(servo.mem[_ADDR_BAUD]) == client_baud

    def _handle(self, pkt: P.Packet, client_baud: int | None) -> tuple[list[bytes], int, list[float]]:
        """Apply one instruction; return (status packets in wire order, their baud, return delays)."""
        arm = self.arm
        now = arm.clock()
        replies: list[bytes] = []
        delays: list[float] = []
        reply_baud = client_baud or BAUD_RATE_BY_CODE.get(arm.servos[0].mem[_ADDR_BAUD], 1_000_000)
        instr = pkt.code
        params = pkt.params

        def listening(servos: list[EmulatedServo]) -> list[EmulatedServo]:
            if client_baud is None:
                return servos
            ok = [s for s in servos if self._hears(s, client_baud)]
            if len(ok) != len(servos):
                self.stats.baud_mismatches += 1
            return ok

        def reply(servo: EmulatedServo, reply_id: int, data: bytes = b"") -> None:
            servo.update(now)  # the error byte reflects protections that tripped since last look
            replies.append(P.encode_status(reply_id, servo.error_bits(), data))
            delays.append(servo.mem[_ADDR_RETURN_DELAY] * 2e-6)

        def wants_reply(servo: EmulatedServo) -> bool:
            return servo.mem[_ADDR_STATUS_LEVEL] != 0

        if pkt.servo_id == P.BROADCAST_ID:
            if instr == P.INST_PING:
                for s in listening(sorted((s for s in arm.servos if s.on_bus), key=lambda s: s.servo_id)):
                    s.update(now)
                    reply(s, s.servo_id)
                if self.realism.ping_collisions:
                    self._collide(replies, delays)
            elif instr == P.INST_SYNC_READ and len(params) >= 2 and params[1] <= MAX_READ_LEN:
                addr, n = params[0], params[1]
                for k, sid in enumerate(params[2:]):
                    answering = listening(arm.servos_by_id(sid))
                    if not answering and self.realism.silence_chains:
                        # The servos after a silent one wait for its reply that never comes.
                        self.stats.chained_silences += len(params) - 3 - k
                        break
                    for s in answering:
                        reply(s, sid, s.read(addr, n, now))
            elif instr == P.INST_SYNC_WRITE and len(params) >= 2:
                addr, n = params[0], params[1]
                body = params[2:]
                step = n + 1
                if n and len(body) % step == 0:
                    for k in range(0, len(body), step):
                        sid = body[k]
                        for s in listening(arm.servos_by_id(sid)):
                            s.write(addr, body[k + 1 : k + step], now)
            elif instr == P.INST_WRITE and len(params) >= 1:
                for s in listening([s for s in arm.servos if s.on_bus]):
                    s.write(params[0], params[1:], now)
            elif instr == P.INST_REG_WRITE and len(params) >= 1:
                for s in listening([s for s in arm.servos if s.on_bus]):
                    s.pending_reg_write = (params[0], bytes(params[1:]))
            elif instr == P.INST_ACTION:
                for s in listening([s for s in arm.servos if s.on_bus]):
                    self._action(s, now)
            # Broadcast READ and anything else: no reply, nothing to do.
            return replies, reply_baud, delays

        for s in listening(arm.servos_by_id(pkt.servo_id)):
            sid = pkt.servo_id
            if instr == P.INST_PING:
                reply(s, sid)
            elif instr == P.INST_READ:
                if len(params) == 2 and params[1] <= MAX_READ_LEN:
                    reply(s, sid, s.read(params[0], params[1], now))
                else:
                    self.stats.ignored += 1
            elif instr == P.INST_WRITE:
                if len(params) >= 1:
                    # Decided before the write: an ID or status-level change answers as before.
                    answer = wants_reply(s)
                    s.write(params[0], params[1:], now)
                    if answer:
                        reply(s, sid)
            elif instr == P.INST_REG_WRITE:
                if len(params) >= 1:
                    s.pending_reg_write = (params[0], bytes(params[1:]))
                    if wants_reply(s):
                        reply(s, sid)
            elif instr == P.INST_ACTION:
                self._action(s, now)
                if wants_reply(s):
                    reply(s, sid)
            # Unknown instructions are ignored, like malformed ones.
        if self.realism.ping_collisions:
            # Servos sharing the addressed id all heard the request and answer it together.
            self._collide(replies, delays)
        return replies, reply_baud, delays

    def _collide(self, replies: list[bytes], delays: list[float]) -> None:
        """Several servos answering one request: each starts after its own return delay, so on
        the shared line the bits fight (a 0 wins on the open-collector-like bus) and the host
        reads one packet, the AND of them: clean where they agree byte for byte, failing its
        checksum where they differ."""
        if len(replies) < 2:
            return
        self.stats.collisions += 1
        width = max(len(r) for r in replies)
        blob = bytearray(b"\xff" * width)
        for r in replies:
            for k, b in enumerate(r):
                blob[k] &= b
        replies[:] = [bytes(blob)]
        delays[:] = [min(delays)]

    @staticmethod
    def _action(servo: EmulatedServo, now: float) -> None:
        if servo.pending_reg_write is not None:
            addr, data = servo.pending_reg_write
            servo.pending_reg_write = None
            servo.write(addr, data, now)
