"""find-ports: sysfs scanning (a fake sysfs tree in the kernel's layout), unplug diffing, udev rules."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.apps.commands import find_ports
from daemon.system.serial_ports import PortDiffError, PortInfo, missing_port, new_port, scan_ports, serial_is_unique
from daemon.system.udev_rules import ArmMatch, RuleError, render_rules

REPO = Path(__file__).resolve().parents[1]
SO101D = str(Path(sys.executable).with_name("so101d"))


class FakeSysfs:
    """Builds /sys/class/tty/<name> and /sys/devices/.../<usb dev> like the kernel does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "class" / "tty").mkdir(parents=True)
        self.bus = root / "devices" / "pci0000:00" / "0000:00:14.0" / "usb1"
        self.bus.mkdir(parents=True)
        (root / "bus" / "usb" / "drivers" / "cdc_acm").mkdir(parents=True)
        (root / "bus" / "usb-serial" / "drivers" / "ftdi_sio").mkdir(parents=True)

    def plug_acm(
        self, tty: str, usb_path: str, vid: str = "1a86", pid: str = "55d3", serial: str | None = None
    ) -> None:
        usb = self.bus / usb_path
        usb.mkdir(exist_ok=True)
        (usb / "idVendor").write_text(vid + "\n")
        (usb / "idProduct").write_text(pid + "\n")
        (usb / "product").write_text("USB Single Serial\n")
        if serial is not None:
            (usb / "serial").write_text(serial + "\n")
        iface = usb / f"{usb_path}:1.0"
        (iface / "tty" / tty).mkdir(parents=True, exist_ok=True)
        drv = iface / "driver"
        if not drv.exists():
            drv.symlink_to(self.root / "bus" / "usb" / "drivers" / "cdc_acm")
        (iface / "tty" / tty / "device").symlink_to(iface)
        (self.root / "class" / "tty" / tty).symlink_to(iface / "tty" / tty)

    def plug_ftdi(self, tty: str, usb_path: str, serial: str) -> None:
        usb = self.bus / usb_path
        usb.mkdir()
        for name, value in (("idVendor", "0403"), ("idProduct", "6014"), ("serial", serial), ("manufacturer", "FTDI")):
            (usb / name).write_text(value + "\n")
        ser = usb / f"{usb_path}:1.0" / tty
        (ser / "tty" / tty).mkdir(parents=True)
        (ser / "latency_timer").write_text("16\n")
        (ser / "driver").symlink_to(self.root / "bus" / "usb-serial" / "drivers" / "ftdi_sio")
        (ser / "tty" / tty / "device").symlink_to(ser)
        (self.root / "class" / "tty" / tty).symlink_to(ser / "tty" / tty)

    def add_virtual(self, tty: str) -> None:
        d = self.root / "devices" / "virtual" / "tty" / tty
        d.mkdir(parents=True)
        (self.root / "class" / "tty" / tty).symlink_to(d)

    def unplug(self, tty: str) -> None:
        link = self.root / "class" / "tty" / tty
        shutil.rmtree(link.resolve())  # the kernel removes the tty's device directory too
        link.unlink()


@pytest.fixture
def sysfs(tmp_path: Path) -> FakeSysfs:
    return FakeSysfs(tmp_path / "sys")


def test_scan_reads_serial_vid_pid_driver_and_usb_path(sysfs: FakeSysfs) -> None:
    sysfs.plug_acm("ttyACM0", "1-2", serial="5A46083059")
    sysfs.plug_acm("ttyACM1", "1-3.1", vid="1a86", pid="7523")  # CH340 clone: no serial
    sysfs.plug_ftdi("ttyUSB0", "1-4", serial="FT8ZQ1")
    sysfs.add_virtual("ttyS0")  # not USB: ignored by name; console ttys likewise
    ports = scan_ports(sysfs.root)
    assert [p.device for p in ports] == ["/dev/ttyACM0", "/dev/ttyACM1", "/dev/ttyUSB0"]
    a0, a1, u0 = ports
    assert (a0.vid, a0.pid, a0.serial, a0.usb_path, a0.driver) == ("1a86", "55d3", "5A46083059", "1-2", "cdc_acm")
    assert a1.serial is None and a1.usb_path == "1-3.1"
    assert (u0.driver, u0.latency_timer_ms, u0.usb_path) == ("ftdi_sio", 16, "1-4")
    assert "serial 5A46083059" in a0.describe()


