"""`so101d setup-motors leader|follower --port P`: give a new kit's servos their ids, one at a time.

A new SO-101 kit's twelve STS3215s all answer as id 1 (at 1 Mbaud, or another rate for some
batches): on one chain they collide. As with LeRobot's ``lerobot-setup-motors`` (its
``SOFollower.setup_motors``), the operator connects one servo alone to the controller board,
gripper first; each servo found alone (``drivers.servo_setup``) gets its joint's final id and
1 Mbaud, EEPROM unlocked and locked again, both read back. Each prompt names the joint and its
final id. What is on the bus when it is not one STS3215 ready to be set up (nothing, several
servos, another model, a servo already given an id in this run) is refused, saying what was seen
and what to do, and the prompt comes again.

Ctrl-C, SIGTERM and SIGHUP (the terminal closed) are held back while one servo's writes are
under way (a servo half written would answer at an id and rate nobody knows); the run then stops,
saying where that servo answers and how to resume. A failed write ends the run the same way: the
servo is looked for where the acknowledged writes should have left it (then at every rate) and the
output says where it answers. ``--from JOINT`` resumes; the joints before it were set up by an
earlier run, so at the end the assembled chain is pinged at ids 1..6 before anything is claimed.

Exit codes: 0 done, 2 stopped by the operator (q or end of input), 3 bus or port failure,
4 the chain check found a joint before ``--from`` not set up, 128 + the signal's number on
Ctrl-C (130), SIGTERM (143) or SIGHUP (129).
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

from calibration.conventions import JOINT_IDS, JOINT_NAMES
from drivers import protocol as P
from drivers.arm_interface import ArmError, PortGoneError
from drivers.feetech_bus import FeetechBus
from drivers.servo_setup import (
    FIRST_BYTE_S,
    QUIET_S,
    TARGET_BAUDRATE,
    IdTaken,
    Place,
    SetupRefused,
    assign,
    find_single_servo,
    locate,
    shared_id_evidence,
)

EXIT_OK, EXIT_STOPPED, EXIT_BUS, EXIT_NOT_SET_UP, EXIT_INTERRUPTED = 0, 2, 3, 4, 130
SETUP_ORDER: tuple[str, ...] = tuple(reversed(JOINT_NAMES))  # gripper first, as LeRobot


class Stopped(Exception):
    """The operator typed q or closed the input."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("role", choices=("follower", "leader"), help="which arm's servos are set up")
    parser.add_argument("--port", required=True, help="the arm's controller board (serial port)")
    parser.add_argument(
        "--from",
        dest="from_joint",
        choices=SETUP_ORDER,
        help="resume at this joint (the ones before it in the order gripper, wrist_roll, ... were set up already)",
    )


def run(args: argparse.Namespace) -> int:
    return SetupRun(args.role, args.port, args.from_joint, sys.stdin, sys.stdout).run()


_STOP_SIGNALS: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP outside one servo's writes."""

    def __init__(self, signum: int) -> None:
        super().__init__(_STOP_SIGNALS[signum])
        self.signum = signum

    @property
    def name(self) -> str:
        return _STOP_SIGNALS[self.signum]


