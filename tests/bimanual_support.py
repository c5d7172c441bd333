"""The virtual bimanual rig's configuration, as docs/configuration.md shows it ([arms.left] /
[arms.right] on the four ports of `so101d emulate --bimanual`, LeRobot's bimanual calibration ids
from the bench's --calibration-out folder), for every bimanual story."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from support import wait_for

from daemon.config.settings import load_config
from daemon.service.daemon import Daemon
from drivers.emulator.process import EmulatorProcess

SIDES = ("left", "right")
# the leaders held still at two different poses (the operator's hands, not moving)
LEFT_POSE = [-30.0, -40.0, 40.0, 30.0, 0.0, 20.0]
RIGHT_POSE = [30.0, -60.0, 60.0, 50.0, 10.0, 60.0]


def bimanual_toml(bench: EmulatorProcess, extra: str = "", rate_hz: float | None = 50.0) -> str:
    """The rig's so101d.toml text; ``extra``: more tables ([socket], [recording], ...)."""
    links = bench.links
    control = f"\n[control]\nrate_hz = {rate_hz}\n" if rate_hz is not None else ""
    return f"""
[leader]
id = "emulated_leader"

[follower]
id = "emulated_follower"

[arms.left]
leader_port = "{links["left_leader"]}"
follower_port = "{links["left_follower"]}"

[arms.right]
leader_port = "{links["right_leader"]}"
follower_port = "{links["right_follower"]}"

[calibration]
root = "{bench.directory / "calibration"}"
{control}{extra}"""


def write_bimanual_config(
    bench: EmulatorProcess, directory: Path, extra: str = "", rate_hz: float | None = 50.0
) -> Path:
    path = directory / "so101d.toml"
    path.write_text(bimanual_toml(bench, extra, rate_hz))
    return path


@contextlib.contextmanager
def still_bimanual_bench(directory: Path) -> Iterator[EmulatorProcess]:
    """`so101d emulate --bimanual` with each leader held still, left at LEFT_POSE, right at RIGHT_POSE."""
    with EmulatorProcess(directory, bimanual=True, calibration_out=directory / "calibration") as bench:
        for side, pose in zip(SIDES, (LEFT_POSE, RIGHT_POSE)):
            bench.control({"cmd": "set_motion", "arm": f"{side}_leader", "motion": "still"})
            bench.control({"cmd": "set_pose", "arm": f"{side}_leader", "pose_units": pose})
        yield bench


@contextlib.contextmanager
def tracking_daemon(config: Path) -> Iterator[Daemon]:
    """The daemon in this process on the rig's configuration, started, once both arms track."""
    daemon = Daemon(load_config(config))
    daemon.start()
    try:
        wait_for(lambda: all(a.state.mode == "teleop" for a in daemon.loop.arms), 30, "both arms tracking")
        yield daemon
    finally:
        daemon.stop()
