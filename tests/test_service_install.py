"""`so101d install-service` into a temporary root; --dry-run writes nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from daemon.apps.commands.install_service import SERVICE_OVERRIDES, InstallError, set_toml_values, writable_paths_for
from daemon.config.settings import load_config

SO101D = str(Path(sys.executable).with_name("so101d"))
EXPECTED = [
    "etc/systemd/system/so101d.service",
    "etc/udev/rules.d/99-so101.rules",
    "etc/sysusers.d/so101d.conf",
    "etc/so101d/so101d.toml",
]


def _install(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SO101D, "install-service", *args], capture_output=True, text=True, timeout=60)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_install_writes_the_expected_files(tmp_path: Path) -> None:
    root = tmp_path / "root"
    r = _install("--root", str(root))
    assert r.returncode == 0, r.stderr
    assert _tree(root) == sorted(EXPECTED)
    unit = (root / EXPECTED[0]).read_text()
    assert f"ExecStart={SO101D} run --config /etc/so101d/so101d.toml" in unit
    assert "@" + "SO101D@" not in unit
    # The installed configuration loads with the daemon's own loader and points at service paths.
    cfg = load_config(root / "etc/so101d/so101d.toml")
    assert cfg.leader.port == "/dev/so101-leader" and cfg.follower.port == "/dev/so101-follower"
    assert cfg.socket.resolved_path() == "/run/so101d/control.sock"  # RuntimeDirectory=so101d
    assert cfg.recording.dataset_root == "/var/lib/so101d/datasets"
    assert cfg.calibration.root == "/var/lib/so101d/calibration"
    # Comments of the example survive.
    assert "# serial port of the leader arm" in (root / "etc/so101d/so101d.toml").read_text()
    assert "m so101d dialout" in (root / "etc/sysusers.d/so101d.conf").read_text()
    for cmd in (
        "systemctl daemon-reload",
        "systemctl enable --now so101d",
        "journalctl -u so101d -f",
        "udevadm control --reload",
    ):
        assert cmd in r.stdout
    assert "no arm rules yet" in r.stderr
    assert all(not p.name.endswith("so101d-tmp") for p in root.rglob("*"))


def test_the_console_unit_is_installed_only_when_asked(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    r = _install("--root", str(plain))
    assert r.returncode == 0, r.stderr
    assert not (plain / "etc/systemd/system/so101d-console.service").exists()
    assert "so101d-console" not in r.stdout
    root = tmp_path / "root"
    r = _install("--root", str(root), "--console")
    assert r.returncode == 0, r.stderr
    assert _tree(root) == sorted([*EXPECTED, "etc/systemd/system/so101d-console.service"])
    unit = (root / "etc/systemd/system/so101d-console.service").read_text()
    assert f"ExecStart={SO101D} console --bind 127.0.0.1:8101 --config /etc/so101d/so101d.toml" in unit
    assert "@" not in unit.replace("@resources", "").replace("@system-service", "").replace("@privileged", "")
    assert "systemctl enable --now so101d-console" in r.stdout


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    r = _install("--root", str(root), "--dry-run", "--realtime")
    assert r.returncode == 0, r.stderr
    assert not root.exists()
    for rel in EXPECTED + ["etc/systemd/system/so101d.service.d/realtime.conf"]:
        assert f"=== would write {root / rel}" in r.stdout
    assert "Type=notify" in r.stdout and "CPUSchedulingPolicy=fifo" in r.stdout


def test_existing_config_is_kept_unless_forced(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert _install("--root", str(root)).returncode == 0
    conf = root / "etc/so101d/so101d.toml"
    conf.write_text(conf.read_text().replace('id = "leader"', 'id = "my_leader"'))
    r = _install("--root", str(root))
    assert r.returncode == 0 and "kept" in r.stdout
    assert 'id = "my_leader"' in conf.read_text()
    r = _install("--root", str(root), "--dry-run")
    assert "(exists: would be kept)" in r.stdout
    assert _install("--root", str(root), "--force-config").returncode == 0
    assert 'id = "my_leader"' not in conf.read_text()


def test_rules_from_find_ports_and_serials(tmp_path: Path) -> None:
    rules = tmp_path / "99-so101.rules"
    r = subprocess.run(
        [SO101D, "find-ports", "--leader-serial", "L1", "--follower-serial", "F1", "--write", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    root = tmp_path / "root"
    r = _install("--root", str(root), "--udev-rules", str(rules))
    assert r.returncode == 0, r.stderr
    assert (root / "etc/udev/rules.d/99-so101.rules").read_text() == rules.read_text()
    assert "no arm rules yet" not in r.stderr
    root2 = tmp_path / "root2"
    assert _install("--root", str(root2), "--leader-serial", "L2", "--follower-serial", "F2").returncode == 0
    assert 'ATTRS{serial}=="F2", SYMLINK+="so101-follower"' in (root2 / "etc/udev/rules.d/99-so101.rules").read_text()


def test_custom_config_user_and_realtime(tmp_path: Path) -> None:
    src = tmp_path / "mine.toml"
    src.write_text(
        '[recording]\ndataset_root = "/srv/so101/datasets"\n[socket]\npath = "/run/so101d/control.sock"\n'
        "[service]\nlock_memory = true\n"
    )
    root = tmp_path / "root"
    r = _install("--root", str(root), "--config", str(src), "--user", "robot", "--realtime")
    assert r.returncode == 0, r.stderr
    unit = (root / "etc/systemd/system/so101d.service").read_text()
    assert "ReadWritePaths=/srv/so101/datasets" in unit and "User=robot" in unit
    assert (root / "etc/so101d/so101d.toml").read_text() == src.read_text()  # installed verbatim
    assert (root / "etc/systemd/system/so101d.service.d/realtime.conf").is_file()
    assert "m robot dialout" in (root / "etc/sysusers.d/so101d.conf").read_text()
    assert "lock_memory" not in r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "/nonexistent.toml"], "cannot read"),
        (["--exec", "/nonexistent/so101d"], "not an executable"),
        (["--user", "Bad User"], "not a valid system user"),
        (["--leader-serial", "A"], "both --leader-serial"),
        (["--leader-serial", 'A"', "--follower-serial", "B"], "characters"),
    ],
)
def test_bad_inputs_are_clear_errors_and_write_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    root = tmp_path / "root"
    r = _install("--root", str(root), *args)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert not root.exists()


def test_bad_config_content_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "bad.toml"
    src.write_text("[safety]\nmax_step_deg = 500\n")
    r = _install("--root", str(tmp_path / "root"), "--config", str(src))
    assert r.returncode == 1 and "safety.max_step_deg" in r.stderr
    src.write_text("[safety\n")
    r = _install("--root", str(tmp_path / "root"), "--config", str(src))
    assert r.returncode == 1 and "not valid TOML" in r.stderr
    src.write_text('[socket]\npath = "/tmp/x.sock"\n')
    r = _install("--root", str(tmp_path / "root"), "--config", str(src))
    assert r.returncode == 0 and "set it to '/run/so101d/control.sock'" in r.stderr


def test_unwritable_root_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    root.mkdir()
    (root / "etc").write_text("a file where a directory should be")
    r = _install("--root", str(root))
    assert r.returncode == 1 and "cannot write" in r.stderr


def test_set_toml_values_edits_in_place() -> None:
    text = '[a]\nx = 1  # keep me\ny = "old"   # and me\n\n[b]\nz = true\n'
    out = set_toml_values(text, {"a.y": 'new "q"', "b.w": "/p", "c.v": "/q"})
    data = tomllib.loads(out)
    assert data == {"a": {"x": 1, "y": 'new "q"'}, "b": {"z": True, "w": "/p"}, "c": {"v": "/q"}}
    assert "# and me" in out and "# keep me" in out
    base = set_toml_values("", SERVICE_OVERRIDES)
    assert tomllib.loads(base)["socket"]["path"] == "/run/so101d/control.sock"


def test_writable_paths() -> None:
    assert writable_paths_for({"recording": {"dataset_root": "/var/lib/so101d/datasets"}}) == []
    assert writable_paths_for({"recording": {"dataset_root": "~/so101d/datasets"}}) == []
    assert writable_paths_for(
        {"recording": {"dataset_root": "/var/lib/so101d-other"}, "calibration": {"root": "/srv/cal/"}}
    ) == ["/var/lib/so101d-other", "/srv/cal"]
    with pytest.raises(InstallError, match="absolute"):
        writable_paths_for({"recording": {"dataset_root": "datasets"}})


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers not installed")
def test_sysusers_file_creates_the_user_in_a_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert _install("--root", str(root)).returncode == 0
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\ndialout:x:20:\nvideo:x:44:\n")
    r = subprocess.run(["systemd-sysusers", f"--root={root}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    passwd = (root / "etc/passwd").read_text()
    line = next(l for l in passwd.splitlines() if l.startswith("so101d:"))
    uid = int(line.split(":")[2])
    assert 0 < uid < 1000 and line.split(":")[5] == "/var/lib/so101d"
    group = (root / "etc/group").read_text()
    assert "dialout:x:20:so101d" in group and "video:x:44:so101d" in group
