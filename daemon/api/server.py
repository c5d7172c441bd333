"""The control API: a local UNIX stream socket whose file permissions decide who may command the arm.

Protocol (newline-delimited JSON, UTF-8): each request is one JSON object on one line,
``{"cmd": "<verb>", ...arguments}``; each reply is one JSON object on one line,
``{"ok": true, "api_version": "1.0", ...}`` or ``{"ok": false, "api_version": "1.0", "error": "<what
went wrong>", "field": "<the request field at fault, or null>"}``, in request order. Every verb's
request and reply is declared in daemon/api/messages.py (published as
docs/reference/control-api.schema.json). A connection may carry any
number of requests. A line longer than ``max_request_bytes`` gets an error reply and the connection
is closed (the rest of that line cannot be trusted); malformed JSON, a non-object, a missing or
unknown ``cmd`` get an error reply and the connection stays usable. Lines are decoded within
bounds (daemon/api/bounded_json.py: depth, number length) and checked against the verbs' declared
fields (daemon/api/requests.py) before any handler sees them: a field of the wrong type is
refused, naming it. Replies are encoded with msgspec (numpy values and paths as JSON numbers and
text).

Nothing a client sends can end the thread serving the others: a failure while serving one
connection closes that connection only. Should the thread end anyway, ``ensure_serving`` (called
by the daemon's main loop) logs it loudly and starts a new one; ``health()`` counts the restarts
for ``status``.

Verbs are registered by name: ``server.register("episode.start", handler)``; a handler takes the
request dict and returns a dict of reply fields (merged after ``"ok": true``), or raises
``RequestError`` (its message becomes the error reply). Any other exception is logged and answered
as an internal error. Nothing here can stall the control loop: handlers talk to the loop through
``ControlLoop.submit`` or read its ``status()`` snapshot.

Serving (an operator must never be locked out): one selector thread owns every connection (no thread per
client); handlers run on small worker pools, so a verb that waits (``policy.load`` with
``wait_s``, ``episode.save`` running a sim's hooks, a reload) never holds up another client. The
operator's verbs (``OPERATOR_VERBS``: status, torque, hold, teleop stop...) have a pool of their
own, so a queue of slow verbs cannot keep them waiting either. Each connection costs a bounded
amount: one request at a time (the next is read only once the previous reply has left), at most
``max_request_bytes`` plus one read of input, one reply of output. A connection that stays silent
for ``idle_timeout_s`` is closed, and at ``max_connections`` the connection idle the longest is
closed (told why, in one error line) to make room: a new client, most likely the operator, is
never the one turned away, however many connections a dashboard or a script leaks.

The socket file is created with mode ``0660`` by default (owner and group: the service user and
e.g. a ``so101d`` group of operators) before ``listen()``; a stale socket left by a crash is
replaced, a live one (another daemon) is an error.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import selectors
import socket
import stat
import struct
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from daemon.api.bounded_json import JsonBounds, JsonRefused, loads_bounded
from daemon.api.messages import API_VERSION
from daemon.api.requests import BadField, Request, parse_request
from daemon.system.logs import RateLimitedLogger

log = logging.getLogger("so101d.socket")
_rl = RateLimitedLogger(log, period_s=10.0, burst=5)

Handler = Callable[[dict[str, Any]], dict[str, Any] | None]


# The process on the other end of the connection whose verb this thread runs now: what a request
# says about its sender (a ``pid`` field) is the client's word, this is the kernel's.
class _Serving(threading.local):
    peer_pid: int | None = None
    inline: bool = False  # on the selector thread (a verb registered inline): it must not wait


_serving = _Serving()


def request_peer_pid() -> int | None:
    """The pid of the process that sent the request this thread is serving (None outside a socket
    request, e.g. ``handle`` called in-process, or where the kernel did not say)."""
    return _serving.peer_pid


def serving_inline() -> bool:
    """True while this thread runs a verb on the selector thread (``register(inline=True)``): a
    verb that finds it would have to wait raises ``RunOnWorker`` instead."""
    return _serving.inline


class RunOnWorker(Exception):
    """Raised by an inline verb that finds it must wait (before it changed anything): the server
    runs the same request again on a worker, where waiting holds up nobody else."""


def _peer_pid(sock: socket.socket) -> int | None:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid = struct.unpack("3i", creds)[0]
    return pid if pid > 0 else None


MAX_CONNECTIONS = 512  # beyond this the longest-idle connection is evicted (fds: systemd's soft limit is 1024)
IDLE_TIMEOUT_S = 300.0  # a silent client is dropped after this
LISTEN_BACKLOG = 128  # connections the kernel queues while the selector thread is busy
WORKERS = 4  # threads running the verbs
OPERATOR_WORKERS = 2  # threads running only OPERATOR_VERBS
# Verbs that read a snapshot or hand the loop one bounded request (it answers within 3 s): they
# run on their own workers, so slow verbs queued on the others never keep them waiting.
OPERATOR_VERBS = frozenset(
    {
        "ping",
        "version",
        "help",
        "status",
        "torque.off",
        "torque.on",
        "teleop.stop",
        "teleop.start",
        "hold",
        "idle",
        "episode.status",
        "policy.status",
        "replay.stop",
        "replay.status",
    }
)
# The one line a connection closed for being idle receives (evicted at the limit, or silent for
# idle_timeout_s). Only a connection with no request in progress gets it, so whatever it had sent
# since was never read: a client may reconnect and send that request again (ControlClient does).
CLOSED_IDLE_PREFIXES = ("connection evicted:", "connection closed: idle")
_READ_CHUNK = 65536
_ACCEPTS_PER_WAKE = 64  # a connect storm cannot starve the connections already served
_EMFILE_PAUSE_S = 0.1  # out of descriptors with nothing to evict: stop accepting this long
_FD_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class RequestError(Exception):
    """Raised by a handler to answer {"ok": false, "error": str(exc), "field": field}
    (``field``: the request field that cannot be served as given, e.g. an unknown camera)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SocketInUseError(RuntimeError):
    """Another live process already serves this socket path."""


