"""The control API's published schema against a real daemon on the virtual bench.

One daemon (`so101d run` on the virtual bench's configuration: emulated arms, two virtual
cameras, recording on) is asked what it serves; the schema a client reads
(docs/reference/control-api.schema.json) must declare every verb it registers, every declared
request field refuses a value of the wrong type naming that field, and the replies the daemon
really gives fit their declared types with no field left undeclared (a field added to a reply
without its declaration fails here). The generated files must match the declarations.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from console_support import Bench

from daemon.api.client import ApiVersionMismatch, ControlClient, check_api_version
from daemon.api.messages import API_VERSION, VERBS, ErrorReply, decode_reply

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "docs" / "reference" / "control-api.schema.json"
# A value of the wrong JSON type for each kind of declared field.
WRONG: dict[str, Any] = {"string": 7, "integer": "7", "number": "7", "boolean": "yes"}


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    b = Bench(tmp_path_factory.mktemp("api"))
    b.emulator.start()
    from daemon.apps.commands.demo import prepare_bench

    b.cfg, _ = prepare_bench(b.dir, socket_path=str(b.sock), dataset_root=b.dir / "datasets")
    try:
        b.start_daemon()
        b.wait_recorder_ready()
        yield b
    except BaseException:
        print(b.logs())
        raise
    finally:
        b.close()


def published() -> dict[str, Any]:
    return json.loads(SCHEMA.read_text(encoding="utf-8"))


def _definition(doc: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    return doc["$defs"][ref["$ref"].rsplit("/", 1)[-1]]


def _kind(prop: dict[str, Any]) -> str:
    kinds = [p.get("type") for p in prop.get("anyOf", [prop]) if p.get("type") not in (None, "null")]
    assert len(kinds) == 1, prop
    return str(kinds[0])


def undeclared(raw: Any, typed: Any, path: str = "$") -> list[str]:
    """Keys of ``raw`` that the decoded ``typed`` (re-encoded) no longer has: fields the
    declaration does not know."""
    out: list[str] = []
    if isinstance(raw, dict) and isinstance(typed, dict):
        for k, v in raw.items():
            out += [f"{path}.{k}"] if k not in typed else undeclared(v, typed[k], f"{path}.{k}")
    elif isinstance(raw, list) and isinstance(typed, list):
        for v, t in zip(raw, typed):
            out += undeclared(v, t, f"{path}[]")
    return out


def test_every_registered_verb_is_in_the_published_schema(bench: Bench) -> None:
    with ControlClient(bench.sock) as c:
        served = c.request("help")["verbs"]
        version = c.request("version")
    doc = published()
    assert doc["api_version"] == API_VERSION == version["api_version"]
    missing = sorted(set(served) - set(doc["verbs"]))
    assert not missing, f"verbs the daemon serves that the schema does not declare: {missing}"
    for verb in served:
        entry = doc["verbs"][verb]
        assert _definition(doc, entry["request"])["properties"]["cmd"]["enum"] == [verb]
        assert "ok" in _definition(doc, entry["reply"])["properties"]


def test_a_wrong_field_type_is_refused_naming_the_field(bench: Bench) -> None:
    doc = published()
    tried = 0
    with ControlClient(bench.sock) as c:
        for verb, entry in doc["verbs"].items():
            for name, prop in _definition(doc, entry["request"])["properties"].items():
                if name == "cmd":
                    continue
                reply = c.call(verb, **{name: WRONG[_kind(prop)]})
                tried += 1
                assert reply["ok"] is False, (verb, name, reply)
                assert reply["field"] == name and f'"{name}"' in reply["error"], (verb, name, reply)
                assert reply["api_version"] == API_VERSION
            unknown = c.call(verb, no_such_field=1)
            assert unknown["ok"] is False and unknown["field"] == "no_such_field", (verb, unknown)
    assert tried >= 10  # every typed field of camera.preview, episode.*, policy.*


def test_real_replies_fit_their_declarations(bench: Bench) -> None:
    """Every verb the bench can answer without side effects beyond an episode, decoded into its
    declared reply type: nothing it sends is undeclared."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("ping", {}),
        ("version", {}),
        ("help", {}),
        ("status", {}),
        ("status.live", {}),
        ("camera.list", {}),
        ("camera.preview", {"camera": "front", "max_width": 32, "max_height": 24}),
        ("camera.preview", {"camera": "front", "after_seq": 2**50}),
        ("episode.status", {}),
        ("policy.status", {}),
        ("hold", {}),
        ("teleop.start", {}),
        ("episode.start", {"task": "schema check"}),
        ("status", {}),
        ("episode.discard", {}),
        ("config.reload", {}),
        ("policy.start", {}),
    ]
    seen_error = False
    with ControlClient(bench.sock) as c:
        for verb, args in calls:
            raw = c.call(verb, **args)
            kind = VERBS[verb].reply if raw["ok"] else ErrorReply
            seen_error |= not raw["ok"]
            typed = msgspec.to_builtins(decode_reply(raw, kind))
            assert not undeclared(raw, typed), f"{verb}: undeclared {undeclared(raw, typed)}"
    assert seen_error  # policy.start without a policy: the error reply is checked too


