"""USB serial ports as sysfs describes them, and which one disappeared between two scans.

ttyACM numbers follow plug order and swap across reboots, so an arm is identified by its USB
adapter: the serial number when the adapter has one (CH343 and FTDI chips do; many CH340 do
not), else the physical USB port path (``1-2.3``: stable while the cable stays in that socket).

Reads sysfs directly (no udev, no pyserial) so the tests can hand it a fake sysfs tree with the
kernel's exact layout:

    /sys/class/tty/ttyACM0 -> ../../devices/.../usb1/1-2/1-2:1.0/tty/ttyACM0
    /sys/class/tty/ttyACM0/device -> ../../../1-2:1.0          (USB interface; cdc_acm)
    /sys/class/tty/ttyUSB0/device -> ../../../ttyUSB0           (usb-serial device; ftdi_sio,
                                                                 has latency_timer)
    .../usb1/1-2/{idVendor,idProduct,serial,manufacturer,product}  (the USB device)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_TTY_NAME = re.compile(r"^tty(ACM|USB)\d+$")


@dataclass(frozen=True)
class PortInfo:
    device: str  # /dev/ttyACM0
    vid: str | None = None  # "1a86" (lower-case hex, as sysfs writes it)
    pid: str | None = None
    serial: str | None = None
    manufacturer: str | None = None
    product: str | None = None
    usb_path: str | None = None  # kernel name of the USB device: "1-2", "3-1.4"
    driver: str | None = None  # cdc_acm, ch341, ftdi_sio, cp210x...
    latency_timer_ms: int | None = None  # FTDI only

    @property
    def name(self) -> str:
        return os.path.basename(self.device)

    def describe(self) -> str:
        ident = f"{self.vid}:{self.pid}" if self.vid else "unknown adapter"
        bits = [self.device, ident]
        if self.serial:
            bits.append(f"serial {self.serial}")
        if self.usb_path:
            bits.append(f"usb port {self.usb_path}")
        if self.product or self.manufacturer:
            bits.append(" ".join(x for x in (self.manufacturer, self.product) if x))
        if self.latency_timer_ms is not None:
            bits.append(f"latency timer {self.latency_timer_ms} ms")
        return ", ".join(bits)


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return None
    return text or None


def _usb_device_dir(start: Path) -> Path | None:
    """Walk up from the tty's device to the USB device (the first ancestor with idVendor)."""
    p = start
    for _ in range(6):
        if (p / "idVendor").is_file():
            return p
        if p.parent == p:
            break
        p = p.parent
    return None


def scan_ports(sysfs_root: str | Path = "/sys", dev_root: str = "/dev") -> list[PortInfo]:
    """Every ttyACM*/ttyUSB* with a USB parent, sorted by name."""
    tty_class = Path(sysfs_root) / "class" / "tty"
    try:
        names = sorted(n for n in os.listdir(tty_class) if _TTY_NAME.match(n))
    except OSError:
        return []
    ports = []
    for name in names:
        dev_link = tty_class / name / "device"
        if not dev_link.exists():
            continue
        dev_dir = dev_link.resolve()
        usb = _usb_device_dir(dev_dir)
        driver_link = dev_dir / "driver"
        driver = os.path.basename(os.path.realpath(driver_link)) if driver_link.exists() else None
        latency = _read(dev_dir / "latency_timer")
        ports.append(
            PortInfo(
                device=f"{dev_root}/{name}",
                vid=_read(usb / "idVendor") if usb else None,
                pid=_read(usb / "idProduct") if usb else None,
                serial=_read(usb / "serial") if usb else None,
                manufacturer=_read(usb / "manufacturer") if usb else None,
                product=_read(usb / "product") if usb else None,
                usb_path=usb.name if usb else None,
                driver=driver,
                latency_timer_ms=int(latency) if latency and latency.isdigit() else None,
            )
        )
    return ports


class PortDiffError(RuntimeError):
    pass


def missing_port(before: list[PortInfo], after: list[PortInfo]) -> PortInfo:
    """The one port present before and gone after an unplug; clear errors otherwise."""
    after_names = {p.device for p in after}
    gone = [p for p in before if p.device not in after_names]
    if not gone:
        raise PortDiffError(
            "no port disappeared: was the USB cable unplugged (not just the arm's power)? "
            f"ports now: {', '.join(p.device for p in after) or 'none'}"
        )
    if len(gone) > 1:
        raise PortDiffError(
            f"{len(gone)} ports disappeared at once ({', '.join(p.device for p in gone)}): unplug only one arm"
        )
    return gone[0]


def new_port(before: list[PortInfo], after: list[PortInfo]) -> PortInfo:
    """The one port that appeared between two scans (replug: it may come back under a new name)."""
    before_names = {p.device for p in before}
    added = [p for p in after if p.device not in before_names]
    if len(added) != 1:
        raise PortDiffError(
            f"expected one new port, found {len(added)}: {', '.join(p.device for p in added) or 'none'}"
        )
    return added[0]


def serial_is_unique(port: PortInfo, ports: list[PortInfo]) -> bool:
    """A serial number is only an identity if no other adapter reports the same one (cheap clones do)."""
    if not port.serial:
        return False
    return sum(1 for p in ports if p.serial == port.serial and p.vid == port.vid and p.pid == port.pid) == 1
