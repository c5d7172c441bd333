"""The virtual bimanual rig's configuration, as docs/configuration.md shows it ([arms.left] /
[arms.right] on the four ports of `so101d emulate --bimanual`, LeRobot's bimanual calibration ids
from the bench's --calibration-out folder), for every bimanual story."""

from __future__ import annotations

from pathlib import Path

from drivers.emulator.process import EmulatorProcess


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
