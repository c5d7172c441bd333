"""The daemon's cameras: built once from ``[cameras.*]`` and owned by the daemon.

The recorder and the policy both read frames from these same objects (one capture per camera,
never two handles on one device). Cameras are built when first asked for (a sim camera is
announced to the simulator, so a daemon that records nothing builds none) and stopped when the
daemon stops; ``start`` is idempotent, so whoever needs frames starts them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from daemon.config.settings import CameraConfig as CameraSection
from daemon.config.settings import keys_given
from drivers.cameras import Camera, CameraConfig, OpenCVCamera, VirtualArmCamera

log = logging.getLogger("so101d.cameras")

SimCameraFactory = Callable[[str, CameraSection], Camera]


@runtime_checkable
class CameraHost(Protocol):
    """A follower that renders cameras (the sim follower): ``camera(name, width, height, fps)``."""

    def camera(self, name: str, width: int = 0, height: int = 0, fps: float = 30.0) -> Camera: ...


def configured_size(c: CameraSection) -> tuple[int, int]:
    """(width, height) a [cameras.<name>] table asks for; (0, 0) when it gives no size.

    A sim camera takes its size from the simulator's announcement; a size given here must then
    match it (the recorder names both sizes when it does not). Built in Python (no file), a size
    other than the defaults counts as given."""
    given: frozenset[str] | set[str] | None = keys_given(c)
    if given is None:
        default = CameraSection()
        given = {k for k in ("width", "height") if getattr(c, k) != getattr(default, k)}
    if "width" in given or "height" in given:
        return int(c.width), int(c.height)
    return 0, 0


def sim_camera_factory(follower: object) -> SimCameraFactory | None:
    """``build_cameras``' sim_factory for a simulated follower (None for any other follower)."""
    if not isinstance(follower, CameraHost):
        return None
    host = follower

    def make(name: str, c: CameraSection) -> Camera:
        width, height = configured_size(c)
        return host.camera(name, width, height, float(c.fps))

    return make


def build_cameras(
    cameras_cfg: Mapping[str, CameraSection], sim_factory: SimCameraFactory | None = None
) -> list[Camera]:
    """Cameras of the configuration. kind "sim" needs ``sim_factory(name, cfg) -> Camera``."""
    cams: list[Camera] = []
    for name, c in sorted(cameras_cfg.items()):
        cc = CameraConfig(name=name, device=c.device, width=c.width, height=c.height, fps=c.fps)
        if c.kind == "virtual":
            cams.append(VirtualArmCamera(cc))
        elif c.kind == "opencv":
            cams.append(OpenCVCamera(cc))
        elif c.kind == "sim":
            if sim_factory is None:
                raise ValueError(f"camera {name!r}: kind 'sim' needs the simulated follower's cameras")
            cams.append(sim_factory(name, c))
        else:
            raise ValueError(f"camera {name!r}: unknown kind {c.kind!r}")
    return cams


class DaemonCameras:
    """The configured cameras, each built on first use (one object per camera, whoever asks),
    stopped with the daemon."""

    def __init__(self, cameras_cfg: Mapping[str, CameraSection], follower: object) -> None:
        self._cfg = dict(cameras_cfg)
        self._follower = follower
        self._built: dict[str, Camera] = {}
        self._brought: list[Camera] | None = None  # a caller's own cameras, served instead

    def all(self) -> list[Camera]:
        """Every configured camera, in name order. ValueError for a bad [cameras.*]."""
        if self._brought is not None:
            return list(self._brought)
        return self.named(sorted(self._cfg))

    def named(self, names: list[str]) -> list[Camera]:
        """These configured cameras (built now if not yet)."""
        missing = {n: self._cfg[n] for n in names if n not in self._built}
        if missing:
            for cam in build_cameras(missing, sim_factory=sim_camera_factory(self._follower)):
                self._built[cam.name] = cam
        return [self._built[n] for n in names]

    def use(self, cameras: list[Camera]) -> None:
        """Serve these cameras instead of the configured ones (a caller that brings its own)."""
        self._brought = list(cameras)

    def stop(self) -> None:
        for cam in [*self._built.values(), *(self._brought or [])]:
            try:
                cam.stop()
            except Exception as exc:  # one camera's hung device must not keep the others running
                log.warning("camera %s: stop failed: %s", cam.name, exc)
