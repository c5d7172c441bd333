"""The LeIsaac follower's logic, driven through SimFollower with LeIsaac-contract fake envs.

The envs (``tests/fixtures/leisaac_env.py``) mirror Isaac Lab's ``ManagerBasedRLEnv.step`` and
LeIsaac's ``enhance/envs/direct_rl_env.py`` + ``tasks/template/direct/single_arm_env.py``
``_get_dones``: both reset the scene *inside* ``step`` when a termination fires, unless the task
is configured the way LeIsaac's ``teleop_se3_agent.py`` configures it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fixtures.isaaclab_scene import REST_POSE_RAD
from fixtures.leisaac_env import SUCCESS_PAN_RAD, FakeDirectRLEnv, FakeManagerBasedRLEnv, H, W
from fixtures.leisaac_install import LeisaacInstall, make_leisaac_install
from fixtures.leisaac_mapping import leisaac_leader_to_sim_rad
from hypothesis import given, settings
from hypothesis import strategies as st
from support import poll_until

from calibration.calibration_file import ArmCalibration
from calibration.conventions import (
    JOINT_NAMES,
    leader_units_to_leisaac_sim_units,
    map_leader_to_sim,
    normalized_to_sim_rad,
    ticks_to_units,
    units_to_sim_rad,
    units_to_ticks,
)
from drivers.arm_interface import FollowerArm
from drivers.sim_follower import SimFollower
from sim_bridge.leisaac_follower import (
    LeisaacAssetsMissing,
    LeisaacBridge,
    LeisaacBridgeConfig,
    build_parser,
    check_step_hz,
    image_to_uint8,
    locate_leisaac_assets,
    prepare_env_cfg,
    success_fn_for,
    task_cameras,
)
from sim_bridge.server import SimServerEndpoint

STEP_HZ = 120.0
CFG = LeisaacBridgeConfig(step_hz=STEP_HZ, publish_hz=30.0, daemon_staleness_s=0.1)


def serve(env, prepare: bool = True):
    """The bridge as main() builds it: task configured like LeIsaac's teleop, success term ours."""
    success_term = (
        prepare_env_cfg(env.cfg) if prepare else getattr(getattr(env.cfg, "terminations", None), "success", None)
    )
    ep = SimServerEndpoint(
        "tcp://127.0.0.1:0",
        backend="leisaac:fake",
        cameras=[{"name": "front", "width": W, "height": H}, {"name": "wrist", "width": W, "height": H}],
    )
    ep.open()
    b = LeisaacBridge(env, ep, config=CFG, success_fn=success_fn_for(env, success_term))
    t = threading.Thread(target=b.run, daemon=True)
    t.start()
    return b, t


@pytest.fixture
def bridge():
    env = FakeManagerBasedRLEnv()
    b, t = serve(env)
    yield b, env
    b.stop()
    t.join(5)
    b.ep.close()


def max_target_step_deg(actions: list[np.ndarray]) -> float:
    a = np.rad2deg(np.concatenate(actions, 0))
    return float(np.max(np.abs(np.diff(a, axis=0)))) if len(a) > 1 else 0.0


def test_isaac_is_not_imported_outside_main():
    assert "isaaclab" not in sys.modules and "leisaac" not in sys.modules
    args = build_parser().parse_args([])
    assert args.task == "LeIsaac-SO101-PickOrange-v0"


