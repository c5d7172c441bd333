"""Who may open the console: loopback by default; any other address needs the console's token.

The token is made once (``secrets.token_urlsafe``), kept in the state directory with mode 0600
(``console-token``), printed when a non-loopback console starts and named in its log. A page
presents it once as ``?token=...``; the console answers with an HttpOnly cookie. Every request
then needs the cookie (or the query).

Also, whatever the address: the websocket is refused unless its ``Origin`` is the console itself.
Without that, any web page the operator's browser opens could drive the arm through a console on
127.0.0.1 (a browser lets any site open a websocket to loopback).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

TOKEN_FILE = "console-token"
COOKIE = "so101d_console"


def state_dir() -> Path:
    """systemd's $STATE_DIRECTORY for the unit, else $XDG_STATE_HOME/so101d (~/.local/state/so101d)."""
    sd = os.environ.get("STATE_DIRECTORY")
    if sd:
        return Path(sd.split(":")[0])
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(xdg) / "so101d"


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def load_or_create_token(directory: Path) -> tuple[str, bool]:
    """(token, created): the one kept in ``directory``, made (0600) if there is none."""
    path = directory / TOKEN_FILE
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        if len(token) >= 16:
            return token, False
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_CREAT
    return token, True


def token_matches(given: str | None, token: str) -> bool:
    return bool(given) and secrets.compare_digest(str(given), token)
