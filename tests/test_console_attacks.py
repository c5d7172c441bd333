"""The console under attack, on a real daemon (emulated arms, following the leader) and a real
`so101d console` on loopback:

- DNS rebinding: requests and websocket handshakes under a name the console does not answer to
  (raw, and from a real headless Chromium page on evil.example mapped to 127.0.0.1) are refused
  and the arm keeps following the leader;
- a second local user, refused by the control socket, is refused by the console too;
- every websocket message gets a reply, also JSON the console cannot parse;
- replies are remembered per page: another page's request with the same id runs;
- off loopback, a token file others can read is refused, and a fresh ?token= link wins over a
  stale cookie.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from console_support import browser_missing, close_browser, open_browser
from security_support import as_user, intruder, no_intruder_reason, running_console, running_daemon
from support import free_port, wait_status

from daemon.api.client import ControlClient


@pytest.fixture(scope="module")
def daemon() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="so101d-") as d, running_daemon(Path(d)) as (sock, _proc):
        yield sock


@pytest.fixture(scope="module")
def console(daemon: Path) -> Iterator[Any]:
    with running_console(daemon, "--allow-host", "bench.lan") as c:
        yield c


@pytest.fixture
def teleop(daemon: Path) -> Path:
    """The arm following the leader again before each attack (so a Hold that got through shows)."""
    with ControlClient(daemon) as c:
        if c.request("status")["mode"] != "teleop":
            c.request("teleop.start")
    wait_status(daemon, lambda s: s["mode"] == "teleop")
    return daemon


def _still_following(sock: Path) -> bool:
    with ControlClient(sock) as c:
        return c.request("status")["mode"] in ("teleop", "aligning")


def _http(port: int, path: str, host: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


_WS_HEADERS = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


@pytest.mark.parametrize("path", ["/", "/api/health", "/api/episodes", "/static/app.js"])
def test_requests_under_a_foreign_name_are_refused_421(console: Any, path: str) -> None:
    status, body = _http(console.port, path, f"evil.example:{console.port}")
    assert status == 421 and "not served under the name" in body, (status, body[:200])
    assert _http(console.port, path, "")[0] == 421  # no name at all
    # its own names are served
    for host in (f"127.0.0.1:{console.port}", f"localhost:{console.port}", f"bench.lan:{console.port}"):
        assert _http(console.port, "/api/health", host)[0] == 200, host


@pytest.mark.parametrize(
    ("host", "origin", "expected"),
    [
        ("evil.example:{port}", "http://evil.example:{port}", 403),  # DNS rebinding: Origin matches Host
        ("evil.example:{port}", None, 403),  # a script naming the foreign host
        ("127.0.0.1:{port}", "http://evil.example:{port}", 403),  # a cross-site page (held before too)
        ("127.0.0.1:{port}", "http://127.0.0.1:{port}", 101),
        ("localhost:{port}", "http://localhost:{port}", 101),
    ],
)
def test_raw_websocket_handshakes_with_forged_host_and_origin(
    console: Any, host: str, origin: str | None, expected: int
) -> None:
    headers = dict(_WS_HEADERS)
    if origin is not None:
        headers["Origin"] = origin.format(port=console.port)
    status, _ = _http(console.port, "/ws", host.format(port=console.port), headers)
    assert status == expected


def test_a_rebinding_page_in_chromium_cannot_open_the_websocket_or_hold(console: Any, teleop: Path) -> None:
    why = browser_missing()
    if why is not None:
        pytest.skip(why)
    driver = open_browser("--host-resolver-rules=MAP evil.example 127.0.0.1")
    try:
        # what the attacker's page sees after its name was re-pointed at the console
        driver.get(f"http://evil.example:{console.port}/")
        assert "not served under the name" in driver.find_element("tag name", "body").text
        result = driver.execute_async_script(
            """
            const done = arguments[arguments.length - 1];
            const ws = new WebSocket(`ws://evil.example:${arguments[0]}/ws`);
            const timer = setTimeout(() => done("timeout"), 10000);
            ws.onopen = () => ws.send(JSON.stringify({t: "verb", id: "x", cmd: "hold", args: {}}));
            ws.onmessage = (ev) => { const m = JSON.parse(ev.data); if (m.t === "reply") { clearTimeout(timer); done("reply " + ev.data); } };
            ws.onerror = () => { clearTimeout(timer); done("refused"); };
            """,
            console.port,
        )
        assert result == "refused", result
    finally:
        close_browser(driver)
    assert _still_following(teleop)  # the arm was not held


def _ws_exchange(port: int, messages: list[str], host: str = "127.0.0.1") -> list[dict[str, Any]]:
    """Open the page websocket, send ``messages``, return one reply per message (in any order)."""

    async def run() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as s, s.ws_connect(f"http://{host}:{port}/ws") as ws:
            for m in messages:
                await ws.send_str(m)
            replies: list[dict[str, Any]] = []
            while len(replies) < len(messages):
                msg = await ws.receive_json(timeout=20)
                if msg.get("t") == "reply":
                    replies.append(msg)
            return replies

    return asyncio.run(run())


@pytest.mark.parametrize(
    "text",
    [
        '{"t":"verb","id":"a","cmd":"hold","args":{"x":' + "9" * 5000 + "}}",
        "[" * 5000 + "]" * 5000,
        '{"t":"verb","id":' + "[" * 3000 + "]" * 3000 + ',"cmd":"hold"}',
        "not json",
        '{"t":"verb","id":"b","cmd":"hold","args":{"x":1e999}}',
    ],
    ids=["huge-int", "deep-array", "deep-id", "not-json", "inf"],
)
def test_every_unparsable_websocket_message_gets_an_error_reply(console: Any, teleop: Path, text: str) -> None:
    (reply,) = _ws_exchange(console.port, [text])
    assert reply["ok"] is False and "malformed JSON" in reply["error"], reply
    assert reply["id"] is None or isinstance(reply["id"], str)
    assert _still_following(teleop)  # none of them held the arm


def test_replies_are_remembered_per_page_not_across_pages(console: Any, teleop: Path) -> None:
    (first,) = _ws_exchange(console.port, ['{"t":"verb","id":"1","cmd":"hold","args":{}}'])
    assert first["ok"] is True and "repeated" not in first
    wait_status(teleop, lambda s: s["mode"] == "hold")
    with ControlClient(teleop) as c:
        c.request("teleop.start")
    wait_status(teleop, lambda s: s["mode"] == "teleop")
    # another page (or the same page after a reload) choosing id "1": a new request; its Hold runs
    (second,) = _ws_exchange(console.port, ['{"t":"verb","id":"1","cmd":"hold","args":{}}'])
    assert second["ok"] is True and "repeated" not in second, second
    wait_status(teleop, lambda s: s["mode"] == "hold")
    # within one page a resend is answered from memory, not run twice
    replies = _ws_exchange(
        console.port, ['{"t":"verb","id":"7","cmd":"hold","args":{}}', '{"t":"verb","id":"7","cmd":"hold","args":{}}']
    )
    assert sorted(bool(r.get("repeated")) for r in replies) == [False, True]


# ------------------------------------------------------------------------------ a second local user
@pytest.fixture(scope="module")
def other_user() -> tuple[int, int]:
    ids = intruder()
    if ids is None:
        pytest.skip(no_intruder_reason())
    return ids


def _intruder_script(port: int, sock: Path) -> str:
    return f"""
