"""Corrections inside a policy episode (DAgger, as LeRobot 0.6.1's lerobot-rollout records it),
end to end on the virtual bench: a tiny ACT drives the emulated follower with recording on;
`policy correct` hands the arm to the leader (brought over first), `policy resume` back to the
policy, twice; the saved episode carries LeRobot's `intervention` column, True exactly on the
frames the cycle record says the leader drove; no command step at a switch exceeds the limit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from pedal_support import PtyOutput, VirtualPedal
from policy_support import tiny_act
from recording_support import train_tiny_act
from support import wait_for
from virtual_bench_support import VirtualBench

from daemon.api.client import ControlClient
from daemon.config.settings import config_from_dict
from daemon.data.interventions import INTERVENTION_KEY, intervention_feature, intervention_runs, is_intervention
from daemon.service.attach_policy import attach_policy
from daemon.service.attach_recording import attach_recorder
from daemon.service.daemon import Daemon
from drivers.cameras import CameraConfig as CamCfg
from drivers.cameras import VirtualArmCamera
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

pytestmark = pytest.mark.e2e  # a policy worker, the dataset writer and LeRobotDataset

H, W = 48, 64
POSE = np.array([0.0, -20.0, 20.0, 10.0, 0.0, 40.0])
MAX_STEP_DEG = 2.0
MAX_STEP_GRIPPER_PCT = 4.0


def test_intervention_is_read_from_the_source_record() -> None:
    assert is_intervention("follower=leader") and not is_intervention("follower=policy")
    assert is_intervention("left=policy,right=leader") and not is_intervention("left=policy,right=policy")
    assert not is_intervention("")
    srcs = ["follower=policy"] * 3 + ["follower=leader"] * 2 + ["follower=policy"] + ["follower=leader"] * 4
    assert intervention_runs(srcs, 10) == (2, 0.6)
    assert intervention_runs([], 30) == (0, 0.0)
    # LeRobot's own declaration (lerobot/rollout/context.py, DAgger strategy)
    assert intervention_feature() == {"dtype": "bool", "shape": (1,), "names": None}


class Commands:
    """Every cycle's command and the source that drove it (what the safety layer sent)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, np.ndarray]] = []
        self.lock = threading.Lock()

    def on_record(self, record) -> None:
        arm = record.arms[0]
        with self.lock:
            self.rows.append((arm.source, arm.action_units.copy()))

    def count(self, source: str) -> int:
        with self.lock:
            return sum(1 for s, _ in self.rows if s == source)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_act(tmp_path_factory, {"front": (H, W)})


def make_daemon(bench: VirtualBench, corrections: str = "in_episode", record: bool = True, pedal: Path | None = None):
    root = bench.root
    bench.leader.set_pose_units(POSE)
    bench.follower.set_pose_units(POSE)
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "control": {"rate_hz": 50.0},
            "safety": {
                # alignment (at most two periods' worth a cycle) stays inside the tracking step limit
                "align_speed_deg_s": 40.0,
                "align_gripper_speed_pct_s": 80.0,
                "max_step_deg": MAX_STEP_DEG,
                "max_step_gripper_pct": MAX_STEP_GRIPPER_PCT,
            },
            "cameras": {"front": {"kind": "virtual", "width": W, "height": H, "fps": 30}},
            "recording": {"enabled": record, "dataset_root": str(root / "datasets"), "repo_id": "eval/dagger"},
            "pedal": {"device": str(pedal or "")},
            "policy": {
                "action_fps": 30.0,
                "refill_below": 4,
                "max_obs_age_s": 5.0,
                "torch_threads": 1,
                "corrections": corrections,
            },
        }
    )
    cam = VirtualArmCamera(CamCfg(name="front", width=W, height=H, fps=30))
    daemon = Daemon(
        cfg,
        FeetechLeader(str(root / "leader"), reference_calibration("leader")),
        FeetechFollower(str(root / "follower"), reference_calibration("follower")),
    )
    commands = Commands()
    daemon.loop.add_hook(commands)
    recorder = attach_recorder(daemon, cameras=[cam]) if record else None
    if recorder is None:  # the recorder starts its cameras; without one, the policy's camera is ours to start
        cam.start()
        daemon.after_stop.append(cam.stop)
    daemon.recorder = recorder  # the daemon's start() then uses this one (our virtual camera)
    ctl = attach_policy(daemon, cameras={"front": cam}, recorder=recorder)
    daemon.start()
    return daemon, ctl, recorder, commands


