"""A small client for the daemon's control socket (see daemon/api/server.py for the protocol).

Used by the CLI verbs (`so101d status|teleop|torque|...`) and by tests::

    with ControlClient("/run/so101d/control.sock") as c:
        c.request("teleop.start")
        st = c.request_as(StatusReply, "status")  # typed: daemon/api/messages.py

Every reply carries the daemon's ``api_version``; a daemon of another major version is refused
at the first reply with ``ApiVersionMismatch`` saying which side is older (a minor difference is
fine: fields unknown to this side are ignored, fields it knows but the daemon lacks take their
defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from daemon.api.messages import API_VERSION, ErrorReply, MessageReply, ReplyMismatch, api_major, decode_reply
from daemon.api.server import CLOSED_IDLE_PREFIXES


class DaemonUnavailable(ConnectionError):
    """No daemon answers at the socket path (not running, wrong path, or no permission)."""


class ApiVersionMismatch(DaemonUnavailable):
    """The daemon speaks another major version of the control API than this client."""


class CommandFailed(RuntimeError):
    """The daemon answered {"ok": false, "error": ...}."""


def check_api_version(reply: dict[str, Any], path: str) -> None:
    """ApiVersionMismatch unless ``reply`` comes from a daemon of this client's major version."""
    theirs = reply.get("api_version")
    ours = api_major(API_VERSION)
    if not isinstance(theirs, str):
        raise ApiVersionMismatch(
            f"the daemon at {path} is older than this client: its replies carry no api_version (this "
            f"client speaks control API {API_VERSION}); restart the daemon from this install "
            "(`so101d run`, or `systemctl restart so101d`)"
        )
    major = api_major(theirs)
    if major == ours:
        return
    side = "older" if major is not None and ours is not None and major < ours else "newer"
    raise ApiVersionMismatch(
        f"the daemon at {path} is {side} than this client: it speaks control API {theirs}, this client "
        f"{API_VERSION}; run the same so101d version on both sides"
    )


class _ClosedWhileIdle(Exception):
    """The daemon had closed this connection while it was idle; what was just sent was not read."""


CONNECT_RETRY_S = 2.0  # how long a connect meeting a full listen backlog keeps trying
_RETRY_FIRST_S = 0.01
_RETRY_MAX_S = 0.2


class ControlClient:
    def __init__(self, path: str | Path, timeout_s: float = 5.0, connect_retry_s: float = CONNECT_RETRY_S) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s
        self.connect_retry_s = connect_retry_s
        self._sock: socket.socket | None = None
        self._buf = bytearray()

    def connect(self) -> ControlClient:
        """Connect; a daemon momentarily not accepting (its listen backlog full: EAGAIN on Linux,
        ECONNREFUSED elsewhere, or a daemon restarting) is retried with a short backoff for up to
        ``connect_retry_s``; no socket file or no permission fail at once."""
        deadline_s = time.monotonic() + self.connect_retry_s
        delay_s = _RETRY_FIRST_S
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout_s)
            try:
                s.connect(self.path)
            except FileNotFoundError:
                s.close()
                raise DaemonUnavailable(
                    f"no daemon socket at {self.path} (is `so101d run` running? see --socket)"
                ) from None
            except PermissionError:
                s.close()
                raise DaemonUnavailable(f"permission denied on {self.path} (are you in the daemon's group?)") from None
            except (BlockingIOError, ConnectionRefusedError) as exc:
                s.close()
                if time.monotonic() + delay_s > deadline_s:
                    raise DaemonUnavailable(_not_accepting(self.path, exc, self.connect_retry_s)) from None
                time.sleep(delay_s)
                delay_s = min(2 * delay_s, _RETRY_MAX_S)
                continue
            except OSError as exc:
                s.close()
                raise DaemonUnavailable(f"cannot connect to {self.path}: {exc.strerror or exc}") from None
            self._sock = s
            return self

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf.clear()  # a reply half read on that connection is no part of the next one's

    def __enter__(self) -> ControlClient:
        return self.connect() if self._sock is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> dict[str, Any]:
        """Send bytes as they are and read one reply line (tests use it for bad requests).

        A connection the daemon closed while it sat idle (evicted by a client leaking
        connections, or silent past the idle timeout: a `so101d record` session between
        episodes) is replaced once, transparently: the request never reached a handler, so it is
        sent again on a fresh connection. Any other loss is DaemonUnavailable."""
        if self._sock is None:
            self.connect()
        try:
            try:
                return self._exchange(data)
            except _ClosedWhileIdle:
                self.close()
                self.connect()
                return self._exchange(data)
        except _ClosedWhileIdle:
            self.close()
            raise DaemonUnavailable(f"daemon at {self.path} closed a fresh connection at once") from None
        except DaemonUnavailable:
            raise
        except (TimeoutError, OSError) as exc:
            self.close()
            raise DaemonUnavailable(f"daemon at {self.path} did not answer: {exc}") from None

    def _exchange(self, data: bytes) -> dict[str, Any]:
        assert self._sock is not None
        try:
            try:
                sent = self._sock.send(data)
            except (BrokenPipeError, ConnectionResetError):
                self._buf.clear()
                raise _ClosedWhileIdle from None  # nothing of it was delivered
            if sent < len(data):
                self._sock.sendall(data[sent:])
            reply = self._read_reply()
        except _ClosedWhileIdle:
            raise
        except DaemonUnavailable:
            self.close()
            raise
        except (TimeoutError, OSError) as exc:
            self.close()
            raise DaemonUnavailable(f"daemon at {self.path} did not answer: {exc}") from None
        except BaseException:
            # interrupted once the request was sent (Ctrl-C's KeyboardInterrupt in recv, or just
            # after send returned: the signal is handled at the next bytecode, which a loaded
            # machine reaches after the daemon already answered; as when a user stops LeRobot's
            # robot_client mid-action): the daemon's reply is still on its way, and the
            # next request on this connection (the plugin's arm.release in LeRobot's finally)
            # would read it as its own; the next request gets a fresh connection instead
            self.close()
            raise
        error = reply.get("error")
        if reply.get("ok") is False and isinstance(error, str) and error.startswith(CLOSED_IDLE_PREFIXES):
            self._buf.clear()
            raise _ClosedWhileIdle
        check_api_version(reply, self.path)
        return reply

    def _read_reply(self) -> dict[str, Any]:
        assert self._sock is not None
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return _decode_reply_line(line)
            chunk = self._sock.recv(65536)
            if not chunk:
                raise DaemonUnavailable(f"daemon at {self.path} closed the connection")
            self._buf += chunk

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Send one request; returns the raw reply (ok true or false)."""
        return self.send_raw((json.dumps({"cmd": cmd, **args}) + "\n").encode())

    def request(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Send one request; raises CommandFailed on an error reply."""
        reply = self.call(cmd, **args)
        if not reply.get("ok"):
            raise CommandFailed(str(reply.get("error", "unknown error")))
        return reply

    def call_as[T: msgspec.Struct](self, kind: type[T], cmd: str, **args: Any) -> T | ErrorReply:
        """Send one request; the reply decoded into ``kind`` (its declared reply type), or the
        ErrorReply. A reply that does not fit ``kind`` is CommandFailed naming the field."""
        reply = self.call(cmd, **args)
        try:
            if not reply.get("ok"):
                return decode_reply(reply, ErrorReply)
            return decode_reply(reply, kind)
        except ReplyMismatch as exc:
            raise CommandFailed(f"{cmd}: the daemon's reply does not fit this client: {exc}") from None

    def request_as[T: msgspec.Struct](self, kind: type[T], cmd: str, **args: Any) -> T:
        """``call_as``, raising CommandFailed on an error reply."""
        reply = self.call_as(kind, cmd, **args)
        if isinstance(reply, ErrorReply):
            raise CommandFailed(reply.error or "unknown error")
        return reply


