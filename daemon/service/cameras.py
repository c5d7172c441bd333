"""The daemon's cameras: built once from ``[cameras.*]`` and owned by the daemon.

The recorder and the policy both read frames from these same objects (one capture per camera,
never two handles on one device). Cameras are built when first asked for (a sim camera is
announced to the simulator, so a daemon that records nothing builds none) and stopped when the
daemon stops; ``start`` is idempotent, so whoever needs frames starts them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from daemon.config.settings import CameraConfig as CameraSection
from daemon.config.settings import keys_given
from daemon.data.recorder import Recorder, RecordingError
from drivers.camera_lerobot import LEROBOT_KINDS, LeRobotCamera
from drivers.cameras import Camera, CameraConfig, VirtualArmCamera

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


def driver_config(name: str, c: CameraSection) -> CameraConfig:
    """The driver's configuration for one [cameras.<name>] table (LeRobot's options passed on)."""
    return CameraConfig(
        name=name,
        device=c.device,
        width=c.width,
        height=c.height,
        fps=c.fps,
        kind=c.kind,
        on_mismatch=c.on_mismatch,
        fourcc=c.fourcc,
        backend=c.backend,
        rotation=c.rotation,
        color_mode=c.color_mode,
        warmup_s=c.warmup_s,
        serial_number_or_name=c.serial_number_or_name,
        use_depth=c.use_depth,
        server_address=c.server_address,
        port=c.port,
        camera_name=c.camera_name,
        timeout_ms=c.timeout_ms,
    )


def build_cameras(
    cameras_cfg: Mapping[str, CameraSection], sim_factory: SimCameraFactory | None = None
) -> list[Camera]:
    """Cameras of the configuration. kind "sim" needs ``sim_factory(name, cfg) -> Camera``."""
    cams: list[Camera] = []
    for name, c in sorted(cameras_cfg.items()):
        cc = driver_config(name, c)
        if c.kind == "virtual":
            cams.append(VirtualArmCamera(cc))
        elif c.kind in LEROBOT_KINDS:
            try:
                cams.append(LeRobotCamera(cc))
            except ValueError as exc:  # LeRobot's own check of its options
                raise ValueError(f"camera {name!r}: {exc}") from None
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

    def built(self) -> list[Camera]:
        """The cameras someone asked for so far (status shows these; it builds none)."""
        if self._brought is not None:
            return list(self._brought)
        return [self._built[n] for n in sorted(self._built)]

    def use(self, cameras: list[Camera]) -> None:
        """Serve these cameras instead of the configured ones (a caller that brings its own)."""
        self._brought = list(cameras)

    def stop(self) -> None:
        for cam in [*self._built.values(), *(self._brought or [])]:
            try:
                cam.stop()
            except Exception as exc:  # one camera's hung device must not keep the others running
                log.warning("camera %s: stop failed: %s", cam.name, exc)


class CameraEpisodeHook:
    """The recorder's episode hook for real cameras: an episode does not start while a camera is
    refused (it delivers another size, rate or format than configured: both values named), gone
    or still opening; a saved episode's tag says when a camera went away and came back (its frames
    in between are recorded missing, and counted) and that a camera recorded at another rate or
    format than configured (on_mismatch = "warn")."""

    def __init__(self, cameras: list[Camera]) -> None:
        self.cameras = [c for c in cameras if isinstance(c, LeRobotCamera)]
        self._started_s = 0.0
        # what the cameras recorded at when the episode began: a replug that fits by the end
        # does not make the frames before it recorded as configured
        self._started_notes: list[str] = []

    def episode_starting(self, recorder: Recorder) -> None:
        refusals = [r for r in (c.refusal() for c in self.cameras) if r]
        if refusals:
            raise RecordingError("episode not started: " + "; ".join(refusals))
        self._started_s = time.monotonic()
        self._started_notes = [n for n in (c.mismatch_note() for c in self.cameras) if n]

    def episode_kept(self, recorder: Recorder, since_monotonic_s: float) -> None:
        """A kept episode (``episode keep``) began ``since_monotonic_s``: the same refusals as a
        start, and the tag's gap notes count from its first kept frame."""
        self.episode_starting(recorder)
        self._started_s = since_monotonic_s

    def episode_ending(self, recorder: Recorder, saved: bool) -> tuple[bool | None, list[str]]:
        now = [n for n in (c.mismatch_note() for c in self.cameras) if n]
        notes = list(dict.fromkeys([*self._started_notes, *now]))
        for cam in self.cameras:
            notes.extend(_gap_notes(cam, self._started_s))
        return None, notes


GAPS_LISTED = 6  # a note lists this many gaps; a tag's notes share a few hundred bytes


def _gap_notes(cam: LeRobotCamera, started_s: float) -> list[str]:
    """One note per camera that went away this episode: 'camera front: gone at 3.20 s (why), back
    at 5.10 s' for one gap; for several, one line listing them (the tag holds a few short notes,
    and a note per gap would push the others out)."""
    gaps: list[tuple[float, float | None]] = []
    why = ""
    for e in cam.events_since(started_s):
        if e.kind == "gone":
            gaps.append((e.monotonic_s - started_s, None))
            why = e.why
        elif e.kind == "back" and gaps and gaps[-1][1] is None:
            gaps[-1] = (gaps[-1][0], e.monotonic_s - started_s)
    if not gaps:
        return []
    if len(gaps) == 1:
        gone, back = gaps[0]
        if back is None:
            return [
                f"camera {cam.name}: gone at {gone:.2f} s ({why}), not back by the end; "
                "its frames from then are recorded missing"
            ]
        return [
            f"camera {cam.name}: gone at {gone:.2f} s ({why}), back at {back:.2f} s; "
            "its frames in between are recorded missing"
        ]
    spans = [f"{a:.2f}-{'end' if b is None else f'{b:.2f}'}" for a, b in gaps]
    listed = spans if len(spans) <= GAPS_LISTED else [*spans[: GAPS_LISTED - 1], "...", spans[-1]]
    return [f"camera {cam.name}: gone {len(gaps)} times, frames recorded missing at {', '.join(listed)} s ({why})"]


def cameras_status(cameras: list[Camera]) -> dict[str, dict[str, object]]:
    """The status section per camera: device, format, configured vs measured fps, dropped frames,
    the newest frame's age, and its state (streaming, gone, refused, ...)."""
    out: dict[str, dict[str, object]] = {}
    for cam in cameras:
        try:
            out[cam.name] = dict(cam.stats())
        except Exception as exc:  # one camera's counters must not hide the others
            out[cam.name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
