"""`so101d install-service`: write the systemd unit, udev rules, sysusers entry and configuration.

Writes into a target root (default /) so packagers and tests can install into a staging tree;
--dry-run prints every file it would write and writes nothing. It does not run systemctl,
udevadm or systemd-sysusers itself: it prints the commands, because an installer that restarts a
robot arm's controller on its own is a surprise nobody wants.

Files (under --root):
  etc/systemd/system/so101d.service                 the unit, ExecStart = this venv's so101d
  etc/systemd/system/so101d.service.d/realtime.conf (only with --realtime)
  etc/systemd/system/so101d-console.service         (only with --console) `so101d console` on
                                                     127.0.0.1:8101, started with so101d
  etc/udev/rules.d/99-so101.rules                    from --udev-rules FILE (find-ports --write),
                                                     or --leader-serial/--follower-serial, or the
                                                     template with commented examples
  etc/sysusers.d/so101d.conf                         the so101d system user, in dialout and video
  etc/so101d/so101d.toml                             the configuration (kept if it exists)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from daemon.system.udev_rules import ArmMatch, RuleError, render_rules

REPO = Path(__file__).resolve().parents[3]
SYSTEMD_DIR = REPO / "systemd"
UNIT_TEMPLATE = SYSTEMD_DIR / "so101d.service"
CONSOLE_TEMPLATE = SYSTEMD_DIR / "so101d-console.service"
REALTIME_DROPIN = SYSTEMD_DIR / "so101d.service.d" / "realtime.conf"
SYSUSERS_TEMPLATE = SYSTEMD_DIR / "so101d.sysusers"
EXAMPLE_CONFIG = REPO / "daemon" / "configs" / "so101d.example.toml"

STATE_DIR = "/var/lib/so101d"
CONFIG_PATH = "/etc/so101d/so101d.toml"
SOCKET_PATH = "/run/so101d/control.sock"
# What the installed configuration changes from the example: udev names, writable state paths
# (ProtectSystem=strict leaves only /var/lib/so101d writable) and the RuntimeDirectory socket.
SERVICE_OVERRIDES: dict[str, str] = {
    "leader.port": "/dev/so101-leader",
    "follower.port": "/dev/so101-follower",
    "calibration.root": f"{STATE_DIR}/calibration",
    "recording.dataset_root": f"{STATE_DIR}/datasets",
    "socket.path": SOCKET_PATH,
}
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_HOME_PREFIXES = ("/home/", "/root/", "/run/user/")


class InstallError(RuntimeError):
    pass


@dataclass
class PlannedFile:
    path: Path  # absolute, under the target root
    text: str
    mode: int = 0o644
    keep_existing: bool = False  # configuration: never overwrite an operator's edits


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--user", default="so101d", help="system user the daemon runs as (default so101d; created by systemd-sysusers)"
    )
    p.add_argument(
        "--config", metavar="PATH", help="configuration to install (default: the example, adapted to the service)"
    )
    p.add_argument("--root", default="/", help="target root directory (default /)")
    p.add_argument("--dry-run", action="store_true", help="print what would be written; write nothing")
    p.add_argument("--udev-rules", metavar="FILE", help="rules written by `so101d find-ports --write FILE`")
    p.add_argument("--leader-serial", metavar="SERIAL", help="leader adapter's USB serial (instead of --udev-rules)")
    p.add_argument("--follower-serial", metavar="SERIAL", help="follower adapter's USB serial")
    p.add_argument("--realtime", action="store_true", help="also install the real-time drop-in (SCHED_FIFO, memlock)")
    p.add_argument(
        "--console",
        action="store_true",
        help="also install so101d-console.service: the browser console on 127.0.0.1:8101, started with so101d",
    )
    p.add_argument("--force-config", action="store_true", help="overwrite an existing /etc/so101d/so101d.toml")
    p.add_argument(
        "--exec", dest="exec_path", metavar="PATH", help="so101d executable for ExecStart (default: this venv's)"
    )


# -------------------------------------------------------------------------------------------------
# pure helpers (tested directly)
# -------------------------------------------------------------------------------------------------
def default_executable() -> Path:
    """The console script next to this interpreter: the venv's bin/so101d, not resolved
    through symlinks (a venv's python is a symlink to the base interpreter)."""
    return Path(sys.executable).with_name("so101d").absolute()


def set_toml_values(text: str, values: dict[str, str]) -> str:
    """Set ``section.key = "value"`` in TOML text, keeping comments and layout.

    Replaces the key's value in place (trailing comment kept); adds the key under its
    section header when absent, and the section at the end when that is absent too.
    Only string values (all the service overrides are paths).
    """
    lines = text.splitlines()
    for dotted, value in values.items():
        section, key = dotted.rsplit(".", 1)
        quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        header = f"[{section}]"
        start = next((i for i, line in enumerate(lines) if line.strip() == header), None)
        if start is None:
            lines += ["", header, f"{key} = {quoted}"]
            continue
        end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        pattern = re.compile(rf"^(\s*){re.escape(key)}\s*=\s*(\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^#\s]+)(\s*#.*)?$")
        for i in range(start + 1, end):
            m = pattern.match(lines[i])
            if m:
                lines[i] = f"{m.group(1)}{key} = {quoted}{m.group(3) or ''}"
                break
        else:
            lines.insert(start + 1, f"{key} = {quoted}")
    return "\n".join(lines) + "\n"


def check_config_text(text: str, origin: str) -> dict:
    """Parse and (when daemon.config.settings is available) validate; InstallError names the problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(f"{origin}: not valid TOML: {exc}") from None
    try:
        from daemon.config.settings import ConfigError, config_from_dict
    except ImportError:  # the daemon core's loader is not there: TOML syntax is all we can check
        return data
    try:
        config_from_dict(data)
    except ConfigError as exc:
        raise InstallError(f"{origin}: {exc}") from None
    return data


def service_config_text(source: Path | None) -> str:
    """The configuration to install: the operator's file verbatim, or the example adapted."""
    if source is not None:
        try:
            text = source.read_text()
        except OSError as exc:
            raise InstallError(f"{source}: cannot read: {exc.strerror or exc}") from None
        check_config_text(text, str(source))
        return text
    if EXAMPLE_CONFIG.is_file():
        base = EXAMPLE_CONFIG.read_text()
        header = "# Installed by `so101d install-service` from the example configuration; edit freely.\n"
    else:  # the example is the daemon core's; until it exists, only the service keys
        base = ""
        header = "# Installed by `so101d install-service`; every other key keeps its default.\n"
    text = header + set_toml_values(base, SERVICE_OVERRIDES)
    check_config_text(text, "generated configuration")
    return text


def writable_paths_for(config: dict) -> list[str]:
    """Dataset/calibration roots outside /var/lib/so101d need ReadWritePaths= (ProtectSystem=strict)."""
    out = []
    for section, key in (("recording", "dataset_root"), ("calibration", "root")):
        value = str(config.get(section, {}).get(key, "") or "")
        if not value or value.startswith("~"):
            continue  # ~ is HOME=/var/lib/so101d under the unit: already writable
        p = os.path.normpath(value)
        if not p.startswith("/"):
            raise InstallError(f"{section}.{key} = {value!r}: the service needs an absolute path")
        if p != STATE_DIR and not p.startswith(STATE_DIR + "/"):
            out.append(p)
    return out


def _under_home(path: Path) -> bool:
    s = str(path) + "/"
    return s.startswith(_HOME_PREFIXES)


def interpreter_of(exec_path: Path) -> Path | None:
    """The real interpreter behind a console script (its shebang, symlinks resolved).

    A venv's python is a symlink to the base interpreter — often pyenv's under /root or /home —
    and the service must be able to reach that too, not only the venv."""
    try:
        with open(exec_path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    if not parts:
        return None
    if os.path.basename(parts[0]) == "env" and len(parts) > 1:
        import shutil

        found = shutil.which(parts[1])
        return Path(os.path.realpath(found)) if found else None
    return Path(os.path.realpath(parts[0]))


def unreachable_by_others(path: Path) -> Path | None:
    """The first ancestor directory a user outside owner and group cannot traverse, if any."""
    for parent in reversed(path.parents):
        try:
            mode = parent.stat().st_mode
        except OSError:
            return None
        if not mode & 0o001:
            return parent
    return None


def render_unit(
    exec_path: Path,
    config_path: str = CONFIG_PATH,
    user: str = "so101d",
    read_write_paths: list[str] | None = None,
    package_dir: Path = REPO,
    template: Path = UNIT_TEMPLATE,
) -> tuple[str, list[str]]:
    """The unit text (the daemon's, or ``CONSOLE_TEMPLATE``'s) and warnings for the operator."""
    if not exec_path.is_absolute():
        raise InstallError(f"ExecStart needs an absolute path, got {exec_path}")
    for label, value in (("executable", str(exec_path)), ("configuration", config_path)):
        if any(c.isspace() for c in value) or "%" in value or '"' in value:
            raise InstallError(
                f"{label} path {value!r} has spaces, quotes or '%': move it (systemd would split or expand it)"
            )
    if not _USER.match(user):
        raise InstallError(f"--user {user!r} is not a valid system user name")
    warnings = []
    protect_home = "yes"
    needed = [("so101d", exec_path), ("the so101d package", package_dir)]
    interp = interpreter_of(exec_path)
    if interp is not None:
        needed.append(("its Python interpreter", interp))
    in_home = [(what, p) for what, p in needed if _under_home(p)]
    if in_home:
        protect_home = "read-only"
        where = "; ".join(f"{what} is {p}" for what, p in in_home)
        warnings.append(
            f"{where}: under a home directory, so ProtectHome=read-only instead of yes. "
            "A venv built from a system Python under /opt/so101d is better."
        )
    for what, p in needed:
        blocked = unreachable_by_others(p)
        if blocked is not None:
            warnings.append(
                f"{what} ({p}) is behind {blocked} (mode {blocked.stat().st_mode & 0o777:o}): user {user} cannot reach it"
            )
    text = template.read_text()
    rw = "\n".join(f"ReadWritePaths={p}" for p in (read_write_paths or []))
    if rw:
        rw = "# dataset / calibration roots outside /var/lib/so101d (from the configuration)\n" + rw
    text = (
        text.replace("@SO101D@", str(exec_path))
        .replace("@CONFIG@", config_path)
        .replace("@PROTECT_HOME@", protect_home)
        .replace("@READ_WRITE_PATHS@", rw)
    )
    if user != "so101d":
        text = text.replace("User=so101d", f"User={user}").replace("Group=so101d", f"Group={user}")
    leftover = re.findall(r"@[A-Z_]+@", text)
    if leftover:
        raise InstallError(f"unit template placeholders left unfilled: {leftover}")
    return text, warnings


def udev_rules_text(rules_file: str | None, leader_serial: str | None, follower_serial: str | None) -> tuple[str, bool]:
    """(rules text, has arm rules)."""
    if rules_file and (leader_serial or follower_serial):
        raise InstallError("give either --udev-rules or --leader-serial/--follower-serial, not both")
    if rules_file:
        try:
            text = Path(rules_file).read_text()
        except OSError as exc:
            raise InstallError(f"{rules_file}: cannot read: {exc.strerror or exc}") from None
        if "so101-leader" not in text or "so101-follower" not in text:
            raise InstallError(
                f"{rules_file}: no so101-leader/so101-follower rules (write it with `so101d find-ports --write`)"
            )
        return text, True
    if leader_serial or follower_serial:
        if not (leader_serial and follower_serial):
            raise InstallError("give both --leader-serial and --follower-serial")
        try:
            return render_rules(
                [ArmMatch("leader", serial=leader_serial), ArmMatch("follower", serial=follower_serial)]
            ), True
        except RuleError as exc:
            raise InstallError(str(exc)) from None
    return render_rules([]), False


def plan(args: argparse.Namespace) -> tuple[list[PlannedFile], list[str]]:
    root = Path(args.root).absolute()
    exec_path = Path(args.exec_path) if args.exec_path else default_executable()
    warnings: list[str] = []
    if not exec_path.is_file() or not os.access(exec_path, os.X_OK):
        raise InstallError(f"{exec_path} is not an executable so101d (pass --exec PATH)")
    config_text = service_config_text(Path(args.config) if args.config else None)
    config = tomllib.loads(config_text)
    sock = config.get("socket", {}).get("path", "")
    if sock != SOCKET_PATH:
        warnings.append(
            f"socket.path is {sock!r}: set it to {SOCKET_PATH!r} so `so101d status` finds the service "
            "(the unit's RuntimeDirectory is /run/so101d; PrivateTmp hides /tmp)"
        )
    unit, unit_warnings = render_unit(exec_path, CONFIG_PATH, args.user, writable_paths_for(config))
    warnings += unit_warnings
    rules, has_arms = udev_rules_text(args.udev_rules, args.leader_serial, args.follower_serial)
    if not has_arms:
        warnings.append(
            "udev rules have no arm rules yet: run `so101d find-ports --write FILE` and install with --udev-rules FILE"
        )
    sysusers = SYSUSERS_TEMPLATE.read_text().replace("@USER@", args.user)
    files = [
        PlannedFile(root / "etc/systemd/system/so101d.service", unit),
        PlannedFile(root / "etc/udev/rules.d/99-so101.rules", rules),
        PlannedFile(root / "etc/sysusers.d/so101d.conf", sysusers),
        PlannedFile(root / CONFIG_PATH.lstrip("/"), config_text, mode=0o644, keep_existing=not args.force_config),
    ]
    if args.console:
        console_unit, _ = render_unit(exec_path, CONFIG_PATH, args.user, template=CONSOLE_TEMPLATE)
        files.insert(1, PlannedFile(root / "etc/systemd/system/so101d-console.service", console_unit))
    if args.realtime:
        files.insert(
            1, PlannedFile(root / "etc/systemd/system/so101d.service.d/realtime.conf", REALTIME_DROPIN.read_text())
        )
        if not config.get("service", {}).get("lock_memory", False):
            warnings.append("--realtime: also set lock_memory = true under [service] to lock the daemon's memory")
    return files, warnings


def write_files(files: list[PlannedFile]) -> list[tuple[Path, str]]:
    """Atomic writes (temp file + rename); returns (path, what happened)."""
    done = []
    for f in files:
        if f.keep_existing and f.path.exists():
            done.append((f.path, "kept (exists; --force-config to replace)"))
            continue
        f.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.path.with_name(f".{f.path.name}.so101d-tmp")
        tmp.write_text(f.text)
        os.chmod(tmp, f.mode)
        os.replace(tmp, f.path)
        done.append((f.path, "written"))
    return done


def operator_commands(args: argparse.Namespace) -> list[str]:
    console = (
        ["systemctl enable --now so101d-console      # the browser console: http://127.0.0.1:8101/"]
        if args.console
        else []
    )
    return [
        "systemd-sysusers                      # create the so101d user (dialout, video)",
        "udevadm control --reload && udevadm trigger",
        "systemctl daemon-reload",
        "systemctl enable --now so101d",
        *console,
        "journalctl -u so101d -f               # follow its log",
        "systemctl status so101d               # STATUS: mode, loop rate, episodes",
        f"usermod -aG {args.user} $USER            # operators: reach {SOCKET_PATH} (log in again)",
        f"so101d status --socket {SOCKET_PATH}",
    ]


def run(args: argparse.Namespace) -> int:
    try:
        files, warnings = plan(args)
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.dry_run:
        for f in files:
            exists = f.path.exists()
            note = " (exists: would be kept)" if f.keep_existing and exists else (" (would replace)" if exists else "")
            print(f"=== would write {f.path} (mode {f.mode:o}){note}")
            print(f.text.rstrip("\n"))
            print()
    else:
        try:
            done = write_files(files)
        except OSError as exc:
            print(
                f"error: cannot write {exc.filename}: {exc.strerror} (run as root, or use --root DIR / --dry-run)",
                file=sys.stderr,
            )
            return 1
        for path, what in done:
            print(f"{path}: {what}")
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    root_note = "" if Path(args.root).absolute() == Path("/") else f" (on the machine whose / is {args.root})"
    print(f"\nThen, as root{root_note}:")
    for c in operator_commands(args):
        print(f"  {c}")
    return 0
