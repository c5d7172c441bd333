"""What a page may send for a replay, checked without a daemon: the episode is a whole number
(true, 3.0, "3" and out-of-range indices are refused, naming why), the page never names the
dataset or the ticket, and the console fills both in: the dataset it lists and a fresh ticket per
start, which its Stop sends while that replay may still run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from daemon.api.messages import MAX_FRAME_SEQ, RecordingStatus, StatusReply
from daemon.apps.console.app import Console, ConsoleConfig, _Page
from daemon.apps.console.page_verbs import BadRequest, parse_request

pytestmark = pytest.mark.unit


def _replay(**args: Any) -> dict[str, Any]:
    return parse_request({"t": "verb", "id": "r1", "cmd": "replay.start", "args": args}).args


def test_an_episode_is_a_whole_number_within_the_declared_bounds() -> None:
    assert _replay(episode=3) == {"episode": 3}
    assert _replay(episode=0, speed=0.25, record=False) == {"episode": 0, "speed": 0.25, "record": False}
    assert _replay(episode=MAX_FRAME_SEQ)["episode"] == MAX_FRAME_SEQ
    for bad, why in (
        (True, "episode must be a whole number, got true/false"),  # a bool is not an index
        (3.0, "episode must be a whole number, got 3.0"),  # as the control socket refuses it
        (2.5, "episode must be a whole number, got 2.5"),
        ("3", "episode must be a whole number, got text"),
        ([3], "episode must be a whole number, got an array"),
        (-1, "episode must be at least 0 and at most 9007199254740992, got -1"),
        (MAX_FRAME_SEQ + 1, "got 9007199254740993"),
    ):
        with pytest.raises(BadRequest) as err:
            _replay(episode=bad)
        assert why in str(err.value), (bad, str(err.value))
    with pytest.raises(BadRequest, match="replay.start: episode is required"):
        _replay(speed=1.0)
    with pytest.raises(BadRequest, match="speed must be from 0.01 to 1"):
        _replay(episode=1, speed=2)


@pytest.mark.parametrize(
    ("cmd", "args", "why"),
    [
        (
            "replay.start",
            {"episode": 0, "dataset": "/etc"},
            "unknown argument(s) dataset (takes: episode, speed, record)",
        ),
        ("replay.start", {"episode": 0, "ticket": "t"}, "unknown argument(s) ticket"),
        ("replay.stop", {"ticket": "someone-elses"}, "unknown argument(s) ticket (takes: none)"),
        ("replay.status", {"dataset": "/etc"}, "unknown argument(s) dataset"),
    ],
)
def test_a_page_never_names_the_dataset_or_the_ticket(cmd: str, args: dict[str, Any], why: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_request({"t": "verb", "id": "x", "cmd": cmd, "args": args})
    assert why in str(err.value)


class _FakeDaemon:
    """The console's link to the daemon, answering replay verbs as the daemon would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, dict[str, Any]] = {}

    async def verb(self, cmd: str, **args: Any) -> dict[str, Any]:
        self.calls.append((cmd, args))
        await asyncio.sleep(0)
        return self.answers.get(cmd, {"ok": True, "phase": "aligning"})


def _console(dataset: str | None) -> tuple[Console, _FakeDaemon]:
    console = Console(ConsoleConfig(socket_path="/nonexistent/control.sock"))
    console.link.last_status = StatusReply(recording=RecordingStatus(phase="idle", dataset=dataset))
    fake = _FakeDaemon()
    console.link.verb = fake.verb  # type: ignore[method-assign]
    return console, fake


def _run(console: Console, page: _Page, rid: str, cmd: str, **args: Any) -> dict[str, Any]:
    req = parse_request({"t": "verb", "id": rid, "cmd": cmd, "args": args})
    return asyncio.run(console.run_verb(page, req))


def test_the_console_fills_in_its_dataset_and_a_ticket_per_start_which_its_stop_sends() -> None:
    console, daemon = _console("/data/local/so101d")
    page = _Page(ws=None)  # type: ignore[arg-type]  # run_verb never writes to it
    assert _run(console, page, "1", "replay.start", episode=2, speed=0.5)["ok"]
    cmd, sent = daemon.calls[-1]
    assert cmd == "replay.start" and sent["dataset"] == "/data/local/so101d" and sent["episode"] == 2
    first = sent["ticket"]
    assert len(first) == 32
    _run(console, page, "2", "replay.stop")
    assert daemon.calls[-1] == ("replay.stop", {"ticket": first})
    # that replay is over: a later Stop (of a replay started elsewhere) names none
    _run(console, page, "3", "replay.stop")
    assert daemon.calls[-1] == ("replay.stop", {"ticket": None})
    # a refused start leaves no ticket behind; the next start has a fresh one
    daemon.answers["replay.start"] = {"ok": False, "error": "replay refused: episode 9 is out of range"}
    assert _run(console, page, "4", "replay.start", episode=9)["error"].endswith("out of range")
    _run(console, page, "5", "replay.stop")
    assert daemon.calls[-1] == ("replay.stop", {"ticket": None})
    del daemon.answers["replay.start"]
    _run(console, page, "6", "replay.start", episode=1)
    assert daemon.calls[-1][1]["ticket"] not in (first, None)
    # replay.status saying nothing runs any more: the ticket is forgotten
    daemon.answers["replay.status"] = {"ok": True, "phase": "done", "report": {}}
    _run(console, page, "7", "replay.status")
    _run(console, page, "8", "replay.stop")
    assert daemon.calls[-1] == ("replay.stop", {"ticket": None})


def test_a_double_click_starts_one_replay_and_no_dataset_is_a_clear_error() -> None:
    console, daemon = _console("/data/local/so101d")
    page = _Page(ws=None)  # type: ignore[arg-type]

    async def twice() -> list[dict[str, Any]]:
        reqs = [parse_request({"t": "verb", "id": i, "cmd": "replay.start", "args": {"episode": 0}}) for i in "ab"]
        return list(await asyncio.gather(*(console.run_verb(page, r) for r in reqs)))

    replies = asyncio.run(twice())
    assert sorted(r["ok"] for r in replies) == [False, True], replies
    assert "already being started" in next(r["error"] for r in replies if not r["ok"])
    assert [c for c, _ in daemon.calls] == ["replay.start"]
    console, daemon = _console(None)  # recording off: the console lists no dataset, so replays none
    reply = _run(console, page, "c", "replay.start", episode=0)
    assert reply == {"ok": False, "error": "replay.start: this daemon records no dataset ([recording] enabled = false)"}
    assert daemon.calls == []
