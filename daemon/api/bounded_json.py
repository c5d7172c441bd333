"""JSON from others, decoded within bounds: size, nesting depth and the length of every number.

``json.loads`` alone is not enough for text a stranger wrote: an array nested some thousand
levels deep raises ``RecursionError`` (or, below the interpreter's limit, hands back a structure
that later code walks recursively), and a 5000-digit integer raises ``ValueError`` (Python's
int-to-string limit) or, below it, costs quadratic time to convert. Here the depth is measured on
the raw text before parsing, numbers are converted by hooks that refuse long ones, and every
failure is one ``JsonRefused`` with a message fit for the reply.

Every request line comes through here, and on a busy machine this Python runs cold (its code and
data out of the caches between a client's steps): the common line (one flat object of plain
text, numbers and flags, as every client here writes it) is decoded by msgspec in one C call
instead, once a scan of the raw bytes shows that nothing in it could be decoded differently or
refused by the bounded decoding (no nesting, escape, control character, exponent, long number, and
as many keys as the object has: none given twice). Anything else takes the bounded decoding.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import msgspec

# A string literal (to the end of the text when unterminated: every byte is scanned once, so a line
# of unmatched quotes costs linear time), or one bracket.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


class JsonRefused(ValueError):
    """The text is not JSON, or JSON beyond the bounds (the message says which)."""


@dataclass(frozen=True)
class JsonBounds:
    max_bytes: int = 65536
    max_depth: int = 16  # objects and arrays inside each other
    max_number_chars: int = 40  # digits, sign, point and exponent of one number


def _too_deep(data: bytes, max_depth: int) -> bool:
    """Objects/arrays nested deeper than ``max_depth`` (brackets inside strings do not count)."""
    depth = 0
    for m in _TOKEN.finditer(data):
        tok = m.group()
        if tok[:1] == b'"':
            continue
        if tok in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                return True  # at once: a line of brackets costs as much as the bound, not its length
        else:
            depth -= 1
    return False


# What sends a line to the bounded decoding: a byte that is not ASCII, a control character (JSON
# refuses one inside text, and whitespace other than a space is rare), an escape, an array, or a
# number (after ":" or ",", where a value starts) with an exponent or longer than _FAST_CHARS
# (a string holding such a text sends its line there too: harmless).
_FAST_CHARS = JsonBounds.max_number_chars
_NOT_FAST = re.compile(
    rb"[^\x20-\x7e]|[\\[]|[:,] *(?:-?[0-9.]*[eE]|-[0-9.]{%d}|[0-9.]{%d})" % (_FAST_CHARS, _FAST_CHARS + 1)
)
# one per key (and per text holding '":'): as many as the decoded object's keys, none was repeated
_KEY_END = re.compile(rb'" *:')
_FAST_DECODER = msgspec.json.Decoder()


def _decode_flat(raw: bytes, bounds: JsonBounds) -> dict[str, Any] | None:
    """``raw`` decoded as the bounded decoding would decode it, if it is one flat object that
    cannot be decoded otherwise (see the module docstring); None: decode it within bounds."""
    if (
        bounds.max_depth < 1
        or bounds.max_number_chars < _FAST_CHARS
        or raw.count(b"{") != 1
        or _NOT_FAST.search(raw) is not None
    ):
        return None
    try:
        obj = _FAST_DECODER.decode(raw)
    except msgspec.DecodeError:  # the bounded decoding words the refusal
        return None
    if type(obj) is not dict or len(obj) != len(_KEY_END.findall(raw)):
        return None
    return obj


def loads_bounded(data: bytes | str, bounds: JsonBounds = JsonBounds()) -> Any:
    """Decode ``data`` (UTF-8) or raise ``JsonRefused``; never anything else."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > bounds.max_bytes:
        raise JsonRefused(f"request too large (limit {bounds.max_bytes} bytes)")
    flat = _decode_flat(raw, bounds)
    if flat is not None:
        return flat
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonRefused(f"malformed request: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if _too_deep(raw, bounds.max_depth):
        raise JsonRefused(f"malformed request: nested deeper than {bounds.max_depth} levels")

    def number(kind: type[int] | type[float]) -> Any:
        def convert(s: str) -> int | float:
            if len(s) > bounds.max_number_chars:
                raise JsonRefused(f"malformed request: a number longer than {bounds.max_number_chars} characters")
            value = kind(s)
            if value in (float("inf"), float("-inf")):
                raise JsonRefused(f"malformed request: {s} is out of range")
            return value

        return convert

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # with a key given twice, one reader (a log, a filter) may see the first and we the last
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj:
                raise JsonRefused(f"malformed request: the key {key[:64]!r} is given twice")
            obj[key] = value
        return obj

    def constant(name: str) -> Any:
        raise JsonRefused(f"malformed request: {name} is not JSON")

    try:
        return json.loads(
            text,
            parse_int=number(int),
            parse_float=number(float),
            parse_constant=constant,
            object_pairs_hook=unique_keys,
        )
    except JsonRefused:
        raise
    except json.JSONDecodeError as exc:
        raise JsonRefused(f"malformed request: {exc}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # bounds checked above: belt and braces
        raise JsonRefused(f"malformed request: {type(exc).__name__}") from None
