"""A small client for the daemon's control socket (see daemon/control_socket.py for the protocol).

Used by the CLI verbs (`so101d status|teleop|torque|...`) and by tests::

    with ControlClient("/run/so101d/control.sock") as c:
        c.request("teleop.start")
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from collections.abc import Callable
from typing import Any


class DaemonUnavailable(ConnectionError):
    """No daemon answers at the socket path (not running, wrong path, or no permission)."""


class CommandFailed(RuntimeError):
    """The daemon answered {"ok": false, "error": ...}."""


class ControlClient:
    def __init__(self, path: str | Path, timeout_s: float = 5.0) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._buf = bytearray()

    def connect(self) -> "ControlClient":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout_s)
        try:
            s.connect(self.path)
        except FileNotFoundError:
            s.close()
            raise DaemonUnavailable(f"no daemon socket at {self.path} (is `so101d run` running? see --socket)") from None
        except PermissionError:
            s.close()
            raise DaemonUnavailable(f"permission denied on {self.path} (are you in the daemon's group?)") from None
        except OSError as exc:
            s.close()
            raise DaemonUnavailable(f"cannot connect to {self.path}: {exc.strerror or exc}") from None
        self._sock = s
        return self

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "ControlClient":
        return self.connect() if self._sock is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> dict[str, Any]:
        """Send bytes as they are and read one reply line (tests use it for bad requests)."""
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        try:
            self._sock.sendall(data)
            return self._read_reply()
        except (TimeoutError, OSError) as exc:
            self.close()
            raise DaemonUnavailable(f"daemon at {self.path} did not answer: {exc}") from None

    def _read_reply(self) -> dict[str, Any]:
        assert self._sock is not None
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return json.loads(line)
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


# ---------------------------------------------------------------------------------------------
# helpers shared by the CLI verbs
# ---------------------------------------------------------------------------------------------
def add_socket_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", metavar="PATH", help="control socket (default: from --config, else the default path)")
    parser.add_argument("--config", metavar="FILE", help="daemon configuration whose [socket] path to use")


def socket_path_from_args(args: argparse.Namespace) -> str:
    if getattr(args, "socket", None):
        return args.socket
    from daemon.config import SERVICE_SOCKET_PATH, load_config  # noqa: PLC0415

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
    into the printed text (default: the reply's message).
    """
    import sys  # noqa: PLC0415

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
        msg = reply.get("message")
        print(msg if msg else f"{cmd}: ok")
    return 0
