"""Wires a Recorder into the running daemon: the daemon's cameras, verbs, hook, status, stop.

The daemon core calls ``attach_recorder(context)`` when ``[recording] enabled = true`` (or `demo`
does). Everything the recorder needs from the daemon goes through the declared context
(daemon/service/context.py): ``loop.add_hook`` (the recorder is a ``CycleHook``), ``server.register``,
``status_extras``, ``on_stop``, ``data_lost`` and the daemon's ``cameras``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from daemon.api.server import RequestError
from daemon.config.settings import ARM_SIDES, RecordingConfig
from daemon.data.recorder import Recorder, RecorderConfig, RecordingError, Rotation
from daemon.service.cameras import CameraEpisodeHook, build_cameras, configured_size, sim_camera_factory
from daemon.service.context import DaemonContext, HasContext, context_of
from drivers.arm_interface import FollowerArm
from drivers.cameras import Camera

log = logging.getLogger("so101d.recording")


def dataset_root(recording_cfg: RecordingConfig) -> Path:
    """<dataset_root>/<repo_id>, as documented in daemon/config/settings.py."""
    return Path(recording_cfg.dataset_root).expanduser() / recording_cfg.repo_id


__all__ = [
    "attach_recorder",
    "build_cameras",
    "configured_size",
    "dataset_root",
    "rotation_from_request",
    "sim_camera_factory",
]

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def depth_encoder_fields(recording_cfg: RecordingConfig) -> dict[str, float | bool]:
    """The [recording.depth_encoder] fields set, for LeRobot's DepthEncoderConfig (the store builds
    it; a field not given keeps LeRobot's default)."""
    de = recording_cfg.depth_encoder
    given = {"depth_min": de.depth_min, "depth_max": de.depth_max, "shift": de.shift, "use_log": de.use_log}
    return {k: v for k, v in given.items() if v is not None}


def _verb(fn: Handler) -> Handler:
    def handler(req: dict[str, Any]) -> dict[str, Any]:
        try:
            return fn(req)
        except RecordingError as exc:
            raise RequestError(str(exc), field=exc.field) from None
        except ValueError as exc:
            raise RequestError(str(exc)) from None

    return handler


def _success_arg(req: dict[str, Any]) -> bool | None:
    v = req.get("success")
    if v is None or isinstance(v, bool):
        return v
    raise ValueError(f'"success" must be true, false or null, got {v!r}')


def _last_s_arg(req: dict[str, Any]) -> float:
    v = req.get("last_s")
    if v is None:
        raise RequestError('episode.keep needs "last_s": how many seconds before now to keep', field="last_s")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RequestError(f'"last_s" must be a number of seconds, got {v!r}', field="last_s")
    return float(v)


def follower_dataset_kind(follower: FollowerArm) -> str:
    """The EpisodeTag follower_kind, as the follower declares it (``FollowerArm.dataset_kind``):
    the sim's ("sim-mujoco", "sim-leisaac"), "emulated" for a Feetech follower on our bus
    emulator, else "feetech"."""
    return follower.dataset_kind


def _origin_arg(req: dict[str, Any]) -> str | None:
    v = req.get("origin")
    if v is None or isinstance(v, str):
        return v
    raise ValueError(f'"origin" must be a string, got {v!r}')


def rotation_from_request(req: dict[str, Any], recording_cfg: RecordingConfig) -> Rotation | None:
    """The request's continuous recording (``continuous``, ``rotate_s``, ``rotate_mb``), each limit
    not given taken from [recording] (0 there: off); None: an ordinary episode. RequestError naming
    the field for what cannot be used (nothing is started)."""
    continuous = req.get("continuous")
    if continuous is not None and not isinstance(continuous, bool):
        raise RequestError(f'"continuous" must be true, false or null, got {continuous!r}', field="continuous")
    given = {k: req.get(k) for k in ("rotate_s", "rotate_mb") if req.get(k) is not None}
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise RequestError(f'"{key}" must be a number above 0, got {value!r}', field=key)
    if not continuous:
        if given:
            key = next(iter(given))
            raise RequestError(f'"{key}" is for a continuous recording: add "continuous": true', field=key)
        return None
    rotate_s = given.get("rotate_s", recording_cfg.rotate_s or None)
    rotate_mb = given.get("rotate_mb", recording_cfg.rotate_mb or None)
    rotation = Rotation(
        float(rotate_s) if rotate_s is not None else None, float(rotate_mb) if rotate_mb is not None else None
    )
    bad = rotation.problem()
    if bad is not None:
        field, why = bad
        raise RequestError(
            f"{why} ([recording] rotate_s = {recording_cfg.rotate_s:g}, rotate_mb = {recording_cfg.rotate_mb:g})",
            field=field,
        )
    return rotation