@dataclass(eq=False)
class _Conn:
    """One client, owned by the selector thread (workers only hand back ``(conn, reply)``)."""

    sock: socket.socket
    fd: int
    last_active_s: float  # last time bytes moved either way or a request was taken
    inbuf: bytearray = field(default_factory=bytearray)  # at most max_request_bytes + one read
    outbuf: bytearray = field(default_factory=bytearray)  # at most one reply
    busy: bool = False  # one of its requests is with a worker
    eof: bool = False  # the client shut its writing side: answer what it sent, then close
    close_after_write: bool = False  # a refused oversized request: the rest cannot be trusted
    closed: bool = False
    events: int = 0  # what the selector watches for it now (0: not registered)
    peer_pid: int | None = None  # the connecting process, by the kernel's word (SO_PEERCRED)


class _WorkerPool:
    """A fixed set of daemon threads taking jobs from a queue.

    Not concurrent.futures: its threads are joined at interpreter exit, and a verb still waiting
    (``policy.load`` with a long ``wait_s``) must not keep a stopping daemon from exiting.
    """

    def __init__(self, name: str, n: int) -> None:
        self._q: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._q.put((fn, args))

    def close(self) -> None:
        for _ in self._threads:
            self._q.put(None)

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            fn, args = job
            try:
                fn(*args)
            except BaseException:
                log.exception("control socket worker job failed")


_LISTENER = object()  # selector key data of the listening socket
_WAKE = object()  # ... of the workers' wake-up socket


