"""Render systemd/99-so101.rules: one stable-name rule per arm, from the adapter's identity.

Values go between double quotes in the rule, so anything outside a conservative character set
(quotes, commas, newlines — a hostile or garbled USB descriptor) is refused rather than escaped:
a mis-quoted rule could match every tty on the machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from daemon.system.serial_ports import PortInfo

TEMPLATE = Path(__file__).resolve().parents[2] / "systemd" / "99-so101.rules"
ARMS = ("leader", "follower")
_SAFE = re.compile(r"^[A-Za-z0-9._:+-]{1,64}$")
_HEX4 = re.compile(r"^[0-9a-f]{4}$")
_USB_PATH = re.compile(r"^\d+-\d+(\.\d+)*$")


class RuleError(ValueError):
    pass


@dataclass(frozen=True)
class ArmMatch:
    """How udev recognises one arm's adapter: serial number, or physical USB port path."""

    arm: str  # "leader" | "follower"
    serial: str | None = None
    usb_path: str | None = None
    vid: str | None = None
    pid: str | None = None
    note: str = ""  # comment line (adapter description)

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            raise RuleError(f"arm must be one of {ARMS}, got {self.arm!r}")
        if not self.serial and not self.usb_path:
            raise RuleError(f"{self.arm}: need a USB serial number or a USB port path to tell the arms apart")
        if self.serial is not None and not _SAFE.match(self.serial):
            raise RuleError(f"{self.arm}: serial {self.serial!r} has characters a udev rule cannot hold safely")
        if self.usb_path is not None and not _USB_PATH.match(self.usb_path):
            raise RuleError(f"{self.arm}: USB port path {self.usb_path!r} is not like '1-2' or '3-1.4'")
        for label, value in (("vendor id", self.vid), ("product id", self.pid)):
            if value is not None and not _HEX4.match(value):
                raise RuleError(f"{self.arm}: {label} {value!r} is not 4 lower-case hex digits")

    @classmethod
    def from_port(cls, arm: str, port: PortInfo, use_serial: bool = True) -> ArmMatch:
        note = port.describe()
        if use_serial and port.serial and _SAFE.match(port.serial):
            return cls(arm, serial=port.serial, vid=port.vid, pid=port.pid, note=note)
        if port.usb_path:
            return cls(
                arm,
                usb_path=port.usb_path,
                vid=port.vid,
                pid=port.pid,
                note=note + " (matched by USB port: keep the cable in this socket)",
            )
        raise RuleError(
            f"{arm}: {port.device} has neither a usable serial number nor a USB port path (is it a USB adapter?)"
        )

    def rule(self) -> str:
        keys = ['SUBSYSTEM=="tty"']
        if self.usb_path:
            keys.append(f'KERNELS=="{self.usb_path}"')
        if self.vid:
            keys.append(f'ATTRS{{idVendor}}=="{self.vid}"')
        if self.pid:
            keys.append(f'ATTRS{{idProduct}}=="{self.pid}"')
        if self.serial:
            keys.append(f'ATTRS{{serial}}=="{self.serial}"')
        keys += [f'SYMLINK+="so101-{self.arm}"', 'GROUP="dialout"', 'MODE="0660"', 'TAG+="systemd"']
        comment = f"# {self.arm}: {' '.join(self.note.split())}" if self.note else f"# {self.arm}"
        return comment + "\n" + ", ".join(keys)


def render_rules(matches: list[ArmMatch], template: Path = TEMPLATE) -> str:
    """The rules file text. With no matches, example rules are left commented out."""
    arms = [m.arm for m in matches]
    if len(set(arms)) != len(arms):
        raise RuleError(f"one rule per arm, got {arms}")
    if len(matches) == 2:
        a, b = matches
        if (
            a.serial and a.serial == b.serial and a.vid == b.vid and a.pid == b.pid and not (a.usb_path or b.usb_path)
        ) or (a.usb_path and a.usb_path == b.usb_path):
            raise RuleError("the leader and follower rules would match the same adapter")
    if matches:
        body = "\n\n".join(m.rule() for m in matches)
    else:
        example = [
            ArmMatch(
                "leader", serial="LEADERSERIAL", vid="1a86", pid="55d3", note="example: run `so101d find-ports --write`"
            ),
            ArmMatch("follower", serial="FOLLOWERSERIAL", vid="1a86", pid="55d3", note="example"),
        ]
        body = "\n".join(
            "#" + line if not line.startswith("#") else line for m in example for line in m.rule().split("\n")
        )
    text = template.read_text()
    if "@ARM_RULES@" not in text:
        raise RuleError(f"{template}: template has no @ARM_RULES@ placeholder")
    return text.replace("@ARM_RULES@", body)
