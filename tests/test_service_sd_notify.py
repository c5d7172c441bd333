"""sd_notify protocol against a fake NOTIFY_SOCKET (a datagram socket this test reads)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from daemon.system.sd_notify import Notifier, ServiceStatus, StatusReporter, WatchdogGate


class FakeSystemd:
    """Receiving end of NOTIFY_SOCKET: a bound AF_UNIX datagram socket."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(2.0)

    def recv(self) -> list[str]:
        return self.sock.recv(4096).decode().split("\n")

    def recv_all(self, quiet_s: float = 0.05) -> list[list[str]]:
        out = []
        self.sock.settimeout(quiet_s)
        try:
            while True:
                out.append(self.sock.recv(4096).decode().split("\n"))
        except TimeoutError:
            pass
        finally:
            self.sock.settimeout(2.0)
        return out

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def fake_path_socket(tmp_path: Path):
    path = str(tmp_path / "notify.sock")
    fake = FakeSystemd(path)
    yield path, fake
    fake.close()


def test_disabled_without_notify_socket_is_a_noop() -> None:
    n = Notifier.from_env({})
    assert not n.enabled
    assert n.watchdog_period_s is None
    assert n.ready() is False and n.watchdog() is False and n.status("x") is False
    gate = WatchdogGate(n)
    assert gate.progress() is False


def test_ready_status_stopping_over_a_path_socket(fake_path_socket) -> None:
    path, fake = fake_path_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready(status="teleop, loop 60.0 Hz")
    msg = fake.recv()
    assert msg[0] == "READY=1"
    assert f"MAINPID={os.getpid()}" in msg
    assert "STATUS=teleop, loop 60.0 Hz" in msg
    assert n.status("multi\nline   text")
    assert fake.recv() == ["STATUS=multi line text"]
    assert n.stopping("saving episode")
    assert fake.recv() == ["STOPPING=1", "STATUS=saving episode"]
    assert n.extend_timeout(2.5)
    assert fake.recv() == ["EXTEND_TIMEOUT_USEC=2500000"]


def test_reloading_carries_monotonic_usec(fake_path_socket) -> None:
    path, fake = fake_path_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    n.reloading()
    msg = fake.recv()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert msg[0] == "RELOADING=1"
    usec = int(msg[1].removeprefix("MONOTONIC_USEC="))
    assert before <= usec <= after


def test_abstract_socket_address() -> None:
    name = f"so101d-test-{os.getpid()}-{time.monotonic_ns()}"
    fake = FakeSystemd("\0" + name)
    try:
        n = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert n.enabled
        assert n.watchdog()
        assert fake.recv() == ["WATCHDOG=1"]
    finally:
        fake.close()


def test_watchdog_usec_and_pid(fake_path_socket) -> None:
    path, _ = fake_path_socket
    assert Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000"}).watchdog_period_s == 3.0
    mine = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier.from_env(mine).watchdog_period_s == 3.0
    # A watchdog armed for another process (our parent) is not ours to pet.
    other = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert Notifier.from_env(other).watchdog_period_s is None
    assert Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "junk"}).watchdog_period_s is None
    assert Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "0"}).watchdog_period_s is None


def test_bad_socket_value_and_vanished_socket_do_not_raise(tmp_path: Path) -> None:
    assert not Notifier.from_env({"NOTIFY_SOCKET": "relative/path"}).enabled
    n = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})
    assert n.enabled
    assert n.ready() is False  # logged, not raised
    assert n.failed_count == 1
    # The socket appears later (systemd re-exec): the notifier recovers.
    fake = FakeSystemd(str(tmp_path / "nobody-listens.sock"))
    try:
        assert n.status("back")
        assert fake.recv() == ["STATUS=back"]
    finally:
        fake.close()


def test_newline_injection_rejected(fake_path_socket) -> None:
    path, _ = fake_path_socket
    with pytest.raises(ValueError):
        Notifier.from_env({"NOTIFY_SOCKET": path}).notify("STATUS=a\nREADY=1")


def test_unset_environment_hides_socket_from_children(fake_path_socket, monkeypatch) -> None:
    path, fake = fake_path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    n = Notifier.from_env(unset_environment=True)
    assert n.enabled and n.watchdog_period_s == 2.0
    assert "NOTIFY_SOCKET" not in os.environ and "WATCHDOG_USEC" not in os.environ
    n.ready()
    assert fake.recv()[0] == "READY=1"


