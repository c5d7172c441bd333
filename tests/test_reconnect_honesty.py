"""The operator's story: a follower servo drops off the bus for two seconds, then comes back.

Real parts only: our Feetech driver talks to the STS3215 emulator on pseudo-terminals, the daemon
runs in-process with the default reconnect backoff (0.2 s doubling to 2 s). While the servo is
missing, ``status`` names it (joint, port) and says when the next try is, and ``teleop start`` is
refused with that reason (the daemon does not start the arm moving by itself the moment the servo
answers). Once it answers, the daemon sees it within a probe period, not after the backoff: the
next ``teleop start`` succeeds within half a second of the servo's return.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from reconnect_support import daemon_on_still_arms
from support import wait_for

from daemon.api.client import CommandFailed, ControlClient
from daemon.apps.commands.status import one_line

SILENT_S = 2.0  # how long the servo stays off the bus (the scenario, not a wait for something)
PICKUP_S = 0.5  # teleop start works again this soon after the servo answers


@pytest.fixture
def bench(tmp_path: Path):
    with daemon_on_still_arms(tmp_path) as b:
        yield b.daemon, b.follower_arm, b.follower_port, b.socket_path


def _names_the_missing_servo(st: dict, port: str) -> bool:
    link = st["follower"]
    return (
        not link["connected"]
        and link["missing_servos"] == ["wrist_flex"]
        and link["port"] == port
        and isinstance(link["next_try_in_s"], float)
        and "wrist_flex" in link["waiting"]
        and port in link["waiting"]
        and "next try" in link["waiting"]
        and "wrist_flex" in st["missing_servos"]
    )


def test_a_servo_silent_for_two_seconds_is_named_then_picked_up_at_once(bench) -> None:
    daemon, fa, port, sock = bench
    wait_for(lambda: daemon.loop.state.mode == "teleop", 20, "teleop")
    with ControlClient(sock) as c:
        fa.set_online("wrist_flex", False)
        silent_at = time.monotonic()
        wait_for(lambda: _names_the_missing_servo(c.request("status"), port), 15, "status naming the missing servo")
        # what `so101d status` prints says it too
        printed = one_line(c.request("status"))
        assert "wrist_flex" in printed and port in printed and "next try" in printed, printed
        with pytest.raises(CommandFailed) as refused:
            c.request("teleop.start")
        text = str(refused.value)
        assert "wrist_flex" in text and port in text and "next try" in text, text
        # the whole silence: every status read names what is missing and when the next try is
        while time.monotonic() - silent_at < SILENT_S:
            st = c.request("status")
            assert _names_the_missing_servo(st, port), st["follower"]
            assert st["follower"]["next_try_in_s"] <= daemon.cfg.control.reconnect_backoff_max_s
        # back just after a full attempt failed, with a long backoff ahead (the worst moment)
        wait_for(
            lambda: (c.request("status")["follower"]["next_try_in_s"] or 0.0) >= 1.0, 10, "a backoff of 1 s or more"
        )
        attempts_before = daemon.loop.follower_link.connects
        fa.set_online("wrist_flex", True)
        back_at = time.monotonic()
        answers: list[str] = []

        def teleop_accepted() -> bool:
            try:
                c.request("teleop.start")
            except CommandFailed as exc:
                answers.append(str(exc))
                return False
            return True

        wait_for(teleop_accepted, 10, "teleop start accepted after the servo came back")
        took_s = time.monotonic() - back_at
        assert took_s <= PICKUP_S, (
            f"teleop start accepted {took_s:.2f} s after the servo answered ({len(answers)} refusals, last: {answers[-1:]})"
        )
        assert daemon.loop.follower_link.connects == attempts_before + 1
        st = c.request("status")
        assert st["follower"]["connected"] and st["follower"]["missing_servos"] == []
        assert st["follower"]["waiting"] == "" and st["follower"]["next_try_in_s"] is None
    wait_for(lambda: daemon.loop.state.mode == "teleop", 20, "following again")
