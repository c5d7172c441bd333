"""The virtual bench the tests share: an emulated leader and follower, each six STS3215s served
by our emulator (drivers/emulator) on a pseudo-terminal in this process, with LeRobot calibration
files for both under the ids the daemon's configuration names ("leader", "follower").

`tests/conftest.py` hands one out per test as the ``virtual_bench`` fixture; a test moves the
arms "by hand" (``leader.set_pose_units``), unplugs a port (``follower_bus.unplug()``) or injects
faults (``follower_bus.faults``), and starts whatever it tests against the two ports: the daemon
in-process, ``so101d run`` with :meth:`VirtualBench.write_config`, LeRobot's own tools.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calibration.calibration_file import save_calibration
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration

if TYPE_CHECKING:
    from daemon.service.daemon import Daemon

# Every joint well inside its range, the gripper half open: what a bench arm at rest looks like.
BENCH_POSE_UNITS = np.array([0.0, -40.0, 45.0, 30.0, 0.0, 50.0])


@dataclass
class VirtualBench:
    """Both arms of one bench in ``root``; ``close()`` unplugs them (idempotent)."""

    root: Path
    leader: EmulatedArm
    follower: EmulatedArm
    leader_bus: BusEmulator
    follower_bus: BusEmulator

    @property
    def leader_port(self) -> Path:
        return self.leader_bus.link_path

    @property
    def follower_port(self) -> Path:
        return self.follower_bus.link_path

    @property
    def calibration_root(self) -> Path:
        return self.root / "calibration"

    @property
    def socket_path(self) -> Path:
        return self.root / "c.sock"

    def write_config(self, extra_toml: str = "", rate_hz: float = 50.0, name: str = "so101d.toml") -> Path:
        """A daemon configuration for this bench (ports, calibration, socket), ``extra_toml`` appended."""
        cfg = self.root / name
        cfg.write_text(
            f'[leader]\nport = "{self.leader_port}"\n[follower]\nport = "{self.follower_port}"\n'
            f'[calibration]\nroot = "{self.calibration_root}"\n[socket]\npath = "{self.socket_path}"\n'
            f"[control]\nrate_hz = {rate_hz}\n" + extra_toml
        )
        return cfg

    def config_sections(self, rate_hz: float = 50.0) -> dict[str, dict[str, Any]]:
        """The daemon configuration's sections for this bench (ports, calibration, socket, rate), as
        ``config_from_dict`` takes them: a test adds its own sections beside these."""
        return {
            "leader": {"port": str(self.leader_port)},
            "follower": {"port": str(self.follower_port)},
            "calibration": {"root": str(self.calibration_root)},
            "socket": {"path": str(self.socket_path)},
            "control": {"rate_hz": rate_hz},
        }

    def daemon(self, sections: dict[str, dict[str, Any]] | None = None, rate_hz: float = 50.0) -> Daemon:
        """An in-process daemon (not started) on this bench's arms, ``sections`` added to its configuration."""
        from daemon.config.settings import config_from_dict
        from daemon.service.daemon import Daemon
        from drivers.feetech_arm import FeetechFollower, FeetechLeader

        cfg = config_from_dict({**self.config_sections(rate_hz), **(sections or {})})
        return Daemon(
            cfg,
            FeetechLeader(str(self.leader_port), reference_calibration("leader")),
            FeetechFollower(str(self.follower_port), reference_calibration("follower")),
        )

    def close(self) -> None:
        self.leader_bus.stop()
        self.follower_bus.stop()


@contextlib.contextmanager
def open_virtual_bench(
    root: Path | None = None,
    leader_pose_units: np.ndarray = BENCH_POSE_UNITS,
    follower_pose_units: np.ndarray | None = None,
) -> Iterator[VirtualBench]:
    """Both arms held still (the leader at ``leader_pose_units``, the follower where it is told or
    at the leader's pose), calibrated; ``root`` defaults to a fresh short temporary directory
    (a UNIX socket's path must stay under 108 bytes)."""
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="so101d-vb-")))
        root.mkdir(parents=True, exist_ok=True)
        pose_f = leader_pose_units if follower_pose_units is None else follower_pose_units
        leader = EmulatedArm("leader", initial_pose_units=leader_pose_units)
        leader.set_pose_units(leader_pose_units)
        follower = EmulatedArm("follower", initial_pose_units=pose_f)
        for role in ("leader", "follower"):
            save_calibration(reference_calibration(role), role, role, root / "calibration")
        bench = VirtualBench(
            root, leader, follower, BusEmulator(root / "leader", leader), BusEmulator(root / "follower", follower)
        )
        stack.callback(bench.close)
        bench.leader_bus.start()
        bench.follower_bus.start()
        yield bench
