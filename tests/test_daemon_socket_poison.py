"""The control socket survives any bytes: the lines an outside security test sent to silence it
(a list or an object where the verb's name goes, a 5000-digit number, an array nested 5000 deep)
each get an error reply on their own connection, and every other client, the operator's Hold
first, is still answered. Fields of the wrong type are refused naming the field; a selector
thread that ends anyway is noticed and restarted."""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

from daemon.api.client import ControlClient
from daemon.api.server import ControlServer

POISON = [
    b'{"cmd":{"a":1}}',
    b'{"cmd":["hold"]}',
    b'{"cmd":"hold","x":' + b"9" * 5000 + b"}",
    b'{"cmd":' + b"[" * 5000 + b"]" * 5000 + b"}",
    b"[" * 5000 + b"]" * 5000,
    b"{" * 5000,
    b'{"cmd":"hold","a":' + b'{"b":' * 3000 + b"1" + b"}" * 3000 + b"}",
    b'{"cmd":"status","v":1e999}',
    b'{"cmd":"status","v":NaN}',
    b'{"cmd":"\xff\xfe"}',
    b'"' * 4000,
    b'\\"' * 2000,
]


@pytest.fixture
def server() -> Iterator[ControlServer]:
    with tempfile.TemporaryDirectory(prefix="so101d-") as d:
        srv = ControlServer(Path(d) / "control.sock", max_request_bytes=65536)
        holds: list[dict[str, object]] = []
        srv.register("hold", lambda req: holds.append(req) or {"message": "holding"})
        srv.register("policy.load", lambda req: {"path": req.get("path"), "wait_s": req.get("wait_s")})
        srv.register("episode.save", lambda req: {"success": req.get("success")})
        srv.holds = holds  # type: ignore[attr-defined]
        srv.start()
        yield srv
        srv.stop()


def _raw(path: Path, line: bytes) -> bytes:
    """One line on a fresh connection; the reply line as bytes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(line + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, f"connection closed without a reply to {line[:40]!r}"
            buf += chunk
        return buf


@pytest.mark.parametrize("line", POISON, ids=lambda b: repr(b[:24]))
def test_a_poison_line_gets_an_error_reply_and_hold_still_works(server: ControlServer, line: bytes) -> None:
    reply = _raw(server.path, line)
    assert b'"ok":false' in reply, reply[:200]
    assert len(reply) < 2000  # the error does not echo the attack back
    # the same connection would be usable; a fresh one (the operator's Hold) certainly is
    with ControlClient(server.path, timeout_s=5) as c:
        assert c.request("hold")["message"] == "holding"
        assert c.request("ping")["pong"] is True
    assert server.serving()


def test_all_poison_lines_pipelined_on_one_connection_then_hold(server: ControlServer) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(server.path))
        s.sendall(b"\n".join(POISON) + b'\n{"cmd":"hold"}\n')
        buf = b""
        while buf.count(b"\n") < len(POISON) + 1:
            chunk = s.recv(65536)
            assert chunk, buf
            buf += chunk
    lines = buf.splitlines()
    assert all(b'"ok":false' in ln for ln in lines[:-1]), lines
    assert b'"ok":true' in lines[-1] and len(server.holds) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        ({"cmd": "policy.load", "path": ["/etc"]}, 'policy.load: "path" must be text, got an array'),
        ({"cmd": "policy.load", "path": "/x", "wait_s": "10"}, '"wait_s" must be a number, got text'),
        ({"cmd": "policy.load", "path": "/x", "wait_s": 1e9}, '"wait_s" must be from 0 to 600'),
        ({"cmd": "episode.save", "success": "yes"}, '"success" must be true or false, got text'),
        ({"cmd": "episode.save", "sucess": True}, "unknown field(s) sucess"),
        ({"cmd": "hold", "force": {"a": 1}}, "hold: unknown field(s) force (it takes no fields)"),
        ({"cmd": 5}, 'missing "cmd" (a string naming the verb), got a number'),
    ],
)
def test_fields_of_the_wrong_type_are_refused_naming_the_field(
    server: ControlServer, request_: dict[str, object], needle: str
) -> None:
    with ControlClient(server.path, timeout_s=5) as c:
        reply = c.send_raw((json.dumps(request_) + "\n").encode())
    assert reply["ok"] is False and needle in reply["error"], reply
    with ControlClient(server.path, timeout_s=5) as c:  # and what is right still goes through
        assert c.request("policy.load", path="/x", wait_s=2)["wait_s"] == 2


def test_a_selector_thread_that_ends_anyway_is_restarted_and_counted(server: ControlServer) -> None:
    # The thread's own machinery failing (not any one client): its selector raises.
    sel = server._selector
    assert sel is not None

    def broken_select(timeout: float | None = None) -> list[object]:
        raise OSError("selector broke")

    sel.select = broken_select  # type: ignore[method-assign]
    with ControlClient(server.path, timeout_s=5):
        pass  # (a connect wakes nothing: the thread breaks at its next select anyway)
    wait_for(lambda: not server.serving(), timeout_s=10, what="the selector thread to end")
    assert server.health()["serving"] is False
    assert server.ensure_serving() is True
    assert server.ensure_serving() is False  # once
    with ControlClient(server.path, timeout_s=5) as c:
        assert c.request("hold")["message"] == "holding"
    h = server.health()
    assert h["serving"] is True and h["thread_restarts"] == 1 and "selector broke" in h["last_thread_failure"]