def refused(c: ControlClient, verb: str, words: str) -> None:
    r = c.call(verb)
    assert r["ok"] is False and words in r["error"], r


def correct_and_drive(c: ControlClient, ctl, daemon, commands: Commands, frames: int) -> None:
    """`policy correct`; wait until the leader drives; then ``frames`` cycles of it."""
    r = c.request("policy.correct")
    assert "correction" in r["message"] and r["phase"] in ("torque_on", "moving"), r
    refused(c, "policy.correct", "already correcting")
    wait_for(lambda: ctl.correction is None or ctl.correction.phase != "taking_over", 30, "the take-over")
    assert ctl.correction.phase == "operator", ctl.correction
    n = commands.count("leader")
    wait_for(lambda: commands.count("leader") >= n + frames, 30, f"{frames} cycles driven by the leader")


def resume_and_drive(c: ControlClient, ctl, daemon, commands: Commands, chunks: int) -> None:
    results = ctl.source.results
    asked_s = time.monotonic()
    r = c.request("policy.resume")
    answered_s = time.monotonic()
    assert "policy aligns from the measured pose" in r["message"], r
    assert ctl.correction is None and not ctl.source.paused
    refused(c, "policy.resume", "not in a correction")
    wait_for(lambda: ctl.source.results >= results + chunks, 30, f"{chunks} chunks after the resume")
    wait_for(lambda: daemon.loop.state.mode == "policy", 30, f"policy mode (now {daemon.loop.state.mode})")
    # every chunk the loop took since is computed from an observation after the resume: nothing
    # asked for before it (the pose the operator has moved the arm away from) is played
    taken = [(obs_s, usable_s) for _req, obs_s, usable_s, _n, _kept in list(ctl.source.chunk_log)]
    after = [obs_s for obs_s, usable_s in taken if usable_s > answered_s]
    assert len(after) >= 1 and min(after) >= asked_s, (asked_s, after)


def check_steps(commands: Commands) -> None:
    """No command step larger than the safety layer's limit, at a switch or anywhere."""
    with commands.lock:
        acts = np.array([a for _, a in commands.rows])
    steps = np.abs(np.diff(acts, axis=0))
    assert steps[:, :5].max() <= MAX_STEP_DEG + 1e-6, steps[:, :5].max(axis=0)
    assert steps[:, 5].max() <= MAX_STEP_GRIPPER_PCT + 1e-6, steps[:, 5].max()


