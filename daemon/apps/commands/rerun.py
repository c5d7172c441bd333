"""`so101d rerun [--connect HOST:PORT]`: stream the running daemon's joints and cameras to Rerun.

A client of the control socket in its own process (daemon/apps/rerun_stream.py), by hand against any
running daemon, or started by the daemon itself for ``[display] rerun = "HOST:PORT"`` /
``so101d run|demo --rerun HOST:PORT`` (then with --exit-with-parent: it dies with the daemon).
Runs until SIGINT / SIGTERM; a viewer or daemon that is away is waited for.
Exit status: 0 when stopped, 2 on a bad address, 3 when rerun-sdk is not installed.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from daemon.api.client import add_socket_arguments, socket_path_from_args
from daemon.apps.rerun_stream import CAMERA_FPS, DEFAULT_VIEWER, JOINTS_HZ

log = logging.getLogger("so101d.rerun")
EXIT_NO_SDK = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from drivers.parent_watch import add_exit_with_parent_arguments

    parser.add_argument(
        "--connect",
        metavar="HOST:PORT",
        help=f"the Rerun viewer's address (default: [display] rerun from --config, else {DEFAULT_VIEWER}, "
        "where `rerun` listens)",
    )
    parser.add_argument(
        "--joints-hz",
        type=float,
        default=JOINTS_HZ,
        metavar="HZ",
        help=f"joint samples per second (default {JOINTS_HZ:g})",
    )
    parser.add_argument(
        "--camera-fps",
        type=float,
        default=CAMERA_FPS,
        metavar="FPS",
        help=f"frames per second per camera, at most the camera's own (default {CAMERA_FPS:g})",
    )
    add_socket_arguments(parser)
    add_exit_with_parent_arguments(parser)


def _address(args: argparse.Namespace) -> str:
    if args.connect:
        return str(args.connect)
    if getattr(args, "config", None):
        from daemon.config.settings import load_config

        configured = load_config(args.config).display.rerun
        if configured:
            return configured
    return DEFAULT_VIEWER


def run(args: argparse.Namespace) -> int:
    from daemon.apps.rerun_stream import RerunMissing, RerunStreamer, StreamConfig, import_rerun
    from daemon.config.settings import ConfigError, parse_host_port
    from drivers.parent_watch import watch_parent
    from drivers.signal_wake import SignalWake

    try:
        address = _address(args)
        host, port = parse_host_port(address)
        socket_path = socket_path_from_args(args)
    except (ValueError, ConfigError) as exc:
        print(f"so101d rerun: {exc}", file=sys.stderr)
        return 2
    for name in ("joints_hz", "camera_fps"):
        if not 0 < getattr(args, name) <= 100:
            print(f"so101d rerun: --{name.replace('_', '-')} must be in (0, 100]", file=sys.stderr)
            return 2
    try:
        rr = import_rerun()
    except RerunMissing as exc:
        log.error("%s; not streaming to %s", exc, address)
        return EXIT_NO_SDK
    wake = SignalWake()
    wake.install((signal.SIGTERM, signal.SIGINT))
    parent_gone = watch_parent(args.exit_with_parent, args.parent_death_signal)

    def wait(timeout_s: float) -> bool:
        """Sleep up to timeout_s; True when stopping (a signal, or the daemon that started us gone)."""
        if wake.wait(timeout_s):
            return True
        if parent_gone():
            log.info("the daemon that started us (pid %d) is gone: stopping", args.exit_with_parent)
            return True
        return False

    cfg = StreamConfig(socket_path, host, port, joints_hz=args.joints_hz, camera_fps=args.camera_fps)
    try:
        RerunStreamer(cfg, rr, wait).run()
    finally:
        wake.close()
    return 0
