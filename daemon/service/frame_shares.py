"""The daemon's cameras shared with clients on this machine: ``camera.share`` starts copying a
camera's new frames into shared memory (drivers/frame_shm.py) and answers where; the LeRobot
plugin maps it and reads the newest frame, so no pixel crosses the control socket.

One thread copies every shared camera's new frames (a frame's ``seq`` tells new from seen); it
never touches the control loop. The files go with the daemon's stop.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from daemon.api.server import RequestError
from daemon.data.shm_names import segment_name, sweep_stale
from daemon.service.context import DaemonContext
from drivers.cameras import Camera
from drivers.frame_shm import FrameShareWriter

log = logging.getLogger("so101d.frame_shares")
POLL_S = 0.002  # a new frame waits at most this long before it is shared (30 fps: 33 ms apart)


def new_share(camera: str, width: int, height: int) -> FrameShareWriter:
    """A camera's share file, named like the recording rings' segments (this process's pid and
    start time) so that the files of a daemon killed whole (SIGKILL of its group: nothing
    unlinks them) are swept, here and at the next ring, once their maker is gone."""
    sweep_stale()
    return FrameShareWriter(camera, width, height, file_name=segment_name("frames"))


class FrameShares:
    def __init__(self, context: DaemonContext) -> None:
        self._context = context
        self._shares: dict[str, tuple[Camera, FrameShareWriter]] = {}
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def newest(self) -> dict[str, int]:
        """Shared camera -> the seq of the newest frame in its share."""
        return dict(self._seen)

    def share(self, req: dict[str, Any]) -> dict[str, Any]:
        name = req.get("camera")
        if not name:
            raise RequestError("camera.share needs a camera (camera.list names them)", "camera")
        with self._lock:
            held = self._shares.get(name)
            if held is None:
                held = self._open(name)
            _cam, writer = held
        return {"camera": name, "path": str(writer.path), "width": writer.width, "height": writer.height,
                "slots": writer.slots}  # fmt: skip

    def _open(self, name: str) -> tuple[Camera, FrameShareWriter]:
        try:
            cams = {c.name: c for c in self._context.cameras.all()}
        except ValueError as exc:
            raise RequestError(f"the daemon's cameras: {exc}") from None
        cam = cams.get(name)
        if cam is None:
            raise RequestError(f"no camera named {name!r} (cameras: {', '.join(cams) or 'none'})", "camera")
        cam.start()  # idempotent: the recorder or the policy may have started it already
        writer = new_share(name, cam.width, cam.height)
        self._shares[name] = (cam, writer)
        log.info("camera %s: frames shared at %s", name, writer.path)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="so101d-frame-shares", daemon=True)
            self._thread.start()
        return cam, writer

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            for name, (cam, writer) in list(self._shares.items()):
                frame = cam.latest_frame()
                if frame is None or frame.seq == self._seen.get(name):
                    continue
                try:
                    writer.write(frame.pixels, frame.seq, frame.capture_monotonic_s)
                except ValueError as exc:
                    log.warning("camera %s: not shared: %s", name, exc)
                    continue
                self._seen[name] = frame.seq

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        with self._lock:
            for _cam, writer in self._shares.values():
                writer.close()
            self._shares.clear()


def attach_frame_shares(context: DaemonContext) -> FrameShares:
    shares = FrameShares(context)
    context.server.register("camera.share", shares.share)
    context.after_stop.insert(0, shares.close)  # before the cameras stop
    return shares