def test_correct_resume_twice_inside_one_recorded_policy_episode(
    virtual_bench: VirtualBench, ckpt: Path, tmp_path: Path
) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    daemon, ctl, recorder, commands = make_daemon(virtual_bench)
    root = virtual_bench.root
    loop = daemon.loop
    try:
        wait_for(lambda: loop.follower_link.connected and loop.measured is not None, 15, "follower connected")
        recorder.wait_ready(120)
        with ControlClient(str(root / "c.sock"), timeout_s=100) as c:
            # refused, each with its reason, and nothing changed
            refused(c, "policy.correct", "no policy loaded")
            refused(c, "policy.resume", "no policy loaded")
            assert c.request("policy.load", path=str(ckpt), wait_s=90)["state"] == "ready"
            mode = loop.intent
            refused(c, "policy.correct", "no policy is running")
            refused(c, "policy.resume", "not in a correction")
            assert loop.intent == mode and ctl.correction is None

            r = c.request("policy.start", task="reach")
            assert r["episode"] is not None, r
            wait_for(lambda: ctl.source.results >= 3, 60, "three chunks")
            wait_for(lambda: loop.state.mode == "policy", 30, f"policy mode (now {loop.state.mode})")
            correct_and_drive(c, ctl, daemon, commands, 25)
            refused(c, "policy.takeover", "correction is in progress")
            st = c.request("policy.status")
            assert st["correction"]["phase"] == "operator" and st["corrections"] == 1 and not st["driving"]
            resume_and_drive(c, ctl, daemon, commands, 2)
            assert ctl.source.chunks_discarded >= 0
            correct_and_drive(c, ctl, daemon, commands, 20)
            resume_and_drive(c, ctl, daemon, commands, 2)
            r = c.request("policy.stop", success=True)
            assert r["episode"] is not None, r
            assert recorder.wait_saved(90)
    finally:
        daemon.stop()
    check_steps(commands)

    ds_root = root / "datasets" / "eval" / "dagger"
    info = json.loads((ds_root / "meta" / "info.json").read_text())
    assert info["features"][INTERVENTION_KEY] == {"dtype": "bool", "shape": [1], "names": None}
    ds = LeRobotDataset("eval/dagger", root=ds_root)
    assert ds.features[INTERVENTION_KEY] == {"dtype": "bool", "shape": (1,), "names": None}
    assert ds.num_episodes == 1
    cols = ds.hf_dataset.with_format(None)
    flags = np.array([bool(v) for v in cols[INTERVENTION_KEY]])
    sources = list(cols["so101d.source"])
    assert set(sources) == {"follower=policy", "follower=leader"}, set(sources)
    # True exactly on the frames the loop's record says the leader drove: two runs
    assert np.array_equal(flags, np.array([s == "follower=leader" for s in sources]))
    count, seconds = intervention_runs(sources, info["fps"])
    assert count == 2 and seconds >= 0.8, (count, seconds)  # 45 cycles at 50 Hz, at least
    assert not flags[0] and not flags[-1]  # the episode starts and ends with the policy
    tag = json.loads(cols["so101d.episode"][0])
    assert tag["interventions"] == 2 and tag["intervention_s"] == seconds and tag["origin"] == "policy", tag
    item = ds[int(np.argmax(flags))]
    assert bool(item[INTERVENTION_KEY]) is True
    if importlib.util.find_spec("accelerate") is not None:  # lerobot-train needs it (lerobot[training])
        train_tiny_act("eval/dagger", ds_root, tmp_path / "train", 1, 1)