@runtime_checkable
class SimEpisodes(Protocol):
    """A follower whose world has episodes of its own (the sim follower, drivers/sim_follower.py):
    they follow the recorder's (daemon/data/sim_episodes.py)."""

    def reset_episode(self, seed: int | None = None, timeout_s: float | None = 5.0) -> int: ...

    def start_episode(self) -> int: ...

    def stop_episode(self) -> int: ...

    def events(self) -> list[Any]: ...

    def stats(self) -> dict[str, Any]: ...


def attach_recorder(
    daemon: DaemonContext | HasContext,
    cameras: list[Camera] | None = None,
    follower_kind: str | None = None,
    root: str | Path | None = None,
) -> Recorder:
    """Builds, opens and plugs in the recorder; returns it (already registered and hooked).

    ``daemon`` is the daemon's context (or the daemon). The cameras are the daemon's
    (``context.cameras``) unless the caller brings its own, which then become the daemon's. With a
    simulated follower (anything with reset/start/stop_episode) its cameras serve kind "sim", its
    episodes follow the recorder's (SimEpisodeHook) and episodes are tagged with its backend; on
    shutdown the episode in progress is saved or discarded per [recording] on_shutdown.
    """
    ctx = context_of(daemon)
    rc = ctx.cfg.recording
    follower = ctx.follower
    if cameras is None:
        cameras = ctx.cameras.all()
    else:
        ctx.cameras.use(cameras)
    rec = Recorder(
        RecorderConfig(
            root=str(root or dataset_root(rc)),
            repo_id=rc.repo_id,
            fps=rc.fps,
            default_task=rc.task,
            min_free_mb=rc.min_free_mb,
            follower_kind=str(follower_kind or follower_dataset_kind(follower)),
            depth_encoder=depth_encoder_fields(rc),
            # a bimanual rig records both arms, LeRobot's BiSOFollower layout (daemon/data/schema.py)
            arms=tuple(ARM_SIDES) if ctx.cfg.bimanual else (),
            ring_s=rc.ring_s,
            ring_max_mb=rc.ring_max_mb,
        ),
        cameras,
    )
    rec.add_episode_hook(CameraEpisodeHook(cameras))  # real cameras: verified, gone/back in the tag
    if follower_kind is None:  # a sim names its backend only once connected: ask at save time
        rec.follower_kind_fn = lambda: follower_dataset_kind(follower)
    if isinstance(follower, SimEpisodes):
        from daemon.data.sim_episodes import SimEpisodeHook

        rec.add_episode_hook(SimEpisodeHook(follower))
        sim = follower
        # the sim's own seed-demo file (LeIsaac --seed_hdf5): a failed write shows in status
        ctx.status_extras["sim"] = lambda: {"seed_recording_error": sim.stats().get("seed_error")}
    rec.open()
    reg = ctx.server.register
    reg(
        "episode.start",
        _verb(
            lambda req: rec.start_episode(
                req.get("task"), _origin_arg(req), rotation_from_request(req, ctx.cfg.recording)
            )
        ),
    )
    reg("episode.save", _verb(lambda req: rec.save_episode(_success_arg(req))))
    reg("episode.discard", _verb(lambda req: rec.discard_episode()))
    reg("episode.keep", _verb(lambda req: rec.keep_episode(_last_s_arg(req), req.get("task"))))
    reg("episode.status", _verb(lambda req: rec.status()))
    ctx.loop.add_hook(rec)
    ctx.status_extras["recording"] = rec.status
    ctx.recorder = rec  # the policy's evaluation episodes find it here
    # read at stop time: a reloaded configuration counts
    ctx.on_stop.append(lambda: _close(ctx, rec))
    return rec


def _close(ctx: DaemonContext, rec: Recorder) -> None:
    """The daemon's stop hook: episodes lost go to ``data_lost`` (the exit code says so)."""
    rc = ctx.cfg.recording
    lost = rec.close(timeout_s=float(rc.stop_timeout_s), on_episode=rc.on_shutdown)
    ctx.data_lost.extend(f"recording: {text}" for text in lost)
