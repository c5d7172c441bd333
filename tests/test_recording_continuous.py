"""Continuous recording (`so101d record --continuous`, LeRobot 0.6.1's ``lerobot-rollout
--strategy.type=sentry``): the daemon on the virtual bench records without a pause, saving an
episode and starting the next one every ``rotate_s``; stopping saves the last, partial one.

Real parts: the daemon in-process on the shared virtual bench (our Feetech driver on the STS3215
emulator), one virtual camera, the real control socket, the writer process and LeRobotDataset.
What is checked: every episode loads; laid end to end, the episodes' frames sit on one grid
(episode i+1's frame 0 is the grid point after episode i's last: none lost, none twice) and the
loop's cycle times of their states never go back; each rotated episode holds rotate_s * fps frames
(+-1); every tag says which part of which continuous recording it is and whether it was rotated.
Bad input is refused at the socket naming the field, and nothing starts.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from recording_support import load_dataset
from support import wait_for

from daemon.api.client import ControlClient
from daemon.apps.commands.record import continuous_session
from daemon.config.settings import ConfigError, config_from_dict
from daemon.data.recorder import Rotation, rotation_frames, seconds_to_fill_mb
from daemon.data.schema import read_episode_tags
from daemon.data.store import TIMING_DIR
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

FPS = 30
ROTATE_S = 1.0
REPO = "local/continuous"


def bench_config(bench, data, **recording):
    return config_from_dict(
        {
            **bench.config_sections(rate_hz=100.0),
            "recording": {
                "enabled": True,
                "dataset_root": str(data),
                "repo_id": REPO,
                "fps": FPS,
                "stop_timeout_s": 60,
                **recording,
            },
            "cameras": {"front": {"kind": "virtual", "width": 64, "height": 48, "fps": 30}},
        }
    )


@pytest.fixture
def daemon(virtual_bench):
    data = virtual_bench.root / "datasets"
    d = Daemon(
        bench_config(virtual_bench, data, rotate_s=0, rotate_mb=0),  # both off: the request must say
        FeetechLeader(str(virtual_bench.leader_port), reference_calibration("leader")),
        FeetechFollower(str(virtual_bench.follower_port), reference_calibration("follower")),
    )
    d.start()
    try:
        yield d, data / "local" / "continuous"
    finally:
        d.stop()


def start_when_ready(c: ControlClient, **fields) -> dict:
    """episode.start once the writer is ready (it loads LeRobot first: a refusal says so)."""
    answer: dict = {}

    def started() -> bool:
        nonlocal answer
        answer = c.call("episode.start", **fields)
        assert answer.get("ok") or "starting" in str(answer.get("error")), answer
        return bool(answer.get("ok"))

    wait_for(started, 120, "the recorder ready")
    return answer


def test_continuous_recording_rotates_episodes_with_no_frame_lost_or_repeated(daemon):
    d, root = daemon
    with ControlClient(d.socket_path, timeout_s=10) as c:
        # bad input first: refused naming the field, nothing started
        refused = [
            ({"continuous": True}, "rotate_s"),  # both limits off in [recording], none given
            ({"continuous": True, "rotate_s": 0}, "rotate_s"),
            ({"continuous": True, "rotate_s": -1.0}, "rotate_s"),
            ({"continuous": True, "rotate_mb": 0}, "rotate_mb"),
            ({"rotate_s": 1.0}, "rotate_s"),  # a rotation without continuous
        ]
        for fields, field in refused:
            wait_for(lambda: c.request("episode.status")["phase"] in ("idle", "starting"), 120, "idle")
            reply = c.call("episode.start", **fields)
            assert reply["ok"] is False and reply.get("field") == field, (fields, reply)
            assert field in reply["error"], reply
            assert c.request("episode.status")["phase"] != "recording", fields

        first = start_when_ready(c, continuous=True, rotate_s=ROTATE_S, task="watch the bench")
        assert first["continuous"]["frames_per_episode"] == round(ROTATE_S * FPS), first
        assert first["continuous"]["limit"] == "rotate_s", first
        # ~3.5 s: three rotations, then half an episode (waited for by counts, not by the clock)
        wait_for(
            lambda: (st := c.request("episode.status"))["continuous"]["rotated"] >= 3 and st["frames"] >= FPS // 2,
            60,
            "three rotations and half an episode",
        )
        saved = c.request("episode.save")  # = `so101d episode stop`: the partial one is saved
        assert saved["durable"] in (True, False) and saved["frames"] >= FPS // 2, saved
        st = c.request("episode.status")
        assert st["phase"] == "idle" and st["continuous"] is None, st
        wait_for(lambda: c.request("episode.status")["saves_pending"] == 0, 60, "every episode committed")
        assert c.request("episode.status")["episodes_in_dataset"] == 4
        assert not c.request("episode.status")["lost_episodes"]

    ds = load_dataset(root, REPO)
    assert ds.num_episodes == 4
    tags = read_episode_tags(root)
    assert sorted(tags) == [0, 1, 2, 3]
    conts = [tags[i].continuous for i in range(4)]
    assert [t["part"] for t in conts] == [0, 1, 2, 3]
    assert {t["session"] for t in conts} == {first["episode"]}
    assert [t["ended"] for t in conts] == ["rotate_s", "rotate_s", "rotate_s", "stop"]
    assert [t["rotated"] for t in conts] == [True, True, True, False]
    assert [tags[i].episode_number for i in range(4)] == [first["episode"] + i for i in range(4)]

    # frames per episode: the dataset's, the tag's, and the rotation's
    ep_frames = [int(ds.meta.episodes[i]["length"]) for i in range(4)]
    assert ep_frames == [tags[i].frames for i in range(4)] == [t["frames"] for t in conts]
    for n in ep_frames[:3]:
        assert abs(n - ROTATE_S * FPS) <= 1, ep_frames
    assert 0 < ep_frames[3] <= ROTATE_S * FPS + 1, ep_frames
    assert len(ds) == sum(ep_frames)

    # laid end to end: one grid, no frame lost or repeated at any boundary
    for a, b in itertools.pairwise(conts):
        assert b["first_frame"] == a["first_frame"] + a["frames"], conts
        assert b["grid_t0_s"] == pytest.approx(a["grid_t0_s"] + a["frames"] / FPS, abs=2e-6), conts
    grid_abs, state_s = [], []
    for i, t in enumerate(conts):
        timing = np.load(root / TIMING_DIR / f"episode_{i:06d}.npz")
        assert len(timing["grid_s"]) == ep_frames[i]
        np.testing.assert_allclose(timing["grid_s"], np.arange(ep_frames[i]) / FPS, atol=1e-9)
        grid_abs.extend(t["grid_t0_s"] + timing["grid_s"])
        state_s.extend(timing["state_s"])
    grid_abs_a, state_s_a = np.asarray(grid_abs), np.asarray(state_s)
    np.testing.assert_allclose(np.diff(grid_abs_a), 1.0 / FPS, atol=5e-6)  # every grid point once
    assert (np.diff(state_s_a) >= 0).all()  # the loop's cycles, in order across every boundary
    assert (state_s_a >= grid_abs_a - 1e-5).all()  # each frame's state is its grid point's or later
    # LeRobot's own view: per episode, frame_index 0.. and timestamps k / fps
    for i in range(4):
        lo = int(ds.meta.episodes[i]["dataset_from_index"])
        hi = int(ds.meta.episodes[i]["dataset_to_index"])
        frames = ds.hf_dataset.select(range(lo, hi))
        assert [int(x) for x in frames["frame_index"]] == list(range(ep_frames[i]))
        np.testing.assert_allclose([float(x) for x in frames["timestamp"]], np.arange(ep_frames[i]) / FPS, atol=1e-4)
    assert [int(x) for x in ds.hf_dataset["index"]] == list(range(len(ds)))


class _Keys:
    enabled = False

    def wait(self, seconds: float) -> str | None:
        return None


class _Client:
    """The CLI session against a scripted daemon: rotations appear, then Ctrl-C (the stop event)."""

    def __init__(self, stop) -> None:
        self.stop = stop
        self.sent: list[tuple[str, dict]] = []
        self.polls = 0

    def request(self, cmd: str, **fields) -> dict:
        self.sent.append((cmd, fields))
        if cmd == "episode.start":
            return {
                "ok": True,
                "episode": 7,
                "task": "t",
                "continuous": {"frames_per_episode": 30, "limit": "rotate_s"},
            }
        if cmd == "episode.status":
            self.polls += 1
            if self.polls == 3:
                self.stop.set()  # Ctrl-C while the third part records
            return {"ok": True, "phase": "recording", "episode": 7 + self.polls, "continuous": {"rotated": self.polls}}
        return {"ok": True, "episode": 10, "frames": 12}


def test_record_continuous_saves_the_last_partial_episode_on_ctrl_c():
    import threading

    stop = threading.Event()
    client = _Client(stop)
    said: list[str] = []
    n = continuous_session(client, "t", 1.0, None, _Keys(), stop, say=said.append)
    assert client.sent[0] == ("episode.start", {"continuous": True, "task": "t", "rotate_s": 1.0})
    assert client.sent[-1] == ("episode.save", {"success": None})
    assert n == 4 and "episode 10 saved" in said[-1], said


def test_rotation_by_size_uses_lerobots_sentry_estimate_and_bad_config_is_refused(tmp_path):
    # LeRobot 0.6.1 (rollout/strategies/core.py): 0.1 bit per pixel of the smallest camera
    assert seconds_to_fill_mb([(480, 640)], 30, 200) == pytest.approx(200 * 2**20 / (640 * 480 * 0.1 * 30 / 8))
    assert seconds_to_fill_mb([], 30, 200) == 300.0  # no video: its fallback
    assert rotation_frames(Rotation(rotate_s=10.0, rotate_mb=200.0), 30, [(480, 640)]) == (300, "rotate_s")
    assert rotation_frames(Rotation(rotate_mb=1.0), 30, [(48, 64)])[1] == "rotate_mb"
    for key, value in (("rotate_s", -1.0), ("rotate_mb", -5.0)):
        with pytest.raises(ConfigError, match=f"recording.{key}"):
            config_from_dict({"recording": {key: value}})
    cfg = config_from_dict({})
    assert cfg.recording.rotate_s == 0.0 and cfg.recording.rotate_mb == 200.0  # LeRobot's 200 MB


def test_a_running_policy_records_continuously_and_policy_stop_saves_the_last_part(
    virtual_bench, tmp_path, tmp_path_factory
):
    from policy_support import tiny_act

    ckpt = tiny_act(tmp_path_factory, {"front": (48, 64)})
    data = virtual_bench.root / "datasets"
    cfg = bench_config(virtual_bench, data, rotate_s=0, rotate_mb=0)
    cfg.policy.action_fps = 30.0
    cfg.policy.refill_below = 4
    cfg.policy.max_obs_age_s = 5.0
    cfg.policy.torch_threads = 2
    d = Daemon(
        cfg,
        FeetechLeader(str(virtual_bench.leader_port), reference_calibration("leader")),
        FeetechFollower(str(virtual_bench.follower_port), reference_calibration("follower")),
    )
    d.start()
    root = data / "local" / "continuous"
    try:
        # the client waits as long as the load may (a loaded machine takes its time)
        with ControlClient(d.socket_path, timeout_s=150) as c:
            assert c.request("policy.load", path=str(ckpt), wait_s=120)["state"] == "ready"
            wait_for(lambda: c.request("episode.status")["phase"] == "idle", 120, "the recorder ready")
            for fields, field in (
                ({"continuous": True}, "rotate_s"),
                ({"continuous": True, "rotate_mb": -1}, "rotate_mb"),
            ):
                reply = c.call("policy.start", **fields)
                assert reply["ok"] is False and reply.get("field") == field, reply
                assert c.request("policy.status")["driving"] is False
                assert c.request("episode.status")["phase"] == "idle"
            started = c.request("policy.start", continuous=True, rotate_s=ROTATE_S, task="sentry")
            assert started["episode"]["continuous"]["frames_per_episode"] == FPS, started
            wait_for(
                lambda: (st := c.request("episode.status"))["continuous"]["rotated"] >= 2 and st["frames"] >= 5,
                60,
                "two rotations under the policy",
            )
            c.request("policy.stop")  # saves the last, partial episode
            wait_for(lambda: c.request("episode.status")["saves_pending"] == 0, 60, "every episode committed")
            assert c.request("episode.status")["episodes_in_dataset"] == 3
    finally:
        d.stop()
    tags = read_episode_tags(root)
    conts = [tags[i].continuous for i in range(3)]
    assert {tags[i].origin for i in range(3)} == {"policy"}
    assert [t["ended"] for t in conts] == ["rotate_s", "rotate_s", "stop"]
    for a, b in itertools.pairwise(conts):
        assert b["first_frame"] == a["first_frame"] + a["frames"], conts
    assert load_dataset(root, REPO).num_episodes == 3


def test_so101d_record_continuous_stops_on_ctrl_c_saving_the_partial_episode(daemon):
    import os
    import signal
    import subprocess
    import sys

    d, root = daemon
    with ControlClient(d.socket_path, timeout_s=10) as c:
        wait_for(lambda: c.request("episode.status")["phase"] == "idle", 120, "the recorder ready")
        cmd = [sys.executable, "-m", "daemon.apps.cli", "record", "--no-keys", "--socket", str(d.socket_path)]
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        for bad, flag in ((["--continuous", "--rotate-s", "0"], "--rotate-s"), (["--rotate-mb", "5"], "--rotate-mb")):
            r = subprocess.run([*cmd, *bad], capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 1 and flag in r.stderr, (bad, r.stderr)
        assert c.request("episode.status")["phase"] == "idle"
        proc = subprocess.Popen(
            [*cmd, "--continuous", "--rotate-s", str(ROTATE_S), "--task", "ctrl-c"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            wait_for(
                lambda: (
                    ((st := c.request("episode.status"))["continuous"] or {}).get("rotated", 0) >= 1
                    and st["frames"] >= 5
                ),
                60,
                "a rotation under `so101d record --continuous`",
            )
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, (out, err)
        assert "the last, partial one" in out, out
        wait_for(lambda: c.request("episode.status")["saves_pending"] == 0, 60, "every episode committed")
        n = c.request("episode.status")["episodes_in_dataset"]
    tags = read_episode_tags(root)
    assert n >= 2 and len(tags) == n
    assert tags[n - 1].continuous["ended"] == "stop" and tags[n - 1].frames >= 5
    assert all(tags[i].continuous["ended"] == "rotate_s" for i in range(n - 1))
