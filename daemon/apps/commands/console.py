"""`so101d console [--bind 127.0.0.1:8101]`: the operator's console in the browser.

Its own process (the daemon stays lean): a client of the control socket like every other verb.
Loopback by default, where it serves the users the control socket admits; another address needs
the console's token (kept in the state directory, printed here, named in the log). Pages are
served only under its bind address, localhost and ``[console] allowed_hosts`` / ``--allow-host``
(daemon/apps/console/access.py, docs/security.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from daemon.api.client import add_socket_arguments, socket_path_from_args

log = logging.getLogger("so101d.console")
DEFAULT_BIND = "127.0.0.1:8101"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default=DEFAULT_BIND, metavar="HOST:PORT", help=f"address (default {DEFAULT_BIND})")
    parser.add_argument(
        "--state-dir", metavar="DIR", help="where the token is kept (default $STATE_DIRECTORY or ~/.local/state/so101d)"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer under this host name (repeatable; adds to [console] allowed_hosts)",
    )
    add_socket_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from daemon.apps.console import access
    from daemon.apps.console.app import Console, ConsoleConfig
    from daemon.config.settings import ConfigError, load_config, parse_host_port

    try:
        host, port = parse_host_port(args.bind, min_port=0)  # 0: any free port
    except ValueError as exc:
        print(f"so101d console: --bind: {exc}", file=sys.stderr)
        return 2
    try:
        allowed = (
            [*load_config(args.config).console.allowed_hosts, *args.allow_host] if args.config else args.allow_host
        )
    except ConfigError as exc:
        print(f"so101d console: {exc}", file=sys.stderr)
        return 2
    token = None
    if not access.is_loopback(host):
        state = Path(args.state_dir) if args.state_dir else access.state_dir()
        try:
            token, created = access.load_or_create_token(state)
        except access.TokenFileUnsafe as exc:
            print(f"so101d console: refusing the access token: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"so101d console: cannot keep the access token in {state}: {exc}", file=sys.stderr)
            return 2
        log.warning(
            "console on %s (not loopback): every request needs the token kept in %s%s",
            host,
            state / access.TOKEN_FILE,
            " (made now)" if created else "",
        )
    console = Console(
        ConsoleConfig(
            socket_path=socket_path_from_args(args), host=host, port=port, token=token, allowed_hosts=tuple(allowed)
        )
    )
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")

    app = console.make_app()
    try:
        asyncio.run(_serve(app, host, port, url, console.cfg.socket_path))
    except OSError as exc:
        print(f"so101d console: cannot listen on {args.bind}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


async def _serve(app: web.Application, host: str, port: int, url: str, socket_path: str) -> None:
    """Serve until SIGINT / SIGTERM; the address is printed once the port is listening."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        print(f"so101d console: {url}  (daemon socket {socket_path}; Ctrl-C stops)", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
