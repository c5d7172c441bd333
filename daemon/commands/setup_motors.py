"""`so101d setup-motors leader|follower --port P`: give a new kit's servos their ids, one at a time.

A new SO-101 kit's twelve STS3215s all answer as id 1 (at 1 Mbaud, or another rate for some
batches): on one chain they collide. As with LeRobot's ``lerobot-setup-motors`` (its
``SOFollower.setup_motors``), the operator connects one servo alone to the controller board,
gripper first; each servo found alone (``drivers.servo_setup``) gets its joint's final id and
1 Mbaud, EEPROM unlocked and locked again, both read back. Each prompt names the joint and its
final id. What is on the bus when it is not one STS3215 ready to be set up (nothing, several
servos, another model, a servo already given an id in this run) is refused, saying what was seen
and what to do, and the prompt comes again.

Ctrl-C is held back while one servo's writes are under way (a servo half written would answer
at an id and rate nobody knows); the run then stops, saying where that servo answers. A failed
write ends the run the same way: the servo is looked for where the acknowledged writes left it
(then at every rate) and the output says where it is. ``--from JOINT`` resumes.

Exit codes: 0 done, 2 stopped by the operator (q or end of input), 3 bus or port failure,
130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import TextIO

from calibration.conventions import JOINT_IDS, JOINT_NAMES
from drivers.arm_interface import ArmError, PortGoneError
from drivers.feetech_bus import FeetechBus
from drivers.servo_setup import (
    TARGET_BAUDRATE,
    IdTaken,
    Place,
    SetupRefused,
    assign,
    find_single_servo,
    locate,
)

EXIT_OK, EXIT_STOPPED, EXIT_BUS, EXIT_INTERRUPTED = 0, 2, 3, 130
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


class _HeldInterrupt:
    """SIGINT noted, not raised, while one servo's writes run (main thread only)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.hit = False
        self._active = threading.current_thread() is threading.main_thread()
        self._previous = signal.getsignal(signal.SIGINT) if self._active else None

    def _note(self, _sig: int, _frame: FrameType | None) -> None:
        if not self.hit:
            print("  Ctrl-C: finishing this servo's writes first", file=self.out, flush=True)
        self.hit = True

    def __enter__(self) -> _HeldInterrupt:
        if self._active:
            self._previous = signal.signal(signal.SIGINT, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._active and self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


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
        # Setup is not time-critical: a generous reply timeout beats a spurious "no reply".
        self.bus = FeetechBus(port, TARGET_BAUDRATE, retries=3, reply_margin_s=0.5)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def resume_hint(self, joint: str) -> str:
        return f"so101d setup-motors {self.role} --port {self.port} --from {joint}"

    def run(self) -> int:
        try:
            self.bus.open()
        except PortGoneError as exc:
            self.say(f"error: {exc} (is the daemon running on this port? stop it first)")
            return EXIT_BUS
        try:
            return self._run()
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
            step = SETUP_ORDER.index(joint) + 1
            target = Place(JOINT_IDS[joint], TARGET_BAUDRATE)
            try:
                found = self._find(joint, step, total, target)
            except Stopped:
                self.say(f"Stopped; the {joint} servo was not changed. Resume: {self.resume_hint(joint)}")
                return EXIT_STOPPED
            except KeyboardInterrupt:
                self.say(f"\nCtrl-C; the {joint} servo was not changed. Resume: {self.resume_hint(joint)}")
                return EXIT_INTERRUPTED
            except ArmError as exc:
                self.say(f"bus error on {self.port}: {exc}. Resume: {self.resume_hint(joint)}")
                return EXIT_BUS
            code = self._assign(joint, found, target)
            if code is not None:
                return code
        self.say(
            f"All six {self.role} servos answer at their ids (1..6) at {TARGET_BAUDRATE} baud. "
            "Now connect them all in one daisy chain, as the arm is assembled."
        )
        self.say(f"Next: so101d calibrate {self.role} --port {self.port} --id {self.role}")
        return EXIT_OK

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
            self.say(f"  {what}: answers as {now}")

        held = _HeldInterrupt(self.out)
        try:
            with held:
                candidates = [Place(target.servo_id, target.baudrate), Place(target.servo_id, found.baudrate), found]
                assign(self.bus, found, target, step)
        except ArmError as exc:
            self.say(f"  the {joint} servo's setup failed: {exc}")
            self._say_where(joint, candidates, where)
            return EXIT_BUS
        self.taken[target.servo_id] = (joint, "in this run")
        self.say(f"  {joint}: id {target.servo_id}, {target.baudrate} baud, read back; EEPROM locked")
        if held.hit:
            rest = self.todo[self.todo.index(joint) + 1 :]
            nxt = f" Resume: {self.resume_hint(rest[0])}" if rest else ""
            self.say(f"Ctrl-C: stopped after the {joint} servo was set up (it answers as {target}).{nxt}")
            return EXIT_INTERRUPTED
        return None

    def _say_where(self, joint: str, candidates: list[Place], last_known: Place) -> None:
        try:
            now = locate(self.bus, [last_known, *candidates])
        except ArmError as exc:
            self.say(
                f"  could not look for it ({exc}); the last acknowledged write left it answering as {last_known}. "
                f"setup-motors searches every id and rate: {self.resume_hint(joint)}"
            )
            return
        if now is None:
            self.say(
                f"  the {joint} servo does not answer at any baud rate now: check its cable and the board's power, "
                f"then {self.resume_hint(joint)}"
            )
        else:
            self.say(f"  the {joint} servo answers as {now}. Resume: {self.resume_hint(joint)}")
