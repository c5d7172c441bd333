"""The operator's foot pedal (LeRobot's DAgger pedal: KEY_A pause/resume, KEY_B correction,
KEY_C the third), read by the daemon through evdev: what each press does, depending on who
drives; a pedal unplugged mid-session is said once and nothing else stops; it is used again when
plugged back; a path that is not an input device refuses the start, naming it.

The pedal is the fake evdev's (tests/fixtures/sdk/evdev); a real one through the kernel's uinput
is the last test, where this machine has uinput and python-evdev.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from pathlib import Path

import pytest
from evdev import ecodes  # the fake: tests/fixtures/sdk/evdev
from pedal_support import VirtualPedal
from rich.console import Console
from support import wait_for
from virtual_bench_support import VirtualBench

from daemon.api.client import ControlClient
from daemon.api.input_actions import Action, Driver, verb_for
from daemon.api.messages import CorrectionStatus, PolicyReply, PolicyStatusReply
from daemon.apps.commands.policy import keys_session
from daemon.apps.commands.status import render
from daemon.apps.terminal_keys import (
    KEY_CORRECT,
    KEY_FAILURE,
    KEY_REDO,
    KEY_STOP,
    KEY_SUCCESS,
    POLICY_KEYS,
    RECORD_KEYS,
    decode_keys,
)
from daemon.config.settings import ConfigError, config_from_dict
from daemon.service.daemon import Daemon, StartupError

TELEOP = Driver(intent="teleop", correcting=False, policy_run=False)
HELD = Driver(intent="hold", correcting=False, policy_run=False)
POLICY = Driver(intent="policy", correcting=False, policy_run=True)
CORRECTING = Driver(intent="teleop", correcting=True, policy_run=True)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("action", "driver", "verb"),
    [
        (Action.PAUSE_RESUME, TELEOP, "teleop.stop"),
        (Action.PAUSE_RESUME, HELD, "teleop.start"),
        (Action.PAUSE_RESUME, POLICY, "policy.correct"),
        (Action.PAUSE_RESUME, CORRECTING, "policy.resume"),
        (Action.CORRECTION, POLICY, "policy.correct"),
        (Action.CORRECTION, CORRECTING, "policy.resume"),
        (Action.CORRECTION, TELEOP, "policy.correct"),  # refused by the verb: no policy runs
        (Action.SAVE, POLICY, "episode.save"),
        (Action.SAVE, TELEOP, "episode.save"),
        (Action.KEEP, TELEOP, "episode.keep"),  # the pedal sends last_s = [recording] ring_s
    ],
)
def test_each_pedal_asks_for_the_verb_that_fits_who_drives(action: Action, driver: Driver, verb: str) -> None:
    assert verb_for(action, driver) == verb


@pytest.mark.unit
@pytest.mark.parametrize(
    ("pedal", "words"),
    [
        ({"save": "c"}, "pedal.save: 'c' must be an evdev key code such as \"KEY_A\""),
        ({"correction": "KEY_A"}, "pedal.correction: KEY_A is already pedal.pause_resume"),
    ],
)
def test_a_pedal_key_that_is_no_key_code_or_bound_twice_is_refused_naming_it(pedal: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        config_from_dict({"pedal": {"device": "/dev/input/event3", **pedal}})


@pytest.mark.unit
def test_a_keep_pedal_with_nothing_buffered_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"pedal.keep: KEY_D keeps the last seconds, but nothing is buffered"):
        config_from_dict({"pedal": {"device": "/dev/input/event3", "keep": "KEY_D"}})
    config_from_dict(
        {"pedal": {"device": "/dev/input/event3", "keep": "KEY_D"}, "recording": {"enabled": True, "ring_s": 5}}
    )


def make_daemon(bench: VirtualBench, device: Path | str) -> Daemon:
    return bench.daemon({"pedal": {"device": str(device)}})


def pedal_status(c: ControlClient) -> dict:
    return c.request("status")["pedal"]


def press_and_wait(c: ControlClient, pedal: VirtualPedal, key: str) -> dict:
    before = pedal_status(c)["presses"]
    pedal.press(key)
    wait_for(lambda: pedal_status(c)["presses"] > before, 5, f"the daemon to read {key}")
    return pedal_status(c)


def test_the_operator_holds_and_resumes_teleop_with_the_pedal_unplugs_it_and_plugs_it_back(
    virtual_bench: VirtualBench, caplog: pytest.LogCaptureFixture
) -> None:
    pedal = VirtualPedal(virtual_bench.root)
    pedal.plug()
    daemon = make_daemon(virtual_bench, pedal.path)
    caplog.set_level(logging.INFO, logger="so101d.pedal")
    daemon.start()
    try:
        with ControlClient(virtual_bench.socket_path, timeout_s=10) as c:
            st = pedal_status(c)
            assert st["state"] == "connected" and st["device"] == str(pedal.path), st
            assert st["keys"] == {"pause_resume": "KEY_A", "correction": "KEY_B", "save": "KEY_C"}  # keep: unbound
            pedal.connect()
            wait_for(lambda: c.request("status")["mode"] == "teleop", 20, "teleop tracking")

            st = press_and_wait(c, pedal, "KEY_A")  # pause: the arm holds
            assert st["last_verb"] == "teleop.stop", st
            wait_for(lambda: c.request("status")["mode"] == "hold", 5, "hold")
            st = press_and_wait(c, pedal, "KEY_A")  # resume: back to the leader, aligned first
            assert st["last_verb"] == "teleop.start", st
            wait_for(lambda: c.request("status")["mode"] == "teleop", 20, "tracking again")

            # a code python-evdev has no name for (a reprogrammed pedal), then A in the same read:
            # the unknown one is skipped, A still holds the arm, and nothing counts as an unplug
            before = pedal_status(c)["presses"]
            pedal.press_codes(0x2FF, ecodes.KEY_A)
            wait_for(lambda: pedal_status(c)["presses"] > before, 5, "A read after an unknown code")
            assert pedal_status(c)["unplugs"] == 0 and pedal_status(c)["last_verb"] == "teleop.stop"
            wait_for(lambda: c.request("status")["mode"] == "hold", 5, "hold")
            press_and_wait(c, pedal, "KEY_A")
            wait_for(lambda: c.request("status")["mode"] == "teleop", 20, "tracking again")

            # the verbs' own refusals, said in the pedal's status; nothing changes
            st = press_and_wait(c, pedal, "KEY_B")
            assert st["last_verb"] == "policy.correct" and "policy" in st["last_reply"], st
            st = press_and_wait(c, pedal, "KEY_C")
            assert st["last_verb"] == "episode.save" and "recording" in st["last_reply"], st
            assert c.request("status")["mode"] == "teleop"

            pedal.unplug()
            wait_for(lambda: pedal_status(c)["state"] == "unplugged", 5, "the pedal seen unplugged")
            cycles = c.request("status")["cycles"]
            # a second of the loop without the pedal (the reader looks for it every 0.25 s)
            wait_for(lambda: c.request("status")["cycles"] >= cycles + 50, 10, "50 more cycles")
            st = c.request("status")
            assert st["mode"] == "teleop" and st["pedal"]["unplugs"] == 1, st["pedal"]
            assert "No such device" in st["pedal"]["problem"], st["pedal"]
            said = [r for r in caplog.records if r.name == "so101d.pedal" and "unplugged" in r.getMessage()]
            assert len(said) == 1, [r.getMessage() for r in said]

            pedal.plug()
            wait_for(lambda: pedal_status(c)["state"] == "connected", 5, "the pedal picked up again")
            pedal.connect()
            st = press_and_wait(c, pedal, "KEY_A")
            assert st["last_verb"] == "teleop.stop", st
            wait_for(lambda: c.request("status")["mode"] == "hold", 5, "hold after the replug")
            shown = io.StringIO()  # `so101d status`: the pedal's line, its last press and answer
            Console(file=shown, width=200, color_system=None).print(render(c.request("status")))
            assert "pedal     connected" in shown.getvalue(), shown.getvalue()
            assert "last KEY_A -> teleop.stop: teleop stopped: holding" in shown.getvalue(), shown.getvalue()
    finally:
        pedal.unplug()
        daemon.stop()


def test_a_pedal_path_that_is_no_input_device_refuses_the_start_naming_it(virtual_bench: VirtualBench) -> None:
    # the follower's serial port where the pedal should be: a tty answers evdev's ioctl with ENOTTY
    daemon = make_daemon(virtual_bench, virtual_bench.follower_port)
    with pytest.raises(StartupError, match=r"pedal.device .*: not an input device \(Inappropriate ioctl"):
        daemon.start()
    assert not virtual_bench.socket_path.exists()  # nothing started: no socket


def test_a_pedal_not_plugged_in_yet_is_waited_for(virtual_bench: VirtualBench) -> None:
    pedal = VirtualPedal(virtual_bench.root)
    daemon = make_daemon(virtual_bench, pedal.path)
    daemon.start()
    try:
        with ControlClient(virtual_bench.socket_path, timeout_s=10) as c:
            assert pedal_status(c)["state"] == "waiting"
            pedal.plug()
            wait_for(lambda: pedal_status(c)["state"] == "connected", 5, "the pedal picked up once plugged in")
    finally:
        pedal.unplug()
        daemon.stop()


def test_a_configured_pedal_without_python_evdev_refuses_the_start_with_the_fix(
    virtual_bench: VirtualBench, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "evdev", None)  # import evdev -> ImportError
    daemon = make_daemon(virtual_bench, "/dev/input/by-id/usb-PCsensor_FootSwitch-event-kbd")
    with pytest.raises(StartupError, match=r"python-evdev is not installed: .*pip install evdev"):
        daemon.start()


def _real_uinput() -> str:
    """Why a real pedal (the kernel's uinput, python-evdev) cannot be made here; "" if it can."""
    import evdev

    if "fixtures" in (evdev.__file__ or ""):
        return "python-evdev is not installed here (only the test fake: tests/fixtures/sdk/evdev)"
    if not os.access("/dev/uinput", os.W_OK):
        return "/dev/uinput is absent or not writable on this machine"
    return ""


@pytest.mark.skipif(bool(_real_uinput()), reason=_real_uinput() or "-")
def test_a_real_virtual_pedal_through_uinput_holds_the_arm(virtual_bench: VirtualBench) -> None:
    from evdev import UInput
    from evdev import ecodes as e

    with UInput({e.EV_KEY: [e.KEY_A, e.KEY_B, e.KEY_C]}, name="so101d test pedal") as ui:
        daemon = make_daemon(virtual_bench, ui.device.path)
        daemon.start()
        try:
            with ControlClient(virtual_bench.socket_path, timeout_s=10) as c:
                wait_for(lambda: c.request("status")["mode"] == "teleop", 20, "teleop tracking")
                ui.write(e.EV_KEY, e.KEY_A, 1)
                ui.write(e.EV_KEY, e.KEY_A, 0)
                ui.syn()
                wait_for(lambda: c.request("status")["mode"] == "hold", 5, "hold")
        finally:
            daemon.stop()


@pytest.mark.unit
def test_terminal_keys_decode_lerobots_dagger_keys_and_a_record_session_ignores_them() -> None:
    assert decode_keys(b" \t\r") == [KEY_CORRECT, KEY_CORRECT, KEY_SUCCESS]
    assert decode_keys(b"\x1b[Cf\x7f\x1b") == [KEY_SUCCESS, KEY_FAILURE, KEY_REDO, KEY_STOP]
    # F1 (ESC O P), Delete (ESC [ 3 ~), Alt+x (ESC x): none of them is esc, none stops a run
    assert decode_keys(b"\x1bOP\x1b[3~\x1bx") == []
    assert KEY_CORRECT not in RECORD_KEYS and KEY_CORRECT in POLICY_KEYS


class _ScriptedDaemon:
    """policy.status / correct / resume / stop of a daemon whose policy runs, as the replies declare."""

    def __init__(self) -> None:
        self.correcting = False
        self.sent: list[tuple[str, dict]] = []

    def call_as(self, kind, cmd: str, **args):
        self.sent.append((cmd, args))
        if cmd == "policy.status":
            return PolicyStatusReply(state="ready", driving=not self.correcting, correction=self._correction())
        if cmd == "policy.correct":
            self.correcting = True
            return PolicyReply(message="correction 1: the leader is brought to the follower")
        if cmd == "policy.resume":
            self.correcting = False
            return PolicyReply(message="the policy aligns from the measured pose")
        return PolicyReply(message="policy stopped: holding")

    def _correction(self):
        return CorrectionStatus(number=1, phase="operator") if self.correcting else None


class _Typed:
    enabled = True

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys

    def wait(self, seconds: float) -> str | None:
        return self.keys.pop(0) if self.keys else KEY_STOP


@pytest.mark.unit
@pytest.mark.parametrize(
    ("last", "stop"),
    [(KEY_SUCCESS, {"success": True}), (KEY_FAILURE, {"success": False}), (KEY_REDO, {"discard": True})],
)
def test_policy_start_keys_toggle_correct_and_resume_then_stop_as_told(last: str, stop: dict) -> None:
    daemon, said = _ScriptedDaemon(), []
    assert keys_session(daemon, _Typed([KEY_CORRECT, KEY_CORRECT, KEY_CORRECT, last]), say=said.append) == 0
    verbs = [cmd for cmd, _ in daemon.sent if cmd != "policy.status"]
    assert verbs == ["policy.correct", "policy.resume", "policy.correct", "policy.stop"], verbs
    assert daemon.sent[-1] == ("policy.stop", stop)
    assert said[-1] == "policy stopped: holding" and "space/tab correct / resume" in said[0], said


class _Polls:
    """policy.status answers in turn: running (correction None, driving) or not."""

    def __init__(self, running: list[bool]) -> None:
        self.running = running
        self.sent: list[str] = []

    def call_as(self, kind, cmd: str, **args):
        self.sent.append(cmd)
        if cmd == "policy.status":
            up = self.running.pop(0) if self.running else False
            return PolicyStatusReply(state="ready", driving=up)
        return PolicyReply(message="policy stopped: holding")


class _Idle:
    enabled = True

    def wait(self, seconds: float) -> str | None:
        return None


@pytest.mark.unit
def test_policy_start_keys_end_when_the_run_ends_elsewhere_not_at_one_blip() -> None:
    # one poll that finds no run (a correction being opened holds the arm a moment first) is not
    # the end; two in a row are, and the session says so without stopping anything itself
    daemon, said = _Polls([True, False, True, True, False, False]), []
    assert keys_session(daemon, _Idle(), say=said.append) == 0
    assert daemon.sent.count("policy.status") == 6 and "policy.stop" not in daemon.sent
    assert "the policy is not running" in said[-1], said
