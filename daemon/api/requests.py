"""The control socket's requests, checked: each verb's request type (daemon/api/messages.py)
decides what a request may hold before any handler sees it.

A request is a JSON object ``{"cmd": VERB, FIELD: value, ...}``. ``parse_request`` turns it into a
``Request`` or raises ``BadField`` naming what is wrong (the field and the type it needs), so no
handler ever sees a list where it expects text or a number where it expects a flag. The check
itself is msgspec's (``msgspec.convert`` into the verb's request type: one C call on the path
taken by every good request); a refusal is then worded from the same declaration (``FIELDS``,
derived from the request types, never declared twice), in JSON's words rather than Python's. A
verb registered without a declaration (a test's own verb) gets only its ``cmd`` checked. The
console's page verbs read ``FIELDS`` too (daemon/apps/console/page_verbs.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from daemon.api.messages import VERBS, RequestBase

Kind = Literal["text", "flag", "number", "whole"]
_KIND_WORDS: dict[Kind, str] = {
    "text": "text",
    "flag": "true or false",
    "number": "a number",
    "whole": "a whole number",
}


class BadField(ValueError):
    """A request that cannot be served as sent; the message names the field and what it needs
    (``field``: its name, None when the request as a whole is at fault)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Field:
    kind: Kind
    lo: float | None = None  # numbers: inclusive bounds
    hi: float | None = None
    max_chars: int = 0  # text only
    what: str = ""  # what it holds, for the refusal (default: its kind, e.g. "a whole number")

    def check(self, cmd: str, name: str, value: Any) -> Any:
        """``value`` as the handler gets it (null: the field was not given), or BadField."""
        if value is None:
            return None
        if self.kind == "text":
            if not isinstance(value, str):
                raise BadField(f'{cmd}: "{name}" must be text, got {json_type(value)}', name)
            if self.max_chars and len(value) > self.max_chars:
                raise BadField(f'{cmd}: "{name}" is longer than {self.max_chars} characters', name)
            if "\0" in value:  # no path, name or task holds one (and os calls raise on it)
                raise BadField(f'{cmd}: "{name}" must not contain a NUL character', name)
            return value
        if self.kind == "flag":
            if not isinstance(value, bool):
                raise BadField(f'{cmd}: "{name}" must be true or false, got {json_type(value)}', name)
            return value
        what = self.what or _KIND_WORDS[self.kind]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadField(f'{cmd}: "{name}" must be {what}, got {json_type(value)}', name)
        if self.kind == "whole" and not isinstance(value, int):
            raise BadField(f'{cmd}: "{name}" must be {what}, got {value!r}', name)
        if not math.isfinite(value):
            raise BadField(f'{cmd}: "{name}" must be a finite number', name)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise BadField(
                f'{cmd}: "{name}" must be {_range_words(self.lo, self.hi)}, got {_number_words(value)}', name
            )
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


def _field_rule(info: msgspec.inspect.Type) -> Field:
    """A request field's declaration (``T | None``, T maybe with bounds) -> its Field."""
    if isinstance(info, msgspec.inspect.UnionType):
        (info,) = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
    what = ""
    if isinstance(info, msgspec.inspect.Metadata):
        what = str((info.extra or {}).get("what", ""))
        info = info.type
    if isinstance(info, msgspec.inspect.StrType):
        return Field("text", max_chars=info.max_length or 0)
    if isinstance(info, msgspec.inspect.BoolType):
        return Field("flag")
    if isinstance(info, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
        kind: Kind = "whole" if isinstance(info, msgspec.inspect.IntType) else "number"
        return Field(kind, lo=info.ge, hi=info.le, what=what)
    raise TypeError(f"a request field must be text, a flag or a number, not {info!r}")


def _fields_of(request: type[RequestBase]) -> dict[str, Field]:
    info = msgspec.inspect.type_info(request)
    assert isinstance(info, msgspec.inspect.StructType)
    return {f.encode_name: _field_rule(f.type) for f in info.fields}


# Every declared verb's fields, as the refusals and the console's page word them.
FIELDS: dict[str, dict[str, Field]] = {verb: _fields_of(spec.request) for verb, spec in VERBS.items()}


@dataclass(frozen=True)
class Request:
    cmd: str
    fields: dict[str, Any]  # checked against the verb's request type when the verb is declared

    def as_dict(self) -> dict[str, Any]:
        """What a handler takes: ``{"cmd": ..., field: value}``."""
        return {"cmd": self.cmd, **self.fields}


def parse_request(obj: Any) -> Request:
    """A decoded request -> a checked ``Request``, or BadField saying what is wrong."""
    if not isinstance(obj, dict):
        raise BadField(f"a request must be a JSON object, got {json_type(obj)}")
    cmd = obj.get("cmd")
    if cmd is None:
        raise BadField('missing "cmd" (a string naming the verb)', "cmd")
    if not isinstance(cmd, str):
        raise BadField(f'missing "cmd" (a string naming the verb), got {json_type(cmd)}', "cmd")
    fields = {k: v for k, v in obj.items() if k != "cmd"}
    spec = VERBS.get(cmd)
    if spec is None:
        return Request(cmd, fields)  # not ours to declare (or unknown: the server says so)
    try:
        msgspec.convert(obj, spec.request)
    except msgspec.ValidationError as exc:
        raise _refusal(cmd, fields, exc) from None
    return Request(cmd, fields)


def _refusal(cmd: str, fields: dict[str, Any], exc: msgspec.ValidationError) -> BadField:
    """The refusal for a request msgspec refused, worded from the verb's declaration."""
    rules = FIELDS[cmd]
    unknown = sorted(set(fields) - set(rules))
    if unknown:
        takes = ", ".join(rules) or "no fields"
        return BadField(f"{cmd}: unknown field(s) {', '.join(unknown)} (it takes {takes})", unknown[0])
    for name, value in fields.items():
        try:
            rules[name].check(cmd, name, value)
        except BadField as refused:
            return refused
    # a rule the words above do not cover (e.g. a NUL in a text): msgspec's own, with its path
    text = str(exc)
    path = text.rsplit(" - at `$.", 1)[-1].rstrip("`") if " - at `$." in text else None
    return BadField(f"{cmd}: {text}", path)