_REPLY_DECODER = msgspec.json.Decoder()


def _decode_reply_line(line: bytes) -> Any:
    """One reply line. msgspec first: the same values as json.loads in a few C calls (a client
    driving the arm reads one reply per step, its code cold on a busy machine); json.loads for
    what msgspec refuses (a NaN written by the server's json fallback) and to word an error."""
    try:
        return _REPLY_DECODER.decode(line)
    except msgspec.DecodeError:
        return json.loads(line)


def next_poll_s(due_s: float, period_s: float, now_s: float) -> float:
    """When a client polling every ``period_s`` polls next: one period after the last deadline
    (so the rate holds whatever one reply took), or ``now_s`` when it fell behind (a slow daemon
    is not answered with a burst of catch-up requests)."""
    return max(due_s + period_s, now_s)


def _not_accepting(path: str, exc: OSError, waited_s: float) -> str:
    if isinstance(exc, BlockingIOError):
        return (
            f"the daemon at {path} is not accepting connections (its listen backlog stayed full for "
            f"{waited_s:g} s: is it stuck? see its log)"
        )
    return (
        f"the daemon at {path} is not accepting connections (refused for {waited_s:g} s: not running, "
        "a socket file left by a crash, or stuck)"
    )


# ---------------------------------------------------------------------------------------------
# helpers shared by the CLI verbs
# ---------------------------------------------------------------------------------------------
def add_socket_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket", metavar="PATH", help="control socket (default: from --config, else the default path)"
    )
    parser.add_argument("--config", metavar="FILE", help="daemon configuration whose [socket] path to use")


def socket_path_from_args(args: argparse.Namespace) -> str:
    if getattr(args, "socket", None):
        return args.socket
    from daemon.config.settings import SERVICE_SOCKET_PATH, load_config

    path = load_config(getattr(args, "config", None)).socket.resolved_path()
    if getattr(args, "config", None) is None and not os.path.exists(path) and os.path.exists(SERVICE_SOCKET_PATH):
        # No daemon of our own, but the system service is running: talk to it.
        return SERVICE_SOCKET_PATH
    return path


def run_simple(
    args: argparse.Namespace,
    cmd: str,
    *,
    label: str | None = None,
    render: Callable[[dict[str, Any]], str] | None = None,
    **fields: Any,
) -> int:
    """Send one verb and print its result; exit 0 on ok, 1 on an error reply, 2 if no daemon.

    ``label`` names the verb in error messages (default ``cmd``); ``render`` turns an ok reply
    into the printed text (default: the reply's message, read as ``MessageReply``).
    """
    import sys

    try:
        with ControlClient(socket_path_from_args(args)) as c:
            reply = c.call(cmd, **fields)
    except DaemonUnavailable as exc:
        print(f"so101d: {exc}", file=sys.stderr)
        return 2
    if not reply.get("ok"):
        print(f"so101d: {label or cmd}: {reply.get('error')}", file=sys.stderr)
        return 1
    if render is not None:
        print(render(reply))
    else:
        msg = decode_reply(reply, MessageReply).message
        print(msg if msg else f"{cmd}: ok")
    return 0
