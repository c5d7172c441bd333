"""Who may open the console, and under which names (docs/security.md says why these rules).

- **Who**: the same rule as the control socket. On loopback the console finds the user behind
  each TCP connection (the kernel's answer for exactly this connection's client end, asked over
  sock_diag; only a live socket names its owner, a closed end names nobody) and serves only a user
  who may connect to the control socket itself: by the socket file's owner, group and mode and
  the search permission of the folders above it, as the kernel decides ``connect()``. The
  console's own user is always served (it is the one talking to the socket). Off loopback the
  peer is another machine and has no local user: every request needs the console's token.
- **Under which names** (every address): the request's ``Host`` must be the console's bind
  address (bound to ``localhost``: 127.0.0.1 and ::1), ``localhost``, any IP literal when bound to
  every address, or a name on the configured allow-list. A page on ``evil.example`` whose name was re-pointed at 127.0.0.1 (DNS rebinding)
  is refused before anything is served.
- **From which page**: the websocket is refused unless its ``Origin`` is the console itself.

The token is made once (``secrets.token_urlsafe``), kept in the state directory with mode 0600
(``console-token``), printed when a non-loopback console starts and named in its log. An
existing token file readable by others is refused with the reason. A page presents the token once
as ``?token=...``; the console answers with an HttpOnly cookie.
"""

from __future__ import annotations

import errno
import grp
import ipaddress
import os
import pwd
import secrets
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TOKEN_FILE = "console-token"
COOKIE = "so101d_console"
LOCAL_NAMES = ("localhost", "localhost.localdomain")
_LOCAL_LITERALS = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
_PROC_TCP = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_HOST_ORDER: Literal["little", "big"] = "big" if socket.htonl(1) == 1 else "little"


class TokenFileUnsafe(OSError):
    """The token file exists but others may read or replace it (the message says how to fix it)."""


def state_dir() -> Path:
    """systemd's $STATE_DIRECTORY for the unit, else $XDG_STATE_HOME/so101d (~/.local/state/so101d)."""
    sd = os.environ.get("STATE_DIRECTORY")
    if sd:
        return Path(sd.split(":")[0])
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(xdg) / "so101d"


def is_loopback(host: str) -> bool:
    if host in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


# ------------------------------------------------------------------------------------------ token
def load_or_create_token(directory: Path) -> tuple[str, bool]:
    """(token, created): the one kept in ``directory``, made (0600) if there is none.

    An existing file must be a regular file of ours that nobody else may read or write: a token
    others could read is no secret (TokenFileUnsafe, with the command that fixes it)."""
    path = directory / TOKEN_FILE
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileUnsafe(f"{path} is not a regular file; remove it and start the console again")
        if st.st_uid != os.geteuid():
            raise TokenFileUnsafe(f"{path} belongs to uid {st.st_uid}, not to this user; remove it")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise TokenFileUnsafe(
                f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read the token. "
                f"`chmod 600 {path}` keeps it, or remove the file for a new one"
            )
        token = path.read_text(encoding="utf-8").strip()
        if len(token) >= 16:
            return token, False
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), 0o600)  # an existing (empty) file keeps its old mode through O_CREAT
        fh.write(token + "\n")
    return token, True


def token_matches(given: str | None, token: str) -> bool:
    return bool(given) and secrets.compare_digest(str(given), token)


