"""Replay (#27) attacked from the outside: what an operator, a second client or a hostile dataset
may do to `so101d replay` and its socket verbs while the daemon (`so101d run` on the virtual
bench) drives the arm.

One daemon for the file, recording into its own dataset. Each story ends with the arm held and no
replay left running (a replay that never ends would refuse every later one and keep the follower).
The last story stops the daemon itself in the middle of a recorded replay.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from dataset_support import Ep, make_dataset
from recording_support import wait_until
from replay_support import SO101D, Bench, bench_daemon, cli
from virtual_bench_support import BENCH_POSE_UNITS

from daemon.api.client import ControlClient

RATE_HZ = 60.0


def _near_bench(state: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = (BENCH_POSE_UNITS + (action - action[0]) * 0.5).astype(np.float32)
    return a.copy(), a


def _far_out(state: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every action thousands of degrees past any joint limit (finite: the loader lets it in)."""
    a = np.tile(np.array([5000.0, -5000.0, 5000.0, -5000.0, 5000.0, 900.0], np.float32), (len(action), 1))
    return a.copy(), a


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("attacks")
    out = {
        "long": make_dataset(tmp / "long", [Ep(frames=300, rows=_near_bench)]),
        "short": make_dataset(tmp / "short", [Ep(frames=30, rows=_near_bench)]),
        "far": make_dataset(tmp / "far", [Ep(frames=60, rows=_far_out)]),
    }
    # info.json lies: fps a billion (the whole episode due in the first cycle)
    fast = make_dataset(tmp / "fast", [Ep(frames=60, rows=_near_bench)])
    info = json.loads((fast / "meta" / "info.json").read_text())
    info["fps"] = 1e9
    (fast / "meta" / "info.json").write_text(json.dumps(info))
    out["fast"] = fast
    # another arm's episode: Koch's joints have the SO-101's names
    koch = make_dataset(tmp / "koch", [Ep(frames=30, rows=_near_bench)])
    info = json.loads((koch / "meta" / "info.json").read_text())
    info["robot_type"] = "koch_follower"
    (koch / "meta" / "info.json").write_text(json.dumps(info))
    out["koch"] = koch
    # a dataset root that is a symlink loop
    loop = tmp / "loop"
    loop.symlink_to(loop)
    out["loop"] = loop
    return out


@pytest.fixture(scope="module")
def bench(datasets: dict[str, Path]) -> Iterator[Bench]:
    with bench_daemon("local/attacked", RATE_HZ) as b:
        yield b


def _req(b: Bench, cmd: str, **fields) -> dict:
    with ControlClient(b.vb.socket_path, timeout_s=10) as c:
        return c.call(cmd, **fields)


def _phase(b: Bench) -> str:
    return _req(b, "replay.status")["phase"]


def _ended(b: Bench) -> bool:
    st = _req(b, "replay.status")
    return st["phase"] in ("done", "stopped", "idle") and (st["phase"] == "idle" or st.get("report") is not None)


def _goals_still(b: Bench, cycles: int = 30) -> bool:
    first = b.vb.follower.goal_ticks()
    start = _req(b, "status")["cycles"]
    assert wait_until(lambda: _req(b, "status")["cycles"] >= start + cycles, 30)
    return np.array_equal(b.vb.follower.goal_ticks(), first)


def _start_playing(b: Bench, dataset: Path, **fields) -> dict:
    r = _req(b, "replay.start", dataset=str(dataset), episode=0, record=False, **fields)
    assert r["ok"], r
    assert wait_until(lambda: _phase(b) == "playing" and (_req(b, "replay.status").get("frame") or 0) >= 10, 60)
    return r


def _settle(b: Bench) -> None:
    """No replay left running, the arm held (each story leaves the bench so)."""
    if not _ended(b):
        _req(b, "replay.stop")
    assert wait_until(lambda: _ended(b), 15), _req(b, "replay.status")
    assert wait_until(lambda: _goals_still(b), 15), "the arm holds"