def test_corrections_only_saves_each_correction_as_an_episode(virtual_bench: VirtualBench, ckpt: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    daemon, ctl, recorder, commands = make_daemon(virtual_bench, corrections="episodes")
    root = virtual_bench.root
    loop = daemon.loop
    try:
        wait_for(lambda: loop.follower_link.connected and loop.measured is not None, 15, "follower connected")
        recorder.wait_ready(120)
        with ControlClient(str(root / "c.sock"), timeout_s=100) as c:
            assert c.request("policy.load", path=str(ckpt), wait_s=90)["state"] == "ready"
            r = c.request("policy.start", task="reach")
            assert r["episode"] is None, r  # the policy's own driving is not recorded
            wait_for(lambda: ctl.source.results >= 3, 60, "three chunks")
            wait_for(lambda: loop.state.mode == "policy", 30, f"policy mode (now {loop.state.mode})")
            for _ in range(2):
                correct_and_drive(c, ctl, daemon, commands, 20)
                wait_for(lambda: ctl.episode_open, 10, "the correction's episode")
                r = c.request("policy.resume")
                assert r["episode"] is not None, r  # the correction saved
                wait_for(lambda: loop.state.mode == "policy", 30, "policy mode after the resume")
            # a run may end inside a correction: `policy stop` saves it and holds
            correct_and_drive(c, ctl, daemon, commands, 10)
            wait_for(lambda: ctl.episode_open, 10, "the third correction's episode")
            r = c.request("policy.stop")
            assert r["episode"] is not None and r["mode"] == "hold", r
            assert ctl.correction is None and not any(bool(s.torque_enabled) for s in virtual_bench.leader.servos)
            refused(c, "policy.resume", "not in a correction")
            assert recorder.wait_saved(90)
    finally:
        daemon.stop()
    check_steps(commands)
    ds_root = root / "datasets" / "eval" / "dagger"
    ds = LeRobotDataset("eval/dagger", root=ds_root)
    assert ds.num_episodes == 3
    cols = ds.hf_dataset.with_format(None)
    assert all(bool(v) for v in cols[INTERVENTION_KEY])  # every frame the operator's
    assert set(cols["so101d.source"]) == {"follower=leader"}


def test_the_operator_corrects_with_the_pedal_and_with_the_keys_of_policy_start(
    virtual_bench: VirtualBench, ckpt: Path
) -> None:
    """LeRobot's DAgger inputs on so101d: the pedal's KEY_B and the terminal's space each toggle
    correct / resume (the same verbs as `so101d policy correct`), enter stops the policy."""
    pedal = VirtualPedal(virtual_bench.root)
    pedal.plug()
    daemon, ctl, _recorder, commands = make_daemon(virtual_bench, record=False, pedal=pedal.path)
    loop = daemon.loop
    sock = str(virtual_bench.root / "c.sock")
    master, slave = pty.openpty()
    cli = None
    try:
        pedal.connect()
        wait_for(lambda: loop.follower_link.connected and loop.measured is not None, 15, "follower connected")
        with ControlClient(sock, timeout_s=100) as c:
            assert c.request("policy.load", path=str(ckpt), wait_s=90)["state"] == "ready"
            cli = subprocess.Popen(
                [sys.executable, "-m", "daemon.apps.cli", "policy", "start", "--keys", "--no-record", "--socket", sock],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=dict(os.environ, HF_HUB_OFFLINE="1"),
            )
            out = PtyOutput(master)
            out.wait_for("space/tab correct / resume", 60)
            wait_for(lambda: ctl.source.results >= 2, 60, "two chunks")
            wait_for(lambda: loop.state.mode == "policy", 30, f"policy mode (now {loop.state.mode})")

            pedal.press("KEY_B")  # the pedal: correct
            wait_for(lambda: ctl.correction is not None, 10, "the pedal's correction")
            wait_for(lambda: ctl.correction.phase == "operator", 30, "the take-over")
            n = commands.count("leader")
            wait_for(lambda: commands.count("leader") >= n + 10, 30, "10 cycles driven by the leader")
            st = c.request("status")["pedal"]
            assert st["last_verb"] == "policy.correct" and st["presses"] == 1, st

            os.write(master, b" ")  # the terminal: resume
            out.wait_for("policy aligns from the measured pose", 20)
            wait_for(lambda: ctl.correction is None, 10, "resumed")
            results = ctl.source.results
            wait_for(lambda: ctl.source.results >= results + 2, 30, "two chunks after the resume")

            os.write(master, b"\t")  # the terminal: correct again
            wait_for(lambda: ctl.correction is not None, 10, "the terminal's correction")
            wait_for(lambda: ctl.correction is None or ctl.correction.phase == "operator", 30, "the take-over")
            pedal.press("KEY_A")  # the pedal: resume (pause_resume toggles it too)
            wait_for(lambda: c.request("status")["pedal"]["presses"] == 2, 10, "the second press read")
            st = c.request("status")["pedal"]
            assert st["last_verb"] == "policy.resume", st
            wait_for(lambda: ctl.correction is None, 10, f"resumed by the pedal ({st['last_reply']})")
            assert ctl.corrections == 2

            os.write(master, b"\r")  # stop (success)
            assert cli.wait(30) == 0, out.text
            wait_for(lambda: loop.intent == "hold", 10, "hold after the stop")
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait()
        os.close(master)
        os.close(slave)
        pedal.unplug()
        daemon.stop()
    check_steps(commands)
