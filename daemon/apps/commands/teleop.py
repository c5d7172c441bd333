"""`so101d teleop start|stop`: start following the leader (after alignment) or stop (= hold)."""

from __future__ import annotations

import argparse

from daemon.api.client import add_socket_arguments, run_simple


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "stop"), help="start: align then follow; stop: hold the pose")
    add_socket_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return run_simple(args, f"teleop.{args.action}")