import http.client, json, socket
out = {{}}
try:
    s = socket.socket(socket.AF_UNIX); s.connect({str(sock)!r}); out["socket"] = "connected"
except OSError as exc:
    out["socket"] = type(exc).__name__
for path, headers in (("/api/health", {{}}), ("/ws", {json.dumps(_WS_HEADERS)})):
    c = http.client.HTTPConnection("127.0.0.1", {port}, timeout=10)
    c.request("GET", path, headers=headers)
    r = c.getresponse()
    out[path] = [r.status, r.read().decode(errors="replace")]
print(json.dumps(out))
"""


def test_a_second_local_user_refused_by_the_socket_is_refused_by_the_console(
    console: Any, teleop: Path, other_user: tuple[int, int]
) -> None:
    uid, gid = other_user
    r = as_user(uid, gid, _intruder_script(console.port, teleop))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["socket"] == "PermissionError"  # the control socket's own rule
    assert out["/api/health"][0] == 403 and "may not use the daemon's control socket" in out["/api/health"][1]
    assert out["/ws"][0] == 403
    assert _still_following(teleop)


def test_a_user_the_socket_admits_by_group_is_admitted_by_the_console(other_user: tuple[int, int]) -> None:
    """The same rule both ways: put the socket's folder and file in the second user's group."""
    uid, gid = other_user
    with tempfile.TemporaryDirectory(prefix="so101d-") as d:
        run = Path(d) / "run"
        run.mkdir()
        os.chown(d, 0, gid)
        os.chmod(d, 0o750)
        os.chown(run, 0, gid)
        os.chmod(run, 0o750)
        sock = run / "control.sock"
        from daemon.api.server import ControlServer

        srv = ControlServer(sock, mode=0o660)
        srv.start()
        try:
            os.chown(sock, 0, gid)
            with running_console(sock) as c:
                r = as_user(uid, gid, _intruder_script(c.port, sock))
                out = json.loads(r.stdout)
                assert out["socket"] == "connected" and out["/api/health"][0] == 200, out
                os.chmod(sock, 0o600)  # the socket closes to the group: so does the console
                r = as_user(uid, gid, _intruder_script(c.port, sock))
                out = json.loads(r.stdout)
                assert out["socket"] == "PermissionError" and out["/api/health"][0] == 403, out
        finally:
            srv.stop()


# ------------------------------------------------------------------------------ the token off loopback
def test_a_token_file_others_can_read_is_refused_with_the_reason(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    token_file = state / "console-token"
    token_file.write_text("A" * 32 + "\n")
    os.chmod(token_file, 0o644)
    out = subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", "console", "--bind", f"0.0.0.0:{free_port()}"]
        + ["--socket", str(tmp_path / "none.sock"), "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "mode 0644: others may read the token" in out.stderr, out.stderr
    assert f"chmod 600 {token_file}" in out.stderr
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o644  # left as it was, for the operator to decide


def test_a_fresh_token_link_wins_over_a_stale_cookie(tmp_path: Path) -> None:
    with running_console(tmp_path / "none.sock", "--state-dir", str(tmp_path / "state"), bind_host="0.0.0.0") as c:
        token = (tmp_path / "state" / "console-token").read_text().strip()
        host = f"127.0.0.1:{c.port}"
        conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=10)
        conn.request("GET", f"/?token={token}", headers={"Host": host, "Cookie": "so101d_console=stale-from-before"})
        r = conn.getresponse()
        r.read()
        assert r.status == 200
        assert f"so101d_console={token}" in (r.getheader("Set-Cookie") or "")
        assert _http(c.port, "/", host, {"Cookie": "so101d_console=stale"})[0] == 401
        assert _http(c.port, "/api/health", f"evil.example:{c.port}", {"Cookie": f"so101d_console={token}"})[0] == 421
