"""`so101d` console entry point.

Each subcommand lives in its own module, imported only when that subcommand runs (so `--help`
stays instant and the control loop never imports torch it does not need). A command module
exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Keep alphabetical within each group.
COMMANDS: dict[str, tuple[str, str]] = {
    # the daemon and its control socket
    "console": (
        "daemon.apps.commands.console",
        "the operator's console in the browser (live view, recording, episodes)",
    ),
    "demo": ("daemon.apps.commands.demo", "run the daemon on the virtual bench (emulated leader and follower)"),
    "rerun": ("daemon.apps.commands.rerun", "stream the daemon's joints and cameras to a Rerun viewer"),
    "run": ("daemon.apps.commands.run", "run the daemon in the foreground (what systemd runs)"),
    "status": ("daemon.apps.commands.status", "show the running daemon's status"),
    "teleop": ("daemon.apps.commands.teleop", "start or stop teleoperation (stop = hold)"),
    "torque": ("daemon.apps.commands.torque", "switch the follower's torque on or off"),
    "policy": (
        "daemon.apps.commands.policy",
        "load, start, stop a local policy (inference next to the servos); check, serve",
    ),
    # hardware and calibration
    "calibrate": ("daemon.apps.commands.calibrate", "calibrate a leader or follower arm"),
    "doctor": (
        "daemon.apps.commands.doctor",
        "bring-up check of the arms (read-only; --power-cycle proves settings persist)",
    ),
    "emulate": ("drivers.emulator.cli", "serve emulated SO-101 arms on pseudo-terminals"),
    "find-cameras": ("daemon.apps.commands.find_cameras", "list the cameras, their modes, a snapshot each, the config"),
    "find-ports": (
        "daemon.apps.commands.find_ports",
        "identify the leader's and follower's serial ports; write udev rules",
    ),
    "install-service": (
        "daemon.apps.commands.install_service",
        "install the systemd unit, udev rules and configuration",
    ),
    "setup-motors": (
        "daemon.apps.commands.setup_motors",
        "give a new kit's servos their ids and 1 Mbaud, one servo connected at a time (gripper first)",
    ),
    "sim-follower": ("sim_bridge.cli", "serve a simulated follower (MuJoCo) for the daemon over ZeroMQ"),
    # datasets
    "replay": ("daemon.apps.commands.replay", "play a dataset episode on the arm, then report how it followed"),
    "episode": ("daemon.apps.commands.episode", "start, save (--success/--failure) or discard an episode"),
    "record": (
        "daemon.apps.commands.record",
        "record a session of N episodes (keys: enter save, f failure, backspace redo)",
    ),
    "dataset": ("daemon.apps.commands.dataset", "info, check, merge, delete, keep, split, retag, pack a dataset"),
    "export-hdf5": ("daemon.apps.commands.export_hdf5", "export episodes as Isaac Lab Mimic seed demos (HDF5)"),
    "import-hdf5": ("daemon.apps.commands.import_hdf5", "import Isaac Lab / LeIsaac HDF5 demos into a dataset"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Top-level parser; only the chosen subcommand's module is imported to add its options."""
    chosen = next((tok for tok in argv if tok in COMMANDS), None)
    parser = argparse.ArgumentParser(
        prog="so101d",
        description="Teleoperation, recording and local inference daemon for the SO-101 arm.",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    from daemon.system.logs import setup_logging

    setup_logging(args.log_level)
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
