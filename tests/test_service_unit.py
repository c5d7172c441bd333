"""The systemd unit: rendered for this venv, checked by systemd-analyze (verify and security)."""

from __future__ import annotations

import configparser
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from daemon.apps.commands.install_service import CONSOLE_TEMPLATE, InstallError, render_unit

REPO = Path(__file__).resolve().parents[1]
SO101D = Path(sys.executable).with_name("so101d")
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None,
    reason="systemd-analyze not installed (Debian/Ubuntu: apt-get install -y systemd); the unit is not checked",
)


def _render(directory: Path, exe: Path = SO101D, name: str = "so101d.service", **kw) -> Path:
    text, _ = render_unit(exe, **kw)
    unit = directory / name
    unit.write_text(text)
    return unit


def _verify(unit: Path) -> subprocess.CompletedProcess:
    # --man=no: Documentation= is not looked up; verify still parses every key and checks ExecStart.
    return subprocess.run([ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)


def _security(unit: Path) -> tuple[float, str, dict[str, dict]]:
    """systemd-analyze security of a unit file: the overall exposure, its line, and each check by name."""
    r = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--threshold=25", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if "Overall exposure level" in l)
    rj = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--json=short", str(unit)], capture_output=True, text=True, timeout=60
    )
    return float(line.split(":")[1].split()[0]), line, {c["name"]: c for c in json.loads(rj.stdout)}


def _service_section(unit: Path) -> dict[str, list[str]]:
    """Keys of [Service] with every assignment (systemd allows repeats)."""
    out: dict[str, list[str]] = {}
    section = None
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            k, _, v = line.partition("=")
            out.setdefault(k, []).append(v)
    return out


