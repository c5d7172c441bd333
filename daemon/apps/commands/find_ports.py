"""`so101d find-ports`: which serial port is which arm, and udev rules for stable names.

Interactive (the default): asks you to unplug each arm's USB cable in turn and watches which port
disappears, like lerobot-find-port, then writes rules naming the ports /dev/so101-leader and
/dev/so101-follower by the adapters' USB serial numbers (or USB socket when there is none).
Non-interactive: --leader PORT --follower PORT (device names as they are right now), or
--leader-serial/--follower-serial. Nothing is installed: --write FILE, then copy it to
/etc/udev/rules.d/ (or let `so101d install-service --udev-rules FILE` do it).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from daemon.system.serial_ports import PortDiffError, PortInfo, missing_port, scan_ports, serial_is_unique
from daemon.system.udev_rules import ArmMatch, RuleError, render_rules

log = logging.getLogger("so101d.find_ports")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--list", action="store_true", help="list USB serial ports and exit")
    p.add_argument("--write", metavar="FILE", help="write the udev rules to FILE (default: print them)")
    p.add_argument(
        "--leader", metavar="PORT", help="the leader's port right now (e.g. /dev/ttyACM0): skip the unplug prompts"
    )
    p.add_argument("--follower", metavar="PORT", help="the follower's port right now")
    p.add_argument("--leader-serial", metavar="SERIAL", help="the leader adapter's USB serial number")
    p.add_argument("--follower-serial", metavar="SERIAL", help="the follower adapter's USB serial number")
    p.add_argument(
        "--by-usb-port", action="store_true", help="match by physical USB socket even when serial numbers exist"
    )
    p.add_argument("--sysfs", default="/sys", help=argparse.SUPPRESS)  # tests: a fake sysfs tree


def _port_by_device(ports: list[PortInfo], device: str) -> PortInfo:
    real = os.path.realpath(device) if os.path.exists(device) else device
    for p in ports:
        if p.device in (device, real) or p.name == os.path.basename(real):
            return p
    known = ", ".join(p.device for p in ports) or "none"
    raise PortDiffError(f"{device} is not a USB serial port here (USB serial ports: {known})")


def _wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def identify_interactively(
    sysfs: str,
    ask: Callable[[str], str] = input,
    say: Callable[[str], None] = print,
    replug_timeout_s: float = 20.0,
) -> dict[str, PortInfo]:
    """Unplug/replug prompts; returns {"leader": port, "follower": port} as they are plugged now."""
    found: dict[str, PortInfo] = {}
    for arm in ("leader", "follower"):
        before = scan_ports(sysfs)
        if not before:
            raise PortDiffError("no USB serial ports (ttyACM*/ttyUSB*) found: plug both arms in and retry")
        candidates = [p for p in before if all(p.device != q.device for q in found.values())]
        if arm == "follower" and len(candidates) == 1:
            found[arm] = candidates[0]
            say(f"follower: {candidates[0].describe()} (the only other port)")
            break
        ask(f"Unplug the USB cable of the {arm.upper()} arm, then press Enter: ")
        after = scan_ports(sysfs)
        gone = missing_port(before, after)
        if any(gone.device == q.device for q in found.values()):
            raise PortDiffError(
                f"{gone.device} is the port already identified as the leader: unplug the follower's cable"
            )
        say(f"{arm}: {gone.describe()}")
        ask(f"Plug the {arm} arm back in, then press Enter: ")

        # The port may come back under another ttyACM number: find it by USB identity.
        def back() -> bool:
            return any(_same_adapter(p, gone) for p in scan_ports(sysfs))  # noqa: B023 (waited on here)

        if not _wait_for(back, replug_timeout_s):
            raise PortDiffError(f"the {arm} adapter did not come back within {replug_timeout_s:.0f} s")
        found[arm] = next(p for p in scan_ports(sysfs) if _same_adapter(p, gone))
    return found


def _same_adapter(a: PortInfo, b: PortInfo) -> bool:
    if a.serial and b.serial:
        return (a.serial, a.vid, a.pid) == (b.serial, b.vid, b.pid)
    return a.usb_path is not None and a.usb_path == b.usb_path


def matches_for(found: dict[str, PortInfo], all_ports: list[PortInfo], by_usb_port: bool = False) -> list[ArmMatch]:
    """Rule matches; serial numbers only where they tell the two adapters apart."""
    out = []
    for arm, port in found.items():
        use_serial = not by_usb_port and serial_is_unique(port, all_ports)
        if not use_serial and port.serial and not by_usb_port:
            log.warning(
                "%s: serial %s is shared with another adapter; matching by USB port %s instead",
                arm,
                port.serial,
                port.usb_path,
            )
        out.append(ArmMatch.from_port(arm, port, use_serial=use_serial))
    return out


def run(args: argparse.Namespace) -> int:
    ports = scan_ports(args.sysfs)
    if args.list:
        if not ports:
            print("no USB serial ports (ttyACM*/ttyUSB*) found")
            return 1
        for p in ports:
            print(p.describe())
        return 0
    try:
        if args.leader_serial or args.follower_serial:
            if not (args.leader_serial and args.follower_serial):
                print("error: give both --leader-serial and --follower-serial", file=sys.stderr)
                return 2
            if args.leader_serial == args.follower_serial:
                print("error: the leader and follower serial numbers are the same", file=sys.stderr)
                return 2
            matches = [ArmMatch("leader", serial=args.leader_serial), ArmMatch("follower", serial=args.follower_serial)]
        else:
            if args.leader or args.follower:
                if not (args.leader and args.follower):
                    print("error: give both --leader and --follower", file=sys.stderr)
                    return 2
                found = {
                    "leader": _port_by_device(ports, args.leader),
                    "follower": _port_by_device(ports, args.follower),
                }
                if found["leader"].device == found["follower"].device:
                    print("error: --leader and --follower are the same port", file=sys.stderr)
                    return 2
            else:
                if not sys.stdin.isatty():
                    print(
                        "error: no terminal for the unplug prompts: use --leader PORT --follower PORT", file=sys.stderr
                    )
                    return 2
                found = identify_interactively(args.sysfs)
            matches = matches_for(found, scan_ports(args.sysfs), by_usb_port=args.by_usb_port)
        text = render_rules(matches)
    except (PortDiffError, RuleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.write:
        out = Path(args.write)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, out)
        except OSError as exc:
            print(f"error: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"wrote {out}. Install it with:")
        print(f"  sudo install -m 0644 {out} /etc/udev/rules.d/99-so101.rules")
        print("  sudo udevadm control --reload && sudo udevadm trigger")
        print('then configure leader.port = "/dev/so101-leader" and follower.port = "/dev/so101-follower".')
    else:
        sys.stdout.write(text)
    return 0
