"""The console's web server (aiohttp): the page, one websocket per page, the episodes, the videos.

Websocket messages, console -> page (text frames are JSON):
- ``{"t": "hello", "link": {...}, "cameras": [...], "verbs": [...]}`` once;
- ``{"t": "status", "status": {...}}`` at 5 Hz: exactly what ``so101d status --json`` shows (the
  daemon's ``status`` verb);
- ``{"t": "live", "live": {"mode", "reason", "fault", "cycles", "joints"}}`` at 20 Hz
  (``status.live``: what the plots and the mode badge need);
- ``{"t": "link", "link": {"connected", "error", "restarts", ...}}`` when the daemon goes or comes;
- ``{"t": "reply", "id": ID, "ok": bool, "error"?: str, ...}`` for each verb the page sent;
- binary frames: camera previews, ``u32 header length (big-endian) | header JSON | JPEG``.
Page -> console: ``{"t": "verb", "id": ID, "cmd": CMD, "args": {...}}`` (see page_verbs.py).

A page that reads slowly loses status and preview frames (newest wins), never a reply.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from daemon.console import access, episodes
from daemon.console.daemon_link import DaemonLink, LinkState, Preview
from daemon.console.page_verbs import PAGE_VERBS, BadRequest, PageRequest, ReplyMemory, parse_request

log = logging.getLogger("so101d.console")

STATIC_DIR = Path(__file__).parent / "static"
PAGE_QUEUE = 32  # messages waiting for one page; beyond, status/preview frames are dropped
MAX_PAGE_MESSAGE_BYTES = 16384


@dataclass(eq=False)
class _Page:
    ws: web.WebSocketResponse
    queue: asyncio.Queue[str | bytes] = field(default_factory=lambda: asyncio.Queue(PAGE_QUEUE))
    dropped: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # its verbs in progress (kept referenced)

    def offer(self, msg: str | bytes) -> None:
        try:
            self.queue.put_nowait(msg)
        except asyncio.QueueFull:
            self.dropped += 1  # a slow page: the next status / frame replaces this one


@dataclass
class ConsoleConfig:
    socket_path: str
    host: str = "127.0.0.1"
    port: int = 8101
    token: str | None = None  # required when not on loopback
    status_hz: float = 5.0
    live_hz: float = 20.0
    preview_fps: float = 15.0


class Console:
    def __init__(self, cfg: ConsoleConfig) -> None:
        self.cfg = cfg
        self.pages: set[_Page] = set()
        self.link = DaemonLink(
            cfg.socket_path,
            on_status=self._on_status,
            on_live=self._on_live,
            on_link=self._on_link,
            on_preview=self._on_preview,
            status_hz=cfg.status_hz,
            live_hz=cfg.live_hz,
            preview_fps=cfg.preview_fps,
        )
        self.replies = ReplyMemory()
        self._in_flight: dict[str, asyncio.Future[dict[str, Any]]] = {}  # request id -> its answer
        self._starting_episode = False
        self.previews_sent = 0

    # ------------------------------------------------------------------ fan-out
    def _broadcast(self, msg: str | bytes) -> None:
        for page in list(self.pages):
            page.offer(msg)

    def _on_status(self, st: dict[str, Any]) -> None:
        if self.pages:
            self._broadcast(json.dumps({"t": "status", "status": st}, separators=(",", ":")))

    def _on_live(self, live: dict[str, Any]) -> None:
        if self.pages:
            self._broadcast(json.dumps({"t": "live", "live": live}, separators=(",", ":")))

    def _on_link(self, state: LinkState) -> None:
        self._broadcast(json.dumps({"t": "link", "link": self.link.link_dict(), "cameras": self.link.cameras}))

    def _on_preview(self, p: Preview) -> None:
        if not self.pages:
            return
        header = json.dumps(
            {
                "camera": p.camera,
                "seq": p.seq,
                "width": p.width,
                "height": p.height,
                # capture -> leaving the console (the daemon's age plus the time spent here)
                "age_ms": round(p.age_ms + (time.monotonic() - p.received_monotonic_s) * 1000.0, 2),
                # CLOCK_MONOTONIC, shared by the processes of this machine (the bench's latency)
                "capture_monotonic_s": p.capture_monotonic_s,
            }
        ).encode()
        self.previews_sent += 1
        self._broadcast(struct.pack(">I", len(header)) + header + p.jpeg)

    # ------------------------------------------------------------------ verbs
    async def run_verb(self, req: PageRequest) -> dict[str, Any]:
        """A checked page request -> the daemon's reply; a repeated id gets the first answer."""
        seen = self.replies.get(req.id)
        if seen is not None:
            return {**seen, "repeated": True}
        pending = self._in_flight.get(req.id)
        if pending is not None:  # the same request twice, the first still on its way
            return {**(await asyncio.shield(pending)), "repeated": True}
        starts = req.cmd in ("episode.start", "episode.redo")
        if starts and self._starting_episode:
            return {"ok": False, "error": f"{req.cmd}: an episode is already being started (double click?)"}
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._in_flight[req.id] = fut
        if starts:
            self._starting_episode = True
        try:
            if req.cmd == "episode.redo":
                reply = await self.link.verb("episode.discard")
                if reply.get("ok") or "no episode is recording" in str(reply.get("error", "")):
                    reply = await self.link.verb("episode.start", task=req.args["task"])
            else:
                reply = await self.link.verb(req.cmd, **req.args)
        finally:
            if starts:
                self._starting_episode = False
            self._in_flight.pop(req.id, None)
        self.replies.put(req.id, reply)
        fut.set_result(reply)
        log.info("page: %s %s -> %s", req.cmd, req.args or "", "ok" if reply.get("ok") else reply.get("error"))
        return reply

    # ------------------------------------------------------------------ http
    def _allowed(self, request: web.Request) -> bool:
        if self.cfg.token is None:
            return True
        given = request.cookies.get(access.COOKIE) or request.query.get("token")
        return access.token_matches(given, self.cfg.token)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not self._allowed(request):
            return web.Response(
                status=401,
                text="so101d console: this console is not on loopback and needs its token: open the "
                "address printed by `so101d console` (it ends in ?token=...)\n",
            )
        resp: web.StreamResponse = await handler(request)
        if self.cfg.token is not None and request.query.get("token") and request.cookies.get(access.COOKIE) is None:
            resp.set_cookie(access.COOKIE, self.cfg.token, httponly=True, samesite="Strict")
        return resp

    async def index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"link": self.link.link_dict(), "pages": len(self.pages), "cameras": self.link.cameras}
        )

    def _dataset_root(self) -> str:
        st = self.link.last_status or {}
        rec = st.get("recording")
        if not isinstance(rec, dict) or not rec.get("dataset"):
            raise web.HTTPNotFound(text="this daemon records no dataset ([recording] enabled = false)")
        return str(rec["dataset"])

    async def episode_list(self, request: web.Request) -> web.StreamResponse:
        root = self._dataset_root()
        try:
            data = await asyncio.to_thread(episodes.list_episodes, root)
        except FileNotFoundError:
            data = {"root": root, "episodes": [], "cameras": [], "fps": None, "note": "no episode saved yet"}
        return web.json_response(data)

    async def episode_detail(self, request: web.Request) -> web.StreamResponse:
        try:
            index = int(request.match_info["index"])
        except ValueError:
            raise web.HTTPBadRequest(text="episode index must be a whole number") from None
        try:
            data = await asyncio.to_thread(episodes.episode_detail, self._dataset_root(), index)
        except (episodes.EpisodeNotFound, FileNotFoundError) as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        return web.json_response(data)

    async def dataset_video(self, request: web.Request) -> web.StreamResponse:
        try:
            path = episodes.dataset_file(self._dataset_root(), request.match_info["path"])
        except PermissionError as exc:
            raise web.HTTPForbidden(text=str(exc)) from None
        except FileNotFoundError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        return web.FileResponse(path, headers={"Content-Type": "video/mp4", "Cache-Control": "no-store"})

    # ------------------------------------------------------------------ websocket
    def _same_origin(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:
            return True  # not a browser (a script or the bench): the token / loopback decide
        return origin in (f"http://{request.host}", f"https://{request.host}")

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        if not self._same_origin(request):
            log.warning("websocket from another site refused (Origin %s)", request.headers.get("Origin"))
            raise web.HTTPForbidden(text="websocket from another site refused")
        ws = web.WebSocketResponse(heartbeat=10.0, max_msg_size=MAX_PAGE_MESSAGE_BYTES)
        await ws.prepare(request)
        page = _Page(ws)
        self.pages.add(page)
        self.link.viewer_joined()
        sender = asyncio.create_task(self._send_loop(page))
        page.offer(
            json.dumps(
                {
                    "t": "hello",
                    "link": self.link.link_dict(),
                    "cameras": self.link.cameras,
                    "verbs": sorted(PAGE_VERBS),
                }
            )
        )
        if self.link.last_status is not None and self.link.state.connected:
            page.offer(json.dumps({"t": "status", "status": self.link.last_status}))
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    # verbs run beside the reading: a slow policy.load does not hold up a hold
                    task = asyncio.create_task(self._page_message(page, msg.data))
                    page.tasks.add(task)
                    task.add_done_callback(page.tasks.discard)
                elif msg.type == WSMsgType.ERROR:
                    break
                else:
                    await page.queue.put(json.dumps({"t": "reply", "id": None, "ok": False, "error": "send JSON text"}))
        finally:
            self.pages.discard(page)
            self.link.viewer_left()
            sender.cancel()
        return ws

    async def _page_message(self, page: _Page, text: str) -> None:
        rid: Any = None
        cmd: Any = None
        try:
            msg = json.loads(text)
            rid = msg.get("id") if isinstance(msg, dict) else None
            cmd = msg.get("cmd") if isinstance(msg, dict) else None
            if not isinstance(msg, dict) or msg.get("t") != "verb":
                raise BadRequest('a message must be {"t": "verb", "id": ..., "cmd": ..., "args": {...}}')
            reply = await self.run_verb(parse_request(msg))
        except json.JSONDecodeError as exc:
            reply = {"ok": False, "error": f"malformed JSON: {exc}"}
        except BadRequest as exc:
            reply = {"ok": False, "error": str(exc)}
        await page.queue.put(
            json.dumps({**reply, "t": "reply", "id": rid, "cmd": cmd if isinstance(cmd, str) else None})
        )

    async def _send_loop(self, page: _Page) -> None:
        try:
            while True:
                msg = await page.queue.get()
                if isinstance(msg, bytes):
                    await page.ws.send_bytes(msg)
                else:
                    await page.ws.send_str(msg)
        except (ConnectionError, RuntimeError, asyncio.CancelledError):
            pass

    # ------------------------------------------------------------------ app
    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self.index)
        app.router.add_get("/ws", self.websocket)
        app.router.add_get("/api/health", self.health)
        app.router.add_get("/api/episodes", self.episode_list)
        app.router.add_get("/api/episodes/{index}", self.episode_detail)
        app.router.add_get("/dataset/{path:videos/.+}", self.dataset_video)
        app.router.add_static("/static/", STATIC_DIR, show_index=False)

        async def on_startup(app: web.Application) -> None:
            self.link.start()

        async def on_cleanup(app: web.Application) -> None:
            for page in list(self.pages):
                await page.ws.close()
            await self.link.stop()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app