def test_targets_become_leisaac_radians_and_state_comes_back(bridge):
    b, env = bridge
    f = SimFollower(b.ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        f.connect()
        assert isinstance(f, FollowerArm)
        # an env made without cfg.seed is reset with a fresh seed: every episode has one to replay
        assert len(env.reset_seeds) == 1 and isinstance(env.reset_seeds[0], int)
        assert env.cfg.terminations.success is None
        goal = np.array([20.0, -30.0, 45.0, 10.0, -60.0, 80.0])
        assert poll_until(lambda: (f.write_goals(goal), np.allclose(f.read_joints(), goal, atol=0.05))[1], 20)
        expected_rad = units_to_sim_rad(goal)
        np.testing.assert_allclose(env.actions_seen[-1][0], expected_rad, atol=1e-5)
        # gripper 80 (LeRobot units) is LeIsaac's own normalised map of the gripper, exactly
        np.testing.assert_allclose(expected_rad[5], normalized_to_sim_rad(np.array([0, 0, 0, 0, 0, 80.0]))[5])
        cams = f.cameras()
        assert set(cams) == {"front", "wrist"}
        assert poll_until(lambda: all(c.latest_frame() is not None for c in cams.values()))
        fr = cams["front"].latest_frame().pixels
        assert fr.shape == (H, W, 3) and fr[0, 0, 1] == 200 and fr[-1, 0, 1] == 0
    finally:
        f.close()


def test_success_reset_and_hold(bridge):
    b, env = bridge
    f = SimFollower(b.ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        f.connect()
        seq = f.reset_episode(seed=7, timeout_s=5)
        assert env.reset_seeds[-1] == 7
        np.testing.assert_allclose(f.read_joints(), b.joint_units(), atol=1e-4)
        start = f.start_episode()
        f.wait_event("started", start, 5)
        pan_deg_for_success = np.rad2deg(SUCCESS_PAN_RAD) + 10.0  # LeRobot degrees = LeIsaac angle for pan
        goal = np.array([pan_deg_for_success, 0.0, 0.0, 0.0, 0.0, 50.0])
        assert poll_until(lambda: (f.write_goals(goal), any(e.event == "success" for e in list(f._events)))[1])
        ev = f.wait_event("success", start, 1)
        assert ev.seq == start and seq < start
        # success is reported once per episode
        time.sleep(0.2)
        assert sum(e.event == "success" for e in f.events()) == 1
        assert env.resets.count("auto") == 0, "teleop configuration: the scene never resets by itself"

        # the daemon goes quiet mid-move: the bridge holds the measured pose instead of the target
        far = np.array([-50.0, 0.0, 0.0, 0.0, 0.0, 50.0])
        f.write_goals(far)
        time.sleep(0.01)
        f.close()
        assert poll_until(lambda: b._daemon_was_stale, 5)
        time.sleep(0.1)
        held = env.actions_seen[-1][0].copy()
        np.testing.assert_allclose(held, env.scene.joint_pos[0], atol=1e-3)
        assert abs(held[0] - units_to_sim_rad(far)[0]) > 0.3, "held where it was, not at the last target"
    finally:
        f.close()


def test_image_conversion():
    f = np.full((1, 4, 5, 4), 0.5, np.float32)  # float RGBA in 0..1
    out = image_to_uint8(f)
    assert out.shape == (4, 5, 3) and out.dtype == np.uint8 and out[0, 0, 0] == 127


def test_workstation_script_needs_only_numpy_zmq_msgpack():
    """On the GPU workstation it runs in LeIsaac's Python with our source tree on the path: it may
    import our lower layers (the wire protocol in drivers/, the joint table in calibration/) but no
    third-party package beyond numpy, pyzmq and msgpack, and nothing of the daemon."""
    import subprocess

    code = (
        "import json, sys, sim_bridge.leisaac_follower; "
        "tops = {m.split('.')[0] for m in sys.modules}; "
        "print(json.dumps(sorted(t for t in tops if t not in sys.stdlib_module_names and not t.startswith('_'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]),
    )
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    allowed = {"sim_bridge", "drivers", "calibration", "numpy", "zmq", "msgpack", "cython_runtime"}
    assert loaded - allowed == set(), f"the workstation script pulls in {sorted(loaded - allowed)}"
    assert {"numpy", "zmq", "msgpack"} <= loaded  # the check sees real imports, not an empty list


def drive_to_success(f: SimFollower, b: LeisaacBridge) -> int:
    seq = f.start_episode()
    f.wait_event("started", seq, 5)
    goal = np.array([np.rad2deg(SUCCESS_PAN_RAD) + 15.0, 0.0, 0.0, 0.0, 0.0, 50.0])
    assert poll_until(lambda: (f.write_goals(goal), any(e.event == "success" for e in list(f._events)))[1], 30)
    return seq


def test_direct_task_configured_like_leisaac_teleop_keeps_success_and_its_scene():
    """single_arm_env._get_dones: with manual_terminate the Direct task never resets by itself;
    success comes from _check_success, read by us after the step."""
    env = FakeDirectRLEnv()
    b, t = serve(env)
    f = SimFollower(b.ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        assert env.cfg.manual_terminate is True and env.cfg.never_time_out is True
        f.connect()
        seq = drive_to_success(f, b)
        assert f.wait_event("success", seq, 1).seq == seq
        assert env.resets.count("auto") == 0
        assert env.scene.joint_pos[0, 0] > SUCCESS_PAN_RAD  # the scene that succeeded is still there
    finally:
        f.close()
        b.stop()
        t.join(5)
        b.ep.close()


def test_direct_task_that_resets_inside_step_keeps_the_success_and_never_jumps():
    """A Direct task left as Isaac Lab builds it (manual_terminate False): _get_dones returns
    _check_success() and step resets the scene. The success (computed before the reset) still
    reaches the daemon, and the arm goes back toward the daemon's target at the re-align speed."""
    env = FakeDirectRLEnv()
    b, t = serve(env, prepare=False)
    f = SimFollower(b.ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        f.connect()
        seq = drive_to_success(f, b)
        assert f.wait_event("success", seq, 1).seq == seq
        assert poll_until(lambda: "auto" in env.resets, 5)
        n_reset = env.auto_reset_at[0]  # actions_seen index of the step that reset the scene
        # the daemon keeps commanding a far goal; after the reset the arm must crawl back to it
        goal = np.array([40.0, 0, 0, 0, 0, 50.0])
        assert poll_until(lambda: (f.write_goals(goal), len(env.actions_seen) > n_reset + 60)[1], 10)
        after = env.actions_seen[n_reset:]
        limit_deg = CFG.realign_speed_deg_s / STEP_HZ
        # first target after the reset: one re-align step from the reset pose, not the old target
        assert max_target_step_deg([REST_POSE_RAD.astype(np.float32), after[0]]) <= limit_deg + 1e-4
        assert max_target_step_deg(after) <= limit_deg + 1e-4, "a target jumped after the reset"
        assert abs(np.rad2deg(after[-1][0, 0])) < 40.0, "still re-aligning, not at the goal in one step"
    finally:
        f.close()
        b.stop()
        t.join(5)
        b.ep.close()


def test_a_daemon_reset_realigns_slowly_too(bridge):
    b, env = bridge
    f = SimFollower(b.ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        f.connect()
        far = np.array([60.0, -30.0, 20.0, 0.0, 0.0, 80.0])
        assert poll_until(lambda: (f.write_goals(far), np.allclose(f.read_joints(), far, atol=0.5))[1], 30)
        f.reset_episode(timeout_s=5)  # the arm is at rest now, the daemon's target still far
        n = env.reset_at[-1]
        assert poll_until(lambda: (f.write_goals(far), len(env.actions_seen) > n + 30)[1], 10)
        after = [REST_POSE_RAD.astype(np.float32)] + env.actions_seen[n:]  # from the reset pose on
        assert max_target_step_deg(after) <= CFG.realign_speed_deg_s / STEP_HZ + 1e-4
        assert b.realigning, "60 degrees at 45 deg/s take more than 30 steps at 120 Hz"
    finally:
        f.close()


def test_prepare_env_cfg_matches_leisaac_teleop():
    manager = SimpleNamespace(terminations=SimpleNamespace(success="S", time_out="T"))
    assert prepare_env_cfg(manager) == "S"
    assert manager.terminations.success is None and manager.terminations.time_out is None
    direct = FakeDirectRLEnv().cfg
    assert prepare_env_cfg(direct) is None
    assert direct.manual_terminate and direct.never_time_out and not direct.return_success_status


# ---------------------------------------------------------------------------------------------
# [follower] sim_mapping = "leisaac": LeIsaac's own leader map
# ---------------------------------------------------------------------------------------------


@st.composite
def calibration_and_ticks(draw):
    cal, ticks = {}, {}
    for i, name in enumerate(JOINT_NAMES):
        lo = draw(st.integers(0, 4000))
        hi = draw(st.integers(lo + 20, 4095))
        cal[name] = {
            "id": i + 1,
            "drive_mode": draw(st.sampled_from([0, 0, 1])),
            "homing_offset": 0,
            "range_min": lo,
            "range_max": hi,
        }
        ticks[name] = draw(st.integers(max(0, lo - 200), min(4095, hi + 200)))  # out of range too: clamped
    return cal, ticks


@settings(max_examples=400, deadline=None)
@given(calibration_and_ticks())
def test_leisaac_mapping_equals_leisaacs_formula(case):
    """The daemon reads the leader in LeRobot degrees; mapped, it is LeIsaac's joint target to 1e-6 rad."""
    cal_json, ticks = case
    cal = ArmCalibration.from_json_dict(cal_json)
    leader_units = ticks_to_units(np.array([ticks[n] for n in JOINT_NAMES]), cal)  # what the daemon's leader gives
    ours_rad = units_to_sim_rad(leader_units_to_leisaac_sim_units(leader_units, cal))
    np.testing.assert_allclose(ours_rad, leisaac_leader_to_sim_rad(ticks, cal_json), atol=1e-6, rtol=0)


def test_the_issue_example_pan_calibrated_650_to_3450_at_plus_50():
    cal_json = {
        n: {"id": i + 1, "drive_mode": 0, "homing_offset": 0, "range_min": 650, "range_max": 3450}
        for i, n in enumerate(JOINT_NAMES)
    }
    cal = ArmCalibration.from_json_dict(cal_json)
    ticks = np.full(6, 2050 + 700)  # +50 normalised: a quarter of the range above the middle
    u = ticks_to_units(ticks, cal)
    assert np.rad2deg(units_to_sim_rad(map_leader_to_sim(u, "leisaac", cal))[0]) == pytest.approx(55.0, abs=1e-6)
    assert np.rad2deg(units_to_sim_rad(map_leader_to_sim(u, "degrees", cal))[0]) == pytest.approx(61.54, abs=0.01)
    with pytest.raises(ValueError, match="unknown sim_mapping"):
        map_leader_to_sim(u, "radians", cal)  # type: ignore[arg-type]


def test_daemon_with_sim_mapping_leisaac_drives_the_sim_as_leisaacs_leader_would(tmp_path):
    """[follower] kind = "sim", sim_mapping = "leisaac": an emulated leader -> the daemon -> the
    LeIsaac bridge; the task's joint targets are LeIsaac's map of the leader, and the episode's
    tag notes name the mapping."""
    from support import still_arm_on_pty

    from daemon.config.settings import config_from_dict
    from daemon.data.sim_episodes import SimEpisodeHook
    from daemon.service.daemon import Daemon, make_follower
    from drivers.emulator import reference_calibration
    from drivers.feetech_arm import FeetechLeader

    pose = np.array([30.0, -40.0, 50.0, 20.0, 10.0, 60.0])
    la, lb = still_arm_on_pty(tmp_path / "leader", "leader", pose)
    env = FakeManagerBasedRLEnv(follow=0.5)
    b, t = serve(env)
    cfg = config_from_dict(
        {
            "socket": {"path": str(tmp_path / "c.sock")},
            "follower": {"kind": "sim", "endpoint": b.ep.endpoint, "stale_timeout_s": 0.5, "sim_mapping": "leisaac"},
            "control": {"rate_hz": 60.0},
            "safety": {"align_speed_deg_s": 180.0, "align_gripper_speed_pct_s": 200.0},
        }
    )
    ref = reference_calibration("leader")
    # this operator calibrated a narrower range than the emulator's reference on every joint
    leader_cal = ArmCalibration.from_json_dict(
        {
            n: {**ref.to_json_dict()[n], "range_min": ref[n].range_min + 300, "range_max": ref[n].range_max - 300}
            for n in JOINT_NAMES
        }
    )
    daemon = Daemon(cfg, FeetechLeader(str(tmp_path / "leader"), leader_cal), make_follower(cfg))
    daemon.start()
    try:
        leader_units = ticks_to_units(units_to_ticks(la.pose_units(), ref), leader_cal)  # what the daemon reads
        want_rad = units_to_sim_rad(leader_units_to_leisaac_sim_units(leader_units, leader_cal))
        assert poll_until(
            lambda: (
                daemon.loop.state.mode == "teleop"
                and not b.realigning
                and np.allclose(env.actions_seen[-1][0], want_rad, atol=2e-3)
            ),
            40,
        ), (daemon.loop.state.mode, np.rad2deg(env.actions_seen[-1][0]), np.rad2deg(want_rad))
        degrees_rad = units_to_sim_rad(leader_units)
        assert np.max(np.abs(np.rad2deg(want_rad - degrees_rad))) > 5.0, "the two mappings differ visibly here"
        _, notes = SimEpisodeHook(daemon.follower).episode_ending(None, True)
        assert "sim_mapping: leisaac" in notes
        # LeIsaac's remote-leader stream (if also enabled) still carries the leader's own ticks
        from daemon.service.daemon import RemoteLeaderHook

        sent = []
        pub = SimpleNamespace(publish_ticks=lambda ticks, cal: sent.append(np.asarray(ticks)))
        RemoteLeaderHook(pub, leader_cal, daemon.leader).on_leader(0.0, daemon.loop.leader_units)
        np.testing.assert_array_equal(sent[0], units_to_ticks(daemon.leader.last_raw_units, leader_cal))
        np.testing.assert_allclose(daemon.leader.last_raw_units, leader_units, atol=0.1)
    finally:
        daemon.stop()
        b.stop()
        t.join(5)
        b.ep.close()
        lb.stop()


# ---------------------------------------------------------------------------------------------
# seed demos for Isaac Lab Mimic (--seed_hdf5)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_cls", [FakeManagerBasedRLEnv, FakeDirectRLEnv])
def test_seed_demos_survive_strict_reset_to_replay_and_the_ik_step(tmp_path, env_cls):
    """Episodes the daemon starts and stops become demos that LeIsaac's Mimic scripts accept
    unmodified: annotate_demos.py / replay.py reset_to(initial_state) on a scene as strict as
    Isaac Lab's and replay the actions to the recorded states; eef_action_process.py --to_ik
    builds its IK actions; LeIsaac's converter and our import both take the successful demo."""
    import h5py
    from fixtures.isaaclab_recorder import annotate_reads, eef_to_ik_reads, leisaac_converter_counts
    from fixtures.isaaclab_scene import StrictScene

    from daemon.data.isaaclab_hdf5 import import_hdf5
    from sim_bridge.seed_recorder import SeedDemoRecorder

    path = tmp_path / "seeds.hdf5"
    env = env_cls()
    rec = SeedDemoRecorder(path, env_name="LeIsaac-SO101-PickOrange-v0", flush_steps=50)
    success_term = prepare_env_cfg(env.cfg)
    ep = SimServerEndpoint("tcp://127.0.0.1:0", backend="leisaac:fake")
    ep.open()
    b = LeisaacBridge(env, ep, config=CFG, success_fn=success_fn_for(env, success_term), seed_recorder=rec)
    t = threading.Thread(target=b.run, daemon=True)
    t.start()
    f = SimFollower(ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        f.connect()
        starts = []
        for seed, goal_pan in ((3, np.rad2deg(SUCCESS_PAN_RAD) + 15.0), (4, 10.0)):  # a success, then a failure
            f.reset_episode(seed=seed, timeout_s=5)
            starts.append(env.scene.get_state(is_relative=True))
            seq = f.start_episode()
            f.wait_event("started", seq, 5)
            goal = np.array([goal_pan, 0.0, 0.0, 0.0, 0.0, 50.0])
            n0 = len(env.actions_seen)
            assert poll_until(lambda: (f.write_goals(goal), len(env.actions_seen) > n0 + 260)[1], 30)
            f.wait_event("stopped", f.stop_episode(), 5)
    finally:
        f.close()
        b.stop()
        t.join(5)
        ep.close()
        rec.close()

    with h5py.File(path, "r") as fh:
        data = fh["data"]
        assert json.loads(data.attrs["env_args"]) == {"env_name": "LeIsaac-SO101-PickOrange-v0", "type": 2}
        assert list(data) == ["demo_0", "demo_1"]
        assert [bool(data[d].attrs["success"]) for d in data] == [True, False]
        assert int(data.attrs["total"]) == sum(int(data[d].attrs["num_samples"]) for d in data)
        for i, name in enumerate(data):
            g = data[name]
            n = int(g.attrs["num_samples"])
            assert n > 260 and int(g.attrs["seed"]) == (3, 4)[i]
            for key in (
                "actions",
                "processed_actions",
                "obs/joint_pos",
                "obs/ee_frame_state",
                "obs/joint_pos_target",
                "obs/front",
                "states/articulation/robot/joint_position",
                "states/rigid_object/Plate/root_pose",
            ):
                assert g[key].shape[0] == n, key
            initial_state, actions = annotate_reads(g)
            scene = StrictScene(seed=99)  # another layout of the oranges: reset_to must put them back
            scene.reset_to(initial_state, None, is_relative=True)
            for obj in scene.objects:
                np.testing.assert_allclose(
                    scene.obj_pose[obj],
                    starts[i]["rigid_object"][obj]["root_pose"] + np.r_[[[2.0, -1.0, 0.0, 0, 0, 0, 0]]],
                    atol=1e-6,
                )
            # replay.py: the same physics from the same state under the same actions ends where the demo ended
            replay = env_cls()
            replay.scene = scene
            for a in actions:
                replay._physics(a[None])
            recorded_end = np.asarray(g["states/articulation/robot/joint_position"][-1])
            np.testing.assert_allclose(replay.scene.joint_pos[0], recorded_end, atol=1e-5)
            assert eef_to_ik_reads(g).shape == (n, 8)
    assert leisaac_converter_counts(path)[0] == 1
    s = import_hdf5([path], tmp_path / "ds")
    assert s.demos_imported == 1 and s.demos_skipped_failed == 1


def test_readme_leisaac_commands_parse():
    """Every so101d / sim_bridge command and the so101d.toml block of docs/sim.md's LeIsaac and Mimic
    sections are real:
    the follower's own arguments parse (Isaac Lab's AppLauncher adds --enable_cameras, --device,
    --headless inside main()), the so101d subcommands parse, the config block loads."""
    import argparse
    import shlex
    import tomllib
    from pathlib import Path

    from daemon.apps.commands import export_hdf5 as export_cmd
    from daemon.apps.commands import import_hdf5 as import_cmd
    from daemon.config.settings import config_from_dict

    readme = (Path(__file__).resolve().parents[1] / "docs" / "sim.md").read_text()
    start = readme.index("## Running the LeIsaac follower on a GPU workstation")
    text = readme[start:]  # with the Mimic section after it: import-hdf5 / export-hdf5
    lines = [ln.strip() for ln in text.splitlines() if ln.startswith("    ")]
    follower = [ln for ln in lines if "sim_bridge.leisaac_follower" in ln]
    assert follower
    for ln in follower:
        argv = shlex.split(ln.split("sim_bridge.leisaac_follower", 1)[1])
        args, unknown = build_parser().parse_known_args(argv)
        assert args.seed_hdf5 and args.task.startswith("LeIsaac-SO101-")
        assert set(a for a in unknown if a.startswith("--")) <= {"--enable_cameras", "--device", "--headless"}, unknown
    parsers = {"import-hdf5": import_cmd, "export-hdf5": export_cmd}
    seen = set()
    for ln in lines:
        if not ln.startswith("so101d "):
            continue
        argv = [
            a
            for a in shlex.split(ln.split("#", 1)[0].replace("[", "").replace("]", "").replace(" | ", " "))
            if a != "so101d"
        ]
        if argv[0] not in parsers:  # e.g. `dataset info`: test_readme checks every command's flags
            continue
        p = argparse.ArgumentParser()
        parsers[argv[0]].add_arguments(p)
        rest = [
            a for a in argv[1:] if a not in ("--human", "--successful-only", "--all")
        ]  # alternatives listed together
        p.parse_args(rest)
        seen.add(argv[0])
    assert seen == set(parsers)
    block = text.split("# so101d.toml", 1)[1].split("\n\n", 1)[0]
    cfg = config_from_dict(tomllib.loads("\n".join(ln[4:] for ln in block.splitlines()[1:])))
    assert cfg.follower.kind == "sim" and cfg.follower.sim_mapping == "leisaac"


# ---------------------------------------------------------------------------------------------
# Started as the README says: assets, seeds, real time, seed writes
# ---------------------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]


def _python(args: list[str], install: LeisaacInstall, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Python on the workstation: LeIsaac's editable install and Isaac Lab on sys.path, our clone
    on PYTHONPATH as the README says, LEISAAC_ASSETS_ROOT unset."""
    env = {k: v for k, v in os.environ.items() if k != "LEISAAC_ASSETS_ROOT"}
    env["PYTHONPATH"] = install.pythonpath(REPO)
    return subprocess.run([sys.executable, *args], cwd=str(cwd), env=env, capture_output=True, text=True, timeout=60)


def test_leisaac_finds_its_assets_when_the_follower_starts_in_our_clone(tmp_path):
    """README: ``cd ~/so101d && PYTHONPATH=$PWD python -m sim_bridge.leisaac_follower ...``. LeIsaac
    alone, imported there, looks for ``~/so101d/assets`` (its constant.py asks git for the
    repository of the current directory); the follower hands it the checkout's assets instead, and
    when there are none anywhere it exits before Isaac Sim starts, naming every place it looked."""
    install = make_leisaac_install(tmp_path / "ws")
    probe = "from leisaac.assets.robots.lerobot import SO101_FOLLOWER_ASSET_PATH as p; print(p, p.is_file())"
    alone = _python(["-c", probe], install, REPO)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.split() == [str(REPO / "assets" / "robots" / "so101_follower.usd"), "False"]  # the break

    started = _python(
        ["-c", f"from sim_bridge.leisaac_follower import use_leisaac_assets; use_leisaac_assets(); {probe}"],
        install,
        REPO,
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == [str(install.robot_usd.resolve()), "True"]
    # started anywhere else (no git repository around it): the checkout's assets too
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = locate_leisaac_assets({}, elsewhere, install.checkout / "source/leisaac/leisaac/__init__.py")
    assert root.path == install.assets.resolve()

    bare = make_leisaac_install(tmp_path / "bare", with_assets=False)
    missing = _python(
        ["-m", "sim_bridge.leisaac_follower", "--task", "LeIsaac-SO101-LiftCube-v0", "--headless"], bare, REPO
    )
    assert missing.returncode == 2, missing.stderr
    said = " ".join(missing.stderr.split())
    for where in (REPO / "assets", bare.assets):
        assert str(where / "robots" / "so101_follower.usd") in said, said
    assert "LEISAAC_ASSETS_ROOT" in said and "Isaac Sim is not installed" not in said
    with pytest.raises(LeisaacAssetsMissing, match="LEISAAC_ASSETS_ROOT=/nowhere has no"):
        locate_leisaac_assets({"LEISAAC_ASSETS_ROOT": "/nowhere"}, REPO, None)


def test_every_seed_demo_carries_the_seed_its_episode_was_reset_with(tmp_path):
    """main() sets ``env_cfg.seed``; the daemon's episode hook resets without a seed. Each demo
    carries the env's seed then (as LeIsaac's recorder writes ``env.cfg.seed``), or the reset's
    seed when one was given, so annotate_demos.py's ``env.seed(int(episode.seed))`` works."""
    import h5py
    from fixtures.isaaclab_recorder import annotate_reads

    from sim_bridge.seed_recorder import SeedDemoRecorder

    path = tmp_path / "seeds.hdf5"
    env = FakeManagerBasedRLEnv()
    env.cfg.seed = 1234  # main(): env_cfg.seed = --seed, else the time
    rec = SeedDemoRecorder(path, env_name="LeIsaac-SO101-PickOrange-v0", flush_steps=50)
    success_term = prepare_env_cfg(env.cfg)
    ep = SimServerEndpoint("tcp://127.0.0.1:0", backend="leisaac:fake")
    ep.open()
    b = LeisaacBridge(env, ep, config=CFG, success_fn=success_fn_for(env, success_term), seed_recorder=rec)
    t = threading.Thread(target=b.run, daemon=True)
    t.start()
    f = SimFollower(ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        f.connect()
        for seed in (None, 77):  # SimEpisodeHook's reset (no seed), then a reset with one
            f.reset_episode(seed=seed, timeout_s=5)
            seq = f.start_episode()
            f.wait_event("started", seq, 5)
            n0 = len(env.actions_seen)
            goal = np.array([10.0, 0.0, 0.0, 0.0, 0.0, 50.0])
            assert poll_until(lambda: (f.write_goals(goal), len(env.actions_seen) > n0 + 60)[1], 30)
            f.wait_event("stopped", f.stop_episode(), 5)
    finally:
        f.close()
        b.stop()
        t.join(5)
        ep.close()
        rec.close()
    assert env.reset_seeds[-2:] == [None, 77]  # the env goes on from its own seed, then reseeds
    with h5py.File(path, "r") as fh:
        demos = [fh["data"][name] for name in ("demo_0", "demo_1")]
        assert [int(g.attrs["seed"]) for g in demos] == [1234, 77]
        for g in demos:
            _initial_state, actions = annotate_reads(g)
            assert len(actions) == int(g.attrs["num_samples"]) > 60


class _TimedEnv(FakeManagerBasedRLEnv):
    """The fake env noting when each step ran (the test's clock, not the bridge's)."""

    def __init__(self) -> None:
        super().__init__()
        self.step_times_s: list[float] = []

    def step(self, action):
        self.step_times_s.append(time.monotonic())
        return super().step(action)


def _send_targets(f: SimFollower, rate_hz: float, count: int) -> tuple[float, float]:
    """The daemon's control loop writing ``count`` targets at ``rate_hz``; returns (first, last)
    send times. (SimFollower adds its 20 ms heartbeats by itself.)"""
    period = 1.0 / rate_hz
    ticker = threading.Event()
    start = next_s = time.monotonic()
    for i in range(count):
        f.write_goals(np.array([5.0 + (i % 50) * 0.1, 0.0, 0.0, 0.0, 0.0, 40.0]))
        next_s += period
        ticker.wait(max(0.0, next_s - time.monotonic()))  # pace the sender (the stimulus, not a check)
    return start, time.monotonic()


def test_the_bridge_steps_at_the_env_step_rate_whatever_the_daemons_message_rate():
    """A 100 Hz and a 500 Hz daemon (plus heartbeats): the bridge steps at its own 60 Hz either way,
    and after the daemon falls silent it still steps (its schedule never ran ahead)."""
    env = _TimedEnv()
    prepare_env_cfg(env.cfg)
    ep = SimServerEndpoint("tcp://127.0.0.1:0", backend="leisaac:fake")
    ep.open()
    step_hz = 1.0 / env.step_dt
    b = LeisaacBridge(env, ep, config=LeisaacBridgeConfig(step_hz=step_hz, daemon_staleness_s=0.1))
    t = threading.Thread(target=b.run, daemon=True)
    t.start()
    f = SimFollower(ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    rates: dict[float, float] = {}
    try:
        f.connect()
        for msg_hz in (100.0, 500.0):
            received0 = ep.stats.received
            first_s, last_s = _send_targets(f, msg_hz, int(msg_hz * 1.2))
            steps = [s for s in env.step_times_s if first_s + 0.1 <= s <= last_s]
            rates[msg_hz] = (len(steps) - 1) / (steps[-1] - steps[0])
            assert ep.stats.received - received0 > 1.2 * msg_hz * 0.9  # the messages did arrive
        print(f"steps/s at step rate {step_hz:.1f}: 100 Hz daemon {rates[100.0]:.2f}, 500 Hz daemon {rates[500.0]:.2f}")
        for msg_hz, rate in rates.items():
            assert abs(rate / step_hz - 1.0) < 0.03, (msg_hz, rate)
        f.close()  # the daemon goes silent: the bridge keeps stepping, holding its pose
        n0 = len(env.step_times_s)
        assert poll_until(lambda: len(env.step_times_s) >= n0 + 30, 5), "no steps after the daemon went silent"
    finally:
        f.close()
        b.stop()
        t.join(5)
        ep.close()


def test_seed_recording_writes_off_the_stepping_thread_lzf_compressed(tmp_path, monkeypatch):
    """The stepping thread only snapshots: with the file writer held up on the first chunk, 150
    more steps (three chunks of 50) still return at once; the writer thread then writes them, lzf-compressed as LeIsaac's
    teleop recorder does, with the values as they were at each step."""
    import h5py

    from sim_bridge import seed_recorder

    gate, writing = threading.Event(), threading.Event()
    stepping = threading.current_thread()
    writer_threads: set[str] = set()
    real_append = seed_recorder._append

    def held_append(*args, **kw):
        if threading.current_thread() is stepping:
            raise AssertionError("an h5py write on the stepping thread")
        writer_threads.add(threading.current_thread().name)
        writing.set()
        gate.wait(5)
        return real_append(*args, **kw)

    monkeypatch.setattr(seed_recorder, "_append", held_append)
    rec = seed_recorder.SeedDemoRecorder(
        tmp_path / "seeds.hdf5", env_name="LeIsaac-SO101-PickOrange-v0", flush_steps=50
    )
    env = FakeManagerBasedRLEnv()
    env.reset()
    rec.begin(env.scene.get_state(is_relative=True), seed=5)
    obs = env._obs()["policy"]
    for i in range(200):
        obs["joint_pos"][:] = i  # the env reuses its buffers: the recorder must have copied
        obs["front"][:] = i
        rec.step(obs["joint_pos"], obs, env.scene.get_state(is_relative=True), obs["joint_pos"])
        if i == 49:  # the writer holds the first chunk (the demo's group is created with it) ...
            assert writing.wait(5)  # ... and the next three chunks fit its queue
    assert not gate.is_set() and rec.queue_waits == 0  # every step returned while the writer was held
    gate.set()
    rec.end(success=True)
    rec.close()
    assert writer_threads == {"seed-hdf5-writer"}
    with h5py.File(tmp_path / "seeds.hdf5", "r") as f:
        g = f["data/demo_0"]
        assert int(g.attrs["num_samples"]) == 200 and int(g.attrs["seed"]) == 5 and bool(g.attrs["success"])
        for key in ("actions", "obs/front", "obs/joint_pos", "states/articulation/robot/joint_position"):
            assert g[key].compression == "lzf", key
        np.testing.assert_array_equal(g["obs/front"][:, 0, 0, 0], np.arange(200) % 256)
        np.testing.assert_array_equal(g["actions"][:, 0], np.arange(200))


def test_the_hello_announces_the_cameras_the_task_has():
    """LiftCube deletes its wrist camera: only ``front`` is announced, with its size."""
    lift = FakeManagerBasedRLEnv(cameras=("front",))
    obs, _ = lift.reset()
    assert task_cameras(obs["policy"], ("front", "wrist"), 30.0) == [
        {"name": "front", "width": W, "height": H, "fps": 30.0}
    ]
    obs, _ = FakeManagerBasedRLEnv().reset()
    assert [c["name"] for c in task_cameras(obs["policy"], ("front", "wrist"), 30.0)] == ["front", "wrist"]


def test_step_hz_follows_the_env_and_a_mismatch_is_refused():
    assert check_step_hz(None, 1.0 / 60.0) == pytest.approx(60.0)
    assert check_step_hz(60.0, 1.0 / 60.0) == 60.0
    with pytest.raises(ValueError, match=r"--step_hz 120 does not match the task.*2x real time"):
        check_step_hz(120.0, 1.0 / 60.0)


# ---------------------------------------------------------------------------------------------
# seed recording when things go wrong: a full disk, a lost daemon, Ctrl-C, a power cut
# ---------------------------------------------------------------------------------------------
_SEED_CHILD = r"""
import json, os, resource, signal, sys
import numpy as np
from sim_bridge.seed_recorder import SeedDemoRecorder, SeedRecordingError
path, limit, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
def step(rec, i):
    # random pixels: lzf cannot shrink them, so the file grows like a real camera's
    obs = {"joint_pos": np.full((1, 6), i, np.float32), "ee_frame_state": np.zeros((1, 7), np.float32),
           "joint_pos_target": np.full((1, 6), i, np.float32),
           "front": rng.integers(0, 255, (1, 120, 160, 3), dtype=np.uint8)}
    states = {"articulation": {"robot": {"joint_position": np.full((1, 6), i, np.float32)}}}
    rec.step(np.full((1, 6), i, np.float32), obs, states, np.full((1, 6), i, np.float32))
initial = {"articulation": {"robot": {"joint_position": np.zeros((1, 6), np.float32)}}}
kw = {"space_left": lambda p: 1 << 60} if mode == "no_preflight" else {}
if limit:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
rec = SeedDemoRecorder(path, env_name="LeIsaac-SO101-PickOrange-v0", flush_steps=10, **kw)
if mode == "power_cut":
    rec.begin(initial, seed=3)
    for i in range(25):
        step(rec, i)
    assert rec.wait_written(30)
    print("written", flush=True)
    sys.stdin.read()  # the parent kills the whole process group here
rec.begin(initial, seed=1)
for i in range(30):
    step(rec, i)
rec.end(success=True)
rec.begin(initial, seed=2)
for i in range(3000):
    step(rec, i)
    if i % 10 == 9 and (not rec.wait_written(30) or rec.error):
        break
rec.end(success=True)
try:
    rec.close()
    print(json.dumps({"error": None}))
except SeedRecordingError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def _seed_child(path: Path, limit: int, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", _SEED_CHILD, str(path), str(limit), mode],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_a_file_size_limit_ends_the_demo_cleanly_and_keeps_the_earlier_ones(tmp_path):
    """RLIMIT_FSIZE runs out during the second demo. The demo before stays readable and
    successful, the one being written ends cut to the rows it counts (success=False) or is
    dropped, the file opens, and close() raises SeedRecordingError naming the demo. (A write that
    really hits the limit is not survivable: HDF5 (2.0.0, from h5py 3.16) then crashes the process in its next
    flush, which is why the recorder checks the room before each chunk.)"""
    import h5py
    from fixtures.isaaclab_recorder import eef_action_process_to_ik

    path = tmp_path / "seeds.hdf5"
    child = _seed_child(path, 12 * 1024 * 1024, "limit")
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    said = json.loads(out.strip().splitlines()[-1])["error"]
    assert said and "demo_1" in said and "no further seed demos are recorded" in said, said
    with h5py.File(path, "r") as f:  # the whole file opens
        d0 = f["data/demo_0"]
        assert bool(d0.attrs["success"]) and int(d0.attrs["num_samples"]) == 30
        np.testing.assert_array_equal(d0["actions"][:, 0], np.arange(30))
        if "demo_1" in f["data"]:
            d1 = f["data/demo_1"]
            n = int(d1.attrs["num_samples"])
            assert not bool(d1.attrs["success"]) and n > 0 and f"cut to its {n} written steps" in said
            for key in ("actions", "obs/front", "obs/ee_frame_state", "states/articulation/robot/joint_position"):
                assert d1[key].shape[0] == n, key
        else:
            assert "demo_1 dropped" in said or "demo_1 was not started" in said, said
    assert eef_action_process_to_ik(path) == ["demo_0"]


def test_an_interrupted_demo_says_success_false_and_an_empty_one_is_never_written(tmp_path):
    """Ctrl-C/SIGTERM of the follower (close() mid-demo) and a power cut (the whole process group
    SIGKILLed) both leave a demo with ``success=False``, which eef_action_process.py --to_ik skips;
    an episode stopped before its first step leaves no demo at all (--to_ik would stop on it)."""
    import h5py
    from fixtures.isaaclab_recorder import eef_action_process_to_ik

    from sim_bridge.seed_recorder import SeedDemoRecorder

    path = tmp_path / "ctrlc.hdf5"
    rec = SeedDemoRecorder(path, env_name="LeIsaac-SO101-PickOrange-v0", flush_steps=10)
    env = FakeManagerBasedRLEnv()
    env.reset()
    rec.begin(env.scene.get_state(is_relative=True), seed=5)
    assert rec.end(success=True) is None  # no steps: nothing for the file
    rec.begin(env.scene.get_state(is_relative=True), seed=6)
    obs = env._obs()["policy"]
    for _ in range(23):
        rec.step(obs["joint_pos"], obs, env.scene.get_state(is_relative=True), obs["joint_pos"])
    rec.close()  # the follower's finally after SIGINT/SIGTERM
    with h5py.File(path, "r") as f:
        assert list(f["data"]) == ["demo_0"]
        g = f["data/demo_0"]
        assert int(g.attrs["seed"]) == 6 and int(g.attrs["num_samples"]) == 23 and not bool(g.attrs["success"])
    assert eef_action_process_to_ik(path) == []

    cut = tmp_path / "power_cut.hdf5"
    child = _seed_child(cut, 0, "power_cut")
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "written"
    finally:
        os.killpg(child.pid, 9)
        child.wait(30)
    with h5py.File(cut, "r") as f:
        g = f["data/demo_0"]
        assert int(g.attrs["num_samples"]) == 20 and not bool(g.attrs["success"])
    assert eef_action_process_to_ik(cut) == []


def _recording_bridge(env, rec, **cfg):
    prepare_env_cfg(env.cfg)
    ep = SimServerEndpoint("tcp://127.0.0.1:0", backend="leisaac:fake")
    ep.open()
    config = LeisaacBridgeConfig(step_hz=STEP_HZ, publish_hz=30.0, daemon_staleness_s=0.1, **cfg)
    b = LeisaacBridge(env, ep, config=config, seed_recorder=rec)
    t = threading.Thread(target=b.run, daemon=True)
    t.start()
    f = SimFollower(ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    f.connect()
    return b, t, f


def _close_bridge(b, t, f) -> None:
    f.close()
    b.stop()
    t.join(5)
    b.ep.close()


def test_a_daemon_gone_silent_mid_episode_ends_the_seed_demo(tmp_path):
    """The daemon dies mid-episode: past ``seed_demo_silence_s`` the demo ends (success=False)
    while the bridge steps on, instead of recording a still arm until the disk fills."""
    import h5py

    from sim_bridge.seed_recorder import SeedDemoRecorder

    path = tmp_path / "orphan.hdf5"
    rec = SeedDemoRecorder(path, env_name="LeIsaac-SO101-PickOrange-v0", flush_steps=50)
    env = FakeManagerBasedRLEnv()
    b, t, f = _recording_bridge(env, rec, seed_demo_silence_s=0.5)
    try:
        f.reset_episode(timeout_s=5)
        n_start = b.steps  # no step before the start is recorded
        f.wait_event("started", f.start_episode(), 5)
        n0 = b.steps
        assert poll_until(lambda: (f.write_goals(np.array([10.0, 0, 0, 0, 0, 50.0])), b.steps > n0 + 30)[1], 30)
        f.close()  # the daemon is gone
        assert poll_until(lambda: not rec.recording, 10), "the seed demo kept recording a silent daemon"
        ended_at = b.steps
        assert poll_until(lambda: b.steps > ended_at + 60, 10)  # the bridge steps on, holding
    finally:
        _close_bridge(b, t, f)
        rec.close()
    with h5py.File(path, "r") as fh:
        g = fh["data/demo_0"]
        assert not bool(g.attrs["success"]) and int(g.attrs["num_samples"]) <= ended_at - n_start


def test_a_failed_seed_write_reaches_the_daemon(tmp_path):
    """No room for the first chunk: the follower's state carries ``seed_error`` from then on (the
    daemon's SimFollower shows it in its stats), the episode's ``stopped`` says so, and close()
    raises SeedRecordingError."""
    from sim_bridge.seed_recorder import SeedDemoRecorder, SeedRecordingError

    rec = SeedDemoRecorder(
        tmp_path / "full.hdf5", env_name="LeIsaac-SO101-PickOrange-v0", flush_steps=20, space_left=lambda p: 0
    )
    env = FakeManagerBasedRLEnv()
    b, t, f = _recording_bridge(env, rec)
    try:
        f.reset_episode(timeout_s=5)
        f.wait_event("started", f.start_episode(), 5)
        goal = np.array([10.0, 0, 0, 0, 0, 50.0])
        assert poll_until(lambda: (f.write_goals(goal), f.stats()["seed_error"])[1], 30), "the daemon was not told"
        said = f.stats()["seed_error"]
        assert "demo_0" in said and "not enough room" in said, said
        stopped = f.wait_event("stopped", f.stop_episode(), 5)
        assert "seed recording failed" in stopped.detail
    finally:
        _close_bridge(b, t, f)
    with pytest.raises(SeedRecordingError, match="writing demo_0 failed"):
        rec.close()


def test_the_stop_is_acknowledged_once_the_demo_is_on_disk(tmp_path, monkeypatch):
    """With the writer held, the daemon's ``stopped`` does not come while the demo's chunks are
    still queued (the sim steps on meanwhile); once they are written it comes, and the demo is
    closed in the file."""
    from sim_bridge import seed_recorder

    gate = threading.Event()
    real_append = seed_recorder._append

    def held_append(*args, **kw):
        gate.wait(30)
        return real_append(*args, **kw)

    monkeypatch.setattr(seed_recorder, "_append", held_append)
    rec = seed_recorder.SeedDemoRecorder(tmp_path / "s.hdf5", env_name="LeIsaac-SO101-PickOrange-v0", flush_steps=10)
    env = FakeManagerBasedRLEnv()
    b, t, f = _recording_bridge(env, rec)
    try:
        f.reset_episode(timeout_s=5)
        f.wait_event("started", f.start_episode(), 5)
        n0 = b.steps
        assert poll_until(lambda: (f.write_goals(np.array([10.0, 0, 0, 0, 0, 50.0])), b.steps > n0 + 25)[1], 30)
        seq = f.stop_episode()
        assert poll_until(lambda: not rec.recording, 10)  # the bridge ended the demo; its writes are held
        stepped = b.steps
        assert poll_until(lambda: b.steps > stepped + 30, 10)  # the sim steps on while the demo is written
        assert rec.jobs_behind > 0 and not [e for e in f.events() if e.event == "stopped"]
        gate.set()
        f.wait_event("stopped", seq, 10)
        assert rec.jobs_behind == 0 and "success" in rec.data["demo_0"].attrs
    finally:
        gate.set()
        _close_bridge(b, t, f)
        rec.close()


def test_demo_numbers_continue_after_the_highest_existing_one(tmp_path):
    """A user deleted the bad demo_1 of demo_0..demo_2: the next demo is demo_3, never a name
    already in the file (counting the groups would pick demo_2 and lose every later demo)."""
    import h5py

    from sim_bridge.seed_recorder import SeedDemoRecorder

    path = tmp_path / "gap.hdf5"
    with h5py.File(path, "w") as f:
        f.create_group("data").attrs["total"] = 0
        f.create_group("data/demo_0")
        f.create_group("data/demo_2")
    rec = SeedDemoRecorder(path, env_name="LeIsaac-SO101-PickOrange-v0", flush_steps=10)
    env = FakeManagerBasedRLEnv()
    env.reset()
    assert rec.begin(env.scene.get_state(is_relative=True), seed=1) == "demo_3"
    obs = env._obs()["policy"]
    for _ in range(12):
        rec.step(obs["joint_pos"], obs, env.scene.get_state(is_relative=True), obs["joint_pos"])
    rec.end(success=True)
    rec.close()  # raises if a write failed
    with h5py.File(path, "r") as f:
        assert int(f["data/demo_3"].attrs["num_samples"]) == 12


def test_the_follower_shuts_everything_down_even_when_the_seed_file_fails():
    from sim_bridge.leisaac_follower import shut_down
    from sim_bridge.seed_recorder import SeedRecordingError

    closed: list[str] = []

    def failing() -> None:
        raise SeedRecordingError("seed file x: writing demo_1 failed (disk full)")

    steps = [("seed file", failing)] + [(n, lambda n=n: closed.append(n)) for n in ("endpoint", "env", "Isaac Sim")]
    assert shut_down(steps) == 1
    assert closed == ["endpoint", "env", "Isaac Sim"]


def test_a_burst_of_targets_is_drained_without_decoding_each(monkeypatch):
    """200 queued targets plus a torque and an episode command: one poll applies the newest valid
    target and both commands, and fully decodes only those (a superseded target is only peeked at)."""
    import zmq

    from drivers import sim_protocol as P

    ctx = zmq.Context()
    ep = SimServerEndpoint("inproc://burst", backend="leisaac:fake", context=ctx)
    ep.open()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect("inproc://burst")
    try:
        for seq in range(200):
            dealer.send_multipart(P.encode_target(seq, 0.0, np.full(6, float(seq))))
            if seq == 100:
                dealer.send_multipart(P.encode("torque", enabled=False))
                dealer.send_multipart(P.encode("episode", cmd="start", seq=7, seed=None))
        dealer.send_multipart(P.encode("target", seq=200, sent_s=0.0, pos=[1.0] * 5))  # invalid: 5 joints
        decoded: list[str] = []
        real_decode = P.decode

        def counting(frames, allowed):
            msg = real_decode(frames, allowed)
            decoded.append(msg.type)
            return msg

        monkeypatch.setattr(P, "decode", counting)
        inbox = ep.poll()
        assert ep.stats.received == 203
        assert inbox.target_seq == 199 and inbox.target_units is not None and inbox.target_units[0] == 199.0
        assert inbox.torque is False and [c["cmd"] for c in inbox.episode_cmds] == ["start"]
        assert sorted(decoded) == ["episode", "target", "torque"], decoded
        assert ep.stats.rejects.by_reason == {"field": 1}
    finally:
        dealer.close(0)
        ep.close()
        ctx.term()
