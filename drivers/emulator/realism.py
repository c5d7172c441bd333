"""Realism options of the STS3215 emulator: where a real servo or USB adapter is stricter than
what LeRobot needs to work.

The defaults are the emulator's historical, LeRobot-compatible behaviour (LeRobot works on real
arms, so it must work here). Each option makes one documented behaviour of real hardware
visible, so our driver cannot come to depend on the emulator's kindness:

Servo (``ServoRealism``, per servo):
- ``lock_applies_unsaved``: with Lock = 1 an EEPROM write takes effect but is not saved; only a
  write made with Lock = 0 survives a power cycle (Feetech's Lock register; the default
  emulator ignores locked EEPROM writes instead).
- ``torque_limit_seeded_at_power_on``: the torque cap is Torque_Limit (48) alone; Max_Torque_Limit
  (16) only seeds 48 at power-on (the default caps at min(48, 16) at once). A gripper configured
  through 16 alone keeps 100 % torque until the next power cycle (LR#3942).
- ``overload_latch_until_power_cycle``: an overload / over-current trip keeps its error bit and
  refuses torque through Torque_Enable writes until a power cycle (the default clears the latch
  on any Torque_Enable write); with ``overload_goes_silent`` the tripped servo also stops
  answering until then (reports from LeRobot- and Physical-AI-Studio-based projects).
- ``max_acceleration_read_only``: register 85 (Maximum_Acceleration, factory area in third-party
  tables) ignores writes; ``return_delay_min``: Return_Delay_Time values below it become it
  (third-party STS tables: under 50 reads 50).

Bus (``BusRealism``, per adapter):
- ``usb``: replies reach the host in USB transfers (``UsbProfile``): chunks of at most
  ``chunk_bytes`` on 1 ms frames, plus adapter latency and jitter; an FTDI adapter holds a short
  transfer until its latency timer (16 ms by default) runs out.
- ``ping_collisions``: a request answered by several servos (a broadcast PING, or any request to
  an id several servos share) garbles on the half-duplex line (all of them start talking at
  once); the host reads one blob, the AND of the replies: clean where they agree, a failing
  checksum where they differ.
- ``silence_chains``: in a SYNC_READ a servo that does not answer silences the ones listed after it
  (each waits for its predecessor's reply on the wire).
- corruption modes (``BusEmulator.corrupt``): a wrong checksum, any byte flipped (LEN included),
  a dropped byte or an inserted byte.

Presets combine them (``--realism strict,ch343``; ``realism`` control command).

What each option mirrors: the register semantics follow the STS3215 control table as LeRobot 0.6.1
lays it out (lerobot/motors/feetech/tables.py) and what real units were reported doing (Lock
semantics, register 85 reading 306 on a real unit in LR#673, Torque_Limit seeded from
Max_Torque_Limit, the overload latch: docs/design/emulator-realism.md); the framing the host sees follows the Feetech SDK
(scservo_sdk/protocol_packet_handler.py: rxPacket hunts for FF FF and checks LEN and checksum);
USB delivery follows the Linux drivers' documented behaviour (ftdi_sio's ``latency_timer`` sysfs
attribute, default 16 ms; cdc_acm bulk transfers of 64 bytes at full speed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

RETURN_DELAY_MIN_STRICT = 50  # 2 us units: third-party STS tables clamp values below 50 to 50


@dataclass(frozen=True)
class ServoRealism:
    lock_applies_unsaved: bool = False
    torque_limit_seeded_at_power_on: bool = False
    overload_latch_until_power_cycle: bool = False
    overload_goes_silent: bool = False
    max_acceleration_read_only: bool = False
    return_delay_min: int = 0


@dataclass(frozen=True)
class UsbProfile:
    """How a USB-serial adapter hands received bytes to the host."""

    name: str
    chunk_bytes: int  # payload bytes per USB transfer (FTDI: 64-byte packets minus 2 status bytes)
    frame_s: float = 0.001  # full-speed USB: the host polls once per 1 ms frame
    latency_s: float = 0.0  # fixed extra delay before a transfer reaches the reader (driver, URB)
    jitter_s: float = 0.0  # uniform extra delay 0..jitter_s per transfer
    latency_timer_s: float = 0.0  # FTDI: a transfer short of a full chunk waits for this timer

    def __post_init__(self) -> None:
        if (
            self.chunk_bytes < 1
            or self.frame_s < 0
            or self.latency_s < 0
            or self.jitter_s < 0
            or self.latency_timer_s < 0
        ):
            raise ValueError(f"invalid USB profile {self}")


# CH343 (WCH, cdc_acm driver): 64-byte bulk packets, 1..4 ms from the line to read().
USB_CH343 = UsbProfile("ch343", chunk_bytes=64, latency_s=0.001, jitter_s=0.003)
# FTDI FT232 with ftdi_sio's default latency timer (16 ms): a short reply waits out the timer.
USB_FTDI = UsbProfile("ftdi", chunk_bytes=62, latency_s=0.0, jitter_s=0.0005, latency_timer_s=0.016)
# FTDI after our udev rule set latency_timer to 1 ms.
USB_FTDI_1MS = UsbProfile("ftdi-1ms", chunk_bytes=62, latency_s=0.0, jitter_s=0.0005, latency_timer_s=0.001)
USB_PROFILES = {p.name: p for p in (USB_CH343, USB_FTDI, USB_FTDI_1MS)}


@dataclass(frozen=True)
class BusRealism:
    usb: UsbProfile | None = None
    ping_collisions: bool = False
    silence_chains: bool = False


@dataclass(frozen=True)
class Realism:
    servo: ServoRealism = field(default_factory=ServoRealism)
    bus: BusRealism = field(default_factory=BusRealism)

    def to_json(self) -> dict:
        return asdict(self)


STRICT_SERVO = ServoRealism(
    lock_applies_unsaved=True,
    torque_limit_seeded_at_power_on=True,
    overload_latch_until_power_cycle=True,
    overload_goes_silent=False,
    max_acceleration_read_only=True,
    return_delay_min=RETURN_DELAY_MIN_STRICT,
)

# preset name -> a function of the realism so far (presets compose left to right)
PRESETS: dict[str, str] = {
    "lerobot": "the default: LeRobot-compatible, nothing stricter",
    "strict": "servo registers as on real units: Lock=1 writes not saved, 85 read-only, Return_Delay_Time >= 50, "
    "torque cap from Torque_Limit only, overload latched until power cycle",
    "silent-overload": "strict, and a servo in overload stops answering until power cycle",
    "ch343": "USB delivery of a CH343 adapter (64-byte chunks, 1 ms frames, 1-4 ms latency)",
    "ftdi": "USB delivery of an FTDI adapter with its default 16 ms latency timer",
    "ftdi-1ms": "USB delivery of an FTDI adapter with latency_timer set to 1 ms",
    "collisions": "answers to one request (broadcast PING, a shared id) collide; a silent servo silences the later ones in a sync read",
    "real": "strict + ch343 + collisions",
}


def _apply(r: Realism, name: str) -> Realism:
    if name == "lerobot":
        return Realism()
    if name == "strict":
        return replace(r, servo=STRICT_SERVO)
    if name == "silent-overload":
        return replace(r, servo=replace(STRICT_SERVO, overload_goes_silent=True))
    if name in USB_PROFILES:
        return replace(r, bus=replace(r.bus, usb=USB_PROFILES[name]))
    if name == "collisions":
        return replace(r, bus=replace(r.bus, ping_collisions=True, silence_chains=True))
    if name == "real":
        return _apply(_apply(_apply(r, "strict"), "ch343"), "collisions")
    raise ValueError(f"unknown realism preset {name!r}; known: {', '.join(PRESETS)}")


def realism_from_spec(spec: str | None) -> Realism:
    """``"strict,ch343"`` -> Realism (presets applied left to right; empty or None: the default)."""
    r = Realism()
    for part in (spec or "").split(","):
        part = part.strip()
        if part:
            r = _apply(r, part)
    return r


def servo_realism_from_json(d: dict) -> ServoRealism:
    """Field-wise overrides from a control request (unknown keys refused)."""
    known = {f.name for f in fields(ServoRealism)}
    bad = set(d) - known
    if bad:
        raise ValueError(f"unknown servo realism option(s) {sorted(bad)}; known: {sorted(known)}")
    # each field as its own type: the delay is a count, every other option a switch
    overrides: dict[str, Any] = {k: (int(v) if k == "return_delay_min" else bool(v)) for k, v in d.items()}
    return ServoRealism(**overrides)
