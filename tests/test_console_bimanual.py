"""The operator's story on a bimanual rig, in a real browser: the console shows both arms.

One virtual bimanual bench for the module (`so101d emulate --bimanual`: four emulated arms, the
leaders running the handover motion), `so101d run` on the rig's configuration as the user writes
it ([arms.left] / [arms.right], tests/bimanual_support.py), `so101d console`, and one headless
Chromium. The tests run in the order of a session at the bench:

- each arm has its own view: mode and source, a servo table of its six servos and a plot of each
  joint, captioned with LeRobot's bimanual names (left_shoulder_pan ...), both plots moving with
  their own leader;
- a left-follower servo taken off the bus is named in the left table only;
- the one Hold button holds both arms.

A single-arm daemon's console is tests/test_console_browser.py's (unchanged by any of this).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from bimanual_support import write_bimanual_config
from console_support import Bench, browser_missing, close_browser, console_errors, open_browser, wait_js
from support import poll_until, wait_status

from daemon.api.client import ControlClient
from daemon.api.messages import LiveStatus, decode_reply
from drivers.emulator.process import EmulatorProcess

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

SIDES = ("left", "right")
JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
# two still poses far apart (units: degrees, the gripper 0..100), inside the calibrated ranges
POSES = {"left": [-30.0, -40.0, 40.0, 30.0, 0.0, 20.0], "right": [30.0, -60.0, 60.0, 50.0, 10.0, 60.0]}


class BimanualBench(Bench):
    """Bench's daemon and console, on the bimanual emulator and the rig's configuration."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.emulator = EmulatorProcess(
            directory, wire_time=False, bimanual=True, calibration_out=directory / "calibration"
        )

    def start(self) -> BimanualBench:
        self.emulator.start()
        self.handover()
        write_bimanual_config(self.emulator, self.dir, f'\n[socket]\npath = "{self.sock}"\n')
        self.start_daemon()
        with open(self.dir / "console.log", "wb") as log:
            self.console = subprocess.Popen(
                [sys.executable, "-m", "daemon.apps.cli", "console", "--bind", f"127.0.0.1:{self.port}"]
                + ["--socket", str(self.sock)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self.wait_both_tracking()
        return self

    def handover(self) -> None:
        for side in SIDES:
            self.emulator.control({"cmd": "set_motion", "arm": f"{side}_leader", "motion": f"handover-{side}"})

    def wait_both_tracking(self, timeout_s: float = 90.0) -> dict[str, Any]:
        """Both arms in teleop. A servo reply late at start-up on a loaded machine latches "not
        answering": cleared as an operator would (teleop start) once the servos answer again."""

        def ready(st: dict[str, Any]) -> bool:
            arms = st["arms"]
            if any(a["mode"] == "fault" for a in arms.values()) and not st["safety"]["fault_now"]:
                with ControlClient(self.sock) as c:
                    c.call("teleop.start")
            return all(arms[side]["mode"] == "teleop" for side in SIDES)

        return wait_status(self.sock, ready, timeout_s=timeout_s, proc=self.daemon)

    def status(self) -> dict[str, Any]:
        with ControlClient(self.sock) as c:
            return c.request("status")

    def leader_pose(self, side: str) -> np.ndarray:
        return np.array(self.emulator.control({"cmd": "snapshot", "arm": f"{side}_leader"})["pose_units"])


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BimanualBench]:
    b = BimanualBench(tmp_path_factory.mktemp("biconsole"))
    try:
        b.start()
        yield b
    except BaseException:
        print(b.logs())
        raise
    finally:
        b.close()


@pytest.fixture(scope="module")
def page(rig: BimanualBench) -> Iterator[Any]:
    driver = open_browser()
    try:
        driver.get(rig.url)
        yield driver
    finally:
        close_browser(driver)


@pytest.fixture(autouse=True)
def no_browser_errors(page: Any) -> Iterator[None]:
    _errors(page)  # what an earlier test left is that test's
    yield
    errors = _errors(page)
    assert not errors, f"the page logged errors: {errors}"


def _errors(page: Any) -> list[dict[str, Any]]:
    """The page's errors, less the episode list's 404: this rig records no dataset, which the
    console answers so (app.py's NO_DATASET) and the page shows in the list's place."""
    return [e for e in console_errors(page) if not ("/api/episodes - " in str(e.get("message")) and "404" in str(e))]


def _text(page: Any, element_id: str) -> str:
    return str(page.find_element("id", element_id).text)


def _rows(page: Any, side: str) -> list[str]:
    """The arm's servo table, one text per row: its cells joined by " | "."""
    rows = f"[...document.querySelectorAll('#servos-{side} tbody tr')]"
    return list(page.execute_script(f"return {rows}.map(r => [...r.cells].map(c => c.textContent).join(' | '))"))


def _samples(page: Any, side: str, key: str) -> list[list[float]]:
    return [
        s
        for s in page.execute_script(f"return window.so101dConsole.arms['{side}'].samples.map(s => s['{key}'])")
        if s is not None
    ]


def _page_modes(page: Any) -> dict[str, str]:
    return {side: _text(page, f"arm-{side}-mode") for side in SIDES}


def test_each_arm_has_its_view_its_servos_and_its_moving_plots(rig: BimanualBench, page: Any) -> None:
    wait_js(page, "return document.getElementById('arm-right-mode')", what="the right arm's view")
    wait_js(
        page,
        "return ['left', 'right'].every(s => document.getElementById(`arm-${s}-mode`).textContent.trim() === 'teleop')",
        what="both arms in teleop",
    )
    # the single arm's table and plots give way to the arms' own
    assert not page.find_element("id", "servos").is_displayed()
    assert not page.find_element("id", "plots").is_displayed()
    for side in SIDES:
        assert _text(page, f"arm-{side}-source") == f"{side}_leader"
        captions = page.execute_script(
            f"return [...document.querySelectorAll('#plots-{side} figcaption')].map(c => c.textContent)"
        )
        assert captions == [f"{side}_{j}" for j in JOINTS]
        wait_js(
            page, f"return document.querySelectorAll('#servos-{side} tbody tr').length === 6", what=f"{side} servos"
        )
        rows = _rows(page, side)
        assert [r.split(" | ")[0] for r in rows] == [f"{side}_{j}" for j in JOINTS], rows
        assert not any("not answering" in r for r in rows), rows
    # a few seconds of samples of each: both leaders move, each its own way
    wait_js(page, "return ['left', 'right'].every(s => window.so101dConsole.arms[s].samples.length >= 60)", 30)
    plots0 = {
        side: page.execute_script(f"return document.getElementById('plot-{side}-shoulder_lift').toDataURL()")
        for side in SIDES
    }
    leaders = {side: np.array(_samples(page, side, "leader")) for side in SIDES}
    for side in SIDES:
        spread = np.ptp(leaders[side], axis=0)
        assert spread.max() > 1.0, f"the {side} leader did not move in its plot: {spread}"
        followers = np.array(_samples(page, side, "follower"))
        assert np.ptp(followers, axis=0).max() > 1.0, f"the {side} follower did not move in its plot"
    n = min(len(leaders["left"]), len(leaders["right"]))
    assert np.max(np.abs(leaders["left"][-n:] - leaders["right"][-n:])) > 5.0, "one arm's values shown twice"
    for side in SIDES:
        assert _redrawn(page, f"plot-{side}-shoulder_lift", plots0[side]), f"the {side} plot was not redrawn"
        assert _canvas_spread(page, f"plot-{side}-shoulder_lift") > 1.0, f"the {side} plot is blank"
    # replay is not built for two arms: the page says so as what keeps Replay off, not as an error
    wait_js(page, "return document.getElementById('replay-block').textContent.includes('two arms')", what="replay off")
    assert "error" not in str(page.find_element("id", "message").get_attribute("class")), _text(page, "message")
    # what the page reads at 20 Hz is declared: the reply decoded into LiveStatus loses nothing
    with ControlClient(rig.sock) as c:
        raw = c.request("status.live")
    typed = msgspec.to_builtins(decode_reply(raw, LiveStatus))
    assert set(raw["arms"]) == set(SIDES) and typed["arms"] == raw["arms"], raw


def test_each_plot_shows_its_own_leader_and_follower(rig: BimanualBench, page: Any) -> None:
    """Leaders put still at two poses far apart: each arm's plot reaches its own leader's pose,
    and its follower (and the command sent) follow it there."""
    for side in SIDES:
        rig.emulator.control({"cmd": "set_motion", "arm": f"{side}_leader", "motion": "still"})
        rig.emulator.control({"cmd": "set_pose", "arm": f"{side}_leader", "pose_units": POSES[side]})
    try:
        for side in SIDES:
            pose = rig.leader_pose(side)

            def there(side: str = side, pose: np.ndarray = pose) -> bool:
                last = page.execute_script(f"return window.so101dConsole.arms['{side}'].samples.at(-1)")
                return last is not None and all(
                    last[k] is not None and np.max(np.abs(np.array(last[k]) - pose)) < 2.0
                    for k in ("leader", "command", "follower")
                )

            assert poll_until(there, 30, 0.1), (
                f"the {side} plot never reached its leader's pose {pose}: "
                f"{page.execute_script(f'return window.so101dConsole.arms[{side!r}].samples.at(-1)')}"
            )
    finally:
        rig.handover()


def test_a_left_servo_off_the_bus_is_named_in_the_left_table_only(rig: BimanualBench, page: Any) -> None:
    rig.emulator.control({"cmd": "set_online", "arm": "left_follower", "joint": "wrist_flex", "online": False})
    try:
        wait_js(
            page,
            "return [...document.querySelectorAll('#servos-left tbody tr')]"
            ".some(r => r.textContent.startsWith('left_wrist_flex') && r.textContent.includes('not answering'))",
            30,
            what="left_wrist_flex not answering in the left table",
        )
        assert not any("not answering" in r for r in _rows(page, "right")), _rows(page, "right")
        assert not any(r.startswith("left_") for r in _rows(page, "right"))
        # both arms out of teleop (safety.fault_holds = "all"): the page shows each arm's own mode
        wait_js(
            page,
            "return ['fault', 'disconnected'].includes(document.getElementById('arm-left-mode').textContent)"
            " && document.getElementById('arm-right-mode').textContent === 'hold'",
            20,
            what="left faulted, right holding",
        )
    finally:
        rig.emulator.control({"cmd": "set_online", "arm": "left_follower", "joint": "wrist_flex", "online": True})
    # back on the bus: the page's resume (refused while the servo is being picked up again)
    _resume_from_the_page(page)
    assert not any("not answering" in r for r in _rows(page, "left"))


def test_hold_holds_both_arms(rig: BimanualBench, page: Any) -> None:
    wait_js(
        page,
        "return ['left', 'right'].every(s => document.getElementById(`arm-${s}-mode`).textContent === 'teleop')",
        30,
    )
    replies = page.execute_script("return window.so101dConsole.replies")
    page.find_element("id", "btn-hold").click()
    wait_js(page, f"return window.so101dConsole.replies > {replies}", what="the hold reply")
    assert _text(page, "message") == "holding"
    wait_js(
        page,
        "return ['left', 'right'].every(s => document.getElementById(`arm-${s}-mode`).textContent === 'hold')",
        what="both arms holding on the page",
    )
    arms = rig.status()["arms"]
    assert {side: arms[side]["mode"] for side in SIDES} == {"left": "hold", "right": "hold"}, arms
    _resume_from_the_page(page)


def _resume_from_the_page(page: Any) -> None:
    """Clear fault / resume teleop, pressed again while the daemon refuses it, until both arms track."""

    def both_tracking() -> bool:
        if all(m == "teleop" for m in _page_modes(page).values()):
            return True
        btn = page.find_element("id", "btn-resume")
        if btn.is_enabled():  # disabled while its last press has no answer yet
            btn.click()
        return False

    assert poll_until(both_tracking, 40, 0.25), (
        f"never both tracking again: {_page_modes(page)}, {_text(page, 'message')}"
    )


def _redrawn(page: Any, canvas_id: str, before: str, timeout_s: float = 10.0) -> bool:
    """The canvas drawn anew (its pixels no longer ``before``)."""
    script = "return document.getElementById(arguments[0]).toDataURL() !== arguments[1]"
    return poll_until(lambda: page.execute_script(script, canvas_id, before), timeout_s, 0.1)


def _canvas_spread(page: Any, canvas_id: str) -> float:
    """Standard deviation of the canvas' grey levels: 0 for a blank (single-colour) canvas."""
    return float(
        page.execute_script(
            """const c = document.getElementById(arguments[0]);
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0, s = 0, s2 = 0;
            for (let i = 0; i < d.length; i += 16) { const g = (d[i] + d[i+1] + d[i+2]) / 3; n++; s += g; s2 += g * g; }
            const m = s / n; return Math.sqrt(Math.max(0, s2 / n - m * m));""",
            canvas_id,
        )
    )
