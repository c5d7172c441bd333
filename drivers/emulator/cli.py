"""`so101d emulate`: serve emulated SO-101 arms on pseudo-terminals until SIGINT/SIGTERM.

    so101d emulate --leader /tmp/bench/leader --follower /tmp/bench/follower \\
        --control /tmp/bench/emulator.sock --calibration-out /tmp/bench/calibration

    so101d emulate --bimanual --left-leader /tmp/bench/left_leader --left-follower /tmp/bench/left_follower \\
        --right-leader /tmp/bench/right_leader --right-follower /tmp/bench/right_follower ...

Each path becomes a symlink to a pty slave that LeRobot, the Feetech SDK or our driver can open
like /dev/ttyACM0. On exit the links (and the control socket) are removed.

``--bimanual`` serves two pairs (the arms ``left_leader``, ``left_follower``, ``right_leader``,
``right_follower`` on the control socket), each arm on its own pty and its own bus thread, as
faithful as the single-arm bench. ``--leader-motion demo`` then moves each leader through its side
of a handover (drivers/emulator/motion.py HANDOVER_KEYFRAMES), and ``--calibration-out`` writes
LeRobot's bimanual layout: BiSOLeader / BiSOFollower with ``id=ID`` look for ``ID_left`` and
``ID_right`` under the single-arm folders (lerobot/teleoperators/bi_so_leader/bi_so_leader.py,
lerobot/robots/bi_so_follower/bi_so_follower.py), so ``--leader-id`` / ``--follower-id`` name the
bimanual ids and the files are ``<id>_left.json`` / ``<id>_right.json``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from calibration.calibration_file import save_calibration
from drivers.emulator.arm import PRESETS as ARM_PRESETS
from drivers.emulator.arm import EmulatedArm, Role
from drivers.emulator.motion import HANDOVER_SIDES, MotionError, MotionSource, motion_from_spec
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
        "--bimanual",
        action="store_true",
        help="serve two pairs (left and right) on the --left-/--right- paths below instead of one "
        "(the leaders' demo motion is then a handover, a different path per side)",
    )
    for side in HANDOVER_SIDES:
        for role in ("leader", "follower"):
            parser.add_argument(
                f"--{side}-{role}", metavar="PATH", help=f"with --bimanual: link path for the {side} {role} arm"
            )
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
    parser.add_argument(
        "--leader-id",
        default="emulated_leader",
        help="calibration id of the leader (file name); with --bimanual the pair's id, files ID_left / ID_right",
    )
    parser.add_argument(
        "--follower-id",
        default="emulated_follower",
        help="calibration id of the follower; with --bimanual the pair's id, files ID_left / ID_right",
    )
    add_exit_with_parent_arguments(parser)


def _arm_paths(args: argparse.Namespace) -> tuple[dict[str, str], str | None]:
    """The arms asked for: name -> link path, or (_, why the flags do not fit together)."""
    sided = {
        f"{side}_{role}": getattr(args, f"{side}_{role}")
        for side in HANDOVER_SIDES
        for role in ("leader", "follower")
        if getattr(args, f"{side}_{role}")
    }
    single = {role: getattr(args, role) for role in ("leader", "follower") if getattr(args, role)}
    if args.bimanual:
        if single:
            flags = ", ".join(f"--{r}" for r in single)
            return {}, f"{flags}: a single pair's port; with --bimanual give --left-leader, --left-follower, ..."
        if not sided:
            return {}, "--bimanual: give --left-leader, --left-follower, --right-leader and/or --right-follower PATH"
        return sided, None
    if sided:
        flags = ", ".join("--" + name.replace("_", "-") for name in sided)
        return {}, f"{flags}: a side's port needs --bimanual"
    if not single:
        return {}, "give --leader PATH and/or --follower PATH (or --bimanual with the four --left-/--right- paths)"
    return single, None


def _leader_motion(spec: str, name: str) -> MotionSource:
    """The motion of leader ``name``: under --bimanual, ``demo`` is that side's handover."""
    side = name.removesuffix("_leader")
    return motion_from_spec(f"handover-{side}" if spec == "demo" and side in HANDOVER_SIDES else spec)


def run(args: argparse.Namespace) -> int:
    paths, why = _arm_paths(args)
    if why:
        print(f"so101d emulate: {why}", file=sys.stderr)
        return 2
    if args.baud not in BAUD_RATE_BY_CODE.values():
        print(
            f"so101d emulate: unsupported --baud {args.baud}; choose one of {sorted(BAUD_RATE_BY_CODE.values())}",
            file=sys.stderr,
        )
        return 2
    try:
        motions = {name: _leader_motion(args.leader_motion, name) for name in paths if name.endswith("leader")}
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
    # Each leader's motion clock starts as its arm is made, microseconds apart here: the two
    # sides of a handover stay in step.
    for name, link in paths.items():
        role: Role = "leader" if name.endswith("leader") else "follower"
        side = name.removesuffix(f"_{role}") if args.bimanual else None
        arm = EmulatedArm(role, args.preset, motion=motions.get(name), baudrate=args.baud, side=side)
        host.add(name, link, arm, not args.no_wire_time, rt, realism)

    if args.calibration_out:
        root = Path(args.calibration_out)
        for name, arm in host.arms.items():
            arm_id = args.leader_id if arm.role == "leader" else args.follower_id
            if arm.side is not None:
                arm_id = f"{arm_id}_{arm.side}"  # LeRobot's bimanual classes: f"{config.id}_left"
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
