"""Attacks on the bimanual loop: what a running two-arm daemon must honour."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config.settings import config_from_dict
from daemon.control.loop import ControlLoop
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

pytestmark = pytest.mark.unit


def test_sighup_reload_of_fault_holds_reaches_the_loop(tmp_path: Path) -> None:
    """safety.fault_holds is a reloadable safety setting: after a reload to "faulted" a fault on
    the right arm must no longer hold the left one (and back to "all" must hold both again)."""

    def cfg(holds: str):
        return config_from_dict({"socket": {"path": str(tmp_path / "c.sock")}, "safety": {"fault_holds": holds}})

    loop = ControlLoop(
        FeetechLeader(str(tmp_path / "l"), reference_calibration("leader")),
        FeetechFollower(str(tmp_path / "f"), reference_calibration("follower")),
        cfg("all"),
        primary_name="left",
        leader_name="left_leader",
    )
    assert loop.hold_together
    loop.apply_config(cfg("faulted"))
    assert not loop.hold_together, "fault_holds reloaded to 'faulted' but the loop still holds every arm together"
    loop.apply_config(cfg("all"))
    assert loop.hold_together
