"""What the daemon shares with the parts that plug into it, declared.

``DaemonContext`` owns the shared things: the configuration, the arms, the control loop, the
control socket's verb registry, the cameras (the daemon's, not the recorder's), the state
directories, and the shutdown lists. Recording (``daemon.service.attach_recording``), the policy
(``daemon.service.attach_policy``) and the LeIsaac remote-leader publisher get this object instead of the
whole daemon; what they attach is declared below (``EpisodeRecorder``, ``PolicyHandle``) and in
``daemon.control.seams`` (target sources and hooks). The wiring itself is ``daemon/service/daemon.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from daemon.api.server import ControlServer
from daemon.config.settings import Config
from daemon.control.loop import ControlLoop
from daemon.data.recorder import Rotation
from daemon.policy.leader_drive import LeaderClaim
from daemon.service.cameras import DaemonCameras
from drivers.arm_interface import FollowerArm, LeaderArm
from drivers.cameras import Camera

StatusExtra = Callable[[], dict[str, Any]]  # a section of `status` (its key is the part's name)


class EpisodeRecorder(Protocol):
    """What the policy (evaluation episodes) and the service (READY, STATUS) ask of the recorder
    (``daemon.data.recorder.Recorder``)."""

    cameras: list[Camera]

    @property
    def phase(self) -> str: ...

    def start_episode(
        self, task: str | None = None, origin: str | None = None, rotation: Rotation | None = None
    ) -> dict[str, Any]: ...

    def save_episode(self, success: bool | None = None, notes: list[str] | None = None) -> dict[str, Any]: ...

    def discard_episode(self) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...


class PolicyHandle(Protocol):
    """The attached policy controller (``daemon.service.attach_policy.PolicyController``)."""

    @property
    def correcting(self) -> bool:
        """A correction is open: the operator drives inside the policy's episode (cheap: read at 20 Hz)."""
        ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass
class DaemonContext:
    """The daemon's shared things (see the module docstring)."""

    cfg: Config
    leader: LeaderArm | None
    follower: FollowerArm
    loop: ControlLoop
    server: ControlServer  # the control socket: ``server.register(verb, handler)``
    cameras: DaemonCameras
    on_stop: list[Callable[[], None]] = field(default_factory=list)  # before the loop stops (save an episode)
    after_stop: list[Callable[[], None]] = field(default_factory=list)  # after it stopped (close publishers)
    status_extras: dict[str, StatusExtra] = field(default_factory=dict)  # name -> section of `status`
    # What a stop hook could not keep (recorded episodes never written): the exit code says so.
    data_lost: list[str] = field(default_factory=list)
    recorder: EpisodeRecorder | None = None  # set by daemon.service.attach_recording
    policy: PolicyHandle | None = None  # set by daemon.service.attach_policy
    # who drives the leader's motors (the policy's take-over, a client's leader.acquire): one at a time
    leader_claim: LeaderClaim = field(default_factory=LeaderClaim)

    @property
    def calibration_dir(self) -> Path | None:
        """Where calibration files are read (None: LeRobot's default location)."""
        return self.cfg.calibration_root()

    @property
    def dataset_dir(self) -> Path:
        """<dataset_root>/<repo_id>: where episodes are recorded."""
        return Path(self.cfg.recording.dataset_root).expanduser() / self.cfg.recording.repo_id


@runtime_checkable
class HasContext(Protocol):
    """The daemon itself (``daemon.service.daemon.Daemon``): attach functions take it or its context."""

    @property
    def context(self) -> DaemonContext: ...


def context_of(daemon: DaemonContext | HasContext) -> DaemonContext:
    return daemon if isinstance(daemon, DaemonContext) else daemon.context
