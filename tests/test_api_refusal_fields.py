"""A client author sends a request the types allow but the daemon cannot serve as asked (a camera
that does not exist): the error reply's ``field`` names the request field at fault, as it does
for a value of the wrong type, so a client can point at the right box without parsing the text.

Real parts: the daemon in-process on emulated arms (our Feetech driver on the STS3215 emulator)
with one virtual camera; the request goes over the real control socket.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import still_arm_on_pty, wait_for

from daemon.api.client import ControlClient
from daemon.config.settings import config_from_dict
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

POSE = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])


@pytest.fixture
def daemon(tmp_path: Path):
    _la, lb = still_arm_on_pty(tmp_path / "leader", "leader", POSE)
    _fa, fb = still_arm_on_pty(tmp_path / "follower", "follower", POSE)
    cfg = config_from_dict(
        {
            "socket": {"path": str(tmp_path / "c.sock")},
            "cameras": {"front": {"kind": "virtual", "width": 160, "height": 120, "fps": 30}},
        }
    )
    d = Daemon(
        cfg,
        FeetechLeader(str(tmp_path / "leader"), reference_calibration("leader")),
        FeetechFollower(str(tmp_path / "follower"), reference_calibration("follower")),
    )
    d.start()
    try:
        yield d
    finally:
        d.stop()
        lb.stop()
        fb.stop()


def test_a_camera_that_does_not_exist_is_refused_naming_the_field(daemon) -> None:
    wait_for(lambda: daemon.loop.state.mode == "teleop", 20, "teleop")
    with ControlClient(daemon.socket_path) as c:
        for req in ({"camera": "nope"}, {}, {"camera": None}):
            reply = c.call("camera.preview", **req)
            assert reply["ok"] is False, reply
            assert reply["field"] == "camera", reply
            assert "front" in reply["error"], reply  # and says which cameras there are
        reply = c.call("camera.preview", camera="front")
        assert reply["ok"] is True and reply["camera"] == "front", reply
