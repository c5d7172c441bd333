"""The control socket's requests, typed: every verb's fields declared once, checked before use.

A request is a JSON object ``{"cmd": VERB, FIELD: value, ...}``. ``parse_request`` turns it into a
``Request`` or raises ``BadField`` naming what is wrong (the field and the type it needs), so no
handler ever sees a list where it expects text or a number where it expects a flag. The fields of
the verbs this package serves are declared in ``VERBS``; a verb registered without a declaration
(a test's own verb) gets only its ``cmd`` checked. The console's page verbs use the same
declarations (daemon/apps/console/page_verbs.py): what a field may hold is said in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["text", "flag", "number", "whole"]
_KIND_WORDS: dict[Kind, str] = {
    "text": "text",
    "flag": "true or false",
    "number": "a number",
    "whole": "a whole number",
}
TEXT_MAX_CHARS = 4096  # any text field (a path, a task, a camera name)
TASK_MAX_CHARS = 500
MAX_FRAME_SEQ = 2**53


class BadField(ValueError):
    """A request that cannot be served as sent; the message names the field and what it needs."""


@dataclass(frozen=True)
class Field:
    kind: Kind
    lo: float | None = None  # numbers: inclusive bounds
    hi: float | None = None
    max_chars: int = TEXT_MAX_CHARS  # text only
    what: str = ""  # what it holds, for the refusal (default: its kind, e.g. "a whole number")

    def check(self, cmd: str, name: str, value: Any) -> Any:
        """``value`` as the handler gets it (null: the field was not given), or BadField."""
        if value is None:
            return None
        if self.kind == "text":
            if not isinstance(value, str):
                raise BadField(f'{cmd}: "{name}" must be text, got {json_type(value)}')
            if len(value) > self.max_chars:
                raise BadField(f'{cmd}: "{name}" is longer than {self.max_chars} characters')
            if "\0" in value:  # no path, name or task holds one (and os calls raise on it)
                raise BadField(f'{cmd}: "{name}" must not contain a NUL character')
            return value
        if self.kind == "flag":
            if not isinstance(value, bool):
                raise BadField(f'{cmd}: "{name}" must be true or false, got {json_type(value)}')
            return value
        what = self.what or _KIND_WORDS[self.kind]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadField(f'{cmd}: "{name}" must be {what}, got {json_type(value)}')
        if self.kind == "whole" and not isinstance(value, int):
            raise BadField(f'{cmd}: "{name}" must be {what}, got {value!r}')
        if not math.isfinite(value):
            raise BadField(f'{cmd}: "{name}" must be a finite number')
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise BadField(f'{cmd}: "{name}" must be {_range_words(self.lo, self.hi)}, got {_number_words(value)}')
        return value


def json_type(value: Any) -> str:
    """What a decoded value is, in JSON's words (never a Python type name)."""
    if value is None:
        return "JSON null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "text"
    return "a number" if isinstance(value, (int, float)) else "a value JSON cannot hold"


def _number_words(value: float) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 24 else f"{value:.3g}"


def _range_words(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"from {_number_words(lo)} to {_number_words(hi)}"
    return f"at least {_number_words(lo)}" if lo is not None else f"at most {_number_words(hi or 0)}"


@dataclass(frozen=True)
class Verb:
    """One verb's fields (all optional on the socket: a handler says what a missing one means)."""

    fields: dict[str, Field] = field(default_factory=dict)


_NONE = Verb()
_PREVIEW_SIDE = Field("whole", lo=16, hi=1920)  # console_api.PREVIEW_MAX_SIDE_PX

# Every verb this package serves, with its fields. A field not declared here is refused.
VERBS: dict[str, Verb] = {
    "ping": _NONE,
    "help": _NONE,
    "status": _NONE,
    "status.live": _NONE,
    "config.reload": _NONE,
    "hold": _NONE,
    "idle": _NONE,
    "teleop.start": _NONE,
    "teleop.stop": _NONE,
    "torque.on": _NONE,
    "torque.off": _NONE,
    "camera.list": _NONE,
    "camera.preview": Verb(
        {
            "camera": Field("text", max_chars=200),
            "max_width": _PREVIEW_SIDE,
            "max_height": _PREVIEW_SIDE,
            "quality": Field("whole", lo=10, hi=95),
            # a frame counter: any real one is far below JSON's exact-integer limit
            "after_seq": Field("whole", lo=0, hi=MAX_FRAME_SEQ, what="a frame number or null"),
        }
    ),
    "episode.start": Verb({"task": Field("text", max_chars=TASK_MAX_CHARS), "origin": Field("text", max_chars=64)}),
    "episode.save": Verb({"success": Field("flag")}),
    "episode.discard": _NONE,
    "episode.status": _NONE,
    "policy.load": Verb({"path": Field("text"), "wait_s": Field("number", lo=0, hi=600)}),
    "policy.start": Verb({"task": Field("text", max_chars=TASK_MAX_CHARS), "record": Field("flag")}),
    "policy.stop": Verb({"success": Field("flag"), "discard": Field("flag")}),
    "policy.takeover": _NONE,
    "policy.unload": _NONE,
    "policy.status": _NONE,
}


@dataclass(frozen=True)
class Request:
    cmd: str
    fields: dict[str, Any]  # checked against VERBS[cmd] when the verb is declared

    def as_dict(self) -> dict[str, Any]:
        """What a handler takes: ``{"cmd": ..., field: value}``."""
        return {"cmd": self.cmd, **self.fields}


def parse_request(obj: Any) -> Request:
    """A decoded request -> a checked ``Request``, or BadField saying what is wrong."""
    if not isinstance(obj, dict):
        raise BadField(f"a request must be a JSON object, got {json_type(obj)}")
    cmd = obj.get("cmd")
    if cmd is None:
        raise BadField('missing "cmd" (a string naming the verb)')
    if not isinstance(cmd, str):
        raise BadField(f'missing "cmd" (a string naming the verb), got {json_type(cmd)}')
    fields = {k: v for k, v in obj.items() if k != "cmd"}
    verb = VERBS.get(cmd)
    if verb is None:
        return Request(cmd, fields)  # not ours to declare (or unknown: the server says so)
    unknown = sorted(set(fields) - set(verb.fields))
    if unknown:
        takes = ", ".join(verb.fields) or "no fields"
        raise BadField(f"{cmd}: unknown field(s) {', '.join(unknown)} (it takes {takes})")
    return Request(cmd, {k: verb.fields[k].check(cmd, k, v) for k, v in fields.items()})