class ControlServer:
    """Serves the control socket on one selector thread; the verbs run on two small worker pools."""

    def __init__(
        self,
        path: str | Path,
        mode: int = 0o660,
        max_request_bytes: int = 65536,
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        backlog: int = LISTEN_BACKLOG,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self.path = Path(path)
        self.mode = mode
        self.max_request_bytes = max_request_bytes
        self.max_connections = max_connections  # read at every accept: may be lowered while serving
        self.idle_timeout_s = idle_timeout_s
        self.backlog = backlog
        self._handlers: dict[str, Handler] = {}
        self._unavailable: dict[str, str] = {}  # verb prefix -> why this daemon has no such verbs
        self._inline: set[str] = set()  # verbs served on the selector thread (register(inline=True))
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Owned by the selector thread. By fd, least recently active first (moved to the end on
        # activity): the oldest idle connection is the first one not busy.
        self._conns: OrderedDict[int, _Conn] = OrderedDict()
        self._n_conns = 0  # len(self._conns), readable from any thread
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._replies: deque[tuple[_Conn, bytes]] = deque()  # workers -> selector thread
        self._pool: _WorkerPool | None = None
        self._operator_pool: _WorkerPool | None = None
        self._accept_paused_until_s = 0.0
        self._count_lock = threading.Lock()
        self.requests = 0  # counted on the selector thread (handle_line: the caller's)
        self.errors = 0
        self.evictions = 0
        self.thread_restarts = 0  # selector threads restarted by ensure_serving
        self.last_thread_failure: str | None = None  # why the last one ended
        self._supervise_lock = threading.Lock()
        self.bounds = JsonBounds(max_bytes=max_request_bytes)
        self.register("ping", lambda req: {"pong": True})
        self.register("version", lambda req: {"daemon_version": _package_version()})
        self.register("help", lambda req: {"verbs": self.verbs()})

    # -------------------------------------------------------------- registry
    def register(self, name: str, handler: Handler, *, inline: bool = False) -> None:
        """``inline``: the handler only reads snapshots or swaps a reference (microseconds, never
        waits, never calls the loop): it runs on the selector thread, which spares a request two
        thread hand-offs (an outside client driving the arm sends two per control step). A
        handler that sometimes has to wait raises ``RunOnWorker`` then (``serving_inline()``
        tells it where it runs), and that request runs on a worker."""
        if not name or not isinstance(name, str):
            raise ValueError("verb name must be a non-empty string")
        with self._lock:
            if name in self._handlers and name not in _BUILT_IN:
                raise ValueError(f"verb {name!r} is already registered")
            self._handlers[name] = handler
            if inline:
                self._inline.add(name)
            else:
                self._inline.discard(name)

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

    def _count_error(self) -> None:
        with self._count_lock:  # workers and the selector thread both count
            self.errors += 1

    def connection_count(self) -> int:
        """Client connections held now."""
        return self._n_conns

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._prepare_path()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, self.mode)  # before listen(): nobody can connect yet
            sock.listen(self.backlog)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._sock = sock
        self._stop.clear()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._pool = _WorkerPool("so101d-control-verb", WORKERS)
        self._operator_pool = _WorkerPool("so101d-control-operator", OPERATOR_WORKERS)
        self._start_serving()
        log.info("control socket at %s (mode %o)", self.path, self.mode)

    def _start_serving(self) -> None:
        """A fresh selector thread on the listening socket (at start, and after a failure)."""
        assert self._sock is not None and self._wake_r is not None
        self._accept_paused_until_s = 0.0
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._serve_forever, name="so101d-control-socket", daemon=True)
        self._thread.start()

    def serving(self) -> bool:
        """The selector thread is running (false before start, after stop, or once it failed)."""
        t = self._thread
        return t is not None and t.is_alive()

    def ensure_serving(self) -> bool:
        """Restart a selector thread that ended while the server should be serving; True if it
        did. Called by the daemon's main loop: whatever ended it, the socket answers again."""
        with self._supervise_lock:
            if self._sock is None or self._stop.is_set() or self.serving():
                return False
            self.thread_restarts += 1
            log.critical(
                "control socket thread on %s had stopped (%s); restarting it (restart %d). Its clients "
                "were disconnected; the control loop was not affected",
                self.path,
                self.last_thread_failure or "no error recorded",
                self.thread_restarts,
            )
            self._replies.clear()  # for connections the old thread closed
            self._start_serving()
            return True

    def health(self) -> dict[str, Any]:
        """For status: is the socket served, and has its thread ever had to be restarted."""
        return {
            "serving": self.serving(),
            "thread_restarts": self.thread_restarts,
            "last_thread_failure": self.last_thread_failure,
            "connections": self._n_conns,
            "requests": self.requests,
            "errors": self.errors,
        }

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        # (the selector thread closed the connections on its way out)
        for pool in (self._pool, self._operator_pool):
            if pool is not None:
                pool.close()  # a verb still running finishes on its own; its reply is dropped
        self._pool = self._operator_pool = None
        for s in (self._sock, self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._sock = self._wake_r = self._wake_w = None
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
            except BlockingIOError:
                raise SocketInUseError(
                    f"{self.path} is served by another running daemon (its backlog is full)"
                ) from None
            except OSError:
                self.path.unlink()  # stale: left by a crash
            else:
                raise SocketInUseError(f"{self.path} is served by another running daemon")
            finally:
                probe.close()

    # -------------------------------------------------------------- the selector thread
    def _serve_forever(self) -> None:
        sel = self._selector
        assert sel is not None
        try:
            while not self._stop.is_set():
                self._resume_accepting()
                for key, mask in sel.select(self._select_timeout_s()):
                    if key.data is _LISTENER:
                        self._accept_ready()
                    elif key.data is _WAKE:
                        self._drain_wake()
                    else:
                        self._serve_one(key.data, mask)
                self._take_replies()
                self._drop_idle()
        except BaseException as exc:
            self.last_thread_failure = f"{type(exc).__name__}: {exc}"
            log.critical(
                "control socket thread failed; nothing answers on %s until it is restarted:\n%s",
                self.path,
                traceback.format_exc(),
            )
        finally:
            for conn in list(self._conns.values()):
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self._close(conn)
            sel.close()
            self._selector = None

    def _serve_one(self, conn: _Conn, mask: int) -> None:
        """One connection's turn. Whatever goes wrong with it ends that connection only (told
        why, when it can still be told), never the thread serving the others."""
        if conn.closed:
            return
        try:
            # (a hang-up is reported as readable whatever we watch: read only when we asked to,
            # or a closing client could push more than the bound)
            if mask & selectors.EVENT_READ and conn.events & selectors.EVENT_READ:
                self._read(conn)
            self._advance(conn)
        except Exception as exc:
            self._count_error()
            _rl.error("conn.failed", "control socket: closed a connection after %r", exc)
            log.debug("connection failure", exc_info=True)
            conn.outbuf = bytearray()
            self._close(conn, f"internal error serving this connection: {type(exc).__name__}")

    def _select_timeout_s(self) -> float:
        # wakes up often enough to drop idle connections and resume a paused accept
        timeout_s = min(1.0, self.idle_timeout_s / 2.0)
        if self._accept_paused_until_s:
            timeout_s = min(timeout_s, _EMFILE_PAUSE_S)
        return max(0.01, timeout_s)

    def _wake(self) -> None:
        w = self._wake_w
        if w is None:
            return
        try:
            w.send(b"\0")
        except OSError:  # full: a wake-up is pending anyway; closed: stopping
            pass

    def _drain_wake(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    # -------------------------------------------------------------- connections
    def _accept_ready(self) -> None:
        assert self._sock is not None
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _FD_ERRNOS:
                    if self._evict_one("the daemon ran out of file descriptors"):
                        continue
                    _rl.warning(
                        "accept.fds",
                        "control socket: out of file descriptors (%s); not accepting for %.1f s",
                        exc.strerror,
                        _EMFILE_PAUSE_S,
                    )
                    self._pause_accepting()
                return
            while self._n_conns >= max(1, self.max_connections):
                self._evict_one(f"the control socket was at its limit of {self.max_connections} connections")
            sock.setblocking(False)
            conn = _Conn(sock=sock, fd=sock.fileno(), last_active_s=time.monotonic(), peer_pid=_peer_pid(sock))
            self._conns[conn.fd] = conn
            self._n_conns = len(self._conns)
            self._set_interest(conn, selectors.EVENT_READ)

    def _pause_accepting(self) -> None:
        assert self._selector is not None and self._sock is not None
        self._selector.unregister(self._sock)
        self._accept_paused_until_s = time.monotonic() + _EMFILE_PAUSE_S

    def _resume_accepting(self) -> None:
        if self._accept_paused_until_s and time.monotonic() >= self._accept_paused_until_s:
            assert self._selector is not None and self._sock is not None
            self._accept_paused_until_s = 0.0
            self._selector.register(self._sock, selectors.EVENT_READ, _LISTENER)

    def _evict_one(self, why: str) -> bool:
        """Close the connection idle the longest (else, all busy, the least recently active one)
        to make room for a new one. False if there is none."""
        victim = next((c for c in self._conns.values() if not c.busy), None)
        if victim is None:
            victim = next(iter(self._conns.values()), None)
        if victim is None:
            return False
        self.evictions += 1
        idle_s = time.monotonic() - victim.last_active_s
        _rl.warning(
            "evict",
            "control socket: closed a connection idle for %.0f s: %s (a client leaks connections?)",
            idle_s,
            why,
        )
        # a busy one (every connection has a verb running) is closed without the notice: its
        # request was taken, so a client must not send it again
        self._close(
            victim, None if victim.busy else f"{CLOSED_IDLE_PREFIXES[0]} idle the longest ({idle_s:.0f} s) when {why}"
        )
        return True

    def _drop_idle(self) -> None:
        if not self._conns:
            return
        cutoff_s = time.monotonic() - self.idle_timeout_s
        expired = []
        for conn in self._conns.values():
            if conn.last_active_s > cutoff_s:
                break  # ordered by activity: the rest are younger
            if not conn.busy:
                expired.append(conn)
        for conn in expired:
            self._close(conn, f"{CLOSED_IDLE_PREFIXES[1]} for {self.idle_timeout_s:g} s")

    def _close(self, conn: _Conn, reason: str | None = None) -> None:
        if conn.closed:
            return
        conn.closed = True
        if reason is not None and not conn.outbuf:
            try:  # best effort, never waits: the client learns why at its next read
                conn.sock.send(_encode(_error(reason)))
            except OSError:
                pass
        if conn.events and self._selector is not None:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.events = 0
        if self._conns.get(conn.fd) is conn:
            del self._conns[conn.fd]
        self._n_conns = len(self._conns)
        conn.inbuf = bytearray()
        conn.outbuf = bytearray()
        conn.sock.close()

    def _touch(self, conn: _Conn) -> None:
        conn.last_active_s = time.monotonic()
        self._conns.move_to_end(conn.fd)

    def _set_interest(self, conn: _Conn, events: int) -> None:
        if events == conn.events or self._selector is None:
            return
        if conn.events == 0:
            self._selector.register(conn.sock, events, conn)
        elif events == 0:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    # -------------------------------------------------------------- one connection's progress
    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if chunk:
            conn.inbuf += chunk
            self._touch(conn)
        else:
            conn.eof = True

    def _advance(self, conn: _Conn) -> None:
        """Move a connection on as far as it goes without waiting: write what is pending, then
        take its next request; then watch for what it waits on (a loop, not recursion: a client
        may pipeline thousands of bad lines)."""
        while not conn.closed:
            if conn.outbuf:
                if not self._write(conn):
                    break  # the client's buffer is full: wait until it reads
                continue
            if conn.close_after_write:
                self._close(conn)
                return
            if conn.busy or not self._next_request(conn):
                break
        if conn.closed:
            return
        if conn.outbuf:
            self._set_interest(conn, selectors.EVENT_WRITE)
        elif conn.busy or conn.eof:
            self._set_interest(conn, 0)  # read nothing more until this reply has left
        else:
            self._set_interest(conn, selectors.EVENT_READ)

    def _write(self, conn: _Conn) -> bool:
        """Send what the kernel takes; True when the reply has left entirely."""
        try:
            n = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self._close(conn)
            return False
        del conn.outbuf[:n]
        self._touch(conn)
        return not conn.outbuf

    def _next_request(self, conn: _Conn) -> bool:
        """Take the next request out of the input; False if a complete one has not arrived yet."""
        nl = conn.inbuf.find(b"\n")
        if nl < 0:
            if len(conn.inbuf) > self.max_request_bytes:
                self._refuse_too_large(conn)
                return True
            if not conn.eof:
                return False
            if not conn.inbuf.strip():
                self._close(conn)
                return True
            line = bytes(conn.inbuf)  # a last request without newline still gets its answer
            conn.inbuf.clear()
        else:
            line = bytes(conn.inbuf[:nl])
            del conn.inbuf[: nl + 1]
            if len(line) > self.max_request_bytes:
                self._refuse_too_large(conn)
                return True
        if line.strip():
            self._start_request(conn, line)
        return True

    def _refuse_too_large(self, conn: _Conn) -> None:
        self._count_error()
        conn.inbuf = bytearray()
        conn.outbuf += _encode(_error(f"request too large (limit {self.max_request_bytes} bytes)"))
        conn.close_after_write = True

    def _start_request(self, conn: _Conn, line: bytes) -> None:
        self.requests += 1
        self._touch(conn)
        req, error = self._parse(line)
        if req is None:
            conn.outbuf += _encode(error or _error("malformed request"))
            return
        if req.cmd in self._inline:
            try:
                conn.outbuf += self._reply_bytes(req, conn.peer_pid, inline=True)
                return
            except RunOnWorker:
                pass  # it would wait: on a worker, as any other verb
        pool = self._operator_pool if req.cmd in OPERATOR_VERBS else self._pool
        if pool is None:  # stopping
            self._close(conn)
            return
        conn.busy = True
        pool.submit(self._run_request, conn, req)

    def _reply_bytes(self, req: Request, peer_pid: int | None, inline: bool = False) -> bytes:
        """The verb run, its reply encoded (an encoding failure answered as an internal error).
        ``inline``: on the selector thread, where the verb may raise ``RunOnWorker``."""
        _serving.peer_pid = peer_pid
        _serving.inline = inline
        try:
            return self.encode_reply(self._dispatch(req))
        except RunOnWorker:
            raise
        except BaseException as exc:
            self._count_error()
            _rl.error(f"encode.{req.cmd}", "reply of %r could not be sent: %r", req.cmd, exc)
            return _encode(_error(f"internal error in {req.cmd!r}: {type(exc).__name__}"))
        finally:
            _serving.peer_pid = None
            _serving.inline = False

    def _run_request(self, conn: _Conn, req: Request) -> None:
        """On a worker: the verb, its reply encoded, handed back to the selector thread."""
        data = self._reply_bytes(req, conn.peer_pid)
        self._replies.append((conn, data))
        self._wake()

    def _take_replies(self) -> None:
        while self._replies:
            conn, data = self._replies.popleft()
            if conn.closed:
                continue  # evicted or gone while its verb ran
            conn.busy = False
            conn.outbuf += data
            self._touch(conn)
            self._serve_one(conn, 0)

    # -------------------------------------------------------------- dispatch
    def encode_reply(self, reply: dict[str, Any]) -> bytes:
        """One reply line (a method so bench/bench_socket_reply.py can put the old encoder beside it)."""
        return _encode(reply)

    def handle_line(self, line: bytes) -> dict[str, Any]:
        """Decode and dispatch one request line; always returns a reply, never raises."""
        self.requests += 1
        req, error = self._parse(line)
        if req is None:
            return error or _error("malformed request")
        return self._dispatch(req)

    def _parse(self, line: bytes) -> tuple[Request | None, dict[str, Any] | None]:
        """A request line -> its checked Request, or the error reply (bounded JSON, typed fields)."""
        try:
            return parse_request(loads_bounded(line, self.bounds)), None
        except BadField as exc:
            self._count_error()
            return None, _error(str(exc), exc.field)
        except JsonRefused as exc:
            self._count_error()
            return None, _error(str(exc))

    def handle(self, req: Any) -> dict[str, Any]:
        """Dispatch an already decoded request (checked here first); never raises."""
        try:
            checked = parse_request(req)
        except BadField as exc:
            self._count_error()
            return _error(str(exc), exc.field)
        return self._dispatch(checked)

    def _dispatch(self, req: Request) -> dict[str, Any]:
        cmd = req.cmd
        with self._lock:
            handler = self._handlers.get(cmd)
        if handler is None:
            self._count_error()
            with self._lock:
                reason = next((r for p, r in self._unavailable.items() if cmd.startswith(p)), None)
            if reason is not None:
                return _error(reason)
            return _error(f"unknown command {cmd[:100]!r} (try 'help')")
        try:
            result = handler(req.as_dict()) or {}
        except RunOnWorker:
            if _serving.inline:
                raise
            self._count_error()  # only the selector thread may hand a verb on
            return _error(f"internal error in {cmd!r}: it asked for a worker while on one")
        except RequestError as exc:
            self._count_error()
            return _error(str(exc), exc.field)
        except Exception as exc:
            self._count_error()
            _rl.error(f"handler.{cmd}", "handler %r failed: %r", cmd, exc)
            log.debug("handler traceback", exc_info=True)
            return _error(f"internal error in {cmd!r}: {type(exc).__name__}: {exc}")
        reply: dict[str, Any] = {"ok": True, "api_version": API_VERSION}
        reply.update(result)
        return reply


_BUILT_IN = frozenset({"ping", "version", "help"})  # a daemon may replace these


def _error(text: str, field: str | None = None) -> dict[str, Any]:
    """The error reply (daemon/api/messages.py ``ErrorReply``)."""
    return {"ok": False, "api_version": API_VERSION, "error": text, "field": field}


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("so101d")
    except PackageNotFoundError:  # a source tree not installed
        return "unknown"


def _enc_hook(o: Any) -> Any:
    """What a handler's reply may hold besides JSON's own types: numpy values, paths."""
    try:
        import numpy as np

        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


def _encode(obj: dict[str, Any]) -> bytes:
    """One reply line. msgspec: several times json.dumps's speed (bench/bench_socket_reply.py)."""
    buf = bytearray()
    try:
        _ENCODER.encode_into(obj, buf)
    except TypeError:  # e.g. a dict with number keys, which msgspec refuses and JSON writes as text
        return (json.dumps(obj, separators=(",", ":"), default=_enc_hook) + "\n").encode("utf-8")
    buf += b"\n"
    return bytes(buf)