class _StopSignals:
    """For the length of a run (main thread only): SIGINT, SIGTERM and SIGHUP raise
    ``Interrupted``, except while one servo's writes run (``holding``): then they are noted, and
    the writes finish first. A kill -9 or a power cut cannot be held; the next run's scan finds
    the servo wherever it is."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.noted: int | None = None
        self._holding = False
        self._active = threading.current_thread() is threading.main_thread()
        self._previous = [(sig, signal.getsignal(sig)) for sig in _STOP_SIGNALS] if self._active else []
        self._installed = False

    def _on(self, signum: int, _frame: FrameType | None) -> None:
        if not self._holding:
            raise Interrupted(signum)
        if self.noted is None:
            try:
                print(f"  {_STOP_SIGNALS[signum]}: finishing this servo's writes first", file=self.out, flush=True)
            except OSError:
                pass  # the terminal is gone (SIGHUP): the writes matter more than the line
        self.noted = signum

    @contextmanager
    def holding(self) -> Iterator[None]:
        self._holding = True
        try:
            yield
        finally:
            self._holding = False

    def __enter__(self) -> _StopSignals:
        if self._active:
            for sig in _STOP_SIGNALS:
                signal.signal(sig, self._on)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._installed:
            return
        for sig, previous in self._previous:
            if previous is not None:  # None: set outside Python, cannot be put back from here
                signal.signal(sig, previous)
        self._installed = False


def port_problem(port: str, exc: Exception) -> str:
    """What is wrong with a port that would not open, and what to do: only the lock error means
    another program (the daemon, most likely) holds it."""
    path = Path(port)
    if not path.exists():
        return (
            f"{port} does not exist: is the controller board's USB cable plugged in? "
            "(its port is usually /dev/ttyACM* or /dev/ttyUSB*)"
        )
    if not stat.S_ISCHR(path.stat().st_mode):
        what = "folder" if path.is_dir() else "regular file" if path.is_file() else "file"
        return f"{port} is a {what}, not a serial port: give the controller board's port (/dev/ttyACM*, /dev/ttyUSB*)"
    if "exclusively lock" in str(exc):
        return f"{exc} (another program holds this port: is so101d running on it? stop it first)"
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return str(exc)
    try:
        is_tty = os.isatty(fd)
    finally:
        os.close(fd)
    return str(exc) if is_tty else f"{port} is a device but not a serial port ({exc})"


class SetupRun:
    """One run of the story on one port."""

    def __init__(self, role: str, port: str, from_joint: str | None, stdin: TextIO, out: TextIO) -> None:
        self.role = role
        self.port = port
        self.stdin = stdin
        self.out = out
        start = SETUP_ORDER.index(from_joint) if from_joint else 0
        self.todo = SETUP_ORDER[start:]
        # id -> (joint, how it got it): the joints before --from were set up by an earlier run.
        self.taken: dict[int, tuple[str, str]] = {
            JOINT_IDS[j]: (j, f"in an earlier run (this one started --from {from_joint})") for j in SETUP_ORDER[:start]
        }
        self.earlier = SETUP_ORDER[:start]
        self.current = self.todo[0]  # the joint being set up (a resume starts there)
        # Setup is not time-critical: a generous reply timeout beats a spurious "no reply".
        self.bus = FeetechBus(port, TARGET_BAUDRATE, retries=3, reply_margin_s=0.5)
        self.signals = _StopSignals(out)

    def say(self, text: str) -> None:
        try:
            print(text, file=self.out, flush=True)
        except OSError:
            pass  # the terminal closed (SIGHUP); the servo's state matters more than the line

    def resume_hint(self, joint: str) -> str:
        return f"so101d setup-motors {self.role} --port {self.port} --from {joint}"

    def run(self) -> int:
        try:
            self.bus.open()
        except PortGoneError as exc:
            self.say(f"error: {port_problem(self.port, exc)}")
            return EXIT_BUS
        try:
            with self.signals:
                try:
                    return self._run()
                except KeyboardInterrupt as exc:
                    # A signal between two steps (after a servo's read back, before the next
                    # prompt): no servo is half written; the one named was set up or untouched.
                    name, code = _interruption(exc)
                    self.say(f"\n{name}: stopped at the {self.current} servo. Resume: {self.resume_hint(self.current)}")
                    return code
        finally:
            self.bus.close()

    def _run(self) -> int:
        self.say(
            f"Setting up the {self.role}'s servos on {self.port}, one at a time: "
            f"{', '.join(f'{j} (id {JOINT_IDS[j]})' for j in self.todo)}."
        )
        self.say(f"Each gets its final id and {TARGET_BAUDRATE} baud. Type q and ENTER at a prompt to stop.")
        total = len(SETUP_ORDER)
        for joint in self.todo:
            self.current = joint
            step = SETUP_ORDER.index(joint) + 1
            target = Place(JOINT_IDS[joint], TARGET_BAUDRATE)
            try:
                found = self._find(joint, step, total, target)
            except Stopped:
                self.say(f"Stopped; the {joint} servo was not changed. Resume: {self.resume_hint(joint)}")
                return EXIT_STOPPED
            except KeyboardInterrupt as exc:
                name, code = _interruption(exc)
                self.say(f"\n{name}; the {joint} servo was not changed. Resume: {self.resume_hint(joint)}")
                return code
            except ArmError as exc:
                self.say(f"bus error on {self.port}: {exc}. Resume: {self.resume_hint(joint)}")
                return EXIT_BUS
            stop = self._assign(joint, found, target)
            if stop is not None:
                return stop
        if self.earlier:
            try:
                return self._check_chain()
            except Stopped:
                self.say(
                    f"Stopped before the chain check: the {', '.join(self.todo)} servo(s) were set up in this run; "
                    f"the {', '.join(self.earlier)} (set up before --from) were not checked"
                )
                return EXIT_STOPPED
            except KeyboardInterrupt as exc:
                name, code = _interruption(exc)
                self.say(f"\n{name} during the chain check: the servos set up before --from were not checked")
                return code
            except ArmError as exc:
                self.say(f"bus error on {self.port} during the chain check: {exc}")
                return EXIT_BUS
        self.say(
            f"All six {self.role} servos were set up in this run and read back at their ids (1..6) at "
            f"{TARGET_BAUDRATE} baud. Now connect them all in one daisy chain, as the arm is assembled."
        )
        self.say(self._next())
        return EXIT_OK

    def _next(self) -> str:
        return f"Next: so101d calibrate {self.role} --port {self.port} --id {self.role}"

    def _check_chain(self) -> int:
        """The joints before --from were set up by an earlier run (or not): ping every id on the
        assembled chain before claiming all six answer."""
        self._prompt(
            f"Now connect all six {self.role} servos in one daisy chain, as the arm is assembled, then press ENTER "
            f"(the {', '.join(self.earlier)} servo(s), set up before --from {self.todo[0]}, are checked at their ids)"
        )
        missing: list[str] = []
        shared: list[str] = []
        for joint in SETUP_ORDER:
            place = Place(JOINT_IDS[joint], TARGET_BAUDRATE)
            self.bus.set_baudrate(place.baudrate)
            replies = self.bus.collect_replies(P.ping(place.servo_id), FIRST_BYTE_S, QUIET_S)
            if not replies.packets and not replies.noise_bytes:
                missing.append(joint)
                continue
            evidence = shared_id_evidence(self.bus, place)
            if evidence is not None:
                shared.append(f"{joint} ({evidence})")
        if not missing and not shared:
            self.say(
                f"All six {self.role} servos answer at their ids (1..6) at {TARGET_BAUDRATE} baud on the chain "
                "(checked just now)."
            )
            self.say(self._next())
            return EXIT_OK
        for joint in missing:
            self.say(
                f"  the {joint} servo (id {JOINT_IDS[joint]}) does not answer at {TARGET_BAUDRATE} baud"
                + (": it was not set up (or its cable is loose)" if joint in self.earlier else ": check its cable")
            )
        for what in shared:
            self.say(
                f"  several servos answer as the id of the {what}: a servo not set up still answers as the "
                "factory id 1 (or two servos were given one id)"
            )
        first = next((j for j in SETUP_ORDER if j in missing), None) or self.earlier[0]
        self.say(
            f"Not all six answer at their ids. Set up the ones missing: {self.resume_hint(first)} "
            "(then connect the chain again)"
        )
        return EXIT_NOT_SET_UP

    def _find(self, joint: str, step: int, total: int, target: Place) -> Place:
        while True:
            self._prompt(
                f"[{step}/{total}] Connect ONLY the {joint} servo (it becomes id {target.servo_id}) to the "
                f"{self.role}'s controller board, then press ENTER"
            )
            try:
                found, _model = find_single_servo(self.bus, joint)
                owner = self.taken.get(found.servo_id)
                if owner is not None and found.servo_id != target.servo_id:
                    raise IdTaken(
                        f"the servo on the bus answers as {found}, the id the {owner[0]} got {owner[1]}: that is "
                        f"the {owner[0]} servo still connected; unplug it and connect only the {joint} servo"
                    )
            except SetupRefused as exc:
                self.say(f"  refused: {exc}")
                continue
            self.say(f"  found one STS3215 alone at {found}")
            return found

    def _prompt(self, text: str) -> None:
        print(text, end=": " if self.out.isatty() else ":\n", file=self.out, flush=True)
        line = self.stdin.readline()
        if not line or line.strip().lower() == "q":
            raise Stopped()

    def _assign(self, joint: str, found: Place, target: Place) -> int | None:
        """Write one servo; None when done and the run goes on, else the exit code."""
        where = found
        candidates = [found]

        def step(what: str, now: Place) -> None:
            nonlocal where
            where = now
            # Acknowledged is not read back: only the read back at the end says where it answers.
            self.say(f"  {what}: acknowledged")

        try:
            with self.signals.holding():
                candidates = [Place(target.servo_id, target.baudrate), Place(target.servo_id, found.baudrate), found]
                assign(self.bus, found, target, step)
        except ArmError as exc:
            self.say(f"  the {joint} servo's setup failed: {exc}")
            self._say_where(joint, candidates, where)
            return EXIT_BUS if self.signals.noted is None else 128 + self.signals.noted
        self.taken[target.servo_id] = (joint, "in this run")
        self.say(f"  {joint}: id {target.servo_id}, {target.baudrate} baud, read back; EEPROM locked")
        if self.signals.noted is not None:
            rest = self.todo[self.todo.index(joint) + 1 :]
            nxt = f" Resume: {self.resume_hint(rest[0])}" if rest else ""
            name = _STOP_SIGNALS[self.signals.noted]
            self.say(f"{name}: stopped after the {joint} servo was set up (it answers as {target}).{nxt}")
            return 128 + self.signals.noted
        return None

    def _say_where(self, joint: str, candidates: list[Place], last_known: Place) -> None:
        unknown = (
            f"the last acknowledged write should have left it answering as {last_known} (not read back). "
            f"setup-motors searches every id and rate: {self.resume_hint(joint)}"
        )
        try:
            # said inside the try: a Ctrl-C as the operator reads it (still in this say) is one
            # "while looking for it", not a stop between two steps
            self.say(f"  looking for the {joint} servo (where the writes should have left it, then every rate)")
            now = locate(self.bus, [last_known, *candidates])
        except ArmError as exc:
            self.say(f"  could not look for it ({exc}); {unknown}")
            return
        except KeyboardInterrupt as exc:
            self.say(f"\n  {_interruption(exc)[0]} while looking for it; {unknown}")
            return
        if now is None:
            self.say(
                f"  the {joint} servo does not answer at any baud rate now: check its cable and the board's power, "
                f"then {self.resume_hint(joint)}"
            )
        else:
            self.say(f"  the {joint} servo answers as {now}. Resume: {self.resume_hint(joint)}")


def _interruption(exc: KeyboardInterrupt) -> tuple[str, int]:
    """The signal's name as the operator knows it, and the exit code (128 + its number)."""
    if isinstance(exc, Interrupted):
        return exc.name, 128 + exc.signum
    return "Ctrl-C", EXIT_INTERRUPTED
