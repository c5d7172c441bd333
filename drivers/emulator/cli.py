"""`so101d emulate`: serve emulated SO-101 arms on pseudo-terminals until SIGINT/SIGTERM.

    so101d emulate --leader /tmp/bench/leader --follower /tmp/bench/follower \\
        --control /tmp/bench/emulator.sock --calibration-out /tmp/bench/calibration

Each path becomes a symlink to a pty slave that LeRobot, the Feetech SDK or our driver can open
like /dev/ttyACM0. On exit the links (and the control socket) are removed.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from calibration.calibration_file import save_calibration
from drivers.emulator.arm import PRESETS as ARM_PRESETS
from drivers.emulator.arm import EmulatedArm
from drivers.emulator.motion import MotionError, motion_from_spec
from drivers.emulator.process import ControlServer, EmulatorHost
from drivers.emulator.realism import PRESETS, realism_from_spec
from drivers.parent_watch import add_exit_with_parent_arguments, watch_parent
from drivers.signal_wake import SignalWake
from drivers.sts3215_table import BAUD_RATE_BY_CODE

log = logging.getLogger("so101d.emulate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--leader", metavar="PATH", help="link path for the emulated leader arm")
    parser.add_argument("--follower", metavar="PATH", help="link path for the emulated follower arm")
    parser.add_argument(
        "--baud", type=int, default=1_000_000, help="servo baud rate (default 1000000, what LeRobot uses)"
    )
    parser.add_argument(
        "--no-wire-time",
        action="store_true",
        help="answer at once instead of after the half-duplex wire time and return delay",
    )
    parser.add_argument(
        "--leader-motion",
        default="demo",
        metavar="demo|still|FILE",
        help="what moves the leader: the built-in pick-and-place demo, a still rest pose, or a "
        "CSV/JSON trajectory of LeRobot units over time (default demo)",
    )
    parser.add_argument(
        "--preset",
        choices=ARM_PRESETS,
        default="calibrated",
        help="EEPROM at power-on: as calibrated by LeRobot (default), factory (offset 0, limits 0..4095), or "
        "new-kit (factory, and every servo still at id 1, at --baud: set it up with so101d setup-motors, "
        "plugging one servo at a time with the connect_servos control command)",
    )
    parser.add_argument(
        "--no-realtime",
        action="store_true",
        help="do not ask for a real-time scheduling slot for the serving threads (by default they "
        "try SCHED_RR 1, then nice -5, so replies leave on time on a loaded machine)",
    )
    parser.add_argument(
        "--realism",
        metavar="PRESET[,PRESET...]",
        default="",
        help="make the emulated hardware stricter, like real servos and USB adapters (default: "
        "LeRobot-compatible). Presets: " + "; ".join(f"{k}: {v}" for k, v in PRESETS.items()),
    )
    parser.add_argument("--control", metavar="SOCKET", help="JSON-lines control socket (fault injection, poses)")
    parser.add_argument(
        "--calibration-out",
        metavar="DIR",
        help="write the arms' reference calibration JSONs under DIR in LeRobot's layout",
    )
    parser.add_argument("--leader-id", default="emulated_leader", help="calibration id of the leader (file name)")
    parser.add_argument("--follower-id", default="emulated_follower", help="calibration id of the follower")
    add_exit_with_parent_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if not args.leader and not args.follower:
        print("so101d emulate: give --leader PATH and/or --follower PATH", file=sys.stderr)
        return 2
    if args.baud not in BAUD_RATE_BY_CODE.values():
        print(
            f"so101d emulate: unsupported --baud {args.baud}; choose one of {sorted(BAUD_RATE_BY_CODE.values())}",
            file=sys.stderr,
        )
        return 2
    try:
        motion = motion_from_spec(args.leader_motion) if args.leader else None
    except MotionError as exc:
        print(f"so101d emulate: {exc}", file=sys.stderr)
        return 2

    try:
        realism = realism_from_spec(args.realism)
    except ValueError as exc:
        print(f"so101d emulate: --realism: {exc}", file=sys.stderr)
        return 2
    host = EmulatorHost()
    rt = not args.no_realtime
    if args.leader:
        arm = EmulatedArm("leader", args.preset, motion=motion, baudrate=args.baud)
        host.add("leader", args.leader, arm, not args.no_wire_time, rt, realism)
    if args.follower:
        host.add(
            "follower",
            args.follower,
            EmulatedArm("follower", args.preset, baudrate=args.baud),
            not args.no_wire_time,
            rt,
            realism,
        )

    if args.calibration_out:
        root = Path(args.calibration_out)
        for name, arm in host.arms.items():
            arm_id = args.leader_id if name == "leader" else args.follower_id
            path = save_calibration(arm.reference, arm.role, arm_id, root=root)
            log.info("reference calibration of the %s: %s", name, path)

    # a self-pipe, not an Event set from the handler: the handler would interrupt this thread
    # inside Event.wait() holding the Event's lock and wait for itself (drivers/signal_wake.py)
    wake = SignalWake()
    wake.install((signal.SIGTERM, signal.SIGINT))
    parent_gone = watch_parent(args.exit_with_parent, args.parent_death_signal)

    control: ControlServer | None = None
    try:
        host.start()
        if args.control:
            control = ControlServer(args.control, host).start()
        for name, bus in host.buses.items():
            print(f"{name}: {bus.link_path} -> {bus.slave_name}", flush=True)
        if control:
            print(f"control: {control.path}", flush=True)
        while True:
            got = wake.wait(0.5)
            if got:
                log.info("signal %d: stopping", got[0])
                break
            if parent_gone():
                log.info("parent process %d is gone: stopping", args.exit_with_parent)
                break
    except (OSError, RuntimeError) as exc:
        print(f"so101d emulate: {exc}", file=sys.stderr)
        return 1
    finally:
        if control:
            control.stop()
        host.stop()
        wake.close()
    return 0
