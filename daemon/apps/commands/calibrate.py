"""`so101d calibrate leader|follower`: the interactive calibration, on top of daemon.apps.calibration_procedure.

Steps shown to the operator: middle pose (ENTER), gripper fully closed (ENTER), gripper fully open
(ENTER), then every joint but wrist_roll through its whole range with a live table (ENTER to
stop). Offsets and limits are written to the servos and the JSON is saved where LeRobot 0.6.1
reads it, so `lerobot-teleoperate` and the daemon both use it without asking again.

`--verify` only compares an existing calibration file with what the servos hold (no prompts, no
writes): exit 0 when they agree, 1 with one line per difference otherwise.

On a bimanual rig, `--arm left|right --config FILE` calibrates that side's leader or follower:
its port and calibration id come from the configuration's [arms.SIDE] (LeRobot's bimanual ids,
``<id>_left`` / ``<id>_right``, in the single-arm folders, as lerobot/robots/bi_so_follower and
lerobot/teleoperators/bi_so_leader read them), so LeRobot's own bimanual classes and the daemon use
the same files.

Until the calibration is saved the servos are changed (factory offsets, limits 0..4095, torque
off, EEPROM unlocked). An attempt that ends any other way (rejected, 'q' or end of input, Ctrl-C,
a bus error, a bug) puts every servo back as it was before, read back and checked.

Exit codes: 0 done, 1 verify found differences, 2 calibration rejected, aborted or bad input
(servos as before, no file written), 3 bus or port failure (or the servos could not be put back).
"""

from __future__ import annotations

import argparse
import glob
import os
import select
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from calibration.calibration_file import (
    CalibrationError,
    Role,
    calibration_path,
    calibration_root,
    find_calibration,
    load_calibration_file,
)
from calibration.conventions import JOINT_NAMES, MAX_TICK
from daemon.apps.calibration_procedure import FULL_TURN_JOINTS, CalibrationRestoreError, CalibrationSession
from daemon.config.settings import ARM_SIDES, ArmPairConfig, ConfigError, load_config
from drivers.arm_interface import ArmError, PortGoneError
from drivers.calibration_io import ServoBus, verify_against_servos

if TYPE_CHECKING:
    from drivers.feetech_bus import FeetechBus

EXIT_OK, EXIT_MISMATCH, EXIT_REJECTED, EXIT_BUS = 0, 1, 2, 3
SAMPLE_PERIOD_S = 0.02  # LeRobot samples ranges every 20 ms too