def test_scan_of_missing_sysfs_is_empty(tmp_path: Path) -> None:
    assert scan_ports(tmp_path / "nothing") == []


def _p(dev: str, serial: str | None = None, usb: str | None = None) -> PortInfo:
    return PortInfo(device=dev, vid="1a86", pid="55d3", serial=serial, usb_path=usb)


def test_port_diffing() -> None:
    a, b, c = _p("/dev/ttyACM0", "A"), _p("/dev/ttyACM1", "B"), _p("/dev/ttyACM2", "C")
    assert missing_port([a, b], [b]) == a
    with pytest.raises(PortDiffError, match="no port disappeared"):
        missing_port([a, b], [a, b])
    with pytest.raises(PortDiffError, match="2 ports disappeared"):
        missing_port([a, b, c], [c])
    assert new_port([a], [a, c]) == c
    with pytest.raises(PortDiffError):
        new_port([a], [a])
    assert serial_is_unique(a, [a, b])
    assert not serial_is_unique(a, [a, _p("/dev/ttyACM5", "A")])
    assert not serial_is_unique(_p("/dev/ttyACM0"), [a])


def test_rules_by_serial_and_by_usb_port() -> None:
    text = render_rules(
        [
            ArmMatch("leader", serial="5A46083059", vid="1a86", pid="55d3", note="ttyACM0"),
            ArmMatch("follower", usb_path="1-3.1", vid="1a86", pid="7523"),
        ]
    )
    rules = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert rules[0] == (
        'SUBSYSTEM=="tty", ATTRS{idVendor}=="1a86", ATTRS{idProduct}=="55d3", ATTRS{serial}=="5A46083059", '
        'SYMLINK+="so101-leader", GROUP="dialout", MODE="0660", TAG+="systemd"'
    )
    assert rules[1].startswith('SUBSYSTEM=="tty", KERNELS=="1-3.1", ATTRS{idVendor}=="1a86"')
    assert 'SYMLINK+="so101-follower"' in rules[1]
    assert rules[2] == 'ACTION=="add", SUBSYSTEM=="usb-serial", DRIVER=="ftdi_sio", ATTR{latency_timer}="1"'
    assert "@ARM_RULES@" not in text
    for line in rules:  # every rule: comma-separated KEY=="v" / KEY+="v" / KEY="v" pairs
        for pair in line.split(", "):
            assert re.fullmatch(r'[A-Z_]+(\{[a-z_A-Z]+\})?(==|\+=|=)"[^"]*"', pair), pair


def test_rules_refuse_unsafe_or_ambiguous_values() -> None:
    with pytest.raises(RuleError, match="characters"):
        ArmMatch("leader", serial='x", RUN+="/bin/sh')
    with pytest.raises(RuleError, match="need a USB serial"):
        ArmMatch("leader")
    with pytest.raises(RuleError):
        ArmMatch("leader", usb_path="../../x")
    with pytest.raises(RuleError, match="arm must be"):
        ArmMatch("middle", serial="A")
    with pytest.raises(RuleError, match="same adapter"):
        render_rules([ArmMatch("leader", serial="A"), ArmMatch("follower", serial="A")])
    with pytest.raises(RuleError, match="one rule per arm"):
        render_rules([ArmMatch("leader", serial="A"), ArmMatch("leader", serial="B")])


def test_rules_without_arms_are_commented_examples() -> None:
    text = render_rules([])
    active = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert active == ['ACTION=="add", SUBSYSTEM=="usb-serial", DRIVER=="ftdi_sio", ATTR{latency_timer}="1"']
    assert "so101-leader" in text


def test_interactive_identification_with_replug_renumbering(sysfs: FakeSysfs) -> None:
    sysfs.plug_acm("ttyACM0", "1-2", serial="LEAD1")
    sysfs.plug_acm("ttyACM1", "1-3", serial="FOLL1")
    sysfs.plug_acm("ttyACM2", "1-4", serial="OTHER")  # a third adapter (e.g. a GPS) stays plugged
    prompts: list[str] = []

    def ask(prompt: str) -> str:
        prompts.append(prompt)
        if prompt.startswith("Unplug the USB cable of the LEADER"):
            sysfs.unplug("ttyACM0")
        elif prompt.startswith("Plug the leader"):
            sysfs.plug_acm("ttyACM3", "1-2", serial="LEAD1")  # comes back as ttyACM3
        elif prompt.startswith("Unplug the USB cable of the FOLLOWER"):
            sysfs.unplug("ttyACM1")
        elif prompt.startswith("Plug the follower"):
            sysfs.plug_acm("ttyACM1", "1-3", serial="FOLL1")
        return ""

    found = find_ports.identify_interactively(str(sysfs.root), ask=ask, say=lambda s: None, replug_timeout_s=2)
    assert found["leader"].device == "/dev/ttyACM3" and found["leader"].serial == "LEAD1"
    assert found["follower"].serial == "FOLL1"
    assert len(prompts) == 4
    matches = find_ports.matches_for(found, scan_ports(sysfs.root))
    assert [(m.arm, m.serial) for m in matches] == [("leader", "LEAD1"), ("follower", "FOLL1")]


