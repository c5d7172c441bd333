"""From the box to teleoperation, as README "With real arms" says, on a new kit (the emulator's
new-kit preset): `setup-motors` for both arms (the operator plugging one servo at a time),
`calibrate`, `doctor`, `run`. Each command ends with the next one to type; this test types it.

The walkthrough's helpers (tests/test_readme_walkthrough.py) run each README command as written,
only the ports substituted, as subprocesses of the installed `so101d`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
from pathlib import Path

import pytest
from readme_support import REPO
from setup_motors_support import SetupSession
from support import poll_until
from test_readme_walkthrough import (
    Bench,
    Machine,
    _operator_calibrates,
    log_of,
    ok,
    readme,
    so101d,
    start,
    stop,
    wait_running,
)

pytestmark = pytest.mark.e2e


def _machine(root: Path) -> Machine:
    home, runtime = root / "home", root / "run"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    env = dict(
        os.environ,
        HOME=str(home),
        XDG_RUNTIME_DIR=str(runtime),
        RUNTIME_DIRECTORY=str(runtime / "so101d"),
        HF_LEROBOT_CALIBRATION=str(root / "calibration"),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return Machine(root, home, env)


def _next(text: str) -> list[str]:
    """The argv (after `so101d`) of the command's last "Next: so101d ..." line."""
    found = re.findall(r"(?im)^next: so101d (.+)$", text)
    assert found, f"no next step in:\n{text}"
    return shlex.split(found[-1])


def test_a_new_kit_from_the_box_to_teleoperation_following_each_next_step(tmp_path: Path) -> None:
    m = _machine(tmp_path)
    d = tmp_path / "bench"
    proc = start(
        m,
        [
            "emulate",
            "--leader",
            str(d / "leader"),
            "--follower",
            str(d / "follower"),
            "--control",
            str(d / "emulator.sock"),
            "--preset",
            "new-kit",
            "--leader-motion",
            "still",
        ],
        "emulate",
    )
    bench = Bench(d / "leader", d / "follower", d / "emulator.sock", d / "calibration", proc)
    try:
        assert poll_until(
            lambda: (
                (bench.leader.exists() and bench.follower.exists() and bench.control.exists())
                or proc.poll() is not None
            ),
            30,
            0.05,
        ), log_of(m, "emulate")
        ports = {"leader": ("/dev/ttyACM0", bench.leader), "follower": ("/dev/ttyACM1", bench.follower)}
        calibrate_next: dict[str, list[str]] = {}
        for role, shown in (
            ("leader", ".venv/bin/so101d setup-motors leader   --port /dev/ttyACM0"),
            ("follower", ".venv/bin/so101d setup-motors follower --port /dev/ttyACM1"),
        ):
            dev, link = ports[role]
            argv = readme(shown, **{dev: str(link)})
            session = SetupSession(argv[1:], tmp_path)
            try:
                code = session.run_story(
                    lambda joint, _id, role=role: bench.request(
                        {"cmd": "connect_servos", "arm": role, "joints": [joint]}
                    )
                )
            finally:
                session.close()
            assert code == 0, session.text
            bench.request({"cmd": "connect_servos", "arm": role, "joints": None})  # the chain, assembled
            calibrate_next[role] = _next(session.text)
            # The next step is the README's calibrate line for this arm.
            assert calibrate_next[role] == readme(
                f".venv/bin/so101d calibrate {role} --port {dev} --id {role}",
                **{dev: str(link)},
            )

        doctor_next = {}
        for role in ("leader", "follower"):
            r = _operator_calibrates(m, bench, role, ports[role][1], calibrate_next[role])
            doctor_next[role] = _next(ok(r))
            assert doctor_next[role][:3] == ["doctor", "--only", role]
            checked = ok(so101d(m, doctor_next[role] + ["--round-trips", "20"], timeout_s=120))
            assert "result: FAIL" not in checked, checked

        # cp daemon/configs/so101d.example.toml so101d.toml, ports set; then the README's doctor.
        shutil.copy(REPO / "daemon/configs/so101d.example.toml", m.root / "so101d.toml")
        text = (m.root / "so101d.toml").read_text()
        text = text.replace('port = "/dev/ttyACM0"', f'port = "{bench.leader}"', 1)
        text = text.replace('port = "/dev/ttyACM1"', f'port = "{bench.follower}"', 1)
        (m.root / "so101d.toml").write_text(text)
        report = ok(so101d(m, readme(".venv/bin/so101d doctor --config so101d.toml"), timeout_s=180))
        assert "result: FAIL" not in report, report
        run_argv = _next(report)
        assert run_argv == readme(".venv/bin/so101d run --config so101d.toml")

        daemon = start(m, run_argv, "run")
        try:
            status = wait_running(m, daemon, "run")
            assert status["mode"] == "teleop"
        finally:
            assert stop(daemon) == 0, log_of(m, "run")
    finally:
        stop(proc, signal.SIGINT, 20)


def test_the_daemon_on_a_new_kit_reports_setup_motors_as_its_fault(tmp_path: Path) -> None:
    """`so101d run` before setup-motors: the arms cannot start, and the fault in the status (what
    `so101d status` and the console's safety line show) names the step."""
    from support import wait_status

    from drivers.emulator.process import EmulatorProcess

    m = _machine(tmp_path)
    with EmulatorProcess(
        tmp_path / "kit", preset="new-kit", leader_motion="still", calibration_out=tmp_path / "cal"
    ) as ep:
        config = tmp_path / "so101d.toml"
        config.write_text(
            f'[leader]\nport = "{ep.leader_path}"\nid = "emulated_leader"\n'
            f'[follower]\nport = "{ep.follower_path}"\nid = "emulated_follower"\n'
            f'[calibration]\nroot = "{tmp_path / "cal"}"\n'
        )
        daemon = start(m, ["run", "--config", str(config)], "run")
        try:
            status = wait_status(m.socket, lambda s: "setup-motors" in str(s.get("fault")), 60, daemon)
        finally:
            assert stop(daemon) == 0, log_of(m, "run")
    assert status["mode"] == "disconnected"
    assert "only id 1 answers, as on a new kit (" in status["fault"]
    assert "): stop so101d, then run so101d setup-motors follower --port" in status["fault"]