class Aborted(Exception):
    """The operator closed stdin (or typed 'q'): stop, writing nothing."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("role", choices=("follower", "leader"), help="which arm is on the port")
    parser.add_argument(
        "--port", help="serial port (default: /dev/so101-<role> if present, else the only USB serial adapter found)"
    )
    parser.add_argument("--id", dest="arm_id", help="calibration id, the JSON file's name (default: the role)")
    parser.add_argument(
        "--arm",
        choices=ARM_SIDES,
        help="a bimanual rig's side: the port, id and calibration root come from --config's [arms.SIDE]",
    )
    parser.add_argument("--config", metavar="FILE", help="the daemon's TOML configuration (with --arm)")
    parser.add_argument(
        "--calibration-dir",
        type=Path,
        help="folder holding <id>.json, like LeRobot's --robot.calibration_dir (default: "
        "LeRobot's folder for the role under the calibration root)",
    )
    parser.add_argument(
        "--calibration-root",
        type=Path,
        help="calibration root (default: $HF_LEROBOT_CALIBRATION or ~/.cache/huggingface/lerobot/calibration)",
    )
    parser.add_argument("--baudrate", type=int, default=1_000_000, help="bus speed (default 1000000)")
    parser.add_argument(
        "--reversed-gripper",
        choices=("flip", "fail"),
        default="flip",
        help="a gripper that closes towards high ticks: set its drive_mode to 1 (flip, default) or stop (fail)",
    )
    parser.add_argument(
        "--min-travel-ticks",
        type=int,
        default=200,
        help="smallest accepted range per joint, in ticks (default 200, about 18 degrees)",
    )
    parser.add_argument(
        "--verify", action="store_true", help="only compare the calibration file with the servos; write nothing"
    )


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    try:
        if args.config and not args.arm:
            # read only with --arm: ignored, the port would be guessed (/dev/so101-<role>, the only
            # adapter), maybe another arm's, and its file saved under the single-arm id
            raise CalibrationError(
                f"--config is read with --arm: name the side (--arm {' or --arm '.join(ARM_SIDES)}); "
                "a single pair: leave --config out and give --port"
            )
        side = _side_of_pair(args) if args.arm else None
        arm_id = args.arm_id or (side.arm_id if side else args.role)
        target = _target_path(args, arm_id)
        port = args.port or (side.port if side else _guess_port(args.role))
    except (CalibrationError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REJECTED

    from drivers.feetech_bus import FeetechBus

    # Calibration is not time-critical: a generous reply timeout and retries beat a spurious
    # "no reply" on a loaded machine (the control loop keeps the tight defaults).
    bus = FeetechBus(port, args.baudrate, retries=3, reply_margin_s=0.5)
    session: CalibrationSession | None = None
    code = EXIT_BUS
    try:
        bus.open()
        if args.verify:
            code = _verify(bus, args.role, arm_id, args, out)
        else:
            session = CalibrationSession(
                bus, role=args.role, min_travel_ticks=args.min_travel_ticks, reversed_gripper=args.reversed_gripper
            )
            code = _calibrate(session, arm_id, target, port, sys.stdin, out)
            if code == EXIT_OK:
                print(f"Next: {_doctor_command(args, arm_id, port)}", file=out)
    except (Aborted, KeyboardInterrupt) as exc:
        why = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else str(exc)
        print(f"\naborted ({why}); nothing was written", file=sys.stderr)
        code = EXIT_REJECTED
    except CalibrationError as exc:  # includes a rejected procedure and a mismatch after writing
        print(f"\nerror: {_describe(exc)}", file=sys.stderr)
        code = EXIT_REJECTED
    except ArmError as exc:
        print(f"\nbus error on {port}: {_describe(exc)}", file=sys.stderr)
        code = EXIT_BUS
        if bus.is_open and not isinstance(exc, PortGoneError):
            print(_next_after_missing_servos(bus, args.role, port), file=sys.stderr)
    finally:
        # Whatever ended the attempt (a rejection already undid itself; an abort, Ctrl-C or an
        # unexpected exception did not), the servos must not keep factory offsets and 0..4095
        # limits: a follower with those can be driven into itself.
        if session is not None:
            code = _undo(session, code)
        bus.close()
    return code


def _next_after_missing_servos(bus: FeetechBus, role: str, port: str) -> str:
    """A servo did not answer: a new kit (only id 1 answers, or the servos are at another rate)
    names setup-motors; a chain cut after servo 1 names the cable."""
    from drivers.servo_setup import diagnose_lone_id_one, scan

    setup = f"Next: so101d setup-motors {role} --port {port} (each servo gets its id and {bus.baudrate} baud)"
    configured = bus.baudrate
    try:
        sightings = scan(bus)
        here = next((s for s in sightings if s.baudrate == configured), None)
        if here is not None and set(here.ids) <= {1}:
            lone = diagnose_lone_id_one(bus)
            return f"only id 1 answers ({lone.why}); {setup}" if lone.new_kit else f"only id 1 answers: {lone.why}"
    except ArmError as exc:
        return f"(could not look for the servos: {exc}); on a new kit: {setup}"
    finally:
        bus.set_baudrate(configured)
    elsewhere = [s for s in sightings if s.baudrate != configured]
    if elsewhere:
        return f"servos answer at another rate ({'; '.join(s.describe() for s in elsewhere)}); {setup}"
    if here is None:
        return "no servo answers at any baud rate: check the arm's power supply and cables"
    return (
        f"servos missing at their ids ({here.describe()}): check the cables; if the arm is new or a servo was "
        f"replaced, {setup}"
    )


def _doctor_command(args: argparse.Namespace, arm_id: str, port: str) -> str:
    """The check that follows a calibration: the doctor on this arm, with this file."""
    root = f" --calibration-root {args.calibration_root}" if args.calibration_root else ""
    return f"so101d doctor --only {args.role} --{args.role} {port} --{args.role}-id {arm_id}{root}"


def _undo(session: CalibrationSession, code: int) -> int:
    """Put the servos back if the attempt left them changed; the exit code to use."""
    if session.before is None:
        return code
    # A second Ctrl-C must not cut the restore short (half the servos restored is the worst case).
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
    try:
        session.restore()
    except CalibrationRestoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BUS
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
    print(
        "The servos were put back as they were before this attempt (offsets, limits, lock, torque), "
        "read back and checked.",
        file=sys.stderr,
    )
    return code


def _describe(exc: BaseException) -> str:
    """The error with the notes added to it (e.g. a restore that failed after a failed write)."""
    return "\n".join([str(exc), *getattr(exc, "__notes__", ())])


# ---------------------------------------------------------------------------------------------
# the interactive procedure
# ---------------------------------------------------------------------------------------------
def _calibrate(session: CalibrationSession, arm_id: str, target: Path, port: str, stdin: TextIO, out: TextIO) -> int:
    role = session.role
    print(f"Calibrating the {role} '{arm_id}' on {port}; result: {target}", file=out)
    if target.exists():
        print(f"  (the existing file will be replaced; the old one is kept as {target.name}.bak)", file=out)
    operator = _OperatorInput(stdin)
    session.begin()
    print("Torque is off: the arm can be moved by hand. Type q and ENTER at any prompt to abort.", file=out)

    _ask(operator, out, "1/4 Move every joint to the MIDDLE of its range of motion, then press ENTER")
    offsets = session.set_homing()
    print("    homing offsets: " + ", ".join(f"{n} {offsets[n]}" for n in JOINT_NAMES), file=out)

    _ask(operator, out, "2/4 CLOSE the gripper fully and hold it, then press ENTER")
    session.mark_gripper("closed")
    _ask(operator, out, "3/4 OPEN the gripper fully and hold it, then press ENTER")
    session.mark_gripper("open")

    print(
        f"4/4 Move every joint except {', '.join(FULL_TURN_JOINTS)} slowly through its ENTIRE range, "
        "one after the other. Press ENTER when done.",
        file=out,
    )
    live = _LiveTable(out)
    session.record_ranges(
        duration_s=float("inf"),
        period_s=SAMPLE_PERIOD_S,
        should_stop=operator.line_ready,
        on_sample=lambda p: live.show(session, p),
    )
    live.done()

    cal = session.finish()
    for note in session.notes:
        print(f"  note: {note}", file=out)
    print(f"{'joint':<14} {'offset':>6} {'min':>5} {'max':>5} {'drive':>5} {'range_deg':>9}", file=out)
    for n in JOINT_NAMES:
        m = cal[n]
        print(
            f"{n:<14} {m.homing_offset:>6} {m.range_min:>5} {m.range_max:>5} {m.drive_mode:>5} "
            f"{(m.range_max - m.range_min) * 360 / (MAX_TICK + 1):>9.1f}",
            file=out,
        )
    path = session.write(arm_id, path=target)
    print(f"Calibration written to the servos and saved to {path}", file=out)
    return EXIT_OK


def _verify(bus: ServoBus, role: Role, arm_id: str, args: argparse.Namespace, out: TextIO) -> int:
    path: Path
    if args.calibration_dir is not None:
        path = args.calibration_dir / f"{arm_id}.json"
        if not path.is_file():
            raise CalibrationError(f"no calibration file {path}")
    else:
        found = find_calibration(role, arm_id, args.calibration_root)
        if found is None:
            expected = calibration_path(role, arm_id, args.calibration_root)
            raise CalibrationError(f"no calibration for {role} '{arm_id}': expected {expected}")
        path = found
    cal = load_calibration_file(path)
    mismatches = verify_against_servos(bus, cal)
    if not mismatches:
        print(f"{path}: the servos hold this calibration", file=out)
        return EXIT_OK
    print(f"{path}: the servos hold a different calibration:", file=out)
    for m in mismatches:
        print(f"  {m.describe()}", file=out)
    return EXIT_MISMATCH


class _OperatorInput:
    """Lines typed by the operator, read straight from the stdin file descriptor.

    Unbuffered on purpose: ``select`` on a buffered TextIO misses lines Python already read ahead
    (several ENTERs piped at once would hang the range recording).
    """

    def __init__(self, stdin: TextIO) -> None:
        try:
            self.fd: int | None = stdin.fileno()
        except (AttributeError, OSError, ValueError):
            self.fd = None
        self.stdin = stdin
        self.buf = b""
        self.eof = False

    def _fill(self, timeout_s: float | None) -> None:
        if self.fd is None:
            line = self.stdin.readline().encode()
            self.buf += line
            self.eof = self.eof or not line
            return
        readable, _, _ = select.select([self.fd], [], [], timeout_s)
        if readable:
            chunk = os.read(self.fd, 4096)
            self.buf += chunk
            self.eof = self.eof or not chunk

    def _pop_line(self) -> str | None:
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            return line.decode(errors="replace")
        return None

    def wait_line(self) -> str:
        """Block until the operator presses ENTER; Aborted on end of input or 'q'."""
        while True:
            line = self._pop_line()
            if line is not None:
                break
            if self.eof:
                raise Aborted("stdin closed")
            self._fill(None)
        if line.strip().lower() == "q":
            raise Aborted("'q' typed")
        return line

    def line_ready(self) -> bool:
        """Non-blocking: has ENTER been pressed? (Aborted on end of input or 'q'.)"""
        if b"\n" not in self.buf and not self.eof:
            if self.fd is None:
                return False  # cannot poll a file object without a descriptor
            self._fill(0)
        if b"\n" in self.buf or self.eof:
            self.wait_line()
            return True
        return False


def _ask(operator: _OperatorInput, out: TextIO, text: str) -> None:
    print(text, end=": " if out.isatty() else ":\n", file=out, flush=True)
    operator.wait_line()


class _LiveTable:
    """min / position / max per joint, redrawn in place on a terminal (10 Hz), silent otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.drawn = 0
        self.count = 0

    def show(self, session: CalibrationSession, positions: dict[str, int]) -> None:
        self.count += 1
        if not self.tty or self.count % 5:
            return
        lines = [f"{'joint':<14} {'min':>5} {'pos':>5} {'max':>5}"]
        for n in JOINT_NAMES:
            if n in FULL_TURN_JOINTS:
                lines.append(f"{n:<14} {'0':>5} {positions[n]:>5} {MAX_TICK:>5}  (full turn)")
            else:
                r = session.ranges[n]
                lines.append(f"{n:<14} {r.min_ticks:>5} {positions[n]:>5} {r.max_ticks:>5}")
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F")
        self.out.write("\n".join(f"{line}\x1b[K" for line in lines) + "\n")
        self.out.flush()
        self.drawn = len(lines)

    def done(self) -> None:
        if self.tty:
            self.out.write("\n")


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PairSide:
    """One arm of a bimanual pair, as the configuration names it."""

    port: str
    arm_id: str