def test_the_client_says_which_side_is_older() -> None:
    with pytest.raises(ApiVersionMismatch, match="older than this client"):
        check_api_version({"ok": True, "pong": True}, "/run/x.sock")
    with pytest.raises(ApiVersionMismatch, match="newer than this client"):
        check_api_version({"ok": True, "api_version": "99.0"}, "/run/x.sock")
    check_api_version({"ok": True, "api_version": API_VERSION.split(".")[0] + ".99"}, "/run/x.sock")


def test_the_published_schema_and_reference_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "daemon.api.reference", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert (REPO / "docs" / "reference" / "control-api.md").is_file()


# ------------------------------------------------------------------ the console's page
CONSOLE_JS = REPO / "daemon" / "apps" / "console" / "static" / "console.js"
_PARAM = re.compile(r"/\*\*\s*@param \{([\w<>, ]+)\} (\w+)\s*\*/")
_LOCAL = re.compile(r"/\*\*\s*@type \{([\w<>, ]+)\}\s*\*/\s*(?:const|let) (\w+)")
_MAP = re.compile(r"Object<string, (\w+)>")


def typed_names(js: str) -> dict[str, str]:
    """JS name -> the schema type its JSDoc tag gives (one type per name in the whole file)."""
    out: dict[str, str] = {}
    for m in [*_PARAM.finditer(js), *_LOCAL.finditer(js)]:
        kind, name = m.group(1), m.group(2)
        assert out.get(name, kind) == kind, f"{name} is tagged both {out[name]} and {kind}: give each its own name"
        out[name] = kind
    return out


def _next(doc: dict[str, Any], prop: dict[str, Any]) -> tuple[str, str] | None:
    """Where a property leads: ("def", name) for a declared message, ("map", name) for an object
    keyed by data (joint, stage, camera names) whose values are that message; None: a plain value."""
    for p in [prop, *prop.get("anyOf", [])]:
        if "$ref" in p:
            return ("def", p["$ref"].rsplit("/", 1)[-1])
        extra = p.get("additionalProperties")
        if isinstance(extra, dict) and "$ref" in extra:
            return ("map", extra["$ref"].rsplit("/", 1)[-1])
    return None


def undeclared_reads(js: str, doc: dict[str, Any]) -> tuple[list[str], int]:
    """Every `name.field.field...` read through a typed name, walked through the schema: the
    reads that name no declared field, and how many reads were checked."""
    defs = doc["$defs"]
    bad, checked = [], 0
    for name, kind in typed_names(js).items():
        m = _MAP.fullmatch(kind)
        start = ("map", m.group(1)) if m else ("def", kind)
        assert start[1] in defs, f"{name}: type {start[1]} is not in the schema"
        for read in re.finditer(rf"(?<![\w.$]){name}((?:\.\w+)+)", js):
            where: tuple[str, str] | None = start
            for field in read.group(1).split(".")[1:]:
                if where is None:
                    break  # a plain value's own members (.length, .toString)
                if where[0] == "map":
                    where = ("def", where[1])  # a data key (a stage's name): its value is the message
                    continue
                props = defs[where[1]].get("properties", {})
                checked += 1
                if field not in props:
                    bad.append(f"{name}{read.group(1)}: {where[1]} has no field {field!r}")
                    break
                where = _next(doc, props[field])
    return bad, checked


def test_the_console_page_reads_only_declared_fields() -> None:
    doc = published()
    js = CONSOLE_JS.read_text(encoding="utf-8")
    bad, checked = undeclared_reads(js, doc)
    assert not bad, "console.js reads fields the control API does not declare:\n" + "\n".join(bad)
    assert checked >= 40  # the status, live, recording, policy, safety and servo reads
    names = typed_names(js)
    assert {"st", "lv", "rec", "pol"} <= set(names), names  # the page's entry points are typed


def test_the_console_check_finds_an_undeclared_read() -> None:
    """The check above can fail: a read the schema lacks, a typo, a field of a nested message."""
    doc = published()
    js = (
        "/** @param {StatusReply} st */ function f(st) { st.mode; st.rate_hz_targt; st.follower.bus.retries;"
        " st.follower.bus.retried; st.timing_ms.cycle.p50; }\n"
        "/** @type {Object<string, StageTiming>} */ const t = {}; t.jitter.p77;"
    )
    bad, checked = undeclared_reads(js, doc)
    assert sorted(b.split(":")[0] for b in bad) == [
        "st.follower.bus.retried",
        "st.rate_hz_targt",
        "t.jitter.p77",
    ], bad
    assert checked == 11


def test_the_console_serves_the_schema_the_page_is_checked_against(tmp_path: Path) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from daemon.apps.console.app import Console, ConsoleConfig

    async def fetch() -> tuple[int, Any]:
        server = TestServer(Console(ConsoleConfig(socket_path=str(tmp_path / "none.sock"))).make_app())
        async with TestClient(server) as client:
            r = await client.get("/api/schema.json")
            return r.status, await r.json()

    status, body = asyncio.run(fetch())
    assert status == 200 and body == published()
