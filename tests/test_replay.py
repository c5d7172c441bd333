"""`so101d replay` on the virtual bench, through the real daemon (`so101d run`).

One daemon for the file, recording into its own dataset. An episode is recorded there by teleop
(the emulated leader moved by a motion source), then replayed: the report's tracking error is
small, the replay is recorded as an episode of origin ``replay`` naming the source episode's
uid, and LeRobot loads the result. A synthetic "Mimic" episode (a 40 degree jump, a segment at
twice the STS3215's rated speed) is replayed under the step limit: no command step is larger than
the safety limit, and the report counts the shaped cycles. Bad inputs are refused before anything
moves: the emulated follower's goal registers are the same before and after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from dataset_support import FPS, Ep, make_dataset, smooth_motion
from recording_support import wait_until
from replay_support import SO101D, Bench, bench_daemon, cli
from virtual_bench_support import BENCH_POSE_UNITS

from daemon.api.client import ControlClient

RATE_HZ = 60.0
MAX_STEP_DEG = 10.0


class BenchMotion:
    """The leader moved by hand along the test datasets' smooth motion, around the bench pose."""

    def pose_at(self, t_s: float) -> np.ndarray:
        k = int(t_s * FPS) % (FPS * 60)
        m = smooth_motion(k + 1)[-1].astype(np.float64)
        return BENCH_POSE_UNITS + np.r_[m[:5] * 0.5, m[5] - 50.0] * np.r_[1, 1, 1, 1, 1, 0.6]


def _status(b: Bench) -> dict:
    with ControlClient(b.vb.socket_path, timeout_s=10) as c:
        return c.request("status")


def _record_teleop_episode(b: Bench, frames: int) -> int:
    """An episode recorded on the bench by teleop: the leader moves, the follower follows."""
    with ControlClient(b.vb.socket_path, timeout_s=10) as c:
        before = int(c.request("episode.status")["episodes_in_dataset"] or 0)
    b.vb.leader.set_motion(BenchMotion())
    try:
        wait_until(lambda: _status(b)["mode"] == "teleop", 30)
        r = cli("episode", "start", "--task", "wave", *b.sock)
        assert r.returncode == 0, r.stderr
        with ControlClient(b.vb.socket_path, timeout_s=10) as c:
            assert wait_until(lambda: c.request("episode.status")["frames"] >= frames, 60)
        r = cli("episode", "save", *b.sock)
        assert r.returncode == 0, r.stderr
    finally:
        b.vb.leader.set_pose_units(b.vb.leader.pose_units())
    with ControlClient(b.vb.socket_path, timeout_s=10) as c:
        assert wait_until(lambda: int(c.request("episode.status")["episodes_in_dataset"] or 0) > before, 60)
        return before


