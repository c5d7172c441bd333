"""The console's link to the daemon: control-socket clients run on threads, the page sees events.

One status poller (the ``status`` verb, ``STATUS_HZ``: statistics and servo health, which move
slowly), one live poller (``status.live``, ``LIVE_HZ``: mode and joints for the plots, cheap for
the daemon), one preview poller per camera
(``camera.preview`` with ``after_seq``, ``PREVIEW_FPS``) while at least one page is open, and
one-shot verbs from the page. Each poller owns its own ``ControlClient`` (a client is one
connection, not shared between threads). A daemon that vanishes, restarts or stops answering is
noticed by the pollers; the link says so (``LinkState``) and keeps trying every ``RETRY_S``.
A restart is told apart from a short loss by the daemon's uptime going backwards.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from daemon.api.client import ControlClient, DaemonUnavailable, next_poll_s
from daemon.api.messages import CameraList, CameraPreview, ErrorReply, LiveStatus, StatusReply, decode_reply

log = logging.getLogger("so101d.console")

STATUS_HZ = 5.0  # loop rate, jitter, stage latency, servo health, recording: windowed figures
LIVE_HZ = 20.0  # mode and joints: the page's live view and joint plots (>= 10 Hz asked)
PREVIEW_FPS = 15.0  # per camera (>= 10 fps asked); a camera slower than this costs no extra encode
PREVIEW_SIZE_PX = (320, 240)
RETRY_S = 0.5
VERB_TIMEOUT_S = 10.0


@dataclass
class LinkState:
    connected: bool = False
    error: str | None = "not connected yet"
    since_s: float = 0.0  # time.time() of the last change
    restarts: int = 0  # daemon restarts seen (uptime went backwards)
    socket: str = ""


@dataclass(frozen=True)
class Preview:
    camera: str
    seq: int
    width: int
    height: int
    age_ms: float  # capture -> leaving the daemon
    capture_monotonic_s: float
    jpeg: bytes
    received_monotonic_s: float


class DaemonLink:
    """Owns the pollers; ``on_status``, ``on_link`` and ``on_preview`` are called on the event loop."""

    def __init__(
        self,
        socket_path: str,
        *,
        on_status: Callable[[StatusReply], None],
        on_live: Callable[[LiveStatus], None],
        on_link: Callable[[LinkState], None],
        on_preview: Callable[[Preview], None],
        status_hz: float = STATUS_HZ,
        live_hz: float = LIVE_HZ,
        preview_fps: float = PREVIEW_FPS,
    ) -> None:
        self.socket_path = socket_path
        self.on_status = on_status
        self.on_live = on_live
        self.live_period_s = 1.0 / live_hz
        self.on_link = on_link
        self.on_preview = on_preview
        self.status_period_s = 1.0 / status_hz
        self.preview_period_s = 1.0 / preview_fps
        self.state = LinkState(socket=socket_path, since_s=time.time())
        self.last_status: StatusReply | None = None
        self.cameras: list[str] = []
        self.viewers = 0  # pages open: previews are fetched only while someone looks
        self._last_uptime_s: float | None = None
        self._ever_connected = False
        self._tasks: list[asyncio.Task[None]] = []
        self._preview_tasks: dict[str, asyncio.Task[None]] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._status_loop(), name="console-status"))
        self._tasks.append(asyncio.create_task(self._live_loop(), name="console-live"))

    async def stop(self) -> None:
        for t in [*self._tasks, *self._preview_tasks.values()]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._preview_tasks.values(), return_exceptions=True)
        self._tasks.clear()
        self._preview_tasks.clear()

    def link_dict(self) -> dict[str, Any]:
        return asdict(self.state)

    def _set_link(self, connected: bool, error: str | None, restarted: bool = False) -> None:
        if restarted:
            self.state.restarts += 1
        if connected == self.state.connected and error == self.state.error and not restarted:
            return
        self.state.connected, self.state.error, self.state.since_s = connected, error, time.time()
        if connected:
            log.info("daemon connected at %s", self.socket_path)
            self._ever_connected = True
        elif self._ever_connected:
            log.warning("daemon lost: %s (reconnecting)", error)
        else:  # started before the daemon (`make run`): waiting is not a failure
            log.info("waiting for the daemon: %s", error)
        self.on_link(self.state)

    # ------------------------------------------------------------------ polling
    async def _paced(
        self,
        period_s: float,
        poll: Callable[[ControlClient], Awaitable[float | None]],
        on_unavailable: Callable[[DaemonUnavailable], None] | None = None,
    ) -> None:
        """``poll`` every ``period_s`` on a connection of its own, until cancelled.

        Deadline paced (``next_poll_s``: the rate holds whatever a reply took, and a slow daemon
        gets no catch-up burst). A daemon that is unavailable closes the connection, is told to
        ``on_unavailable`` and is tried again every ``RETRY_S``. ``poll`` returns None to keep the
        pace, or a pause in seconds after an error reply (retried off the pace)."""
        client = ControlClient(self.socket_path, timeout_s=3.0, connect_retry_s=0.5)
        next_s = time.monotonic()
        try:
            while True:
                try:
                    pause_s = await poll(client)
                except DaemonUnavailable as exc:
                    client.close()
                    if on_unavailable is not None:
                        on_unavailable(exc)
                    await asyncio.sleep(RETRY_S)
                    next_s = time.monotonic()
                    continue
                if pause_s is not None:
                    await asyncio.sleep(pause_s)
                    continue
                now_s = time.monotonic()
                next_s = next_poll_s(next_s, period_s, now_s)
                await asyncio.sleep(next_s - now_s)
        finally:
            client.close()

    # ------------------------------------------------------------------ status
    async def _status_loop(self) -> None:
        def unavailable(exc: DaemonUnavailable) -> None:
            self._last_uptime_s = None if not self.state.connected else self._last_uptime_s
            self._set_link(False, str(exc))

        await self._paced(self.status_period_s, self._poll_status, unavailable)

    async def _poll_status(self, client: ControlClient) -> float | None:
        try:
            st = await asyncio.to_thread(client.request_as, StatusReply, "status")
        except DaemonUnavailable:
            raise
        except Exception as exc:  # an error reply to `status` is a daemon in trouble: say so
            self._set_link(False, f"status failed: {exc}")
            return RETRY_S
        uptime = st.uptime_s
        restarted = uptime is not None and self._last_uptime_s is not None and uptime + 0.5 < self._last_uptime_s
        self._last_uptime_s = uptime
        if restarted or not self.state.connected:
            await self._refresh_cameras()
        self._set_link(True, None, restarted=bool(restarted))
        self.last_status = st
        self.on_status(st)
        return None

    async def _live_loop(self) -> None:
        async def poll(client: ControlClient) -> None:
            reply = await asyncio.to_thread(client.call_as, LiveStatus, "status.live")
            if isinstance(reply, LiveStatus):
                self.on_live(reply)

        await self._paced(self.live_period_s, poll)  # the status poller tells the page of a lost daemon

    async def _refresh_cameras(self) -> None:
        try:
            reply = decode_reply(await self.verb("camera.list"), CameraList)
        except Exception as exc:
            log.warning("camera.list failed: %s", exc)
            return
        self.cameras = [c.name for c in reply.cameras] if reply.ok else []
        self._sync_previews()

    # ------------------------------------------------------------------ previews
    def viewer_joined(self) -> None:
        self.viewers += 1
        self._sync_previews()

    def viewer_left(self) -> None:
        self.viewers = max(0, self.viewers - 1)
        self._sync_previews()

    def _sync_previews(self) -> None:
        wanted = set(self.cameras) if self.viewers > 0 else set()
        for name in list(self._preview_tasks):
            if name not in wanted:
                self._preview_tasks.pop(name).cancel()
        for name in wanted:
            task = self._preview_tasks.get(name)
            if task is None or task.done():
                self._preview_tasks[name] = asyncio.create_task(
                    self._preview_loop(name), name=f"console-preview-{name}"
                )

    async def _preview_loop(self, camera: str) -> None:
        after: int | None = None  # the newest frame shown: the daemon answers "unchanged" until a newer one
        w, h = PREVIEW_SIZE_PX

        def unavailable(exc: DaemonUnavailable) -> None:
            nonlocal after
            after = None  # a restarted daemon counts its frames from 0 again

        async def poll(client: ControlClient) -> float | None:
            nonlocal after
            reply = await asyncio.to_thread(
                client.call_as,
                CameraPreview,
                "camera.preview",
                camera=camera,
                max_width=w,
                max_height=h,
                after_seq=after,
            )
            if isinstance(reply, ErrorReply):
                # e.g. the camera went away with a restarted daemon's new configuration
                log.warning("preview of %s: %s", camera, reply.error)
                return RETRY_S * 4
            if reply.jpeg_b64 and reply.seq is not None:
                after = reply.seq
                self.on_preview(
                    Preview(
                        camera=camera,
                        seq=after,
                        width=reply.width or 0,
                        height=reply.height or 0,
                        age_ms=reply.age_ms or 0.0,
                        capture_monotonic_s=reply.capture_monotonic_s or 0.0,
                        jpeg=base64.b64decode(reply.jpeg_b64),
                        received_monotonic_s=time.monotonic(),
                    )
                )
            return None

        await self._paced(self.preview_period_s, poll, unavailable)

    # ------------------------------------------------------------------ verbs from the page
    async def verb(self, cmd: str, **args: Any) -> dict[str, Any]:
        """One documented verb on the control socket; the raw reply (ok true or false).

        Each verb has a connection of its own: Hold or Torque off never waits behind a
        ``policy.load`` that is waiting for its worker (the daemon runs operator verbs on workers
        of their own, too). A verb that waits (``wait_s``) gets that much longer to answer."""
        wait_s = float(args.get("wait_s") or 0.0)

        def call() -> dict[str, Any]:
            with ControlClient(self.socket_path, timeout_s=VERB_TIMEOUT_S + wait_s, connect_retry_s=1.0) as c:
                return c.call(cmd, **args)

        try:
            return await asyncio.to_thread(call)
        except DaemonUnavailable as exc:
            return {"ok": False, "error": f"daemon unavailable: {exc}"}
