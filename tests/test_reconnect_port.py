"""The operator's story: the follower's USB cable is pulled, then plugged back in.

Real parts: our Feetech driver on the STS3215 emulator's pty, whose link disappears on unplug and
comes back at the same path on replug (``BusEmulator.unplug``/``replug``); the daemon in-process
with the default reconnect backoff (0.2 s doubling to 2 s). While the port is gone, status says
so (the port, the next try); once it is back, the daemon finds it within a probe period instead of
after the rest of a 2 s backoff, as it does for a servo that answers again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from reconnect_support import daemon_on_still_arms
from support import wait_for

from daemon.api.client import ControlClient

PICKUP_S = 0.5  # a port plugged back in is used again this soon


@pytest.fixture
def bench(tmp_path: Path):
    with daemon_on_still_arms(tmp_path) as b:
        yield b.daemon, b.follower_bus, b.follower_port, b.socket_path


def test_a_port_plugged_back_in_is_found_within_a_probe_period(bench) -> None:
    daemon, fb, port, sock = bench
    wait_for(lambda: daemon.loop.state.mode == "teleop", 20, "teleop")
    with ControlClient(sock) as c:
        fb.unplug()
        wait_for(lambda: not c.request("status")["follower"]["connected"], 10, "the follower lost")
        # plugged back in at the worst moment: just after a failed attempt, a long backoff ahead
        wait_for(
            lambda: (c.request("status")["follower"]["next_try_in_s"] or 0.0) >= 1.0, 15, "a backoff of 1 s or more"
        )
        st = c.request("status")["follower"]
        assert port in st["waiting"] and "gone" in st["waiting"] and "next try" in st["waiting"], st["waiting"]
        fb.replug()
        back_at = time.monotonic()
        wait_for(lambda: c.request("status")["follower"]["connected"], 10, "the follower connected again")
        took_s = time.monotonic() - back_at
        assert took_s <= PICKUP_S, f"the follower connected {took_s:.2f} s after its port came back"
