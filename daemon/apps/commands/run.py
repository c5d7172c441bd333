"""`so101d run --config FILE`: the daemon in the foreground until SIGTERM/SIGINT (what systemd runs)."""

from __future__ import annotations

import argparse
import logging
import sys

log = logging.getLogger("so101d.run")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="TOML configuration (default: built-in defaults, leader on /dev/ttyACM0)"
    )
    parser.add_argument("--socket", metavar="PATH", help="control socket path (overrides [socket] path)")
    parser.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (scripted runs)")
    add_rerun_argument(parser)


def add_rerun_argument(parser: argparse.ArgumentParser) -> None:
    """--rerun HOST:PORT, shared with `so101d demo`."""
    parser.add_argument(
        "--rerun",
        metavar="HOST:PORT",
        help="stream joints and cameras to the Rerun viewer there (overrides [display] rerun; "
        "a helper process, `so101d rerun`)",
    )


def rerun_argument_error(args: argparse.Namespace) -> str | None:
    """Why --rerun's value is no address, or None."""
    from daemon.config.settings import parse_host_port

    if args.rerun is None:
        return None
    try:
        parse_host_port(args.rerun)
    except ValueError as exc:
        return f"--rerun: {exc} (a Rerun viewer's address)"
    return None


def run(args: argparse.Namespace) -> int:
    from daemon.api.server import SocketInUseError
    from daemon.config.settings import ConfigError, load_config
    from daemon.service.daemon import Daemon, StartupError

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"so101d: configuration error: {exc}", file=sys.stderr)
        return 2
    bad = rerun_argument_error(args)
    if bad:
        print(f"so101d: {bad}", file=sys.stderr)
        return 2
    notifier = None
    try:
        from daemon.system.sd_notify import Notifier

        notifier = Notifier.from_env(unset_environment=True)  # children must not talk to systemd
    except ImportError:  # pragma: no cover
        pass
    try:
        daemon = Daemon(cfg, notifier=notifier, socket_path=args.socket, config_path=args.config, rerun=args.rerun)
        return daemon.run_forever(duration_s=args.duration)
    except (StartupError, SocketInUseError) as exc:
        print(f"so101d: cannot start: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"so101d: cannot start: {exc}", file=sys.stderr)
        return 2
