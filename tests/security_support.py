"""The security tests' bench: a real `so101d run` on emulated arms, a real `so101d console`, and
a second local user made with useradd (we run as root in CI; skipped with the reason elsewhere)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from support import free_port, wait_status

from calibration.calibration_file import save_calibration
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration

INTRUDER = "so101d-intruder"  # the second local user: in no group of ours


@contextlib.contextmanager
def running_daemon(run_dir: Path, extra_toml: str = "") -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """`so101d run` on two emulated arms, following the leader (mode teleop); (socket, process)."""
    cal_root = run_dir / "cal"
    save_calibration(reference_calibration("leader"), "leader", "l1", cal_root)
    save_calibration(reference_calibration("follower"), "follower", "f1", cal_root)
    sock = run_dir / "control.sock"
    cfg = run_dir / "so101d.toml"
    cfg.write_text(
        f'[leader]\nport = "{run_dir / "leader"}"\nid = "l1"\n'
        f'[follower]\nport = "{run_dir / "follower"}"\nid = "f1"\n'
        f'[calibration]\nroot = "{cal_root}"\n[socket]\npath = "{sock}"\n' + extra_toml
    )
    with (
        BusEmulator(run_dir / "leader", EmulatedArm("leader")),
        BusEmulator(run_dir / "follower", EmulatedArm("follower")),
    ):
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", "run", "--config", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_status(sock, lambda s: s["mode"] == "teleop", proc=proc)
            yield sock, proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)


@dataclass
class Console:
    proc: subprocess.Popen[str]
    port: int
    url: str  # as printed (with ?token=... off loopback)
    lines: list[str]


@contextlib.contextmanager
def running_console(sock: Path, *extra: str, bind_host: str = "127.0.0.1") -> Iterator[Console]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "console",
            "--bind",
            f"{bind_host}:{port}",
            "--socket",
            str(sock),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        end = time.monotonic() + 60
        while time.monotonic() < end:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"console exited: {lines}")
            lines.append(line)
            if "so101d console: http://" in line:
                url = line.split("so101d console: ", 1)[1].split()[0]
                yield Console(proc, port, url, lines)
                break
        else:
            raise AssertionError(f"console never printed its address: {lines}")
    finally:
        proc.terminate()
        proc.wait(30)


def intruder() -> tuple[int, int] | None:
    """(uid, gid) of a second local user, made now if missing; None where we cannot."""
    with contextlib.suppress(KeyError):
        pw = pwd.getpwnam(INTRUDER)
        return pw.pw_uid, pw.pw_gid
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return None
    r = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", INTRUDER], capture_output=True)
    if r.returncode not in (0, 9):  # 9: made meanwhile by another test process
        return None
    pw = pwd.getpwnam(INTRUDER)
    return pw.pw_uid, pw.pw_gid


def no_intruder_reason() -> str:
    return "needs root and useradd to make a second local user"


def as_user(uid: int, gid: int, code: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` as another user (no supplementary groups), stdlib only: the system's
    python3 (ours may live under root's home, out of that user's reach)."""
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", python, "-I", "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd="/",
    )
