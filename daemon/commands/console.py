"""`so101d console [--bind 127.0.0.1:8101]`: the operator's console in the browser.

Its own process (the daemon stays lean): a client of the control socket like every other verb.
Loopback by default; another address needs the console's token (kept in the state directory,
printed here, named in the log).
"""

from __future__ import annotations

import argparse
import logging
import sys

from daemon.control_client import add_socket_arguments, socket_path_from_args

log = logging.getLogger("so101d.console")
DEFAULT_BIND = "127.0.0.1:8101"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default=DEFAULT_BIND, metavar="HOST:PORT", help=f"address (default {DEFAULT_BIND})")
    parser.add_argument(
        "--state-dir", metavar="DIR", help="where the token is kept (default $STATE_DIRECTORY or ~/.local/state/so101d)"
    )
    add_socket_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from aiohttp import web

    from daemon.console import access
    from daemon.console.app import Console, ConsoleConfig

    try:
        host, port = access.parse_bind(args.bind)
    except ValueError as exc:
        print(f"so101d console: {exc}", file=sys.stderr)
        return 2
    token = None
    if not access.is_loopback(host):
        state = Path(args.state_dir) if args.state_dir else access.state_dir()
        try:
            token, created = access.load_or_create_token(state)
        except OSError as exc:
            print(f"so101d console: cannot keep the access token in {state}: {exc}", file=sys.stderr)
            return 2
        log.warning(
            "console on %s (not loopback): every request needs the token kept in %s%s",
            host,
            state / access.TOKEN_FILE,
            " (made now)" if created else "",
        )
    console = Console(ConsoleConfig(socket_path=socket_path_from_args(args), host=host, port=port, token=token))
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")

    async def announce(app: web.Application) -> None:
        print(f"so101d console: {url}  (daemon socket {console.cfg.socket_path}; Ctrl-C stops)", flush=True)

    app = console.make_app()
    app.on_startup.append(announce)
    try:
        web.run_app(app, host=host, port=port, print=None, handle_signals=True, access_log=None)
    except OSError as exc:
        print(f"so101d console: cannot listen on {args.bind}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0
