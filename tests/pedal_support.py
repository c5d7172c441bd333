"""A foot pedal on the bench, for the fake ``evdev`` (tests/fixtures/sdk/evdev, on the path).

The pedal's input device is a named pipe at the path the configuration names (LeRobot's
by-id name, under a temporary /dev/input); pressing writes the events a USB foot switch sends
(key down, sync, key up, sync: ``struct input_event`` records), unplugging removes the node and
closes the pedal's end, as udev and the kernel do.
"""

from __future__ import annotations

import os
import select
import struct
import time
from pathlib import Path

from evdev import ecodes  # the fake

EVENT = struct.Struct("llHHi")  # struct input_event on 64-bit Linux


class VirtualPedal:
    def __init__(self, root: Path) -> None:
        self.path = root / "dev" / "input" / "by-id" / "usb-PCsensor_FootSwitch-event-kbd"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None

    def plug(self) -> None:
        """The node appears (the daemon may open it from now on)."""
        os.mkfifo(self.path)

    def connect(self) -> None:
        """The pedal's side of the device: call once the daemon has opened it (it blocks until then)."""
        self._fd = os.open(self.path, os.O_WRONLY)

    def press(self, key: str) -> None:
        self.press_codes(ecodes.ecodes[key])

    def press_codes(self, *codes: int) -> None:
        """Each code pressed and released, in order, in one write (one read on the daemon's side)."""
        assert self._fd is not None, "connect() first"
        now = time.time()
        sec, usec = int(now), int((now % 1) * 1e6)
        down_up = b"".join(
            EVENT.pack(sec, usec, t, c, v)
            for code in codes
            for t, c, v in (
                (ecodes.EV_KEY, code, 1),
                (ecodes.EV_SYN, ecodes.SYN_REPORT, 0),
                (ecodes.EV_KEY, code, 0),
                (ecodes.EV_SYN, ecodes.SYN_REPORT, 0),
            )
        )
        os.write(self._fd, down_up)  # 96 bytes a code: one atomic pipe write (up to 42 codes)

    def unplug(self) -> None:
        """udev removes the node, then the device is gone (reads fail)."""
        self.path.unlink(missing_ok=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class PtyOutput:
    """What a program on a pseudo-terminal has printed (its master side), read as it comes."""

    def __init__(self, master_fd: int) -> None:
        self.fd = master_fd
        self.text = ""

    def wait_for(self, words: str, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while words not in self.text:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{words!r} never printed; the terminal shows: {self.text[-2000:]!r}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if ready:
                try:
                    self.text += os.read(self.fd, 4096).decode(errors="replace")
                except OSError:  # the program closed its side
                    raise AssertionError(
                        f"{words!r} never printed; the terminal shows: {self.text[-2000:]!r}"
                    ) from None
