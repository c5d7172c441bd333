"""Run emulated arms as a set, control them over a JSON-lines UNIX socket, or in a subprocess.

- ``EmulatorHost``: the leader and/or follower of one virtual bench (or the two pairs of a
  bimanual one: left_leader, left_follower, right_leader, right_follower), each an
  ``EmulatedArm`` on its own ``BusEmulator`` thread.
- ``ControlServer``: a UNIX socket speaking JSON lines: one request object per line
  ``{"cmd": "...", "arm": "leader"|"follower"|"left_leader"|..., ...}`` -> one reply line ``{"ok": true, ...}`` or
  ``{"ok": false, "error": "..."}``. Fault injection and live pose setting from another process
  (tests, the daemon's demo). No pickle, loopback-free (a filesystem socket).
- ``EmulatorProcess``: ``so101d emulate`` as a subprocess (its own GIL, so a client measured
  against it is not slowed by the emulator), with ``.control({...})`` and ``.stop()``.

Commands (``arm`` defaults to the only arm when there is one):
  ping; arms; snapshot; stats; reference_calibration; eeprom_calibration;
  set_pose {pose_units: [6]}; set_joint_ticks {joint, ticks}; set_motion {motion: demo|still|PATH};
  block {joint, at_ticks: int|null}; drop_replies {n}; corrupt {rate}; latency {seconds};
  set_online {joint, online}; error_bits {joint, bits}; voltage {volts, joint?};
  temperature {joint, celsius}; set_register {joint, name, value}; clear_faults; unplug; replug;
  corrupt {rate, mode?: checksum|any|len|drop|insert, next?: N}; power_cycle (the arm's power unplugged and
  plugged back: saved EEPROM reloaded, SRAM reset); realism {preset?: "strict,ch343", servo?: {..},
  usb?: ch343|ftdi|ftdi-1ms|null} (no argument: the current settings); refuse_writes {joint, name,
  refuse?} (a servo acknowledges writes to that register without keeping them);
  connect_servos {joints: [joint, ...] | null} (only those servos' cables plugged into the chain,
  null: all; the new-kit preset's one-servo-at-a-time setup); saved_eeprom (per joint, the EEPROM
  bytes 0..39 a power cycle brings back).
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibration.conventions import JOINT_NAMES
from drivers.emulator.arm import EmulatedArm
from drivers.emulator.bus_server import BusEmulator
from drivers.emulator.motion import motion_from_spec
from drivers.emulator.realism import USB_PROFILES, Realism, realism_from_spec, servo_realism_from_json
from drivers.parent_watch import exit_with_parent_args
from drivers.sts3215_table import CONTROL_TABLE

log = logging.getLogger("so101d.emulator")

MAX_REQUEST_BYTES = 64 * 1024


class EmulatorControlError(RuntimeError):
    """The emulator refused a control request (the message says why)."""


class EmulatorHost:
    """The arms of one virtual bench: name ('leader'/'follower', or 'left_leader' ... with
    --bimanual) -> (arm, bus)."""

    def __init__(self) -> None:
        self.arms: dict[str, EmulatedArm] = {}
        self.buses: dict[str, BusEmulator] = {}

    def add(
        self,
        name: str,
        link_path: str | os.PathLike,
        arm: EmulatedArm,
        wire_time: bool = True,
        realtime: bool = True,
        realism: Realism | None = None,
    ) -> BusEmulator:
        if name in self.arms:
            raise ValueError(f"arm {name!r} already present")
        self.arms[name] = arm
        self.buses[name] = BusEmulator(link_path, arm, wire_time=wire_time, realtime=realtime)
        if realism is not None:
            arm.set_realism(realism.servo)
            self.buses[name].set_realism(realism.bus)
        return self.buses[name]

    def start(self) -> None:
        for bus in self.buses.values():
            bus.start()

    def stop(self) -> None:
        for bus in self.buses.values():
            bus.stop()

    # --- control requests -------------------------------------------------------------------
    def _pick(self, req: dict) -> str:
        name = req.get("arm")
        if name is None:
            if len(self.arms) == 1:
                return next(iter(self.arms))
            raise EmulatorControlError(f"say which arm: one of {sorted(self.arms)}")
        if name not in self.arms:
            raise EmulatorControlError(f"no arm {name!r} here; arms are {sorted(self.arms)}")
        return name

    def handle(self, req: object) -> dict[str, Any]:
        """Apply one control request; never raises (errors become {"ok": false})."""
        try:
            if not isinstance(req, dict):
                raise EmulatorControlError("a request must be a JSON object")
            cmd = req.get("cmd")
            if not isinstance(cmd, str):
                raise EmulatorControlError("missing 'cmd'")
            fn = _COMMANDS.get(cmd)
            if fn is None:
                raise EmulatorControlError(f"unknown command {cmd!r}; known: {', '.join(sorted(_COMMANDS))}")
            result = fn(self, req)
            return {"ok": True, **(result or {})}
        except (EmulatorControlError, ValueError, KeyError, TypeError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            return {"ok": False, "error": str(msg)}
        except Exception as exc:  # a bug must not kill the control thread
            log.exception("control request %r failed", req)
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _need(req: dict, key: str) -> Any:
    if key not in req:
        raise EmulatorControlError(f"'{req.get('cmd')}' needs '{key}'")
    return req[key]


def _joint(req: dict) -> str | int:
    j = _need(req, "joint")
    if isinstance(j, bool) or not isinstance(j, (str, int)):
        raise EmulatorControlError("'joint' must be a joint name or a servo number 1..6")
    return j


def _cal_json(cal) -> dict:
    return {"calibration": cal.to_json_dict()}


def _cmd_set_register(host: EmulatorHost, req: dict) -> dict:
    name = _need(req, "name")
    if name not in CONTROL_TABLE:
        raise EmulatorControlError(f"unknown register {name!r}")
    arm = host.arms[host._pick(req)]
    with arm.lock:
        arm.servo(_joint(req)).set_register(name, int(_need(req, "value")))
    return {}


def _cmd_realism(host: EmulatorHost, req: dict) -> dict:
    """Set (any of preset / servo / usb) and report the realism of one arm or of every arm."""
    names = [host._pick(req)] if req.get("arm") is not None or len(host.arms) == 1 else sorted(host.arms)
    for name in names:
        arm, bus = host.arms[name], host.buses[name]
        if "preset" in req:
            r = realism_from_spec(str(req["preset"]))
            arm.set_realism(r.servo)
            bus.set_realism(r.bus)
        if "servo" in req:
            if not isinstance(req["servo"], dict):
                raise EmulatorControlError("'servo' must be an object of realism options")
            arm.set_realism(servo_realism_from_json(req["servo"]))
        if "usb" in req:
            usb = req["usb"]
            if usb is not None and usb not in USB_PROFILES:
                raise EmulatorControlError(f"unknown USB profile {usb!r}; known: {', '.join(USB_PROFILES)} or null")
            from dataclasses import replace

            bus.set_realism(replace(bus.realism, usb=None if usb is None else USB_PROFILES[usb]))
    return {"realism": {n: Realism(host.arms[n].realism, host.buses[n].realism).to_json() for n in names}}


def _cmd_corrupt(host: EmulatorHost, req: dict) -> dict:
    host.buses[host._pick(req)].corrupt(
        float(_need(req, "rate")), str(req.get("mode", "checksum")), int(req.get("next", 0))
    )
    return {}


def _cmd_connect_servos(host: EmulatorHost, req: dict) -> dict:
    # A misspelt key must not read as "plug in every servo": 'joints' is required (null: all).
    unknown = sorted(set(req) - {"cmd", "arm", "joints"})
    if unknown:
        raise EmulatorControlError(f"connect_servos: unknown key(s) {unknown}; it takes 'arm' and 'joints'")
    if "joints" not in req:
        raise EmulatorControlError(
            "connect_servos needs 'joints': a list of joint names / servo numbers, or null for all"
        )
    joints = req["joints"]
    if joints is not None and (
        not isinstance(joints, list) or any(isinstance(j, bool) or not isinstance(j, (str, int)) for j in joints)
    ):
        raise EmulatorControlError("'joints' must be a list of joint names / servo numbers 1..6, or null for all")
    arm = host.arms[host._pick(req)]
    arm.connect_servos(joints)
    return {"connected": arm.connected_joints()}


def _cmd_set_motion(host: EmulatorHost, req: dict) -> dict:
    arm = host.arms[host._pick(req)]
    arm.set_motion(motion_from_spec(str(_need(req, "motion"))))
    return {}


_COMMANDS: dict[str, Callable[[EmulatorHost, dict], dict | None]] = {
    "ping": lambda h, r: {"pid": os.getpid()},
    "arms": lambda h, r: {
        "arms": {n: {"link": str(b.link_path), "pty": b.slave_name, "plugged": b.plugged} for n, b in h.buses.items()}
    },
    "snapshot": lambda h, r: h.arms[h._pick(r)].snapshot(),
    "stats": lambda h, r: {"stats": h.buses[h._pick(r)].stats_dict()},
    "reference_calibration": lambda h, r: _cal_json(h.arms[h._pick(r)].reference),
    "eeprom_calibration": lambda h, r: _cal_json(h.arms[h._pick(r)].eeprom_calibration()),
    "set_pose": lambda h, r: h.arms[h._pick(r)].set_pose_units(_need(r, "pose_units")),
    "set_joint_ticks": lambda h, r: h.arms[h._pick(r)].set_joint_ticks(_joint(r), float(_need(r, "ticks"))),
    "set_motion": _cmd_set_motion,
    "connect_servos": _cmd_connect_servos,
    "saved_eeprom": lambda h, r: {
        "eeprom": {j: list(s.saved_eeprom) for j, s in zip(JOINT_NAMES, h.arms[h._pick(r)].servos)}
    },
    "block": lambda h, r: h.arms[h._pick(r)].block_joint(
        _joint(r), None if r.get("at_ticks") is None else float(r["at_ticks"])
    ),
    "drop_replies": lambda h, r: h.buses[h._pick(r)].drop_replies(int(_need(r, "n"))),
    "corrupt": _cmd_corrupt,
    "power_cycle": lambda h, r: h.arms[h._pick(r)].power_cycle(),
    "refuse_writes": lambda h, r: h.arms[h._pick(r)].refuse_writes(
        _joint(r), str(_need(r, "name")), bool(r.get("refuse", True))
    ),
    "realism": _cmd_realism,
    "latency": lambda h, r: h.buses[h._pick(r)].set_latency(float(_need(r, "seconds"))),
    "set_online": lambda h, r: h.arms[h._pick(r)].set_online(_joint(r), bool(_need(r, "online"))),
    "error_bits": lambda h, r: h.arms[h._pick(r)].set_error_bits(_joint(r), int(_need(r, "bits"))),
    "voltage": lambda h, r: h.arms[h._pick(r)].set_supply_voltage(float(_need(r, "volts")), r.get("joint")),
    "temperature": lambda h, r: h.arms[h._pick(r)].set_temperature(_joint(r), float(_need(r, "celsius"))),
    "set_register": _cmd_set_register,
    "clear_faults": lambda h, r: h.buses[h._pick(r)].clear_faults(),
    "unplug": lambda h, r: h.buses[h._pick(r)].unplug(),
    "replug": lambda h, r: h.buses[h._pick(r)].replug(),
}


class ControlServer:
    """JSON-lines UNIX socket in front of an ``EmulatorHost`` (one thread per client)."""

    def __init__(self, path: str | os.PathLike, host: EmulatorHost) -> None:
        self.path = Path(path)
        self.host = host
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    def start(self) -> ControlServer:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            # A stale socket of a dead emulator: refuse to steal a live one.
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(self.path))
            except OSError:
                self.path.unlink()
            else:
                probe.close()
                raise RuntimeError(f"control socket {self.path} is in use by another emulator")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        sock.listen(8)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept, name="emulator-control", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing = True
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.path.unlink(missing_ok=True)

    def _accept(self) -> None:
        while not self._closing and self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn:
            reader = conn.makefile("rb")
            for line in reader:
                if len(line) > MAX_REQUEST_BYTES:
                    reply = {"ok": False, "error": "request too long"}
                else:
                    try:
                        req = json.loads(line)
                    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                        reply = {"ok": False, "error": f"not JSON: {exc}"}
                    else:
                        reply = self.host.handle(req)
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    return


class ControlClient:
    """Blocking client of a ``ControlServer`` (one connection, reused)."""

    def __init__(self, path: str | os.PathLike, timeout_s: float = 5.0) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._reader: io.BufferedReader | None = None
        self._lock = threading.Lock()

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        sock.connect(self.path)
        self._sock = sock
        self._reader = sock.makefile("rb")

    def request(self, req: dict) -> dict:
        """Send one request; return the reply; raise EmulatorControlError when ok is false."""
        with self._lock:
            if self._sock is None:
                self._connect()
            assert self._sock is not None and self._reader is not None
            try:
                self._sock.sendall(json.dumps(req).encode() + b"\n")
                line = self._reader.readline()
            except OSError:
                self.close()
                raise
            if not line:
                self.close()
                raise EmulatorControlError("emulator closed the control connection")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise EmulatorControlError(reply.get("error", "unknown error"))
        return reply

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._reader = None


class EmulatorProcess:
    """``so101d emulate`` in a subprocess: start, wait until its links and socket exist, control, stop."""

    def __init__(
        self,
        directory: str | os.PathLike,
        leader: bool = True,
        follower: bool = True,
        wire_time: bool = True,
        leader_motion: str = "demo",
        preset: str = "calibrated",
        calibration_out: str | os.PathLike | None = None,
        extra_args: list[str] | None = None,
        bimanual: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.bimanual = bimanual
        roles = [r for r, wanted in (("leader", leader), ("follower", follower)) if wanted]
        # arm name -> link path: "leader"/"follower", or "left_leader" ... "right_follower" (--bimanual)
        names = [f"{side}_{r}" for side in ("left", "right") for r in roles] if bimanual else roles
        self.links: dict[str, Path] = {name: self.directory / name for name in names}
        self.leader_path = self.links.get("leader")
        self.follower_path = self.links.get("follower")
        self.control_path = self.directory / "emulator.sock"
        self.args = [sys.executable, "-m", "daemon.apps.cli", "emulate", "--control", str(self.control_path)]
        if bimanual:
            self.args.append("--bimanual")
        for name, path in self.links.items():
            self.args += ["--" + name.replace("_", "-"), str(path)]
        if leader:
            self.args += ["--leader-motion", leader_motion]
        if not wire_time:
            self.args.append("--no-wire-time")
        if preset != "calibrated":
            self.args += ["--preset", preset]
        if calibration_out is not None:
            self.args += ["--calibration-out", str(calibration_out)]
        self.args += extra_args or []
        self.proc: subprocess.Popen | None = None
        # Set in start(): the emulator exits when the process that started it is gone, even when
        # that process was killed -9 and never called stop() (drivers/emulator/cli.py).
        self.exit_with_parent = True
        self._client: ControlClient | None = None

    def __enter__(self) -> EmulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout_s: float = 30.0) -> EmulatorProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        # Output goes to a file, not a pipe nobody drains (a full pipe would stall the emulator).
        self.log_path = self.directory / "emulator.log"
        with open(self.log_path, "ab") as log_file:
            # Its own session: a Ctrl-C at the terminal reaches the process that owns this handle,
            # which stops its clients first and then the emulator (stop()), instead of the arms
            # vanishing under a daemon that is still shutting down.
            self.proc = subprocess.Popen(
                self.args + self._parent_args(), stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        links = list(self.links.values())
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.log_path.read_text(errors="replace")
                raise RuntimeError(f"so101d emulate exited with {self.proc.returncode}: {err.strip()[-2000:]}")
            if self.control_path.exists() and all(p.is_symlink() for p in links):
                try:
                    self.control({"cmd": "ping"})
                    return self
                except (OSError, EmulatorControlError):
                    pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"so101d emulate did not come up within {timeout_s} s")

    def _parent_args(self) -> list[str]:
        return exit_with_parent_args() if self.exit_with_parent else []

    def control(self, req: dict) -> dict:
        if self._client is None:
            self._client = ControlClient(self.control_path)
        return self._client.request(req)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait (the emulator removes its links), SIGKILL if it hangs. Returns the exit code."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