@needs_analyze
def test_rendered_unit_verifies_cleanly(tmp_path: Path) -> None:
    unit = _render(tmp_path)
    r = _verify(unit)
    assert r.returncode == 0, r.stderr
    # systemd-analyze only warns (rc 0) for unknown keys or bad values: any mention of our file fails.
    assert "so101d.service" not in r.stderr, r.stderr


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a missing executable and a bad key are both reported."""
    unit = _render(tmp_path)
    unit.write_text(unit.read_text().replace(str(SO101D), "/nonexistent/so101d"))
    r = _verify(unit)
    assert r.returncode != 0 and "not executable" in r.stderr
    unit = _render(tmp_path)
    unit.write_text(unit.read_text().replace("DevicePolicy=closed", "DevicePolicy=closed\nCPUSchedulingPolicy=bogus"))
    assert "so101d.service:" in _verify(unit).stderr  # "<file>:<line>: Failed to parse CPU scheduling policy"


@needs_analyze
def test_realtime_dropin_verifies_with_the_unit(tmp_path: Path) -> None:
    unit = _render(tmp_path)
    d = tmp_path / "so101d.service.d"
    d.mkdir()
    shutil.copy(REPO / "systemd" / "so101d.service.d" / "realtime.conf", d / "realtime.conf")
    r = _verify(unit)
    assert r.returncode == 0 and "so101d.service" not in r.stderr, r.stderr
    # Merged as intended: the base unit denies @resources and realtime, the drop-in re-allows both.
    rj = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--json=short", str(unit)], capture_output=True, text=True, timeout=60
    )
    checks = {c["name"]: c["set"] for c in json.loads(rj.stdout)}
    assert checks["SystemCallFilter=~@resources"] is False and checks["RestrictRealtime="] is False
    shutil.rmtree(d)
    rj = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--json=short", str(unit)], capture_output=True, text=True, timeout=60
    )
    checks = {c["name"]: c["set"] for c in json.loads(rj.stdout)}
    assert checks["SystemCallFilter=~@resources"] is True and checks["RestrictRealtime="] is True
    # The drop-in is really read (a broken one is reported).
    d.mkdir()
    (d / "zz-broken.conf").write_text("[Service]\nLimitRTPRIO=lots\n")
    assert "zz-broken.conf:2" in _verify(unit).stderr


@needs_analyze
def test_security_exposure_is_low(open_dir: Path) -> None:
    exe = _fake_so101d(open_dir)
    unit = _render(open_dir, exe, package_dir=open_dir / "opt")
    score, line, checks = _security(unit)
    print(f"systemd-analyze security: {score}")
    # 10 = unconfined; systemd calls < 2.0 "OK". Serial/camera devices, the network (a remote
    # simulator) and W+X memory (torch JIT) are allowed on purpose.
    assert score <= 2.0, line
    for name in (
        "NoNewPrivileges=",
        "ProtectSystem=",
        "ProtectHome=",
        "PrivateTmp=",
        "RestrictRealtime=",
        "LockPersonality=",
        "ProtectKernelModules=",
        "CapabilityBoundingSet=~CAP_SYS_ADMIN",
        "RestrictAddressFamilies=~AF_PACKET",
        "RestrictAddressFamilies=~AF_NETLINK",
        "User=/DynamicUser=",
    ):
        assert checks[name]["set"], name


@pytest.fixture
def open_dir():
    """A directory every user can traverse (pytest's tmp_path sits under a 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="so101d-unit-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _fake_so101d(tmp_path: Path) -> Path:
    """A console script outside any home directory (the real venv's interpreter may live in /root)."""
    exe = tmp_path / "opt" / "bin" / "so101d"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


def test_unit_contents(open_dir: Path) -> None:
    tmp_path = open_dir
    exe = _fake_so101d(tmp_path)
    text, _ = render_unit(exe, package_dir=tmp_path / "opt")
    unit = tmp_path / "so101d.service"
    unit.write_text(text)
    s = _service_section(unit)
    assert s["Type"] == ["notify"]
    assert s["ExecStart"] == [f"{exe} run --config /etc/so101d/so101d.toml"]
    assert Path(s["ExecStart"][0].split()[0]).is_absolute()
    assert s["User"] == ["so101d"] and "dialout" in s["SupplementaryGroups"][0].split()
    assert s["WatchdogSec"] and s["Restart"] == ["on-failure"]
    assert s["RuntimeDirectory"] == ["so101d"]
    assert set(s["StateDirectory"][0].split()) == {"so101d", "so101d/datasets", "so101d/calibration"}
    assert s["DevicePolicy"] == ["closed"]
    assert {"char-ttyACM rw", "char-ttyUSB rw"} <= set(s["DeviceAllow"])
    assert s["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert s["ProtectSystem"] == ["strict"] and s["ProtectHome"] == ["yes"]
    assert s["CapabilityBoundingSet"] == [""] and s["NoNewPrivileges"] == ["yes"]
    assert "MemoryDenyWriteExecute" not in s  # torch's oneDNN JIT needs W+X pages
    assert "ReadWritePaths" not in s
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string(unit.read_text())
    assert int(parser["Unit"]["StartLimitBurst"]) >= 1
    assert parser["Install"]["WantedBy"] == "multi-user.target"


def test_unit_variants_and_refusals(open_dir: Path) -> None:
    tmp_path = open_dir
    exe = _fake_so101d(tmp_path)
    text, warnings = render_unit(exe, user="robot", read_write_paths=["/srv/datasets"], package_dir=tmp_path / "opt")
    assert "User=robot" in text and "Group=robot" in text and "ReadWritePaths=/srv/datasets" in text
    assert warnings == []
    text, warnings = render_unit(Path("/home/op/venv/bin/so101d"), package_dir=Path("/home/op/so101d"))
    assert "ProtectHome=read-only" in text and "home directory" in warnings[0]
    # A venv whose python links to an interpreter under /root (pyenv) is caught through the shebang.
    venv_py = tmp_path / "venv" / "bin" / "python"
    venv_py.parent.mkdir(parents=True)
    venv_py.symlink_to("/root/.pyenv/versions/3.12.1/bin/python3.12")
    script = tmp_path / "venv" / "bin" / "so101d"
    script.write_text(f"#!{venv_py}\n")
    text, warnings = render_unit(script, package_dir=tmp_path / "opt")
    assert "ProtectHome=read-only" in text and "/root/.pyenv" in warnings[0]
    locked = tmp_path / "locked"
    (locked / "bin").mkdir(parents=True)
    locked.chmod(0o700)
    try:
        _, warnings = render_unit(locked / "bin" / "so101d", package_dir=tmp_path / "opt")
        assert any("cannot reach" in w and str(locked) in w for w in warnings), warnings
    finally:
        locked.chmod(0o755)
    with pytest.raises(InstallError, match="absolute"):
        render_unit(Path("so101d"))
    with pytest.raises(InstallError, match="spaces"):
        render_unit(Path("/opt/my venv/bin/so101d"))
    with pytest.raises(InstallError, match="user"):
        render_unit(SO101D, user="Robot; rm")


# ---------------------------------------------------------------------------------------------
# the optional console unit (so101d install-service --console)
# ---------------------------------------------------------------------------------------------
def _render_console(directory: Path, exe: Path = SO101D, **kw) -> Path:
    return _render(directory, exe, "so101d-console.service", template=CONSOLE_TEMPLATE, **kw)


@needs_analyze
def test_console_unit_verifies_cleanly_and_its_exposure_is_low(open_dir: Path) -> None:
    unit = _render_console(open_dir)
    r = _verify(unit)
    assert r.returncode == 0, r.stderr
    assert "so101d-console.service" not in r.stderr, r.stderr
    unit = _render_console(open_dir, _fake_so101d(open_dir), package_dir=open_dir / "opt")
    score, line, checks = _security(unit)
    print(f"systemd-analyze security (console): {score}")
    assert score <= 2.0, line
    for name in ("PrivateDevices=", "NoNewPrivileges=", "ProtectSystem=", "User=/DynamicUser="):
        assert checks[name]["set"], name


def test_console_unit_contents(open_dir: Path) -> None:
    exe = _fake_so101d(open_dir)
    unit = _render_console(open_dir, exe, package_dir=open_dir / "opt")
    s = _service_section(unit)
    # `so101d console` on loopback, talking to the socket the installed configuration names
    assert s["ExecStart"] == [f"{exe} console --bind 127.0.0.1:8101 --config /etc/so101d/so101d.toml"]
    assert s["User"] == ["so101d"] and s["Group"] == ["so101d"]
    # no device access at all, and no serial/video groups
    assert s["PrivateDevices"] == ["yes"] and s["DevicePolicy"] == ["closed"]
    assert "DeviceAllow" not in s and "SupplementaryGroups" not in s
    # /run/so101d is the daemon's: declaring it here would remove the socket's directory at stop
    assert "RuntimeDirectory" not in s
    assert s["StateDirectory"] == ["so101d/console"]
    assert s["ProtectSystem"] == ["strict"] and s["ProtectHome"] == ["yes"]
    assert s["CapabilityBoundingSet"] == [""] and s["NoNewPrivileges"] == ["yes"]
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string(unit.read_text())
    assert parser["Unit"]["After"] == "so101d.service" and parser["Unit"]["PartOf"] == "so101d.service"
    assert "BindsTo" not in parser["Unit"]  # the page must outlive a daemon crash to say so
    assert parser["Install"]["WantedBy"] == "so101d.service"
    text, _ = render_unit(exe, user="robot", template=CONSOLE_TEMPLATE, package_dir=open_dir / "opt")
    assert "User=robot" in text and "Group=robot" in text
