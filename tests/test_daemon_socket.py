"""Control socket: registry, bad requests answered without disturbing anything, permissions, and
no lock-out: leaked connections evicted oldest-first, bounded memory per client, slow verbs off
the selector thread, the client retrying a full listen backlog (issue 12)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from support import poll_until, wait_for

from daemon.api.client import CommandFailed, ControlClient, DaemonUnavailable
from daemon.api.messages import API_VERSION
from daemon.api.server import ControlServer, RequestError, SocketInUseError


@pytest.fixture
def sock_dir():
    # AF_UNIX paths are limited to ~107 bytes: keep it short
    with tempfile.TemporaryDirectory(prefix="so101d-") as d:
        yield Path(d)


@pytest.fixture
def server(sock_dir):
    srv = ControlServer(sock_dir / "run" / "control.sock", mode=0o660, max_request_bytes=1024)
    calls = []

    def echo(req):
        calls.append(req)
        return {"echo": req.get("x")}

    def refuse(req):
        raise RequestError("not now")

    def broken(req):
        raise ZeroDivisionError("boom")

    srv.register("echo", echo)
    srv.register("refuse", refuse)
    srv.register("broken", broken)
    srv.start()
    srv.calls = calls
    yield srv
    srv.stop()


def test_socket_file_mode_and_cleanup(server):
    st = os.stat(server.path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    server.stop()
    assert not server.path.exists()


def test_registered_verbs_and_replies(server):
    with ControlClient(server.path) as c:
        assert c.request("echo", x=[1, 2]) == {"ok": True, "api_version": API_VERSION, "echo": [1, 2]}
        assert c.request("ping")["pong"] is True
        assert "echo" in c.request("help")["verbs"]
        with pytest.raises(CommandFailed, match="not now"):
            c.request("refuse")
        r = c.call("broken")
        assert r["ok"] is False and "ZeroDivisionError" in r["error"]
        # the same connection still works after errors
        assert c.request("echo", x=3)["echo"] == 3


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json\n", "malformed"),
        (b"\xff\xfe\n", "malformed"),
        (b"[1,2]\n", "JSON object"),
        (b'{"x": 1}\n', 'missing "cmd"'),
        (b'{"cmd": 5}\n', 'missing "cmd"'),
        (b'{"cmd": "launch.missiles"}\n', "unknown command"),
    ],
)
def test_bad_requests_get_error_replies_and_connection_survives(server, raw, needle):
    with ControlClient(server.path) as c:
        r = c.send_raw(raw)
        assert r["ok"] is False and needle in r["error"]
        assert c.request("echo", x="after")["echo"] == "after"


def test_oversized_request_rejected_and_server_keeps_serving(server):
    with ControlClient(server.path) as c:
        r = c.send_raw(b'{"cmd": "echo", "x": "' + b"a" * 5000 + b'"}\n')
        assert r["ok"] is False and "too large" in r["error"]
    # without a newline at all
    with ControlClient(server.path) as c:
        r = c.send_raw(b"a" * 4000)
        assert r["ok"] is False and "too large" in r["error"]
    with ControlClient(server.path) as c:
        assert c.request("echo", x=1)["echo"] == 1
    assert all(len(json.dumps(call)) < 1024 for call in server.calls)


def test_duplicate_verb_refused(server):
    with pytest.raises(ValueError, match="already registered"):
        server.register("echo", lambda r: {})


def test_many_concurrent_clients(server):
    errors = []

    def worker(i):
        try:
            with ControlClient(server.path) as c:
                for j in range(20):
                    assert c.request("echo", x=[i, j])["echo"] == [i, j]
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_stale_socket_replaced_live_one_refused(sock_dir):
    path = sock_dir / "c.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # file remains, nobody listens
    srv = ControlServer(path)
    srv.start()
    try:
        with pytest.raises(SocketInUseError, match="another running daemon"):
            ControlServer(path).start()
    finally:
        srv.stop()
    path.write_text("not a socket")
    with pytest.raises(SocketInUseError, match="not a socket"):
        ControlServer(path).start()


def test_client_without_daemon(sock_dir):
    with pytest.raises(DaemonUnavailable, match="no daemon socket"):
        ControlClient(sock_dir / "nothing.sock").connect()


# ---------------------------------------------------------------------------------------------
# Operator lock-out (issue 12): a client that leaks connections, floods bytes, never reads its
# replies or asks a slow verb must not keep anyone else from being answered.
# ---------------------------------------------------------------------------------------------
def _raw_connect(path: Path, timeout_s: float = 5.0) -> socket.socket:
    """A bare connection, as a leaking script makes one (retrying a momentarily full backlog)."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            s.connect(str(path))
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _read_line(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def _closed_by_server(s: socket.socket, timeout_s: float = 5.0) -> bool:
    """True when the server closed ``s`` (whatever it said first), False if it stays open."""
    s.settimeout(timeout_s)
    try:
        while s.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:  # reset: closed too
        return True


def test_leaked_connections_evict_the_oldest_idle_one_never_the_new_one(sock_dir):
    srv = ControlServer(sock_dir / "c.sock", max_connections=8)
    srv.start()
    leaked: list[socket.socket] = []
    try:
        for _i in range(8):
            s = _raw_connect(srv.path)
            s.sendall(b'{"cmd": "ping"}\n')  # answered: the server holds it
            assert json.loads(_read_line(s))["pong"] is True
            leaked.append(s)
        # the first one stays busy talking: the oldest *idle* one is now leaked[1]
        leaked[0].sendall(b'{"cmd": "ping"}\n')
        assert json.loads(_read_line(leaked[0]))["ok"] is True
        with ControlClient(srv.path, timeout_s=2) as operator:
            assert operator.request("ping")["pong"] is True
        assert _closed_by_server(leaked[1]), "the oldest idle connection was kept"
        for s in [leaked[0], *leaked[2:]]:
            assert not _closed_by_server(s, timeout_s=0.05), "a younger connection was evicted"
        assert srv.evictions == 1
        # an operator always gets through, however many connections keep leaking
        for _ in range(30):
            leaked.append(_raw_connect(srv.path))
        t0 = time.monotonic()
        with ControlClient(srv.path, timeout_s=2) as operator:
            assert operator.request("ping")["pong"] is True
        assert time.monotonic() - t0 < 1.0
        assert srv.connection_count() <= 8
    finally:
        for s in leaked:
            s.close()
        srv.stop()


def test_evicted_client_is_told_why(sock_dir):
    srv = ControlServer(sock_dir / "c.sock", max_connections=2)
    srv.start()
    try:
        first = _raw_connect(srv.path)
        first.sendall(b'{"cmd": "ping"}\n')
        _read_line(first)
        second = _raw_connect(srv.path)
        second.sendall(b'{"cmd": "ping"}\n')
        _read_line(second)
        with ControlClient(srv.path, timeout_s=2) as c:
            c.request("ping")
        r = json.loads(_read_line(first))
        assert r["ok"] is False and "evicted" in r["error"] and "2 connections" in r["error"]
        second.close()
        first.close()
    finally:
        srv.stop()


def test_ten_megabytes_without_newline_get_an_error_and_memory_stays_bounded(server):
    chunk = b"a" * 65536
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        s = _raw_connect(server.path)
        sent = 0
        try:
            while sent < 10 * 1024 * 1024:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the server closed its end once the limit was passed: it reads no more
        reply = _read_line(s)
        assert _closed_by_server(s)
        s.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    r = json.loads(reply)
    assert r["ok"] is False and "too large" in r["error"]
    assert sent < 10 * 1024 * 1024, "the server kept reading a request it had refused"
    # the server held at most one request's worth (1 KiB limit here) plus one read
    assert peak - base < 512 * 1024, f"memory grew by {(peak - base) / 1024:.0f} KiB"
    with ControlClient(server.path) as c:
        assert c.request("echo", x=1)["echo"] == 1


def test_client_that_never_reads_its_replies_costs_bounded_memory(server):
    """Requests keep coming, replies are never read: once the kernel's buffers hold what the
    client left unread, the server stops taking its requests (one reply waits, no more) instead
    of queueing replies without end, and answers everyone else."""
    greedy = _raw_connect(server.path)
    greedy.setblocking(False)
    line = b'{"cmd": "help"}\n'
    sent = 0

    def server_stopped_taking_requests() -> bool:
        nonlocal sent
        try:
            sent += greedy.send(line * 100)
        except BlockingIOError:
            pass
        before = server.requests
        time.sleep(0.3)
        return server.requests == before

    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        poll_until(server_stopped_taking_requests, timeout_s=30, period_s=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert server_stopped_taking_requests(), "the server kept answering a client that never reads"
    assert server.requests < sent // len(line), "every request taken: nothing pushed back"
    assert peak - base < 512 * 1024, f"memory grew by {(peak - base) / 1024:.0f} KiB"
    with ControlClient(server.path, timeout_s=2) as c:
        assert c.request("echo", x="others")["echo"] == "others"
    greedy.close()


def test_slow_verbs_never_keep_status_from_answering(sock_dir):
    srv = ControlServer(sock_dir / "c.sock")
    release = threading.Event()
    started = threading.Semaphore(0)

    def slow(req):  # e.g. policy.load with wait_s, episode.save of a long episode
        started.release()
        release.wait(20)
        return {"waited": True}

    srv.register("slow", slow)
    srv.register("status", lambda req: {"mode": "teleop"})
    srv.register("torque.off", lambda req: {"mode": "idle"})
    srv.start()
    replies: list[dict] = []
    slow_clients = [
        threading.Thread(target=lambda: replies.append(ControlClient(srv.path, timeout_s=30).call("slow")))
        for _ in range(12)
    ]
    try:
        for t in slow_clients:
            t.start()
        assert started.acquire(timeout=10)  # at least one slow verb is running
        time.sleep(0.2)  # the rest are queued behind it
        t0 = time.monotonic()
        with ControlClient(srv.path, timeout_s=2) as c:
            assert c.request("status")["mode"] == "teleop"
            assert c.request("torque.off")["mode"] == "idle"
        assert time.monotonic() - t0 < 1.0
    finally:
        release.set()
        for t in slow_clients:
            t.join(30)
        srv.stop()
    assert len(replies) == 12 and all(r == {"ok": True, "api_version": API_VERSION, "waited": True} for r in replies)


def test_a_request_interrupted_by_ctrl_c_leaves_no_reply_for_the_next_one(sock_dir):
    """Ctrl-C lands while the client waits for a reply (LeRobot's robot_client stopped mid
    send_action); the request after it, on the same ControlClient (the plugin's arm.release in
    LeRobot's finally), gets its own reply, not the one still on its way."""
    srv = ControlServer(sock_dir / "c.sock")
    answer = threading.Event()

    def slow(req):
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, while the client waits
        answer.wait(20)
        return {"slow": True}

    srv.register("slow", slow)
    srv.register("echo", lambda req: {"echo": req.get("x")})
    srv.start()
    try:
        with ControlClient(srv.path, timeout_s=10) as c:
            with pytest.raises(KeyboardInterrupt):
                c.request("slow")
            answer.set()  # the interrupted request's reply now arrives
            assert c.request("echo", x=2)["echo"] == 2
    finally:
        answer.set()
        srv.stop()


class _InterruptedAfterSend:
    """A connection whose send delivers the request and then takes the user's Ctrl-C: the signal
    handled at the bytecode after send returned, before the client starts waiting for the reply."""

    def __init__(self, sock) -> None:
        self._sock = sock
        self._interrupted = False

    def send(self, data: bytes) -> int:
        sent = self._sock.send(data)
        if self._interrupted:
            return sent
        self._interrupted = True
        raise KeyboardInterrupt(f"after {sent} bytes were sent")

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


def test_a_ctrl_c_just_after_the_request_was_sent_leaves_no_reply_for_the_next_one(sock_dir):
    srv = ControlServer(sock_dir / "c.sock")
    srv.register("echo", lambda req: {"echo": req.get("x")})
    srv.start()
    try:
        with ControlClient(srv.path, timeout_s=10) as c:
            real = c._sock
            c._sock = _InterruptedAfterSend(real)
            with pytest.raises(KeyboardInterrupt):
                c.request("echo", x=1)
            assert c.request("echo", x=2)["echo"] == 2, "the next request read the interrupted one's reply"
            real.close()
    finally:
        srv.stop()


def test_pipelined_requests_are_answered_in_order(server):
    s = _raw_connect(server.path)
    s.sendall(
        b"".join(b'{"cmd": "echo", "x": %d}\n' % i for i in range(50)) + b'{"cmd": "refuse"}\n{"cmd": "echo", "x": 99}'
    )
    s.shutdown(socket.SHUT_WR)  # the last request has no newline: it is still answered
    buf = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    replies = [json.loads(x) for x in buf.splitlines()]
    assert [r.get("echo") for r in replies[:50]] == list(range(50))
    assert replies[50] == {"ok": False, "api_version": API_VERSION, "error": "not now", "field": None}
    assert replies[51] == {"ok": True, "api_version": API_VERSION, "echo": 99}


def test_idle_client_dropped_after_the_idle_timeout(sock_dir):
    srv = ControlServer(sock_dir / "c.sock", idle_timeout_s=0.3)
    srv.start()
    try:
        s = _raw_connect(srv.path)
        s.sendall(b'{"cmd": "ping"}\n')
        _read_line(s)
        assert _closed_by_server(s, timeout_s=5)
        s.close()
    finally:
        srv.stop()


class _StalledListener:
    """A daemon whose socket is momentarily not accepted (its thread busy): a listen backlog of
    one, filled by ``fillers`` connections nobody has accepted yet. ``resume()`` accepts all and
    answers each line with a pong."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(0)
        self.fillers: list[socket.socket] = []
        for _ in range(64):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(str(path))
            except BlockingIOError:
                s.close()
                break
            self.fillers.append(s)
        else:
            raise AssertionError("the listen backlog never filled")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def full(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(self.path))
        except BlockingIOError:
            return True
        finally:
            s.close()
        return False

    def resume(self, after_s: float) -> None:
        def serve() -> None:
            time.sleep(after_s)
            self.sock.settimeout(0.1)
            while not self._stop.is_set():
                try:
                    conn, _ = self.sock.accept()
                except TimeoutError:
                    continue
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                while _read_line(conn):
                    conn.sendall(b'{"ok": true, "api_version": "%s", "pong": true}\n' % API_VERSION.encode())
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for s in self.fillers:
            s.close()
        self.sock.close()


def test_client_retries_a_full_listen_backlog_then_gets_through(sock_dir):
    stalled = _StalledListener(sock_dir / "c.sock")
    try:
        assert stalled.full()
        stalled.resume(after_s=0.4)
        t0 = time.monotonic()
        with ControlClient(stalled.path, timeout_s=5) as c:
            assert c.request("ping")["pong"] is True
        waited = time.monotonic() - t0
        assert 0.3 < waited < 2.5, f"connected after {waited:.2f} s"
    finally:
        stalled.close()


def test_cli_verb_retries_a_full_backlog(sock_dir, capsys):
    from daemon.apps.cli import main

    stalled = _StalledListener(sock_dir / "c.sock")
    try:
        stalled.resume(after_s=0.3)
        assert main(["torque", "off", "--socket", str(stalled.path)]) == 0
    finally:
        stalled.close()
    assert "torque.off: ok" in capsys.readouterr().out


def test_client_gives_up_on_a_backlog_that_stays_full(sock_dir):
    stalled = _StalledListener(sock_dir / "c.sock")
    try:
        t0 = time.monotonic()
        with pytest.raises(DaemonUnavailable, match="not accepting connections"):
            ControlClient(stalled.path, timeout_s=5).connect()
        waited = time.monotonic() - t0
        assert 1.5 < waited < 4.0, f"gave up after {waited:.2f} s"
    finally:
        stalled.close()


_LOW_FD_SERVER = """
import resource, sys, time
from daemon.api.server import ControlServer
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
srv = ControlServer(sys.argv[1], max_connections=10_000)
srv.start()
print("ready", flush=True)
sys.stdin.read()
print("evictions", srv.evictions, flush=True)
srv.stop()
"""


def test_out_of_file_descriptors_evicts_the_oldest_too(sock_dir):
    """A daemon with a low descriptor limit (a unit's LimitNOFILE) runs out before its connection
    limit: the longest-idle connection still makes room for the new one."""
    path = sock_dir / "c.sock"
    child = subprocess.Popen(
        [sys.executable, "-c", _LOW_FD_SERVER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    leaked: list[socket.socket] = []
    try:
        assert child.stdout.readline().strip() == "ready"
        for _ in range(100):  # more than 64 descriptors' worth
            leaked.append(_raw_connect(path))
            leaked[-1].sendall(b'{"cmd": "ping"}\n')
            assert json.loads(_read_line(leaked[-1]))["pong"] is True
        with ControlClient(path, timeout_s=2) as operator:
            assert operator.request("ping")["pong"] is True
        r = json.loads(_read_line(leaked[0]))
        assert r["ok"] is False and "out of file descriptors" in r["error"]
        assert not _closed_by_server(leaked[-1], timeout_s=0.05)
        out, _ = child.communicate("", timeout=20)
    finally:
        for s in leaked:
            s.close()
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    assert int(out.split()[-1]) >= 100 - 64


def test_a_session_left_idle_past_the_timeout_carries_on(sock_dir):
    """`so101d record` between episodes: the daemon closed the silent connection; the next
    request goes through on a fresh one, exactly once."""
    srv = ControlServer(sock_dir / "c.sock", idle_timeout_s=0.3)
    calls = []
    srv.register("episode.start", lambda req: calls.append(req) or {"episode": len(calls)})
    srv.start()
    try:
        with ControlClient(srv.path, timeout_s=2) as c:
            assert c.request("episode.start")["episode"] == 1
            wait_for(lambda: srv.connection_count() == 0, 10, "the idle connection closed")
            assert c.request("episode.start")["episode"] == 2
        assert len(calls) == 2
    finally:
        srv.stop()


def test_an_evicted_session_carries_on(sock_dir):
    srv = ControlServer(sock_dir / "c.sock", max_connections=4)
    srv.start()
    leaked: list[socket.socket] = []
    try:
        with ControlClient(srv.path, timeout_s=2) as dashboard:
            assert dashboard.request("ping")["pong"] is True
            leaked = [_raw_connect(srv.path) for _ in range(6)]  # a script leaks connections
            wait_for(lambda: srv.evictions >= 1, 10, "the dashboard's connection evicted")
            assert dashboard.request("ping")["pong"] is True  # reconnected, nothing lost
    finally:
        for s in leaked:
            s.close()
        srv.stop()
