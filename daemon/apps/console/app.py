"""The console's web server (aiohttp): the page, one websocket per page, the episodes, the videos.

Websocket messages, console -> page (text frames are JSON):
- ``{"t": "hello", "link": {...}, "cameras": [...], "verbs": [...]}`` once;
- ``{"t": "status", "status": {...}}`` at 5 Hz: the daemon's ``status`` reply as the API declares
  it (``StatusReply``, daemon/api/messages.py; a field the schema does not declare never reaches the
  page);
- ``{"t": "live", "live": {"mode", "reason", "fault", "cycles", "joints", "arms"}}`` at 20 Hz
  (``status.live``: what the plots and the mode badge need; ``arms``, each arm's mode, source and
  joints, only from a daemon driving more than one);
- ``{"t": "link", "link": {"connected", "error", "restarts", ...}}`` when the daemon goes or comes;
- ``{"t": "reply", "id": ID, "ok": bool, "error"?: str, ...}`` for each verb the page sent;
- binary frames: camera previews, ``u32 header length (big-endian) | header JSON | JPEG``.
``GET /api/schema.json`` serves the control API's JSON Schema (daemon/api/reference.py): what the
page's script may read of ``status`` and ``live`` (tests/test_api_schema.py checks that it reads
nothing else).
Page -> console: ``{"t": "verb", "id": ID, "cmd": CMD, "args": {...}}`` (see page_verbs.py).
``replay.start`` from a page names an episode only: the console replays it from the dataset it
lists (the daemon's recording dataset, from ``status``) under a ticket of its own, which its
``replay.stop`` sends while that replay may still run. ``status`` does not carry the replay: a
page asks ``replay.status`` while one runs.

A page that reads slowly loses status and preview frames (newest wins), never a reply.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from daemon.api import reference
from daemon.api.bounded_json import JsonBounds, JsonRefused, loads_bounded
from daemon.api.messages import LiveStatus, StatusReply
from daemon.apps.console import access, episodes
from daemon.apps.console.daemon_link import DaemonLink, LinkState, Preview
from daemon.apps.console.page_verbs import PAGE_VERBS, BadRequest, PageRequest, ReplyMemory, parse_request

log = logging.getLogger("so101d.console")

STATIC_DIR = Path(__file__).parent / "static"
PAGE_QUEUE = 32  # messages waiting for one page; beyond, status/preview frames are dropped
MAX_PAGE_MESSAGE_BYTES = 16384
NO_DATASET = "this daemon records no dataset ([recording] enabled = false)"
PAGE_JSON = JsonBounds(max_bytes=MAX_PAGE_MESSAGE_BYTES, max_depth=8)


def _message(kind: str, body: msgspec.Struct) -> str:
    """A page message carrying a declared reply: only the fields the schema declares reach the page."""
    return msgspec.json.encode({"t": kind, kind: body}).decode("utf-8")


@dataclass(eq=False)
class _Page:
    ws: web.WebSocketResponse
    queue: asyncio.Queue[str | bytes] = field(default_factory=lambda: asyncio.Queue(PAGE_QUEUE))
    dropped: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # its verbs in progress (kept referenced)
    # Its own replies by request id: a page resending after a hiccup gets the first answer, and
    # another page choosing the same id is another request (its Hold runs).
    replies: ReplyMemory = field(default_factory=ReplyMemory)
    in_flight: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)

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
    allowed_hosts: tuple[str, ...] = ()  # names besides the bind address and localhost (Host header)
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
        self.hosts = access.HostRule(cfg.host, tuple(h.lower().rstrip(".") for h in cfg.allowed_hosts))
        self._own_uid = os.geteuid()
        self._starting_episode = False
        # the replay this console started: its ticket, which its Stop sends (a stop that overtakes
        # the start cancels it); None once it is known to have ended
        self._replay_ticket: str | None = None
        self._starting_replay = False
        self.previews_sent = 0
        self._schema_text = reference.schema_text()

    # ------------------------------------------------------------------ fan-out
    def _broadcast(self, msg: str | bytes) -> None:
        for page in list(self.pages):
            page.offer(msg)

    def _on_status(self, st: StatusReply) -> None:
        if self.pages:
            self._broadcast(_message("status", st))

    def _on_live(self, live: LiveStatus) -> None:
        if self.pages:
            self._broadcast(_message("live", live))

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
    async def run_verb(self, page: _Page, req: PageRequest) -> dict[str, Any]:
        """A checked page request -> the daemon's reply; an id this page sent before gets the first answer."""
        seen = page.replies.get(req.id)
        if seen is not None:
            return {**seen, "repeated": True}
        pending = page.in_flight.get(req.id)
        if pending is not None:  # the same request twice, the first still on its way
            return {**(await asyncio.shield(pending)), "repeated": True}
        starts = req.cmd in ("episode.start", "episode.redo")
        if starts and self._starting_episode:
            return {"ok": False, "error": f"{req.cmd}: an episode is already being started (double click?)"}
        replays = req.cmd == "replay.start"
        if replays and self._starting_replay:
            return {"ok": False, "error": "replay.start: a replay is already being started (double click?)"}
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        page.in_flight[req.id] = fut
        if starts:
            self._starting_episode = True
        if replays:
            self._starting_replay = True
        try:
            if req.cmd == "episode.redo":
                reply = await self.link.verb("episode.discard")
                if reply.get("ok") or "no episode is recording" in str(reply.get("error", "")):
                    reply = await self.link.verb("episode.start", task=req.args["task"])
            elif req.cmd.startswith("replay."):
                reply = await self._replay_verb(req)
            else:
                reply = await self.link.verb(req.cmd, **req.args)
        finally:
            if starts:
                self._starting_episode = False
            if replays:
                self._starting_replay = False
            page.in_flight.pop(req.id, None)
        page.replies.put(req.id, reply)
        fut.set_result(reply)
        log.info("page: %s %s -> %s", req.cmd, req.args or "", "ok" if reply.get("ok") else reply.get("error"))
        return reply

    async def _replay_verb(self, req: PageRequest) -> dict[str, Any]:
        """replay.*: the page names an episode of the dataset it lists; the console adds that
        dataset (never a path from the page) and a ticket per start, which its Stop sends."""
        if req.cmd == "replay.start":
            root = self._dataset_root_or_none()
            if root is None:
                return {"ok": False, "error": f"replay.start: {NO_DATASET}"}
            ticket = uuid.uuid4().hex
            self._replay_ticket = ticket  # set before the start goes: a Stop meanwhile cancels it
            reply = await self.link.verb("replay.start", dataset=root, ticket=ticket, **req.args)
            if not reply.get("ok") and self._replay_ticket == ticket:
                self._replay_ticket = None  # refused: nothing of ours runs
            return reply
        if req.cmd == "replay.stop":
            ours = self._replay_ticket
            reply = await self.link.verb("replay.stop", ticket=ours)
            if ours is not None and not self._starting_replay and self._replay_ticket == ours:
                self._replay_ticket = None  # ours is stopped, canceled, or had ended (the reply says which)
            return reply
        reply = await self.link.verb("replay.status")
        if reply.get("ok") and reply.get("phase") not in ("aligning", "playing") and not self._starting_replay:
            self._replay_ticket = None  # no replay runs: a later Stop names none
        return reply

    # ------------------------------------------------------------------ http
    def _token_ok(self, request: web.Request) -> bool:
        """Off loopback: the token, from the query first (a fresh link beats a stale cookie)."""
        assert self.cfg.token is not None
        return access.token_matches(request.query.get("token"), self.cfg.token) or access.token_matches(
            request.cookies.get(access.COOKIE), self.cfg.token
        )

    def _refused_user(self, peer: Any, local: Any) -> str | None:
        """On loopback: why the user behind this connection may not drive the arm (None: may)."""
        if not peer or not local:
            return "the connection's user cannot be told"
        uid = access.peer_uid((str(peer[0]), int(peer[1])), (str(local[0]), int(local[1])))
        if uid is None:
            return "the connection's user cannot be told (no live connection in the kernel's socket table)"
        if uid == self._own_uid or access.may_connect(uid, self.cfg.socket_path):
            return None
        return (
            f"user {access.user_name(uid)} may not use the daemon's control socket {self.cfg.socket_path}, "
            f"so not its console either (operators: usermod -aG {access.socket_group(self.cfg.socket_path)} USER)"
        )

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        host = request.headers.get("Host")
        if not self.hosts.permits(host):
            log.warning("request for host %r refused (not this console's name: DNS rebinding?)", (host or "")[:100])
            # 421 Misdirected Request; the websocket's handshake is simply forbidden
            status = 403 if request.path == "/ws" else 421
            return web.Response(
                status=status,
                text=f"so101d console: not served under the name {(host or '')[:100]!r} "
                "(add it to [console] allowed_hosts if it is yours)\n",
            )
        if self.cfg.token is not None:
            if not self._token_ok(request):
                return web.Response(
                    status=401,
                    text="so101d console: this console is not on loopback and needs its token: open the "
                    "address printed by `so101d console` (it ends in ?token=...)\n",
                )
        else:
            transport = request.transport
            peer = transport.get_extra_info("peername") if transport is not None else None
            local = transport.get_extra_info("sockname") if transport is not None else None
            why = await asyncio.to_thread(self._refused_user, peer, local)
            if why is not None:
                log.warning("console refused: %s", why)
                return web.Response(status=403, text=f"so101d console: {why}\n")
        resp: web.StreamResponse = await handler(request)
        token, given = self.cfg.token, request.query.get("token")
        # a link with the token: its cookie replaces whatever (stale) cookie the browser had
        # (not on a websocket: its headers have left already)
        stale = request.cookies.get(access.COOKIE) != token
        if token is not None and access.token_matches(given, token) and stale and not resp.prepared:
            resp.set_cookie(access.COOKIE, token, httponly=True, samesite="Strict")
        return resp

    async def index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"link": self.link.link_dict(), "pages": len(self.pages), "cameras": self.link.cameras}
        )

    async def api_schema(self, request: web.Request) -> web.StreamResponse:
        """The control API's schema: every field the page reads is declared there."""
        return web.Response(text=self._schema_text, content_type="application/json")

    def _dataset_root_or_none(self) -> str | None:
        """The dataset the daemon records into (its status says which): the one listed and replayed."""
        st = self.link.last_status
        rec = st.recording if st is not None else None
        return rec.dataset if rec is not None and rec.dataset else None

    def _dataset_root(self) -> str:
        root = self._dataset_root_or_none()
        if root is None:
            raise web.HTTPNotFound(text=NO_DATASET)
        return root

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
        try:
            await ws.prepare(request)
        except ConnectionError:
            # the client left during the handshake: nothing to serve, and nothing wrong with us.
            # A plain response (the half-prepared websocket cannot be finished) meets the same
            # closed transport in aiohttp's finish, which lets a ConnectionError go quietly.
            log.info("a page left before its websocket opened")
            return web.Response(status=400, text="so101d console: the websocket handshake did not complete\n")
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
            page.offer(_message("status", self.link.last_status))
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
            msg = loads_bounded(text, PAGE_JSON)
            rid = msg.get("id") if isinstance(msg, dict) else None
            cmd = msg.get("cmd") if isinstance(msg, dict) else None
            if not isinstance(msg, dict) or msg.get("t") != "verb":
                raise BadRequest('a message must be {"t": "verb", "id": ..., "cmd": ..., "args": {...}}')
            reply = await self.run_verb(page, parse_request(msg))
        except JsonRefused as exc:
            reply = {"ok": False, "error": f"malformed JSON: {exc}"}
        except BadRequest as exc:
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:  # every message gets its reply; a bug here is logged, not silent
            log.exception("page message failed")
            reply = {"ok": False, "error": f"internal error: {type(exc).__name__}"}
        if not isinstance(rid, (str, int)) or isinstance(rid, bool) or len(str(rid)) > 64:
            rid = None  # (echoing an arbitrary value back is not the page's id)
        await page.queue.put(
            json.dumps(
                {**reply, "t": "reply", "id": rid, "cmd": cmd if isinstance(cmd, str) and len(cmd) < 64 else None}
            )
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
        app.router.add_get("/api/schema.json", self.api_schema)
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
