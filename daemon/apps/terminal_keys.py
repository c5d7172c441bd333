"""A terminal's keys during a session (`so101d record`, `so101d policy start --keys`): raw,
non-blocking input decoded to actions; a USB foot pedal that types keys works the same way.

enter or right arrow = success, ``f`` = failure, backspace = redo (record) or discard (policy),
esc = stop, space or tab = correct / resume (LeRobot's DAgger keys: space pause/resume, tab
correction; one step in so101d, daemon/api/input_actions.py).
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import Any

KEY_SUCCESS, KEY_FAILURE, KEY_REDO, KEY_STOP, KEY_CORRECT = "success", "failure", "redo", "stop", "correct"
RECORD_KEYS = frozenset({KEY_SUCCESS, KEY_FAILURE, KEY_REDO, KEY_STOP})
POLICY_KEYS = RECORD_KEYS | {KEY_CORRECT}


def decode_keys(data: bytes) -> list[str]:
    """Key presses in a chunk of raw terminal input -> session actions."""
    out: list[str] = []
    i = 0
    while i < len(data):
        b = data[i : i + 1]
        if data[i : i + 3] in (b"\x1b[C", b"\x1bOC"):
            out.append(KEY_SUCCESS)
            i += 3
            continue
        if b == b"\x1b":
            nxt = data[i + 1 : i + 2]
            if nxt in (b"[", b"O"):  # another escape sequence (F1 is ESC O P): skip it whole
                j = i + 2
                while j < len(data) and not (0x40 <= data[j] <= 0x7E):  # up to its final byte
                    j += 1
                i = j + 1
                continue
            if nxt:  # Alt+key arrives as ESC then the key, in one read: not esc
                i += 2
                continue
            out.append(KEY_STOP)
        elif b in (b"\r", b"\n"):
            out.append(KEY_SUCCESS)
        elif b in (b"f", b"F"):
            out.append(KEY_FAILURE)
        elif b in (b"\x7f", b"\x08"):
            out.append(KEY_REDO)
        elif b in (b" ", b"\t"):  # LeRobot's DAgger keys: space pause/resume, tab correction
            out.append(KEY_CORRECT)
        i += 1
    return out


class Keys:
    """Raw, non-blocking terminal input while the session runs (restored on exit)."""

    def __init__(self, enabled: bool, accept: frozenset[str] = RECORD_KEYS) -> None:
        self.enabled = enabled and sys.stdin.isatty()
        self.accept = accept  # the session's keys; any other is ignored
        self._saved: Any = None
        self._pending: list[str] = []  # keys read together with an earlier one (fast typing)

    def __enter__(self) -> Keys:
        if self.enabled:
            import termios
            import tty

            self._saved = termios.tcgetattr(sys.stdin.fileno())
            tty.setcbreak(sys.stdin.fileno())
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._saved is not None:
            import termios

            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self._saved)

    def wait(self, seconds: float) -> str | None:
        """Sleeps up to ``seconds``; returns the first action key pressed, if any."""
        if self._pending:
            return self._pending.pop(0)
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not self.enabled:
                time.sleep(min(left, 0.2))
                continue
            r, _, _ = select.select([sys.stdin], [], [], min(left, 0.2))
            if r:
                keys = [k for k in decode_keys(os.read(sys.stdin.fileno(), 64)) if k in self.accept]
                if keys:
                    self._pending.extend(keys[1:])
                    return keys[0]
