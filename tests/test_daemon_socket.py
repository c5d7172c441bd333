"""Control socket: registry, bad requests answered without disturbing anything, permissions."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from daemon.control_client import CommandFailed, ControlClient, DaemonUnavailable
from daemon.control_socket import ControlServer, RequestError, SocketInUseError


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
        assert c.request("echo", x=[1, 2]) == {"ok": True, "echo": [1, 2]}
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
        (b'{"x": 1}\n', "missing \"cmd\""),
        (b'{"cmd": 5}\n', "missing \"cmd\""),
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
        except Exception as exc:  # noqa: BLE001
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