def test_gate_rate_limits_pets_to_half_period(fake_path_socket) -> None:
    path, fake = fake_path_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"})
    gate = WatchdogGate(n)
    sent = [gate.progress(now_s=t / 100) for t in range(0, 201)]  # 100 Hz loop for 2 s
    # Pets at t = 0, 0.5, 1.0, 1.5, 2.0 s: twice per 1 s period, never every cycle.
    assert sum(sent) == 5
    assert fake.recv_all() == [["WATCHDOG=1"]] * 5


def test_stalled_loop_stops_the_pets(fake_path_socket) -> None:
    path, fake = fake_path_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"})
    gate = WatchdogGate(n)
    assert gate.progress(now_s=0.0)
    # The loop stalls at t = 0.1; a side thread asks to pet every 0.1 s: only while alive.
    gate.progress(now_s=0.1)
    side = [gate.pet_if_alive(now_s=0.1 * k) for k in range(2, 30)]
    assert sum(side) == 1  # t = 0.5 s, loop last seen 0.4 s earlier: still alive
    assert gate.stalled_for_s(now_s=2.9) == pytest.approx(2.8)
    assert gate.withheld > 0
    assert fake.recv_all() == [["WATCHDOG=1"]] * 2
    # An unhealthy but spinning loop does not pet either.
    assert gate.progress(now_s=5.0, healthy=False) is False
    assert fake.recv_all() == []


def test_stalled_thread_loop_observed_on_the_socket(fake_path_socket) -> None:
    """A real thread loop with an injected stall: pings arrive, stop during the stall, resume."""
    path, fake = fake_path_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})  # 0.2 s -> pet every 0.1 s
    gate = WatchdogGate(n)
    stall = threading.Event()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            if stall.is_set():
                time.sleep(0.01)  # wedged: no progress marks
                continue
            gate.progress()
            time.sleep(0.01)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        first = fake.recv()
        assert first == ["WATCHDOG=1"]
        stall.set()
        time.sleep(0.15)  # let a pet already in flight land
        fake.recv_all(quiet_s=0.05)
        assert fake.recv_all(quiet_s=0.6) == []  # three periods of silence while stalled
        stall.clear()
        assert fake.recv() == ["WATCHDOG=1"]
    finally:
        stop.set()
        t.join(2)


def test_status_reporter_formats_and_limits(fake_path_socket) -> None:
    path, fake = fake_path_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    rep = StatusReporter(n, min_interval_s=1.0)
    st = ServiceStatus(mode="teleop", loop_hz=59.94, episodes=3, recording=True)
    assert st.line() == "teleop, loop 59.9 Hz, 3 episodes, recording"
    assert rep.update(st, now_s=0.0)
    assert not rep.update(st, now_s=5.0)  # unchanged text: nothing sent
    assert rep.update(ServiceStatus(mode="teleop", loop_hz=59.94, episodes=4), now_s=5.1)
    st2 = ServiceStatus(mode="hold", loop_hz=60.0, episodes=1)
    assert not rep.update(st2, now_s=5.5)  # changed, but too soon after the last
    assert rep.update(st2, now_s=6.2)
    assert rep.update("waiting for follower on /dev/so101-follower", force=True, now_s=6.3)
    assert fake.recv_all() == [
        ["STATUS=teleop, loop 59.9 Hz, 3 episodes, recording"],
        ["STATUS=teleop, loop 59.9 Hz, 4 episodes"],
        ["STATUS=hold, loop 60.0 Hz, 1 episode"],
        ["STATUS=waiting for follower on /dev/so101-follower"],
    ]


def test_full_queue_never_blocks_the_watchdog_pet(fake_path_socket) -> None:
    """systemd not reading: pets from the loop are dropped at once, others wait at most wait_s."""
    path, fake = fake_path_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"})
    t0 = time.monotonic()
    results = [n.watchdog() for _ in range(200)]  # far more than the ~10-datagram queue
    assert time.monotonic() - t0 < 1.0
    assert results[0] and not all(results)
    assert n.dropped_count == results.count(False) > 0
    t0 = time.monotonic()
    assert n.notify("READY=1", wait_s=0.2) is False
    assert time.monotonic() - t0 >= 0.15
    fake.recv_all()  # systemd catches up: sending works again
    assert n.ready()
    assert fake.recv()[0] == "READY=1"