def test_interactive_two_ports_follower_by_elimination_and_no_unplug_error(sysfs: FakeSysfs) -> None:
    sysfs.plug_acm("ttyACM0", "1-2")
    sysfs.plug_acm("ttyACM1", "1-3")

    def ask(prompt: str) -> str:
        if prompt.startswith("Unplug"):
            sysfs.unplug("ttyACM1")
        elif prompt.startswith("Plug"):
            sysfs.plug_acm("ttyACM1", "1-3")
        return ""

    found = find_ports.identify_interactively(str(sysfs.root), ask=ask, say=lambda s: None, replug_timeout_s=2)
    assert (found["leader"].usb_path, found["follower"].usb_path) == ("1-3", "1-2")
    # No serial numbers: rules fall back to the USB socket.
    assert [m.usb_path for m in find_ports.matches_for(found, scan_ports(sysfs.root))] == ["1-3", "1-2"]

    with pytest.raises(PortDiffError, match="no port disappeared"):
        find_ports.identify_interactively(str(sysfs.root), ask=lambda p: "", say=lambda s: None, replug_timeout_s=0.2)


def test_shared_serial_numbers_fall_back_to_usb_port(sysfs: FakeSysfs) -> None:
    sysfs.plug_acm("ttyACM0", "1-2", serial="0001")  # clones that all report the same serial
    sysfs.plug_acm("ttyACM1", "1-3", serial="0001")
    ports = scan_ports(sysfs.root)
    matches = find_ports.matches_for({"leader": ports[0], "follower": ports[1]}, ports)
    assert [(m.serial, m.usb_path) for m in matches] == [(None, "1-2"), (None, "1-3")]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SO101D, "find-ports", *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def test_cli_non_interactive_write_and_errors(sysfs: FakeSysfs, tmp_path: Path) -> None:
    sysfs.plug_acm("ttyACM0", "1-2", serial="LEAD1")
    sysfs.plug_ftdi("ttyUSB0", "1-3", serial="FOLL1")
    out = tmp_path / "rules" / "99-so101.rules"
    r = _cli("--sysfs", str(sysfs.root), "--leader", "/dev/ttyACM0", "--follower", "/dev/ttyUSB0", "--write", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert 'ATTRS{serial}=="LEAD1", SYMLINK+="so101-leader"' in text
    assert (
        'ATTRS{idVendor}=="0403", ATTRS{idProduct}=="6014", ATTRS{serial}=="FOLL1", SYMLINK+="so101-follower"' in text
    )
    assert "udevadm control --reload" in r.stdout

    r = _cli("--sysfs", str(sysfs.root), "--list")
    assert r.returncode == 0 and "/dev/ttyACM0" in r.stdout and "latency timer 16 ms" in r.stdout
    r = _cli("--sysfs", str(sysfs.root), "--leader", "/dev/ttyACM7", "--follower", "/dev/ttyUSB0")
    assert r.returncode == 1 and "not a USB serial port" in r.stderr
    r = _cli("--sysfs", str(sysfs.root), "--leader", "/dev/ttyACM0")
    assert r.returncode == 2 and "--follower" in r.stderr
    r = _cli("--sysfs", str(sysfs.root))  # no terminal for the prompts
    assert r.returncode == 2 and "no terminal" in r.stderr
    r = _cli("--leader-serial", "A", "--follower-serial", 'B"x')
    assert r.returncode == 1 and "characters" in r.stderr
    r = _cli("--leader-serial", "A", "--follower-serial", "B")
    assert r.returncode == 0 and 'ATTRS{serial}=="B", SYMLINK+="so101-follower"' in r.stdout
    r = _cli("--sysfs", str(tmp_path / "empty"), "--list")
    assert r.returncode == 1 and "no USB serial ports" in r.stdout
    assert not os.path.exists(str(out) + ".tmp")
