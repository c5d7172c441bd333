"""Wires a Recorder into the running Daemon: cameras from [cameras.*], verbs, hook, status, stop.

The daemon core calls ``attach_recorder(daemon)`` when ``[recording] enabled = true`` (or `demo`
does). Everything the recorder needs from the daemon goes through its published plug points:
``loop.add_hook``, ``server.register``, ``status_extras`` and ``on_stop``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from daemon.config import CameraConfig as CameraSection
from daemon.config import keys_given
from daemon.recording.recorder import Recorder, RecorderConfig, RecordingError
from drivers.cameras import Camera, CameraConfig, OpenCVCamera, VirtualArmCamera

log = logging.getLogger("so101d.recording")


def dataset_root(recording_cfg: Any) -> Path:
    """<dataset_root>/<repo_id>, as documented in daemon/config.py."""
    return Path(recording_cfg.dataset_root).expanduser() / recording_cfg.repo_id


def build_cameras(cameras_cfg: dict[str, Any], sim_factory: Any = None) -> list[Camera]:
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


def _verb(fn: Any) -> Any:
    from daemon.control_socket import RequestError

    def handler(req: dict[str, Any]) -> dict[str, Any]:
        try:
            return fn(req)
        except (RecordingError, ValueError) as exc:
            raise RequestError(str(exc)) from None

    return handler


def _success_arg(req: dict[str, Any]) -> bool | None:
    v = req.get("success")
    if v is None or isinstance(v, bool):
        return v
    raise ValueError(f'"success" must be true, false or null, got {v!r}')


def configured_size(c: Any) -> tuple[int, int]:
    """(width, height) a [cameras.<name>] table asks for; (0, 0) when it gives no size.

    A sim camera takes its size from the simulator's announcement; a size given here must then
    match it (the recorder names both sizes when it does not). Built in Python (no file), a size
    other than the defaults counts as given."""
    given = keys_given(c)
    if given is None:
        default = CameraSection()
        given = {k for k in ("width", "height") if getattr(c, k) != getattr(default, k)}
    if "width" in given or "height" in given:
        return int(c.width), int(c.height)
    return 0, 0


def sim_camera_factory(follower: Any) -> Any:
    """``build_cameras``' sim_factory for a simulated follower (None when it has no cameras)."""
    if not callable(getattr(follower, "camera", None)):
        return None

    def make(name: str, c: Any) -> Camera:
        width, height = configured_size(c)
        return follower.camera(name, width, height, float(c.fps))

    return make


def follower_dataset_kind(follower: Any) -> str:
    """The EpisodeTag follower_kind: the sim's ("sim-mujoco", "sim-leisaac"), "emulated" for a
    Feetech follower on a pseudo-terminal (our bus emulator; a real USB adapter never is one),
    else "feetech"."""
    kind = getattr(follower, "dataset_kind", None)
    if isinstance(kind, str) and kind:
        return kind
    base = str(getattr(follower, "kind", None) or "feetech")
    port = getattr(follower, "port", None)
    if base == "feetech" and isinstance(port, str) and os.path.realpath(port).startswith("/dev/pts/"):
        return "emulated"
    return base


def _origin_arg(req: dict[str, Any]) -> str | None:
    v = req.get("origin")
    if v is None or isinstance(v, str):
        return v
    raise ValueError(f'"origin" must be a string, got {v!r}')


def attach_recorder(
    daemon: Any, cameras: list[Camera] | None = None, follower_kind: str | None = None, root: str | Path | None = None
) -> Recorder:
    """Builds, opens and plugs in the recorder; returns it (already registered and hooked).

    With a simulated follower (anything with reset/start/stop_episode) its cameras serve kind
    "sim", its episodes follow the recorder's (SimEpisodeHook) and episodes are tagged with its
    backend; on shutdown the episode in progress is saved or discarded per [recording] on_shutdown.
    """
    rc = daemon.cfg.recording
    follower = daemon.follower
    if cameras is None:
        cameras = build_cameras(daemon.cfg.cameras, sim_factory=sim_camera_factory(follower))
    rec = Recorder(
        RecorderConfig(
            root=str(root or dataset_root(rc)),
            repo_id=rc.repo_id,
            fps=rc.fps,
            default_task=rc.task,
            follower_kind=str(follower_kind or follower_dataset_kind(follower)),
        ),
        cameras,
    )
    if follower_kind is None:  # a sim names its backend only once connected: ask at save time
        rec.follower_kind_fn = lambda: follower_dataset_kind(follower)
    if all(callable(getattr(follower, m, None)) for m in ("reset_episode", "start_episode", "stop_episode", "events")):
        from daemon.recording.sim_episodes import SimEpisodeHook

        rec.add_episode_hook(SimEpisodeHook(follower))
    rec.open()
    reg = daemon.server.register
    reg("episode.start", _verb(lambda req: rec.start_episode(req.get("task"), _origin_arg(req))))
    reg("episode.save", _verb(lambda req: rec.save_episode(_success_arg(req))))
    reg("episode.discard", _verb(lambda req: rec.discard_episode()))
    reg("episode.status", _verb(lambda req: rec.status()))
    daemon.loop.add_hook(rec)
    daemon.status_extras["recording"] = rec.status
    # read at stop time: a reloaded configuration counts
    daemon.on_stop.append(lambda: _close(daemon, rec))
    return rec


def _close(daemon: Any, rec: Recorder) -> None:
    """The daemon's stop hook: episodes lost go to ``daemon.data_lost`` (the exit code says so)."""
    rc = daemon.cfg.recording
    lost = rec.close(
        timeout_s=float(getattr(rc, "stop_timeout_s", 120.0)), on_episode=getattr(rc, "on_shutdown", "discard")
    )
    data_lost = getattr(daemon, "data_lost", None)
    if isinstance(data_lost, list):
        data_lost.extend(f"recording: {text}" for text in lost)
