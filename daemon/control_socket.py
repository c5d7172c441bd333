"""The control API: a local UNIX stream socket whose file permissions decide who may command the arm.

Protocol (newline-delimited JSON, UTF-8): each request is one JSON object on one line,
``{"cmd": "<verb>", ...arguments}``; each reply is one JSON object on one line, ``{"ok": true, ...}``
or ``{"ok": false, "error": "<what went wrong>"}``, in request order. A connection may carry any
number of requests. A line longer than ``max_request_bytes`` gets an error reply and the connection
is closed (the rest of that line cannot be trusted); malformed JSON, a non-object, a missing or
unknown ``cmd`` get an error reply and the connection stays usable.

Verbs are registered by name: ``server.register("episode.start", handler)``; a handler takes the
request dict and returns a dict of reply fields (merged after ``"ok": true``), or raises
``RequestError`` (its message becomes the error reply). Any other exception is logged and answered
as an internal error. The server runs on its own threads: nothing here can stall the control loop,
handlers talk to the loop through ``ControlLoop.submit`` or read its ``status()`` snapshot.

The socket file is created with mode ``0660`` by default (owner and group: the service user and
e.g. a ``so101d`` group of operators) before ``listen()``; a stale socket left by a crash is
replaced, a live one (another daemon) is an error.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.logs import RateLimitedLogger

log = logging.getLogger("so101d.socket")
_rl = RateLimitedLogger(log, period_s=10.0, burst=5)

Handler = Callable[[dict[str, Any]], dict[str, Any] | None]
MAX_CONNECTIONS = 32
_IDLE_TIMEOUT_S = 300.0  # a silent client is dropped after this


class RequestError(Exception):
    """Raised by a handler to answer {"ok": false, "error": str(exc)}."""


class SocketInUseError(RuntimeError):
    """Another live process already serves this socket path."""


class ControlServer:
    def __init__(self, path: str | Path, mode: int = 0o660, max_request_bytes: int = 65536) -> None:
        self.path = Path(path)
        self.mode = mode
        self.max_request_bytes = max_request_bytes
        self._handlers: dict[str, Handler] = {}
        self._unavailable: dict[str, str] = {}  # verb prefix -> why this daemon has no such verbs
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self.requests = 0
        self.errors = 0
        self.register("ping", lambda req: {"pong": True})
        self.register("help", lambda req: {"verbs": sorted(self._handlers)})

    # -------------------------------------------------------------- registry
    def register(self, name: str, handler: Handler) -> None:
        if not name or not isinstance(name, str):
            raise ValueError("verb name must be a non-empty string")
        with self._lock:
            if name in self._handlers and name not in ("ping", "help"):
                raise ValueError(f"verb {name!r} is already registered")
            self._handlers[name] = handler

    def explain_missing(self, prefix: str, reason: str) -> None:
        """Verbs starting with ``prefix`` that are not registered answer ``reason`` (e.g. recording
        is disabled in this daemon, and how to enable it) instead of "unknown command"."""
        with self._lock:
            self._unavailable[prefix] = reason

    def unregister(self, name: str) -> None:
        with self._lock:
            self._handlers.pop(name, None)

    def verbs(self) -> list[str]:
        with self._lock:
            return sorted(self._handlers)

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._prepare_path()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, self.mode)  # before listen(): nobody can connect yet
            sock.listen(16)
        except OSError:
            sock.close()
            raise
        sock.settimeout(0.2)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept_loop, name="so101d-control-socket", daemon=True)
        self._thread.start()
        log.info("control socket at %s (mode %o)", self.path, self.mode)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            if self.path.is_socket():
                self.path.unlink()
        except OSError:
            pass

    def _prepare_path(self) -> None:
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir(parents=True, mode=0o750, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            if not stat.S_ISSOCK(os.lstat(self.path).st_mode):
                raise SocketInUseError(f"{self.path} exists and is not a socket; refusing to replace it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(0.5)
            try:
                probe.connect(str(self.path))
            except OSError:
                self.path.unlink()  # stale: left by a crash
            else:
                raise SocketInUseError(f"{self.path} is served by another running daemon")
            finally:
                probe.close()

    # -------------------------------------------------------------- serving
    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            with self._lock:
                if len(self._conns) >= MAX_CONNECTIONS:
                    too_many = True
                else:
                    too_many = False
                    self._conns.add(conn)
            if too_many:
                try:
                    conn.sendall(_encode({"ok": False, "error": "too many connections"}))
                finally:
                    conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="so101d-control-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(_IDLE_TIMEOUT_S)
        buf = bytearray()
        try:
            while not self._stop.is_set():
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) > self.max_request_bytes:
                        self.errors += 1
                        conn.sendall(_encode({"ok": False, "error": f"request too large (limit {self.max_request_bytes} bytes)"}))
                        return
                    try:
                        chunk = conn.recv(65536)
                    except (TimeoutError, OSError):
                        return
                    if not chunk:
                        if buf.strip():  # a last request without newline still gets its answer
                            conn.sendall(_encode(self.handle_line(bytes(buf))))
                        return
                    buf += chunk
                    continue
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                if len(line) > self.max_request_bytes:
                    self.errors += 1
                    conn.sendall(_encode({"ok": False, "error": f"request too large (limit {self.max_request_bytes} bytes)"}))
                    return
                if not line.strip():
                    continue
                conn.sendall(_encode(self.handle_line(line)))
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def handle_line(self, line: bytes) -> dict[str, Any]:
        """Decode and dispatch one request line; always returns a reply, never raises."""
        self.requests += 1
        try:
            req = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            self.errors += 1
            return {"ok": False, "error": f"malformed request: {exc}"}
        return self.handle(req)

    def handle(self, req: Any) -> dict[str, Any]:
        if not isinstance(req, dict):
            self.errors += 1
            return {"ok": False, "error": f"a request must be a JSON object, got {type(req).__name__}"}
        cmd = req.get("cmd")
        if not isinstance(cmd, str):
            self.errors += 1
            return {"ok": False, "error": 'missing "cmd" (a string naming the verb)'}
        with self._lock:
            handler = self._handlers.get(cmd)
        if handler is None:
            self.errors += 1
            with self._lock:
                reason = next((r for p, r in self._unavailable.items() if cmd.startswith(p)), None)
            if reason is not None:
                return {"ok": False, "error": reason}
            return {"ok": False, "error": f"unknown command {cmd!r} (try 'help')"}
        try:
            result = handler(req) or {}
        except RequestError as exc:
            self.errors += 1
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a handler bug answers as an error, never kills the server
            self.errors += 1
            _rl.error(f"handler.{cmd}", "handler %r failed: %r", cmd, exc)
            log.debug("handler traceback", exc_info=True)
            return {"ok": False, "error": f"internal error in {cmd!r}: {type(exc).__name__}: {exc}"}
        reply: dict[str, Any] = {"ok": True}
        reply.update(result)
        return reply


def _encode(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), default=_json_default) + "\n").encode("utf-8")


def _json_default(o: Any) -> Any:
    try:
        import numpy as np  # noqa: PLC0415

        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
