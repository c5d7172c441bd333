"""Wires a Recorder into the running Daemon: cameras from [cameras.*], verbs, hook, status, stop.

The daemon core calls ``attach_recorder(daemon)`` when ``[recording] enabled = true`` (or `demo`
does). Everything the recorder needs from the daemon goes through its published plug points:
``loop.add_hook``, ``server.register``, ``status_extras`` and ``on_stop``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from daemon.recording.cameras import Camera, CameraConfig, OpenCVCamera, VirtualArmCamera
from daemon.recording.recorder import Recorder, RecorderConfig, RecordingError

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
    from daemon.control_socket import RequestError  # noqa: PLC0415

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


def attach_recorder(daemon: Any, cameras: list[Camera] | None = None, follower_kind: str | None = None,
                    root: str | Path | None = None) -> Recorder:
    """Builds, opens and plugs in the recorder; returns it (already registered and hooked)."""
    rc = daemon.cfg.recording
    if cameras is None:
        cameras = build_cameras(daemon.cfg.cameras)
    kind = follower_kind or getattr(daemon.follower, "kind", None) or "feetech"
    rec = Recorder(RecorderConfig(root=str(root or dataset_root(rc)), repo_id=rc.repo_id, fps=rc.fps,
                                  default_task=rc.task, follower_kind=str(kind)), cameras)
    rec.open()
    reg = daemon.server.register
    reg("episode.start", _verb(lambda req: rec.start_episode(req.get("task"))))
    reg("episode.save", _verb(lambda req: rec.save_episode(_success_arg(req))))
    reg("episode.discard", _verb(lambda req: rec.discard_episode()))
    reg("episode.status", _verb(lambda req: rec.status()))
    daemon.loop.add_hook(rec)
    daemon.status_extras["recording"] = rec.status
    daemon.on_stop.append(rec.close)
    return rec
