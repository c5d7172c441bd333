"""Hold is always reachable on a real `so101d run`: after every poison line an attacker in the
socket's group can send, a fresh connection's `hold` still holds; and SIGUSR1 (what
`systemctl kill --signal=SIGUSR1 so101d` sends) holds without the control socket at all."""

from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from security_support import running_daemon
from support import wait_status
from test_daemon_socket_poison import POISON

from daemon.api.client import ControlClient


@pytest.fixture
def daemon() -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    with tempfile.TemporaryDirectory(prefix="so101d-") as d, running_daemon(Path(d)) as bench:
        yield bench


def test_after_every_poison_line_a_fresh_connection_still_holds(daemon: tuple[Path, subprocess.Popen[str]]) -> None:
    sock, proc = daemon
    for line in POISON:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(sock))
            s.sendall(line + b"\n")
            assert b'"ok":false' in s.recv(65536), line[:40]
    with ControlClient(sock, timeout_s=5) as c:
        assert c.request("hold")["mode"] == "hold"
        st = c.request("status")
    assert st["control_socket"]["serving"] is True and st["control_socket"]["thread_restarts"] == 0
    assert st["control_socket"]["errors"] >= len(POISON)
    assert proc.poll() is None


def test_sigusr1_holds_without_the_control_socket(daemon: tuple[Path, subprocess.Popen[str]]) -> None:
    sock, proc = daemon
    proc.send_signal(signal.SIGUSR1)
    wait_status(sock, lambda s: s["mode"] == "hold", proc=proc)
    assert proc.poll() is None  # a hold, not a stop
    with ControlClient(sock, timeout_s=5) as c:  # the operator resumes as usual
        assert c.request("teleop.start")["ok"] is True
    wait_status(sock, lambda s: s["mode"] == "teleop", proc=proc)
    proc.terminate()
    assert proc.wait(30) == 0
    assert proc.stderr is not None and "SIGUSR1: holding" in proc.stderr.read()


def test_after_torque_off_hold_says_the_arm_is_limp(daemon: tuple[Path, subprocess.Popen[str]]) -> None:
    """hold does not stiffen an arm whose torque was switched off, so its reply must not say
    "holding" (and SIGUSR1's log line neither)."""
    sock, proc = daemon
    with ControlClient(sock, timeout_s=5) as c:
        assert c.request("torque.off")["mode"] == "idle"
        for verb in ("hold", "teleop.stop"):
            reply = c.request(verb)
            assert reply["mode"] == "idle"
            assert "holding" not in reply["message"] and "torque is off" in reply["message"], reply
    proc.send_signal(signal.SIGUSR1)
    wait_status(sock, lambda s: s["intent"] == "hold" and s["mode"] == "idle", proc=proc)
    proc.terminate()
    assert proc.wait(30) == 0
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert "SIGUSR1: torque is off" in log and "SIGUSR1: holding" not in log
