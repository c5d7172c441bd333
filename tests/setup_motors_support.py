"""Drive `so101d setup-motors` as an operator would: read its prompts, plug servos, press ENTER.

The emulator (`so101d emulate --preset new-kit`) stands in for the kit: its `connect_servos`
control command is the operator plugging one servo's 3-pin cable into the controller board.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from drivers.emulator.process import EmulatorProcess

REPO = Path(__file__).resolve().parents[1]
_CONSOLE = Path(sys.executable).with_name("so101d")
SO101D = [str(_CONSOLE)] if _CONSOLE.exists() else [sys.executable, "-m", "daemon.apps.cli"]
PROMPT = re.compile(r"Connect ONLY the (\w+) servo \(it becomes id (\d)\)")
CHAIN_PROMPT = re.compile(r"Now connect all six \w+ servos in one daisy chain, .* then press ENTER")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}


def plug_only(emu: EmulatorProcess, arm: str, joints: list[str] | None) -> None:
    emu.control({"cmd": "connect_servos", "arm": arm, "joints": joints})


class SetupSession:
    """One `so101d setup-motors` process; ``answer`` reacts to each prompt (plug, then ENTER)."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            SO101D + ["setup-motors", *argv],
            env=env(),
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.seen: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.seen)

    def next_line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.seen.append(line)
        return line

    def until(self, pattern: str) -> re.Match[str]:
        """Read lines until one matches ``pattern`` (the process must not end first)."""
        while True:
            line = self.next_line()
            assert line, f"setup-motors ended before {pattern!r}:\n{self.text}"
            m = re.search(pattern, line)
            if m:
                return m

    def enter(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def run_story(self, on_prompt: Callable[[str, int], None], on_chain: Callable[[], None] | None = None) -> int:
        """Answer every prompt with ``on_prompt(joint, final_id)`` then ENTER, until the end; the
        chain check of a ``--from`` run with ``on_chain()`` (the operator assembling the chain)."""
        while True:
            line = self.next_line()
            if not line:
                return self.proc.wait(timeout=60)
            m = PROMPT.search(line)
            if m:
                on_prompt(m.group(1), int(m.group(2)))
                self.enter()
            elif CHAIN_PROMPT.search(line):
                assert on_chain is not None, f"unexpected chain check:\n{self.text}"
                on_chain()
                self.enter()

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout_s: float = 60) -> int:
        assert self.proc.stdout is not None
        if self.proc.stdin is not None and self.proc.stdin.closed:
            self.proc.stdin = None  # the operator closed it (end of input): nothing left to flush
        rest, _ = self.proc.communicate(timeout=timeout_s)
        self.seen.append(rest)
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def set_up_arm(emu: EmulatorProcess, arm: str, port: Path, cwd: Path) -> SetupSession:
    """The whole story on one arm: each prompted servo plugged in alone, then the chain."""
    session = SetupSession([arm, "--port", str(port)], cwd)
    try:
        code = session.run_story(lambda joint, _id: plug_only(emu, arm, [joint]))
    finally:
        session.close()
    assert code == 0, session.text
    plug_only(emu, arm, None)
    return session
