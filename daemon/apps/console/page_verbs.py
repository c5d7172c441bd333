"""What the page may ask for: the documented control verbs it offers, with their arguments checked.

The page sends ``{"t": "verb", "id": ID, "cmd": CMD, "args": {...}}``. Anything else, an unknown
verb, an argument of the wrong type or out of range gets a reply naming what was wrong; nothing
reaches the daemon. ``episode.redo`` is the one composite: discard the episode in progress, then
start the same task again (what backspace does in ``so101d record``). ``replay.start`` names an
episode only: the console adds the dataset it lists and a ticket of its own (app.py).

The argument types and bounds are the control socket's own field declarations
(the request types of daemon/api/messages.py); the page adds which ones it must send and one-line text.

A verb sent twice never acts twice: a request id this page has already sent is answered with the
first reply (a page resending after a hiccup; another page's ids are its own), and a second ``episode.start`` while one is
still on its way is refused (a double click); the daemon itself refuses to start an episode while
one is recording; likewise a second ``replay.start`` while one is on its way.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from daemon.api.requests import FIELDS, json_type


class BadRequest(ValueError):
    """The page's request is malformed; the message is shown on the page."""


@dataclass(frozen=True)
class Arg:
    kind: type
    required: bool = False
    max_chars: int = 0  # str only
    lo: float | None = None  # numbers only
    hi: float | None = None


_KINDS: dict[str, type] = {"text": str, "flag": bool, "number": float, "whole": int}


def _page_args(verb: str, *names: str, required: tuple[str, ...] = ()) -> dict[str, Arg]:
    """The page's arguments of a control verb: the field declarations of the control socket
    (daemon/api/messages.py), of which the page offers ``names``; ``required`` it must send."""
    fields = FIELDS[verb]
    return {
        n: Arg(_KINDS[fields[n].kind], n in required, fields[n].max_chars, fields[n].lo, fields[n].hi) for n in names
    }


# verb -> its arguments. Only these reach the daemon from a page.
PAGE_VERBS: dict[str, dict[str, Arg]] = {
    "hold": {},
    "torque.off": {},
    "torque.on": {},
    "teleop.start": {},
    "teleop.stop": {},
    "episode.start": _page_args("episode.start", "task", required=("task",)),
    "episode.save": _page_args("episode.save", "success", required=("success",)),
    "episode.keep": _page_args("episode.keep", "last_s", "task", required=("last_s",)),
    "episode.discard": {},
    "episode.redo": _page_args("episode.start", "task", required=("task",)),
    "policy.load": _page_args("policy.load", "path", "wait_s", required=("path",)),
    "policy.start": _page_args("policy.start", "task", "record"),
    "policy.stop": _page_args("policy.stop", "success", "discard"),
    "policy.takeover": {},
    "policy.correct": {},
    "policy.resume": {},
    "policy.unload": {},
    # the page names the episode, never the dataset (the console's own, the one it lists) nor the
    # ticket (the console's own, one per start: its Stop names it)
    "replay.start": _page_args("replay.start", "episode", "speed", "record", required=("episode",)),
    "replay.stop": {},
    "replay.status": {},
}


@dataclass(frozen=True)
class PageRequest:
    id: str
    cmd: str
    args: dict[str, Any]


def parse_request(msg: Any) -> PageRequest:
    """A page message -> a checked request, or BadRequest saying what is wrong."""
    if not isinstance(msg, dict):
        raise BadRequest(f"a request must be a JSON object, got {json_type(msg)}")
    rid = msg.get("id")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or str(rid) == "" or len(str(rid)) > 64:
        raise BadRequest('"id" must be a short text or number that names this request')
    cmd = msg.get("cmd")
    if not isinstance(cmd, str):
        raise BadRequest(f'"cmd" must be text naming a verb, got {json_type(cmd)}')
    if cmd not in PAGE_VERBS:
        raise BadRequest(f"{cmd!r} is not a verb the console offers (offered: {', '.join(sorted(PAGE_VERBS))})")
    raw = msg.get("args", {})
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest(f'{cmd}: "args" must be an object, got {json_type(raw)}')
    spec = PAGE_VERBS[cmd]
    unknown = sorted(set(raw) - set(spec))
    if unknown:
        raise BadRequest(f"{cmd}: unknown argument(s) {', '.join(unknown)} (takes: {', '.join(spec) or 'none'})")
    args: dict[str, Any] = {}
    for name, a in spec.items():
        v = raw.get(name)
        if v is None:
            if a.required:
                raise BadRequest(f"{cmd}: {name} is required")
            continue
        args[name] = _check(cmd, name, a, v)
    return PageRequest(id=str(rid), cmd=cmd, args=args)


def _check(cmd: str, name: str, a: Arg, v: Any) -> Any:
    if a.kind is bool:
        if not isinstance(v, bool):
            raise BadRequest(f"{cmd}: {name} must be true or false, got {json_type(v)}")
        return v
    if a.kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise BadRequest(f"{cmd}: {name} must be a number, got {json_type(v)}")
        if (a.lo is not None and v < a.lo) or (a.hi is not None and v > a.hi):
            raise BadRequest(f"{cmd}: {name} must be from {a.lo:g} to {a.hi:g}, got {v}")
        return float(v)
    if a.kind is int:
        # JSON's 3 only: not true (Python's bool is an int), not 3.0 (a page sends an index as
        # an integer; the control socket refuses 3.0 too), not "3"
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadRequest(f"{cmd}: {name} must be a whole number, got {_words(v)}")
        if (a.lo is not None and v < a.lo) or (a.hi is not None and v > a.hi):
            lo = "" if a.lo is None else f" at least {a.lo:.0f}"
            hi = "" if a.hi is None else f" at most {a.hi:.0f}"
            raise BadRequest(f"{cmd}: {name} must be{lo}{' and' if lo and hi else ''}{hi}, got {v}")
        return v
    if not isinstance(v, str):
        raise BadRequest(f"{cmd}: {name} must be text, got {json_type(v)}")
    text = v.strip()
    if not text:
        raise BadRequest(f"{cmd}: {name} must not be empty")
    if a.max_chars and len(text) > a.max_chars:
        raise BadRequest(f"{cmd}: {name} is longer than {a.max_chars} characters")
    if any(ord(ch) < 32 for ch in text):
        raise BadRequest(f"{cmd}: {name} must be one line of text (no control characters)")
    return text


def _words(v: Any) -> str:
    """A value that is not a whole number, in JSON's words (a fraction shown as it came)."""
    return repr(v) if isinstance(v, float) else json_type(v)


class ReplyMemory:
    """Replies by request id (the newest ``size``): a request seen before gets the same answer."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._replies: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, rid: str) -> dict[str, Any] | None:
        return self._replies.get(rid)

    def put(self, rid: str, reply: dict[str, Any]) -> None:
        self._replies[rid] = reply
        self._replies.move_to_end(rid)
        while len(self._replies) > self.size:
            self._replies.popitem(last=False)