# ------------------------------------------------------------------------------------------- Host
@dataclass(frozen=True)
class HostRule:
    """The names the console answers to (see the module docstring)."""

    bind_host: str
    allowed: tuple[str, ...] = ()  # configured names (lower case)

    def permits(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        name = _host_name(host_header)
        if name is None:
            return False
        if name in LOCAL_NAMES or name in self.allowed or name == self.bind_host.lower():
            return True
        try:
            literal = ipaddress.ip_address(name)
        except ValueError:
            return False  # a name nobody listed: what DNS rebinding looks like
        bind = _ip(self.bind_host)
        if bind is None:  # bound by name (localhost): the loopback addresses that name stands for
            return self.bind_host.lower() in LOCAL_NAMES and literal in _LOCAL_LITERALS
        # an IP literal cannot be re-pointed by DNS: served when it is the address we are bound
        # to, or any when bound to every address (off loopback the token is asked as well)
        return bind.is_unspecified or literal == bind


def _host_name(header: str) -> str | None:
    """``Host`` -> the lower-case name or address without port (None: not a host)."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        rest = h[end + 1 :] if end > 0 else ""
        if rest and not (rest.startswith(":") and _port_ok(rest[1:])):
            return None
        return h[1:end] if end > 0 else None
    name, _, port = h.partition(":")
    if port and not _port_ok(port):
        return None
    return name.rstrip(".") or None


def _port_ok(port: str) -> bool:
    return port.isascii() and port.isdigit() and 0 < int(port) < 65536


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


# ------------------------------------------------------------------------------------- who (uid)
# The kernel's answer for one TCP socket, asked by its 4-tuple (sock_diag, linux/inet_diag.h): an
# exact lookup costs the same however many sockets the machine has, where reading /proc/net/tcp
# costs a line per socket any local user may open.
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLMSG_ERROR = 2
_NETLINK_SOCK_DIAG = 4
_TCP_ESTABLISHED = 1
_NOCOOKIE = 0xFFFFFFFF
_NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# family, protocol, ext, pad, states | sport, dport (network order) | src, dst (16 bytes each),
# interface, cookie (two words): struct inet_diag_req_v2
_DIAG_REQ_HEAD = struct.Struct("=BBBxI")
_DIAG_REQ_PORTS = struct.Struct("!HH")
_DIAG_REQ_TAIL = struct.Struct("=16s16sIII")
# family, state, timer, retrans; sockid (48 bytes); expires, rqueue, wqueue, uid, inode
_DIAG_MSG = struct.Struct("=BBBB48xIIIII")


class PeerUnknown(LookupError):
    """The kernel cannot name a live owner for this connection (closed, or not found)."""


@dataclass(frozen=True)
class _Conn:
    """The client's socket as the kernel files it: its own end (local) and ours (remote)."""

    family: int
    client: ipaddress.IPv4Address | ipaddress.IPv6Address
    client_port: int
    server: ipaddress.IPv4Address | ipaddress.IPv6Address
    server_port: int


def _client_conn(peer: tuple[str, int], local: tuple[str, int]) -> _Conn:
    """An IPv4 client of a dual-stack listener is ::ffff:a.b.c.d on our side and a plain IPv4
    socket on its own: both ends mapped -> look it up as IPv4."""
    a, b = (ipaddress.ip_address(h.split("%")[0]) for h in (peer[0], local[0]))
    if isinstance(a, ipaddress.IPv6Address) and isinstance(b, ipaddress.IPv6Address):
        a4, b4 = a.ipv4_mapped, b.ipv4_mapped
        if a4 is not None and b4 is not None:
            a, b = a4, b4
    family = socket.AF_INET if isinstance(a, ipaddress.IPv4Address) else socket.AF_INET6
    return _Conn(family, a, int(peer[1]), b, int(local[1]))


def peer_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The user owning the client end of the loopback TCP connection ``peer`` -> ``local``, or
    None when it cannot be told: only a live (ESTABLISHED) socket that still has an inode names
    its owner. A closed end (FIN_WAIT, TIME_WAIT: the kernel shows uid 0 and inode 0 for those)
    names nobody, least of all root."""
    conn = _client_conn(peer, local)
    try:
        return _diag_uid(conn)
    except PeerUnknown:
        return None
    except OSError:
        return _proc_uid(conn)  # no sock_diag here (a kernel without it, a sandbox): same rules


def _diag_uid(conn: _Conn) -> int:
    """Ask the kernel (NETLINK_SOCK_DIAG) for exactly this socket; PeerUnknown if it isn't live."""
    req = (
        _DIAG_REQ_HEAD.pack(conn.family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF)
        + _DIAG_REQ_PORTS.pack(conn.client_port, conn.server_port)
        + _DIAG_REQ_TAIL.pack(conn.client.packed, conn.server.packed, 0, _NOCOOKIE, _NOCOOKIE)
    )
    msg = _NLMSG_HDR.pack(_NLMSG_HDR.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + req
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(msg, (0, 0))
        data = nl.recv(8192)
    if len(data) < _NLMSG_HDR.size:
        raise PeerUnknown("short reply")
    length, kind, _flags, _seq, _pid = _NLMSG_HDR.unpack_from(data)
    if kind == _NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, _NLMSG_HDR.size)
        if err in (-errno.ENOENT, 0):
            raise PeerUnknown("no such socket")
        raise OSError(-err, os.strerror(-err))  # e.g. the family is not supported: fall back
    if kind != _SOCK_DIAG_BY_FAMILY or length < _NLMSG_HDR.size + _DIAG_MSG.size:
        raise PeerUnknown("unexpected reply")
    _fam, state, _t, _r, _exp, _rq, _wq, uid, inode = _DIAG_MSG.unpack_from(data, _NLMSG_HDR.size)
    if state != _TCP_ESTABLISHED or inode == 0:
        raise PeerUnknown("not a live socket")
    return int(uid)


def _proc_uid(conn: _Conn) -> int | None:
    """The same answer from /proc/net/tcp{,6} (reads the whole table): the row of this very
    connection, ESTABLISHED (st 01) with a non-zero inode, else None."""
    table = _PROC_TCP[0] if conn.family == socket.AF_INET else _PROC_TCP[1]
    key = (_proc_addr(conn.client, conn.client_port), _proc_addr(conn.server, conn.server_port))
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        cols = line.split()
        if len(cols) > 9 and (cols[1].upper(), cols[2].upper()) == key:
            if cols[3] != "01" or cols[9] == "0":
                return None
            return int(cols[7])
    return None


def _proc_addr(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """An address as /proc/net/tcp{,6} writes it: the address bytes in 32-bit host-order words."""
    packed = ip.packed
    words = [packed[i : i + 4] for i in range(0, len(packed), 4)]
    hexed = "".join(int.from_bytes(w, _HOST_ORDER).to_bytes(4, "big").hex() for w in words)
    return f"{hexed.upper()}:{port:04X}"


def may_connect(uid: int, socket_path: str | Path) -> bool:
    """Whether user ``uid`` may ``connect()`` to the unix socket at ``socket_path``: search on every
    folder above it and write on the socket, by owner / group / other bits (root: always)."""
    if uid == 0:
        return True
    try:
        user = pwd.getpwuid(uid)
        groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    except KeyError:
        groups = set()  # a uid without a passwd entry: only the "other" bits apply
    path = Path(os.path.abspath(socket_path))
    try:
        checks = [(os.stat(p), 0o1) for p in reversed(path.parents)] + [(os.stat(path), 0o2)]
    except OSError:
        return False
    for st, bit in checks:
        if st.st_uid == uid:
            allowed = st.st_mode & (bit << 6)
        elif st.st_gid in groups:
            allowed = st.st_mode & (bit << 3)
        else:
            allowed = st.st_mode & bit
        if not allowed:
            return False
    return True


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def socket_group(socket_path: str | Path) -> str:
    """The group the control socket admits (for the refusal's advice)."""
    try:
        return grp.getgrgid(os.stat(socket_path).st_gid).gr_name
    except (OSError, KeyError):
        return "the daemon's group"