def test_replay_of_an_episode_recorded_on_the_bench_tracks_closely_and_is_recorded(bench: Bench):
    ep = _record_teleop_episode(bench, 90)
    r = cli("replay", str(bench.data), "--episode", str(ep), "--json", *bench.sock)
    assert r.returncode == 0, (r.stdout, r.stderr, bench.log.read_text()[-3000:])
    reply = json.loads(r.stdout.strip().splitlines()[-1])
    rep = reply["report"]
    assert reply["phase"] == "done" and rep["frames_played"] == rep["frames"] >= 90, reply
    p99 = max(e["p99"] for e in rep["error"])
    print(f"tracking p99 (worst joint) {p99:.2f} deg, lag {rep['lag_ms']} ms, shaped {rep['shaped_cycles']} cycles")
    assert p99 < 10.0, rep
    assert rep["joint_limited_cycles"] == 0, rep
    # the replay was recorded, tagged origin=replay with the source episode's uid
    with ControlClient(bench.vb.socket_path, timeout_s=10) as c:
        assert wait_until(lambda: int(c.request("episode.status")["episodes_in_dataset"] or 0) > ep + 1, 60)
    from daemon.data.schema import read_episode_tags

    tags = read_episode_tags(bench.data)
    src_uid = tags[ep].uid
    replayed = tags[max(tags)]
    assert replayed.origin == "replay", replayed
    assert any(n.startswith(f"replay_of={src_uid}") for n in replayed.notes), replayed.notes
    assert any("tracking p99" in n for n in replayed.notes), replayed.notes
    # LeRobot itself loads the dataset with the replayed episode in it
    code = (
        "from lerobot.datasets.lerobot_dataset import LeRobotDataset as D;"
        f"d=D('local/replayed', root={str(bench.data)!r});"
        "print(d.meta.total_episodes, d[len(d)-1]['action'].shape)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[0] == str(max(tags) + 1), out.stdout


RATED_DEG_S = 60.0 / 0.19  # 7.4 V STS3215, no load: 0.19 s per 60 degrees (about 316 deg/s)
JUMP_FRAME = 30
FAST_FRAMES = range(60, 66)


def _mimic_rows(state: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A generated episode near the bench pose: a 40 degree jump of the elbow at a subtask boundary
    (frame 30), then shoulder_pan at twice the rated speed for six frames (60..65)."""
    n = len(state)
    a = np.tile(BENCH_POSE_UNITS.astype(np.float32), (n, 1))
    a[:, 0] = -50.0
    a[JUMP_FRAME:, 2] += 40.0
    per_frame = 2 * RATED_DEG_S / FPS
    for k, f in enumerate(FAST_FRAMES, start=1):
        a[f:, 0] = -50.0 + k * per_frame
    return a.copy(), a


@pytest.fixture(scope="module")
def mimic(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mimic") / "mimic"
    return make_dataset(
        root,
        [Ep(frames=100, follower_kind="sim-leisaac", origin="import", source={"generated": True}, rows=_mimic_rows)],
    )


def test_a_mimic_episode_replays_under_the_step_limit_and_the_report_counts_shaped_cycles(bench: Bench, mimic: Path):
    r = cli("replay", str(mimic), "--episode", "0", "--json", "--no-record", *bench.sock)
    assert r.returncode == 0, (r.stdout, r.stderr)
    rep = json.loads(r.stdout.strip().splitlines()[-1])["report"]
    assert rep["step_limited_cycles"] >= 3, rep  # 40 deg at 10 deg per cycle
    assert any(JUMP_FRAME <= f <= JUMP_FRAME + 1 for f in rep["shaped_frames"]), rep
    steps = rep["max_command_step"]  # the largest change between two commands sent, per joint
    assert max(steps[:5]) <= MAX_STEP_DEG + 1e-6, steps
    assert rep["sim_gap"] and {e["joint"] for e in rep["sim_gap"]} >= {"elbow_flex.pos"}, rep


@pytest.fixture(scope="module")
def bad_datasets(tmp_path_factory) -> tuple[Path, Path]:
    """A dataset with two joints swapped in its features, and one declaring two arms."""
    tmp = tmp_path_factory.mktemp("bad")
    other = make_dataset(tmp / "swapped", [Ep(frames=20)])
    info = json.loads((other / "meta" / "info.json").read_text())
    for key in ("action", "observation.state"):
        names = info["features"][key]["names"]
        names[0], names[1] = names[1], names[0]
    (other / "meta" / "info.json").write_text(json.dumps(info))
    bi = make_dataset(tmp / "bi", [Ep(frames=20)])
    info = json.loads((bi / "meta" / "info.json").read_text())
    for key in ("action", "observation.state"):
        names = info["features"][key]["names"]
        info["features"][key]["names"] = [f"{s}_{n}" for s in ("left", "right") for n in names]
        info["features"][key]["shape"] = [12]
    (bi / "meta" / "info.json").write_text(json.dumps(info))
    return other, bi


def test_bad_inputs_are_refused_naming_why_and_the_arm_never_moves(
    bench: Bench, mimic: Path, bad_datasets: tuple[Path, Path], tmp_path
):
    vb = bench.vb
    wait_until(lambda: _status(bench)["mode"] in ("teleop", "hold"), 30)
    goals = vb.follower.goal_ticks()
    # out of range
    r = cli("replay", str(mimic), "--episode", "5", *bench.sock)
    assert r.returncode == 1 and "episode 5 is out of range" in r.stderr and "1 episodes" in r.stderr, r.stderr
    other, bi = bad_datasets
    # another joint order
    r = cli("replay", str(other), "--episode", "0", *bench.sock)
    assert r.returncode == 1 and "joint order" in r.stderr and "shoulder_lift.pos" in r.stderr, r.stderr
    # a bimanual episode on one arm
    r = cli("replay", str(bi), "--episode", "0", *bench.sock)
    assert r.returncode == 1 and "two-arm episode" in r.stderr and "one arm" in r.stderr, r.stderr
    # not a dataset at all
    r = cli("replay", str(tmp_path), "--episode", "0", *bench.sock)
    assert r.returncode == 1 and "no LeRobot dataset here" in r.stderr, r.stderr
    assert np.array_equal(vb.follower.goal_ticks(), goals), (goals, vb.follower.goal_ticks())
    with ControlClient(vb.socket_path, timeout_s=10) as c:
        assert c.request("replay.status")["phase"] in ("done", "stopped"), "the last replay's report stays"


def test_a_replay_does_not_take_the_arm_from_a_client_nor_play_into_an_episode_being_recorded(
    bench: Bench, mimic: Path
):
    vb = bench.vb
    wait_until(lambda: _status(bench)["mode"] in ("teleop", "hold"), 30)
    # an episode the operator is recording: a replay would play into it under its origin
    r = cli("episode", "start", "--task", "wave", *bench.sock)
    assert r.returncode == 0, r.stderr
    try:
        goals = vb.follower.goal_ticks()
        for flag in ("--no-record", "--record"):
            r = cli("replay", str(mimic), "--episode", "0", flag, *bench.sock)
            assert r.returncode == 1 and "an episode is being recorded" in r.stderr, (flag, r.stdout, r.stderr)
        assert np.array_equal(vb.follower.goal_ticks(), goals)
    finally:
        assert cli("episode", "discard", *bench.sock).returncode == 0
    # a client (the LeRobot plugin) holds the arm: the replay would cut it off mid-motion
    with ControlClient(vb.socket_path, timeout_s=10) as c:
        lease = c.request("arm.acquire", client="test client")["lease"]
        try:
            goals = vb.follower.goal_ticks()
            r = cli("replay", str(mimic), "--episode", "0", "--no-record", *bench.sock)
            assert r.returncode == 1 and "driven by 'client'" in r.stderr, (r.stdout, r.stderr)
            assert np.array_equal(vb.follower.goal_ticks(), goals)
        finally:
            c.request("arm.release", lease=lease)


@pytest.fixture(scope="module")
def long_episode(tmp_path_factory) -> Path:
    """Ten seconds of smooth motion near the bench pose: long enough to be stopped midway."""

    def near_bench(state: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = (BENCH_POSE_UNITS + (action - action[0]) * 0.5).astype(np.float32)
        return a.copy(), a

    return make_dataset(tmp_path_factory.mktemp("long") / "long", [Ep(frames=300, rows=near_bench)])


def _goals_still(b: Bench, cycles: int = 30) -> bool:
    """The follower's goal registers the same before and after ``cycles`` more control cycles:
    the arm is held."""
    first = b.vb.follower.goal_ticks()
    start = _status(b)["cycles"]
    assert wait_until(lambda: _status(b)["cycles"] >= start + cycles, 30)
    return np.array_equal(b.vb.follower.goal_ticks(), first)


def test_hold_and_ctrl_c_stop_a_replay_at_once_and_the_arm_holds(bench: Bench, long_episode: Path):
    vb = bench.vb
    with ControlClient(vb.socket_path, timeout_s=10) as c:
        # the operator's hold (the console's Hold button sends the same verb)
        c.request("replay.start", dataset=str(long_episode), episode=0, record=False)
        assert wait_until(lambda: c.request("replay.status")["phase"] == "playing", 60)
        assert wait_until(lambda: c.request("replay.status")["frame"] >= 15, 30)
        assert c.request("hold")["mode"] == "hold"
        assert wait_until(lambda: c.request("replay.status").get("report") is not None, 10)
        st = c.request("replay.status")
        assert st["phase"] == "stopped" and st["report"]["frames_played"] < 300, st
        assert st["report"]["outcome"].startswith("stopped: the arm left tracking: hold"), st["report"]
        assert c.request("status")["mode"] == "hold"
        assert wait_until(lambda: _goals_still(bench), 10), "the arm holds"
    # Ctrl-C of `so101d replay`
    proc = subprocess.Popen(
        [*SO101D, "replay", str(long_episode), "--episode", "0", "--no-record", *bench.sock],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    try:
        with ControlClient(vb.socket_path, timeout_s=10) as c:

            def playing_midway() -> bool:
                st = c.request("replay.status")  # the last replay's report stays until this one starts
                return st["phase"] == "playing" and (st.get("frame") or 0) >= 15

            assert wait_until(playing_midway, 60)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 1, (out, err)
            assert "so101d: replay (Ctrl-C): replay stopped: holding" in err, err
            assert "replay stopped: stopped by the operator" in out, out
            assert c.request("status")["mode"] == "hold"
            assert wait_until(lambda: _goals_still(bench), 10), "the arm holds"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_stop_sent_while_the_start_is_on_its_way_ends_that_replay_whichever_arrives_first(
    bench: Bench, long_episode: Path
):
    """Ctrl-C of `so101d replay` before the start was answered sends replay.stop, naming the
    start's ticket, on a second connection. The two run on different workers, so either may come
    first: the stop ends the replay once it started, or the start is refused when it comes. The
    replay never plays on after a stop was answered."""
    import socket

    vb = bench.vb
    ticket = uuid.uuid4().hex
    starting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    starting.settimeout(30)
    try:
        starting.connect(str(vb.socket_path))
        start = {"cmd": "replay.start", "dataset": str(long_episode), "episode": 0, "record": False, "ticket": ticket}
        starting.sendall((json.dumps(start) + "\n").encode())
        with ControlClient(vb.socket_path, timeout_s=30) as c:
            stopped = c.request("replay.stop", ticket=ticket)
            started = json.loads(starting.makefile("rb").readline())
            if stopped["message"] == "replay stopped: holding":
                assert started.get("ok"), (stopped, started)
                assert wait_until(lambda: c.request("replay.status").get("report") is not None, 10)
                assert c.request("replay.status")["phase"] == "stopped"
            else:
                assert stopped["message"] == "replay canceled before it started: the arm was not moved", stopped
                assert not started.get("ok") and "its replay.stop came first" in started["error"], started
            assert c.request("replay.status")["phase"] != "aligning"
            assert c.request("status")["mode"] == "hold"
            assert wait_until(lambda: _goals_still(bench), 10), "the arm holds"
    finally:
        starting.close()


def test_a_start_whose_stop_came_first_is_refused_and_the_arm_does_not_move(bench: Bench, long_episode: Path):
    """The order the race above may take, made certain: the stop with the ticket, then its start."""
    vb = bench.vb
    ticket = uuid.uuid4().hex
    with ControlClient(vb.socket_path, timeout_s=30) as c:
        before = c.request("replay.status")
        stopped = c.request("replay.stop", ticket=ticket)
        assert stopped["ok"] and "canceled before it started" in stopped["message"], stopped
        goals = vb.follower.goal_ticks()
        late = c.call("replay.start", dataset=str(long_episode), episode=0, record=False, ticket=ticket)
        assert not late["ok"] and late["error"].startswith("replay canceled: its replay.stop came first"), late
        assert c.request("replay.status") == before, "nothing started"
        assert wait_until(lambda: _goals_still(bench), 10) and np.array_equal(vb.follower.goal_ticks(), goals)
        # the ticket was used up: the same start again is a fresh start (and is stopped with it)
        again = c.call("replay.start", dataset=str(long_episode), episode=0, record=False, ticket=ticket)
        assert again["ok"], again
        assert c.request("replay.stop", ticket=ticket)["message"] == "replay stopped: holding"
        assert wait_until(lambda: c.request("replay.status").get("report") is not None, 10)


@pytest.fixture(scope="module")
def bench(mimic: Path, long_episode: Path, bad_datasets: tuple[Path, Path]) -> Iterator[Bench]:
    """The daemon on the virtual bench. The datasets are written first: writing them in this
    process (video encoding, LeRobot) while the emulated servos answer from it starves them."""
    with bench_daemon("local/replayed", RATE_HZ, extra_toml=f"[safety]\nmax_step_deg = {MAX_STEP_DEG}\n") as b:
        yield b
