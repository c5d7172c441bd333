"""`so101d torque on|off`: follower torque (off = idle and limp: support the arm first!)."""

from __future__ import annotations

import argparse

from daemon.api.client import add_socket_arguments, run_simple


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("state", choices=("on", "off"), help="on: hold the current pose; off: limp (idle)")
    add_socket_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return run_simple(args, f"torque.{args.state}")
