"""Calibrating a bimanual rig arm by arm: `so101d calibrate leader|follower --arm left|right
--config so101d.toml` takes that side's port and LeRobot's bimanual id (``<id>_left`` /
``<id>_right``, lerobot/robots/bi_so_follower/bi_so_follower.py) from the daemon's configuration,
so the file it checks or writes is the one LeRobot's BiSOFollower / BiSOLeader and the daemon read.

The virtual bimanual bench (`so101d emulate --bimanual`, a subprocess) writes each arm's reference
calibration (--calibration-out), as a calibrated rig has them; its right arms' offsets differ from
the left's, so a file checked against the wrong side's servos is caught.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.emulator.process import EmulatorProcess

pytestmark = pytest.mark.e2e  # the bimanual emulator and `so101d calibrate` as the operator runs them

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmulatorProcess, Path]]:
    d = tmp_path_factory.mktemp("bimanual-calibrate")
    with EmulatorProcess(d, bimanual=True, calibration_out=d / "calibration") as bench:
        links = bench.links
        config = d / "so101d.toml"
        config.write_text(
            f"""
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
root = "{d / "calibration"}"
"""
        )
        yield bench, config


def _calibrate(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", "calibrate", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


@pytest.mark.parametrize("role", ["leader", "follower"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_each_arm_of_the_pair_is_checked_against_its_own_lerobot_file(rig, role: str, side: str) -> None:
    bench, config = rig
    done = _calibrate(role, "--arm", side, "--config", str(config), "--verify")
    assert done.returncode == 0, done.stdout + done.stderr
    folder = "robots/so_follower" if role == "follower" else "teleoperators/so_leader"
    expected = bench.directory / "calibration" / folder / f"emulated_{role}_{side}.json"
    assert f"{expected}: the servos hold this calibration" in done.stdout


def test_the_other_sides_file_on_an_arm_is_caught(rig) -> None:
    """The right follower's calibration checked on the left follower's servos (an --id that names
    the wrong side): the differences are listed, exit 1."""
    _bench, config = rig
    wrong = _calibrate(
        "follower", "--arm", "left", "--config", str(config), "--id", "emulated_follower_right", "--verify"
    )
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert "Homing_Offset" in wrong.stdout


def test_calibrating_one_side_opens_that_sides_port_and_an_abort_writes_nothing(rig) -> None:
    """The interactive procedure on the right leader (its port from the configuration): closing
    stdin at the first prompt aborts it, the servos are put back and no file is written."""
    bench, config = rig
    target = bench.directory / "calibration" / "teleoperators/so_leader/emulated_leader_right.json"
    before = target.read_bytes()
    done = _calibrate("leader", "--arm", "right", "--config", str(config), stdin="")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "MIDDLE" in done.stdout
    assert "aborted" in done.stderr and "nothing was written" in done.stderr
    assert target.read_bytes() == before
    ok = _calibrate("leader", "--arm", "right", "--config", str(config), "--verify")
    assert ok.returncode == 0, ok.stdout + ok.stderr  # the servos as they were


def test_arm_needs_a_bimanual_configuration(rig, tmp_path: Path) -> None:
    no_config = _calibrate("follower", "--arm", "left", "--verify")
    assert no_config.returncode == 2
    assert "--arm left needs the rig's configuration: add --config FILE" in no_config.stderr
    single = tmp_path / "single.toml"
    single.write_text('[follower]\nport = "/dev/null"\n')
    one_pair = _calibrate("follower", "--arm", "left", "--config", str(single), "--verify")
    assert one_pair.returncode == 2
    assert "has no [arms.left] / [arms.right]" in one_pair.stderr
