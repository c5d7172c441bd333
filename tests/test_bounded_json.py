"""The request decoder's shortcut (one flat object decoded by msgspec in one call) decodes every
line as the bounded decoding does, and refuses what it refuses: the same value, or the same
JsonRefused message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.api import bounded_json
from daemon.api.bounded_json import JsonBounds, JsonRefused, loads_bounded

DEFAULT = JsonBounds()


def _bounded_only(raw: bytes, bounds: JsonBounds = DEFAULT) -> tuple[str, Any]:
    """What the bounded decoding alone makes of ``raw``: ("value", v) or ("refused", message)."""
    original = bounded_json._decode_flat
    bounded_json._decode_flat = lambda raw, bounds: None  # type: ignore[assignment]
    try:
        return _outcome(raw, bounds)
    finally:
        bounded_json._decode_flat = original


def _outcome(raw: bytes, bounds: JsonBounds = DEFAULT) -> tuple[str, Any]:
    try:
        value = loads_bounded(raw, bounds)
    except JsonRefused as exc:
        return ("refused", str(exc))
    return ("value", (value, _types(value)))


def _types(value: Any) -> Any:
    """The value's types all the way down (1 and 1.0 and True compare equal, but are not the same)."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def _same(raw: bytes, bounds: JsonBounds = DEFAULT) -> None:
    assert _outcome(raw, bounds) == _bounded_only(raw, bounds), raw


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**45), max_value=10**45)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=8), scalars, max_size=8), st.booleans())
def test_a_flat_object_decodes_as_the_bounded_decoding_does(obj: dict[str, Any], compact: bool) -> None:
    text = json.dumps(obj, separators=(",", ":") if compact else None)
    _same(text.encode())
    _same(text.encode(), JsonBounds(max_number_chars=10))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "{",
                "}",
                '"a"',
                ":",
                ",",
                "1",
                "-0.5",
                "1e5",
                "true",
                "null",
                '"b\\"',
                " ",
                "[",
                "]",
                '"a":1',
                "\t",
                "\u00e9",
                "NaN",
                "9" * 30,
            ]
        ),
        max_size=14,
    )
)
def test_any_line_decodes_or_is_refused_as_by_the_bounded_decoding(parts: list[str]) -> None:
    _same("".join(parts).encode("utf-8"))


@pytest.mark.parametrize(
    "line",
    [
        b'{"cmd":"hold","cmd":"torque.off"}',  # a key twice
        b'{"cmd":"x","a":1e999}',  # out of range
        b'{"cmd":"x","a":' + b"1" * 41 + b"}",  # a number too long
        b'{"cmd":"x","a":' + b"1" * 40 + b"}",  # as long as a number may be
        b'{"cmd":"x","a":-' + b"1" * 40 + b"}",
        b'{"cmd":"x","a":-0.' + b"1" * 38 + b"}",
        b'{"cmd":"x","a":NaN}',
        b'{"cmd":"x","a":"\\u0000"}',
        b'{"cmd":"x","a":"\xff"}',
        b'{"cmd":"x"} {',
        b'{"cmd":"x","a":{"b":1}}',
        b'{"cmd":"arm.action","lease":"ab12","shoulder_pan":-12.345678901234567,"gripper":50}',
    ],
)
def test_lines_near_the_shortcut_s_edges(line: bytes) -> None:
    _same(line)


def test_the_common_request_takes_the_shortcut() -> None:
    line = json.dumps(
        {"cmd": "arm.action", "lease": "0f" * 16, "shoulder_pan": -0.0012345678901234567, "gripper": 5}
    ).encode()
    assert bounded_json._decode_flat(line, JsonBounds()) == json.loads(line)