def test_a_second_replay_from_another_client_is_refused_and_the_first_plays_on(bench: Bench, datasets):
    _start_playing(bench, datasets["long"])
    second = _req(bench, "replay.start", dataset=str(datasets["short"]), episode=0, record=False)
    assert not second["ok"] and "a replay is running already" in second["error"], second
    st = _req(bench, "replay.status")
    assert st["phase"] == "playing" and st["dataset"] == str(datasets["long"]), st
    _settle(bench)


def test_a_client_taking_the_arm_mid_replay_does_not_leave_a_replay_running_for_ever(bench: Bench, datasets):
    """arm.acquire (the LeRobot plugin) while a replay plays: either refused (the replay plays on)
    or the replay ends, and the client keeps the arm it was given."""
    _start_playing(bench, datasets["long"])
    got = _req(bench, "arm.acquire", client="attacker")
    if not got["ok"]:
        assert "replay" in got["error"], got
        _settle(bench)
        return
    lease = got["lease"]
    try:
        assert wait_until(lambda: _ended(bench), 10), ("the replay still runs", _req(bench, "replay.status"))
        assert "the follower was taken by 'client'" in _req(bench, "replay.status")["report"]["outcome"]
        arms = _req(bench, "status")["arms"]
        assert arms["follower"]["source"] == "client", ("the client lost the arm it was given", arms)
    finally:
        _req(bench, "arm.release", lease=lease)
    ok = _req(bench, "replay.start", dataset=str(datasets["short"]), episode=0, record=False)
    assert ok["ok"], ("a later replay is refused", ok)
    _settle(bench)


def test_teleop_start_mid_replay_is_refused_rather_than_answered_falsely(bench: Bench, datasets):
    """The operator's teleop.start while a replay plays used to answer "following the leader" while
    the replay played on to its end and the arm then held. It is refused, naming the replay; the
    replay plays on, and Hold stops it."""
    _start_playing(bench, datasets["long"])
    r = _req(bench, "teleop.start")
    assert not r["ok"] and "a replay drives the follower" in r["error"], r
    assert _phase(bench) == "playing"
    assert _req(bench, "hold")["mode"] == "hold"
    assert wait_until(lambda: _ended(bench), 10)
    assert _req(bench, "replay.status")["phase"] == "stopped"
    _settle(bench)
    # once the replay ended, teleop.start is the operator's again
    r = _req(bench, "teleop.start")
    assert r["ok"], r
    assert wait_until(lambda: _req(bench, "status")["mode"] in ("aligning", "teleop"), 10)
    assert _req(bench, "hold")["mode"] == "hold"


def test_policy_start_mid_replay_is_refused_naming_the_replay(bench: Bench, datasets):
    """policy.start while a replay plays would answer "policy driving the follower" while the
    replay kept the arm and then held it: refused naming the replay (checked before whether a
    policy is loaded: this bench has none). The replay plays on."""
    _start_playing(bench, datasets["long"])
    r = _req(bench, "policy.start")
    assert not r["ok"] and "a replay drives the follower" in r["error"], r
    assert _phase(bench) == "playing"
    _settle(bench)


