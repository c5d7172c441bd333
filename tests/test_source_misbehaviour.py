"""A client author's source that misbehaves: it answers a plain list, a wrong shape, text, or
raises. Attached through the public seams only (``loop.add_source``, ``loop.assign``), on the
real daemon driving an emulated follower through our Feetech driver.

What must hold: the control loop keeps running (a list once killed its thread while status kept
saying "teleop, following leader"), the arm holds, status says which source and what was wrong,
and handing the arm back to the leader resumes teleop.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import still_arm_on_pty, wait_for

from daemon.api.client import ControlClient
from daemon.config.settings import config_from_dict
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

POSE = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])


class Answers:
    """A TargetSource that answers ``value`` (or raises it) every cycle."""

    def __init__(self, value: object) -> None:
        self.value = value
        self.calls = 0

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        self.calls += 1
        if isinstance(self.value, Exception):
            raise self.value
        return self.value  # type: ignore[return-value]  # what a careless client returns


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("misbehaving")
    _la, lb = still_arm_on_pty(tmp / "leader", "leader", POSE)
    _fa, fb = still_arm_on_pty(tmp / "follower", "follower", POSE)
    cfg = config_from_dict({"socket": {"path": str(tmp / "c.sock")}})
    daemon = Daemon(
        cfg,
        FeetechLeader(str(tmp / "leader"), reference_calibration("leader")),
        FeetechFollower(str(tmp / "follower"), reference_calibration("follower")),
    )
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        lb.stop()
        fb.stop()


CASES = {
    "a_long_list": ([0.0, -60.0, 60.0, 40.0, 0.0, 20.0, 1.0], "6 joint values"),
    "a_list_of_text": (["a"] * 6, "6 joint values"),
    "a_short_array": (np.zeros(3), "6 joint values"),
    "a_column": (np.zeros((6, 1)), "6 joint values"),
    "text": ("abc", "6 joint values"),
    "a_raise": (RuntimeError("boom"), "boom"),
    "nan": (np.full(6, np.nan), "not finite"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_misbehaving_source_holds_the_arm_and_says_why(bench, name: str) -> None:
    daemon = bench
    loop = daemon.loop
    value, why = CASES[name]
    wait_for(lambda: loop.state.mode == "teleop", 30, "teleop")
    source = Answers(value)
    loop.add_source(name, source)
    loop.assign("follower", name).result(timeout=5.0)
    calls = source.calls
    wait_for(lambda: source.calls >= calls + 20, 10, f"the loop asking {name} again and again")
    assert loop.is_running(), f"the control loop died on a source answering {value!r}"
    with ControlClient(daemon.socket_path) as c:
        st = c.request("status")
        assert st["mode"] == "hold", st["mode"]
        assert name in st["reason"] and why in st["reason"], st["reason"]
        assert st["arms"]["follower"]["source"] == name
    loop.assign("follower", "leader").result(timeout=5.0)
    loop.remove_source(name)
    with ControlClient(daemon.socket_path) as c:
        c.request("teleop.start")
    wait_for(lambda: loop.state.mode == "teleop", 30, "teleop again once the leader drives")
    assert loop.is_running()


def test_a_plain_list_of_six_numbers_drives_the_arm(bench) -> None:
    """A list is what a Python client most likely returns: it is taken as the joints' targets."""
    daemon = bench
    loop = daemon.loop
    wait_for(lambda: loop.state.mode == "teleop", 30, "teleop")
    goal = [10.0, -50.0, 55.0, 35.0, 5.0, 30.0]
    source = Answers(goal)
    loop.add_source("plain", source)
    loop.assign("follower", "plain").result(timeout=5.0)
    follower = daemon.loop.arms[0]
    wait_for(
        lambda: follower.measured is not None and bool(np.all(np.abs(follower.measured - goal) <= 2.0)),
        30,
        "the follower at the list's pose",
    )
    assert loop.is_running() and loop.state.mode == "teleop", loop.state
    loop.assign("follower", "leader").result(timeout=5.0)
    loop.remove_source("plain")
