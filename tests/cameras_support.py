"""Camera sources OpenCV really opens, for driving LeRobot's OpenCV camera without a camera.

``PipeCamera`` is a named pipe fed with a YUV4MPEG2 stream at a set rate by a child process: like
a V4L2 node, it can be opened again and again (each reader gets a fresh stream, header first), its
header says the rate the "camera" negotiated while the feeder sets the rate it really delivers,
and ``unplug()`` (SIGKILL the feeder, remove the path: the by-id link disappearing) / ``replug()``
model a USB camera pulled and put back. Run as a script, this file is the feeder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class PipeCamera:
    path: Path
    width: int = 320
    height: int = 240
    header_fps: int = 30  # what the stream says (CAP_PROP_FPS)
    rate_fps: float = 30.0  # what the feeder really delivers
    proc: subprocess.Popen[bytes] | None = None

    def plug(self) -> PipeCamera:
        os.mkfifo(self.path)
        return self.resume_writer()

    def resume_writer(self) -> PipeCamera:
        """A feeder on the pipe already at ``path`` (after ``stop_writer``)."""
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                str(self.path),
                str(self.width),
                str(self.height),
                str(self.header_fps),
                str(self.rate_fps),
            ],
            start_new_session=True,
        )
        return self

    def stop_writer(self) -> None:
        """The feeder killed, the pipe left at its path: nothing writes to it any more."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def freeze(self) -> None:
        """The feeder stopped (SIGSTOP), the pipe open: a camera that stops sending, still plugged in."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def unplug(self) -> None:
        self.stop_writer()
        self.path.unlink(missing_ok=True)

    replug = plug


def _open_for_reader(path: str, parent_pid: int) -> int:
    """The pipe opened for writing once a reader has it open; exits when the test is gone."""
    while True:
        if os.getppid() != parent_pid:
            sys.exit(0)  # the test process died: no orphan left feeding nobody
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet; ENOENT: unplugged under us
            time.sleep(0.02)
            continue
        os.set_blocking(fd, True)
        return fd


def serve(path: str, width: int, height: int, header_fps: int, rate_fps: float) -> None:
    """Every reader that opens ``path`` gets a stream; a reader that closes ends only its stream."""
    parent = os.getppid()
    uv = np.full(width * height // 2, 128, np.uint8).tobytes()
    while True:
        fd = _open_for_reader(path, parent)
        try:
            with os.fdopen(fd, "wb", buffering=0) as f:
                f.write(f"YUV4MPEG2 W{width} H{height} F{header_fps}:1 Ip A1:1 C420jpeg\n".encode())
                t0 = time.monotonic()
                i = 0
                while True:
                    y = np.full((height, width), (i * 8) % 256, np.uint8)
                    f.write(b"FRAME\n" + y.tobytes() + uv)
                    i += 1
                    delay = t0 + i / rate_fps - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
        except BrokenPipeError:
            continue  # that reader went away; wait for the next one


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
