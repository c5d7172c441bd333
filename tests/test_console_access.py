"""Who may open the console: loopback needs nothing, another address needs the token; a page from
another site cannot open the websocket; bad --bind values are refused. (No daemon needed: the
console starts without one and says so.)"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support import free_port


def _start(tmp_path: Path, bind: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "daemon.apps.cli", "console", "--bind", bind, "--socket", str(tmp_path / "none.sock")]
        + ["--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _first_line_with(proc: subprocess.Popen[str], needle: str, timeout_s: float = 30.0) -> tuple[str, list[str]]:
    seen: list[str] = []
    end = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return line, seen
    raise AssertionError(f"no line with {needle!r}: {seen}")


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(), r.headers.get("Set-Cookie") or ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), ""


def test_a_console_off_loopback_needs_its_token_kept_in_the_state_directory(tmp_path: Path) -> None:
    port = free_port()
    proc = _start(tmp_path, f"0.0.0.0:{port}")
    try:
        line, seen = _first_line_with(proc, "so101d console: http://")
        token_file = tmp_path / "state" / "console-token"
        token = token_file.read_text().strip()
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        assert f"?token={token}" in line
        assert any("needs the token" in s and str(token_file) in s for s in seen), seen
        status, body, _ = _get(f"http://127.0.0.1:{port}/")
        assert status == 401 and "token" in body
        assert _get(f"http://127.0.0.1:{port}/?token=wrong")[0] == 401
        status, body, cookie = _get(f"http://127.0.0.1:{port}/?token={token}")
        assert status == 200 and "so101d console" in body and "HttpOnly" in cookie
        status, body, _ = _get(f"http://127.0.0.1:{port}/api/health", {"Cookie": f"so101d_console={token}"})
        assert status == 200 and '"connected": false' in body  # no daemon: said, not hidden
    finally:
        proc.terminate()
        proc.wait(20)
    # the token is kept: a restarted console asks for the same one
    proc = _start(tmp_path, f"0.0.0.0:{port}")
    try:
        line, _ = _first_line_with(proc, "so101d console: http://")
        assert f"?token={token}" in line
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_page_from_another_site_cannot_open_the_websocket(tmp_path: Path) -> None:
    import asyncio

    import aiohttp

    port = free_port()
    proc = _start(tmp_path, f"127.0.0.1:{port}")
    try:
        _first_line_with(proc, "so101d console: http://")

        async def try_ws(origin: str) -> int | str:
            async with aiohttp.ClientSession() as s:
                try:
                    async with s.ws_connect(f"http://127.0.0.1:{port}/ws", headers={"Origin": origin}) as ws:
                        msg = await ws.receive_json(timeout=10)
                        return str(msg["t"])
                except aiohttp.WSServerHandshakeError as exc:
                    return exc.status

        assert asyncio.run(try_ws("http://evil.example")) == 403
        assert asyncio.run(try_ws(f"http://127.0.0.1:{port}")) == "hello"
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.parametrize(
    ("bind", "why"),
    [
        ("8101", "--bind: '8101' must be HOST:PORT"),
        ("127.0.0.1:http", "port must be a number"),
        ("127.0.0.1:70000", "0..65535"),
    ],
)
def test_a_bad_bind_address_is_refused_with_the_reason(tmp_path: Path, bind: str, why: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", "console", "--bind", bind, "--socket", str(tmp_path / "x.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and why in out.stderr, out.stderr