def test_a_cli_killed_mid_replay_leaves_the_replay_to_end_and_the_arm_holds(bench: Bench, datasets):
    """SIGKILL of `so101d replay` (no Ctrl-C handler runs): the daemon plays the episode to its end
    (nothing stops it but the operator's Hold), then holds and keeps the report."""
    proc = subprocess.Popen(
        [*SO101D, "replay", str(datasets["short"]), "--episode", "0", "--no-record", *bench.sock],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    try:
        assert wait_until(lambda: _phase(bench) in ("aligning", "playing"), 60)
        proc.kill()
        proc.wait(10)
        assert wait_until(lambda: _ended(bench), 30), _req(bench, "replay.status")
        st = _req(bench, "replay.status")
        assert st["phase"] == "done" and st["report"]["frames_played"] == 30, st
        assert _req(bench, "status")["mode"] == "hold"
        assert wait_until(lambda: _goals_still(bench), 10), "the arm holds"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_actions_far_past_the_limits_are_clamped_and_the_replay_still_ends(bench: Bench, datasets):
    r = cli("replay", str(datasets["far"]), "--episode", "0", "--no-record", "--json", *bench.sock, timeout=90)
    assert r.returncode in (0, 1), (r.stdout, r.stderr)
    rep = json.loads(r.stdout.strip().splitlines()[-1])["report"]
    assert rep["frames_played"] == 60 and rep["joint_limited_cycles"] > 0, rep
    _settle(bench)


def test_an_fps_a_billion_plays_the_episode_under_the_step_limit_and_ends(bench: Bench, datasets):
    r = cli("replay", str(datasets["fast"]), "--episode", "0", "--no-record", "--json", *bench.sock, timeout=90)
    assert r.returncode == 0, (r.stdout, r.stderr)
    rep = json.loads(r.stdout.strip().splitlines()[-1])["report"]
    assert rep["frames_played"] >= 1 and rep["outcome"] == "done", rep
    _settle(bench)


def test_hostile_requests_are_refused_and_the_arm_never_moves(bench: Bench, datasets, tmp_path):
    _settle(bench)
    goals = bench.vb.follower.goal_ticks()
    big = tmp_path / "big"
    (big / "meta").mkdir(parents=True)
    with open(big / "meta" / "info.json", "wb") as f:  # sparse: no disk used, 256 MiB to read
        f.truncate(256 << 20)
    bad = [
        ({"dataset": str(datasets["long"]), "episode": 0, "speed": 0}, "speed"),
        ({"dataset": str(datasets["long"]), "episode": 0, "speed": -1}, "speed"),
        ({"dataset": str(datasets["long"]), "episode": 0, "speed": 1.0000001}, "speed"),
        ({"dataset": str(datasets["long"]), "episode": -1}, "episode"),
        ({"dataset": str(datasets["long"]), "episode": 1.5}, "episode"),
        ({"dataset": str(datasets["loop"]), "episode": 0}, "no LeRobot dataset here"),
        ({"dataset": str(big), "episode": 0}, "info.json"),
        ({"dataset": "", "episode": 0}, "dataset"),
        ({"dataset": str(datasets["koch"]), "episode": 0}, "robot_type 'koch_follower' is not an SO-100/SO-101"),
    ]
    for fields, why in bad:
        r = _req(bench, "replay.start", record=False, **fields)
        assert not r["ok"] and why in r["error"], (fields, r)
    # NaN as JSON's NaN literal, through the raw socket
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(str(bench.vb.socket_path))
        line = json.dumps({"cmd": "replay.start", "dataset": str(datasets["long"]), "episode": 0, "speed": 0.5})
        s.sendall(line.replace("0.5", "NaN").encode() + b"\n")  # JSON has no NaN; Python's json.loads takes it
        reply = json.loads(s.makefile("rb").readline())
        assert not reply.get("ok"), reply
    finally:
        s.close()
    assert _phase(bench) != "aligning" and _phase(bench) != "playing"
    assert np.array_equal(bench.vb.follower.goal_ticks(), goals)


def test_every_tag_field_the_episodes_list_shows_is_escaped():
    """The tag is read from the dataset as written (a dataset from elsewhere, edited by hand or by
    another tool): its fields are not type-checked, so ``late_frames`` may be text such as
    ``<img src=x onerror=...>``. The row is built as HTML: every tag field in it goes through
    esc() (text) or fmt() (a number)."""
    import re

    js = (Path(__file__).parent.parent / "daemon" / "apps" / "console" / "static" / "console.js").read_text()
    body = js[js.index("async function loadEpisodes") : js.index("// ---", js.index("async function loadEpisodes"))]
    shown = re.findall(r"\$\{([^{}]*\bt\.[a-z_]+[^{}]*)\}", body)
    assert shown, "the row shows tag fields"
    raw = [x for x in shown if not re.match(r"\s*(esc|fmt)\(", x)]
    assert not raw, f"tag fields put into the row's HTML unescaped: {raw}"


def test_a_recorded_replay_of_the_dataset_the_daemon_is_writing(bench: Bench, datasets):
    """A replay recorded into the daemon's dataset, then at once a replay of that very episode of
    that dataset (its writer may still be appending it): played from what is at rest, or refused
    saying why; and the second recording names the first by its uid."""
    _settle(bench)
    before = bench.episodes()
    r = _req(bench, "replay.start", dataset=str(datasets["short"]), episode=0, record=True)
    assert r["ok"] and r["recording"] == before, r
    assert wait_until(lambda: _ended(bench), 30)
    assert _req(bench, "replay.status")["phase"] == "done"
    again = _req(bench, "replay.start", dataset=str(bench.data), episode=before, record=True)
    print("replay of the episode just saved:", again.get("message") or again.get("error"))
    if not again["ok"]:
        # the save is queued, the writer commits it a moment later: until then it is not at rest
        assert any(w in again["error"] for w in ("out of range", "recorder is", "no LeRobot dataset here")), again
        assert wait_until(lambda: bench.episodes() > before, 60)
        again = _req(bench, "replay.start", dataset=str(bench.data), episode=before, record=True)
    assert again["ok"], again
    assert wait_until(lambda: _ended(bench), 30)
    assert _req(bench, "replay.status")["phase"] == "done", _req(bench, "replay.status")
    assert wait_until(lambda: bench.episodes() > before + 1, 60)
    from daemon.data.schema import read_episode_tags

    tags = read_episode_tags(bench.data)
    first, second = tags[before], tags[before + 1]
    assert first.origin == second.origin == "replay", (first, second)
    assert any(n.startswith(f"replay_of={first.uid}") for n in second.notes), second.notes
    _settle(bench)


def test_dataset_check_tag_on_a_dataset_it_cannot_write_prints_the_findings_and_says_why(bench: Bench, tmp_path):
    """`dataset check --tag` on the dataset the daemon is recording (the daemon owns it), and on
    one whose folder cannot take the edit's staging (here: a file in its place; a read-only mount
    reads the same): the findings are printed, no tag is written, the exit status says it failed."""
    r = cli("dataset", "check", str(bench.data), "--tag")
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    assert "error: --tag: no tag was written: DatasetBusyError" in r.stderr, r.stderr
    assert "clean," in r.stdout, r.stdout  # the check itself is printed
    ds = make_dataset(tmp_path / "ds", [Ep(frames=40, rows=_far_out)])
    import shutil

    shutil.rmtree(tmp_path / ".ds.so101d-staging", ignore_errors=True)  # the store's, left empty
    (tmp_path / ".ds.so101d-staging").write_text("in the way")
    before = {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()}
    r = cli("dataset", "check", str(ds), "--tag")
    assert r.returncode == 1 and "error: --tag: no tag was written" in r.stderr, (r.stdout, r.stderr)
    assert "FLAGGED" in r.stdout and "0 clean, 1 flagged" in r.stdout, r.stdout
    assert {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()} == before, "nothing changed"


def test_the_daemon_stopped_mid_recorded_replay_never_says_saved_falsely(bench: Bench, datasets):
    """SIGTERM to `so101d run` while a recorded replay plays (the last story: it ends the daemon).
    `so101d replay` says the daemon went away; the dataset then holds the replay's episode with
    its tag (origin replay, replay_of) or not at all, and loads."""
    _settle(bench)
    before = bench.episodes()
    proc = subprocess.Popen(
        [*SO101D, "replay", str(datasets["long"]), "--episode", "0", "--record", *bench.sock],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    try:
        assert wait_until(lambda: _phase(bench) == "playing" and (_req(bench, "replay.status")["frame"] or 0) >= 30, 60)
        bench.proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        print("so101d replay:", proc.returncode, out[-500:], err[-500:])
        assert proc.returncode != 0, (out, err)
        assert bench.proc.wait(60) == 0, bench.log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = bench.log.read_text()
    print(log[-2500:])
    from daemon.data.schema import read_episode_tags

    tags = read_episode_tags(bench.data)
    print({i: (t.origin, t.notes) for i, t in tags.items() if i >= before})
    if before in tags:
        t = tags[before]
        assert t.origin == "replay" and any(n.startswith("replay_of=") for n in t.notes), t
        assert any("the daemon is stopping" in n for n in t.notes), t.notes  # the report says it was cut off
    else:
        assert "its episode was not saved" in log, log[-3000:]