def _side_of_pair(args: argparse.Namespace) -> PairSide:
    """``--arm SIDE``: the port and id of that side's arm from ``--config`` (and its calibration
    root, unless one is given)."""
    if not args.config:
        raise CalibrationError(f"--arm {args.arm} needs the rig's configuration: add --config FILE")
    cfg = load_config(args.config)
    if not cfg.bimanual:
        raise CalibrationError(
            f"--arm {args.arm}: {args.config} has no [arms.left] / [arms.right] (a single pair: leave --arm out)"
        )
    pair = cfg.arms[args.arm]
    if args.calibration_root is None and args.calibration_dir is None:
        args.calibration_root = cfg.calibration_root()  # the daemon's own ([calibration] root)
    role = args.role
    return PairSide(pair.follower_port if role == "follower" else pair.leader_port, _pair_id(pair, role))


def _pair_id(pair: ArmPairConfig, role: str) -> str:
    return pair.follower_id if role == "follower" else pair.leader_id


def _target_path(args: argparse.Namespace, arm_id: str) -> Path:
    if args.calibration_dir is not None and args.calibration_root is not None:
        raise CalibrationError("give --calibration-dir or --calibration-root, not both")
    if args.calibration_dir is not None:
        calibration_path(args.role, arm_id, Path("/"))  # validates the id
        return args.calibration_dir.expanduser() / f"{arm_id}.json"
    return calibration_path(args.role, arm_id, args.calibration_root or calibration_root())


def _guess_port(role: str, dev: Path = Path("/dev")) -> str:
    """/dev/so101-<role> (the udev name `so101d find-ports` sets up), else the only USB serial
    adapter present, else a clear error listing what was found."""
    named = dev / f"so101-{role}"
    if named.exists():
        return str(named)
    by_id = sorted(glob.glob(str(dev / "serial/by-id/*")))
    candidates = by_id or sorted(glob.glob(str(dev / "ttyACM*")) + glob.glob(str(dev / "ttyUSB*")))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise CalibrationError(f"no serial adapter found for the {role}: plug the arm in or give --port")
    raise CalibrationError(f"several serial ports found ({', '.join(candidates)}): choose the {role}'s with --port")
