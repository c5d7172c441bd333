"""Two arms in one simulated world: the MuJoCo follower's two-arm scene driven by a bimanual daemon.

The scene mirrors LeIsaac's bi-arm template (LightwheelAI/leisaac
``source/leisaac/leisaac/tasks/template/bi_arm_env_cfg.py``: articulations ``left_arm`` /
``right_arm`` side by side with the same heading, cameras ``left_wrist``, ``right_wrist``, ``top``)
and its joints are ``source/leisaac/leisaac/utils/constant.py`` ``BI_ARM_JOINT_NAMES`` (left first).
One sim process serves both arms on one endpoint; each of the daemon's two follower links
addresses its arm by name (``drivers.sim_protocol``, "Arms").

- the scene loads and steps; a target for one arm moves that arm only, torque and a silent link too;
- a one-arm sim and a two-arm sim each refuse the other kind of link, naming why;
- the configuration: [arms] with follower.kind = "sim" names leader ports only; a follower port on
  one side (a real follower there, the sim on the other) is refused naming the key;
- the daemon on that configuration teleoperates both arms from two emulated leaders and records a
  12-dim observation.state / action with LeRobot's ``left_`` / ``right_`` names and the three
  cameras; with no sim running, each arm's status says no simulator answers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import MujocoSimThread, free_port, still_arm_on_pty, wait_for

from calibration.calibration_file import save_calibration
from calibration.conventions import FEATURE_NAMES, JOINT_NAMES
from daemon.api.client import ControlClient
from daemon.config.settings import ConfigError, config_from_dict
from daemon.service.daemon import Daemon, make_follower
from drivers.arm_interface import HandshakeError
from drivers.emulator import EmulatedArm, reference_calibration
from drivers.sim_follower import SimFollower

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SIDES = ("left", "right")
# LeIsaac's utils/constant.py BI_ARM_JOINT_NAMES
BI_ARM_JOINT_NAMES = [f"{side}_{joint}" for side in SIDES for joint in JOINT_NAMES]
CAMERAS = ("left_wrist", "right_wrist", "top")
W, H = 64, 48  # cheap to render and to encode
LEFT_POSE = np.array([-20.0, -50.0, 50.0, 30.0, 0.0, 20.0])
RIGHT_POSE = np.array([25.0, -40.0, 45.0, 40.0, 15.0, 60.0])
# a position servo under gravity (MuJoCo's STS3215 model): a few degrees of droop
TOL = np.array([4.0, 8.0, 8.0, 8.0, 4.0, 4.0])
REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    """A child's environment: this checkout importable, offline."""
    path = os.pathsep.join([str(REPO), str(REPO / "lerobot_plugin"), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1")


def two_arm_sim(endpoint: str, cameras: tuple[str, ...] = ()) -> MujocoSimThread:
    return MujocoSimThread(endpoint, arms=SIDES, cameras=cameras, camera_width=W, camera_height=H)


# ------------------------------------------------------------------------------------------------
# the scene
# ------------------------------------------------------------------------------------------------
def test_the_two_arm_scene_has_leisaacs_joints_and_cameras_and_steps() -> None:
    from sim_bridge.mujoco_follower import MujocoFollower, MujocoFollowerConfig

    sim = MujocoFollower(MujocoFollowerConfig(arms=SIDES, cameras=CAMERAS, camera_width=W, camera_height=H, seed=0))
    m = sim.model
    arm_joints = [m.joint(i).name for i in range(m.njnt) if m.joint(i).name != "cube_free"]
    assert arm_joints == BI_ARM_JOINT_NAMES
    assert [m.actuator(i).name for i in range(m.nu)] == BI_ARM_JOINT_NAMES
    assert sorted(m.camera(i).name for i in range(m.ncam)) == sorted(CAMERAS)
    # the wrist cameras ride on their own arm's gripper
    for side in SIDES:
        assert m.body(m.cam_bodyid[m.camera(f"{side}_wrist").id]).name == f"{side}_gripper"
    # both bases on the table, apart, with the same heading
    left_base, right_base = (sim.data.xpos[m.body(f"{s}_base").id] for s in SIDES)
    assert left_base[1] > 0.1 and right_base[1] < -0.1 and abs(left_base[0] - right_base[0]) < 1e-9
    t0 = sim.data.time
    sim.step_for(0.1)
    assert sim.data.time > t0
    # both arms at the rest pose, holding it; the cube stays put
    for side in SIDES:
        assert np.allclose(sim.joint_units(side), sim.joint_units(SIDES[0]), atol=1.0)
    assert not sim.cube_lost() and not sim.cube_lifted()


def test_each_arm_moves_only_its_own_joints() -> None:
    from sim_bridge.mujoco_follower import MujocoFollower, MujocoFollowerConfig

    sim = MujocoFollower(MujocoFollowerConfig(arms=SIDES, cameras=(), seed=0))
    sim.step_for(1.0)  # both arms settle at the rest pose (a position servo droops under gravity)
    rest = {side: sim.joint_units(side).copy() for side in SIDES}
    sim.set_target_units(LEFT_POSE, "left")
    sim.step_for(1.5)
    assert np.all(np.abs(sim.joint_units("left") - LEFT_POSE) <= TOL), sim.joint_units("left")
    assert np.all(np.abs(sim.joint_units("right") - rest["right"]) < 1.0), "the right arm moved with the left"
    # the right gripper opens, the left one keeps its opening
    left_gap = sim.jaw_gap_m("left")
    sim.set_target_units(np.concatenate([rest["right"][:5], [90.0]]), "right")
    sim.step_for(1.0)
    assert sim.jaw_gap_m("right") > sim.jaw_gap_m("left") + 0.01 and abs(sim.jaw_gap_m("left") - left_gap) < 2e-3
    # torque off on the left: the left goes limp, the right keeps holding
    sim.set_torque(False, "left")
    assert sim.arm("left").torque is False and sim.arm("right").torque is True
    assert np.all(sim.model.actuator_gainprm[sim.arm("left").act, 0] == 0.0)
    assert np.all(sim.model.actuator_gainprm[sim.arm("right").act, 0] > 0.0)
    with pytest.raises(KeyError, match="no arm 'middle'.*left, right"):
        sim.arm("middle")


def test_two_arm_scene_refuses_a_single_wrist_camera() -> None:
    from sim_bridge.mujoco_scene import CameraSpec, build_model

    with pytest.raises(ValueError, match="left_wrist, right_wrist, not 'wrist'"):
        build_model((CameraSpec("wrist", W, H),), arms=SIDES)


# ------------------------------------------------------------------------------------------------
# one endpoint, two arm links
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def served() -> Iterator[tuple[MujocoSimThread, dict[str, SimFollower]]]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sim = two_arm_sim(endpoint, CAMERAS)
    links = {side: SimFollower(endpoint, staleness_s=0.5, arm=side) for side in SIDES}
    try:
        for link in links.values():
            link.connect()
        yield sim, links
    finally:
        for link in links.values():
            link.close()
        sim.close()


def test_each_link_drives_its_own_arm_of_the_one_scene(served) -> None:
    sim, links = served
    rest_right = links["right"].read_joints()
    links["left"].write_goals(LEFT_POSE)
    wait_for(lambda: np.all(np.abs(links["left"].read_joints() - LEFT_POSE) <= TOL), 10, "the left arm on its goal")
    assert np.all(np.abs(links["right"].read_joints() - rest_right) < 1.0), "the right arm moved with the left"
    links["right"].write_goals(RIGHT_POSE)
    wait_for(lambda: np.all(np.abs(links["right"].read_joints() - RIGHT_POSE) <= TOL), 10, "the right arm on its goal")
    assert np.all(np.abs(links["left"].read_joints() - LEFT_POSE) <= TOL)
    # each link's state is its own arm of the sim's one scene
    wait_for(
        lambda: np.allclose(sim.sim.joint_units("right"), links["right"].read_joints(), atol=1.0),
        10,
        "the right link's state the sim's right arm (the arm settled)",
    )
    # the cameras reach the first arm's link (the daemon takes its cameras from its first arm)
    cams = links["left"].cameras()
    assert sorted(cams) == sorted(CAMERAS)
    wait_for(lambda: all(cams[n].latest_frame() is not None for n in CAMERAS), 10, "frames of the three cameras")
    assert all(cams[n].latest_frame().pixels.shape == (H, W, 3) for n in CAMERAS)
    assert links["left"].stats()["arm"] == "left"


def test_a_scene_reset_asked_by_one_link_reaches_both(served) -> None:
    _sim, links = served
    before = {side: link.scene_resets() for side, link in links.items()}
    links["left"].reset_episode(timeout_s=10)
    wait_for(lambda: all(link.scene_resets() > before[s] for s, link in links.items()), 5, "both links saw the reset")


def test_a_one_arm_sim_and_a_two_arm_sim_refuse_the_other_kind_of_link() -> None:
    one, two = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    sims = [MujocoSimThread(one, cameras=()), two_arm_sim(two)]
    try:
        cases = (
            (SimFollower(one, arm="left", connect_timeout_s=5), "this sim serves one arm.*'left'"),
            (SimFollower(two, connect_timeout_s=5), "serves the arms left, right.*single-arm configuration"),
            (SimFollower(two, arm="middle", connect_timeout_s=5), "has no arm 'middle'"),
        )
        for link, why in cases:
            try:
                with pytest.raises(HandshakeError, match=why):
                    link.connect()
            finally:
                link.close()
        # a refused link heartbeats 50 times a second; the sim tells it why at most once a second
        ep = sims[0].sim.endpoint
        assert ep is not None
        late = SimFollower(one, arm="left", connect_timeout_s=5)
        try:
            received, sent = ep.stats.received, ep.stats.sent
            with pytest.raises(HandshakeError):
                late.connect()
            wait_for(lambda: ep.stats.received >= received + 25, 10, "25 refused messages")
            assert ep.stats.sent - sent <= 2, ep.stats
        finally:
            late.close()
    finally:
        for s in sims:
            s.close()


# ------------------------------------------------------------------------------------------------
# configuration
# ------------------------------------------------------------------------------------------------
def sim_rig(root: Path, endpoint: str, *, record: bool = False, cameras: tuple[str, ...] = ()) -> dict:
    """A bimanual configuration on two leaders at root/<side>_leader and the two-arm sim."""
    data: dict = {
        "socket": {"path": str(root / "c.sock")},
        "follower": {"kind": "sim", "endpoint": endpoint, "stale_timeout_s": 0.5},
        "arms": {side: {"leader_port": str(root / f"{side}_leader")} for side in SIDES},
        "calibration": {"root": str(root / "calibration")},
        "control": {"rate_hz": 60.0, "reconnect_backoff_min_s": 0.05, "reconnect_backoff_max_s": 0.2},
        "safety": {"align_speed_deg_s": 120.0, "align_gripper_speed_pct_s": 150.0},
    }
    if record:
        data["recording"] = {
            "enabled": True,
            "dataset_root": str(root / "datasets"),
            "repo_id": "local/sim-bimanual",
            "fps": 30,
            "task": "hand the cube over",
        }
    data["cameras"] = {name: {"kind": "sim"} for name in cameras}
    return data


def test_a_bimanual_sim_configuration_names_leader_ports_only(tmp_path: Path) -> None:
    cfg = config_from_dict(sim_rig(tmp_path, "tcp://127.0.0.1:5555"))
    assert cfg.bimanual and cfg.follower.kind == "sim"
    for side in SIDES:
        f = make_follower(cfg, side)
        assert isinstance(f, SimFollower) and f.arm == side and f.endpoint == "tcp://127.0.0.1:5555"
    # a serial follower on one side, the sim on the other: not one task, refused naming the key
    data = sim_rig(tmp_path, "tcp://127.0.0.1:5555")
    data["arms"]["right"]["follower_port"] = "/dev/ttyACM3"
    with pytest.raises(ConfigError, match=r"arms\.right\.follower_port: '/dev/ttyACM3' with follower\.kind = 'sim'"):
        config_from_dict(data)
    data = sim_rig(tmp_path, "tcp://127.0.0.1:5555")
    del data["arms"]["left"]["leader_port"]
    with pytest.raises(ConfigError, match=r"arms\.left\.leader_port: missing"):
        config_from_dict(data)


def test_sim_mapping_leisaac_maps_both_leaders_each_through_its_own_calibration(tmp_path: Path) -> None:
    """``sim_mapping = "leisaac"`` on a bimanual sim rig: each side's leader is mapped as LeIsaac's
    own bi-so101leader maps it (its own calibrated range), not the left one only."""
    from daemon.service.daemon import build_loop
    from drivers.leader_mapping import LeisaacMappedLeader

    for side in SIDES:
        save_calibration(reference_calibration("leader"), "leader", f"leader_{side}", tmp_path / "calibration")
    data = sim_rig(tmp_path, "tcp://127.0.0.1:5555")
    data["follower"]["sim_mapping"] = "leisaac"
    loop = build_loop(config_from_dict(data))
    leaders = {name: src.link.arm for name, src in loop.leaders.items()}
    assert sorted(leaders) == ["left_leader", "right_leader"]
    assert all(isinstance(arm, LeisaacMappedLeader) for arm in leaders.values()), leaders
    assert [a.link.arm.arm for a in loop.arms] == list(SIDES)  # each follower link names its sim arm


# ------------------------------------------------------------------------------------------------
# the daemon on the bimanual sim
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def leaders(tmp_path: Path) -> Iterator[dict[str, EmulatedArm]]:
    """Two emulated leaders held still at their own poses, LeRobot's bimanual calibration ids."""
    arms, buses = {}, []
    for side, pose in zip(SIDES, (LEFT_POSE, RIGHT_POSE)):
        save_calibration(reference_calibration("leader"), "leader", f"leader_{side}", tmp_path / "calibration")
        arm, bus = still_arm_on_pty(tmp_path / f"{side}_leader", "leader", pose)
        arms[side] = arm
        buses.append(bus)
    yield arms
    for bus in buses:
        bus.stop()


def _status(daemon: Daemon) -> dict:
    with ControlClient(daemon.socket_path) as c:
        return c.request("status")


def test_the_daemon_teleoperates_and_records_both_sim_arms(tmp_path: Path, leaders) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from daemon.data.schema import ACTION_KEY, BIMANUAL_ROBOT_TYPE, STATE_KEY, read_episode_tags

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sim = two_arm_sim(endpoint, CAMERAS)
    daemon = Daemon(config_from_dict(sim_rig(tmp_path, endpoint, record=True, cameras=CAMERAS)))
    frames = 20
    try:
        daemon.start()
        wait_for(lambda: all(a.state.mode == "teleop" for a in daemon.loop.arms), 30, "both arms tracking")
        for side, pose in zip(SIDES, (LEFT_POSE, RIGHT_POSE)):
            wait_for(
                lambda: np.all(np.abs(sim.sim.joint_units(side) - pose) <= TOL), 10, f"the {side} arm on its leader"
            )
        # each arm follows its own leader: the right leader moves, the left arm stays
        moved = RIGHT_POSE + np.array([-20.0, 10.0, 0.0, -10.0, 0.0, -30.0])
        leaders["right"].set_pose_units(moved)
        wait_for(
            lambda: np.all(np.abs(sim.sim.joint_units("right") - moved) <= TOL), 10, "the right arm on its moved leader"
        )
        assert np.all(np.abs(sim.sim.joint_units("left") - LEFT_POSE) <= TOL)
        st = _status(daemon)
        assert set(st["arms"]) == set(SIDES) and all(a["mode"] == "teleop" for a in st["arms"].values())

        wait_for(lambda: _status(daemon)["recording"]["phase"] == "idle", 120, "the recorder ready")
        with ControlClient(daemon.socket_path) as c:
            c.request("episode.start")  # the sim resets its scene: both arms re-align from the rest pose
            wait_for(lambda: c.request("episode.status")["frames"] >= frames, 30, f"{frames} frames")
            for side, pose in zip(SIDES, (LEFT_POSE, moved)):
                wait_for(lambda: np.all(np.abs(sim.sim.joint_units(side) - pose) <= TOL), 10, f"the {side} arm back")
            # a few frames recorded since (a loaded host's recorder runs behind the sim)
            back = c.request("episode.status")["frames"]
            wait_for(lambda: c.request("episode.status")["frames"] >= back + 3, 30, "frames of both arms back")
            c.request("episode.save")
            wait_for(lambda: c.request("episode.status")["episodes_in_dataset"] == 1, 60, "the episode committed")
    finally:
        daemon.stop()
        sim.close()

    root = tmp_path / "datasets" / "local/sim-bimanual"
    ds = LeRobotDataset("local/sim-bimanual", root=root, video_backend="pyav")
    assert ds.meta.robot_type == BIMANUAL_ROBOT_TYPE and ds.num_frames >= frames
    names = [f"{side}_{n}" for side in SIDES for n in FEATURE_NAMES]  # LeRobot's BiSOFollower order
    for key in (STATE_KEY, ACTION_KEY):
        assert ds.features[key]["names"] == names and tuple(ds.features[key]["shape"]) == (12,), key
    cams = sorted(k.removeprefix("observation.images.") for k in ds.features if k.startswith("observation.images."))
    assert cams == sorted(CAMERAS)
    item = ds[ds.num_frames - 1]  # the arms back on their leaders after the reset
    for cam in CAMERAS:
        assert tuple(item[f"observation.images.{cam}"].shape) == (3, H, W), cam
    state = item[STATE_KEY].numpy()
    assert np.all(np.abs(state[:6] - LEFT_POSE) <= TOL), state
    assert np.all(np.abs(state[6:] - moved) <= TOL), state
    tags = read_episode_tags(root)
    assert tags[0].follower_kind == "sim-mujoco", tags


def test_the_sim_process_absent_or_gone_is_said_per_arm_and_a_new_one_is_picked_up(tmp_path: Path, leaders) -> None:
    """No sim yet: each arm's status names the endpoint nobody answers at. The sim starts: both arms
    connect and track. It dies: both arms are lost followers (the loop keeps running)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    daemon = Daemon(config_from_dict(sim_rig(tmp_path, endpoint)))
    sim: MujocoSimThread | None = None
    modes = lambda: {a.name: a.state.mode for a in daemon.loop.arms}  # noqa: E731
    try:
        daemon.start()

        def said() -> bool:
            arms = _status(daemon)["arms"]
            return all(endpoint in str(arms[s]) and "no simulator answering" in str(arms[s]) for s in SIDES)

        wait_for(said, 15, "each arm's status naming the silent simulator")
        assert all(m != "teleop" for m in modes().values()), modes()
        sim = two_arm_sim(endpoint)
        wait_for(lambda: all(m == "teleop" for m in modes().values()), 30, f"both arms tracking ({modes()})")
        sim.close()
        wait_for(lambda: all(m == "disconnected" for m in modes().values()), 10, f"both arms lost ({modes()})")
        assert daemon.loop.is_running()
    finally:
        daemon.stop()
        if sim is not None:
            sim.close()


def test_so101d_sim_follower_serves_the_two_arm_scene(tmp_path: Path) -> None:
    import subprocess
    import sys

    from sim_bridge import cli

    bad = subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", "sim-follower", "--arms", "left"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=_env(),
    )
    assert bad.returncode == 2 and "--arms 'left': the two-arm scene's arms are 'left,right'" in bad.stderr, bad.stderr
    endpoint = f"ipc://{tmp_path}/sim.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.apps.cli", "sim-follower", "--arms", "left,right", "--bind", endpoint],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        env=_env(),
    )
    links = {side: SimFollower(endpoint, arm=side, connect_timeout_s=60) for side in SIDES}
    try:
        for link in links.values():
            link.connect()
        # the default cameras of the two-arm scene, announced to the first arm's link
        wait_for(lambda: sorted(links["left"].cameras()) == sorted(CAMERAS), 10, "the three cameras announced")
        assert cli.BI_ARM_CAMERAS.split(",") == list(CAMERAS)
    finally:
        for link in links.values():
            link.close()
        proc.terminate()
        proc.wait(10)


@pytest.mark.e2e  # `so101d demo` as a user runs it: the emulator, the sim and the daemon, three processes
def test_so101d_demo_bimanual_sim_records_both_sim_arms(tmp_path: Path) -> None:
    """`so101d demo --bimanual --sim`: emulated leaders (the handover), the two-arm MuJoCo scene as
    the followers, an episode recorded with the sim's three cameras."""
    import subprocess
    import sys

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from daemon.data.schema import STATE_KEY, read_episode_tags

    run_dir, out_path, err_path = tmp_path / "bench", tmp_path / "demo.out", tmp_path / "demo.err"
    args = ["demo", "--bimanual", "--sim", "--sim-camera-size", f"{W}x{H}", "--dir", str(run_dir)]
    args += ["--record", "1", "--episode-time", "1", "--socket", str(tmp_path / "d.sock")]
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", *args], stdout=out, stderr=err, cwd=REPO, env=_env()
        )
    try:

        def recorded() -> bool:
            assert proc.poll() is None, err_path.read_text()[-3000:]
            return "episodes in the dataset" in out_path.read_text()

        wait_for(recorded, 240, "the demo's episode in the dataset")
        proc.send_signal(2)  # SIGINT: Ctrl-C
        assert proc.wait(timeout=120) == 0, err_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ds_root = run_dir / "datasets" / "local" / "so101d-demo-bimanual"
    ds = LeRobotDataset("local/so101d-demo-bimanual", root=ds_root, video_backend="pyav")
    assert ds.meta.total_episodes == 1 and ds.meta.robot_type == "bi_so_follower"
    assert ds.features[STATE_KEY]["names"] == [f"{side}_{n}" for side in SIDES for n in FEATURE_NAMES]
    cams = sorted(k.removeprefix("observation.images.") for k in ds.features if k.startswith("observation.images."))
    assert cams == sorted(CAMERAS)
    assert tuple(ds[0]["observation.images.top"].shape) == (3, H, W)
    assert read_episode_tags(ds_root)[0].follower_kind == "sim-mujoco"


# ------------------------------------------------------------------------------------------------
# the LeIsaac follower on a bi-arm task (a fake env built from LeIsaac's bi-arm template)
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def leisaac_bi_arm() -> Iterator[tuple[object, object, dict[str, SimFollower]]]:
    import threading

    from fixtures.leisaac_env import FakeBiArmManagerBasedRLEnv

    from sim_bridge.leisaac_follower import (
        BI_ARM_CAMERAS,
        BI_ARM_SIDES,
        LeisaacBridge,
        LeisaacBridgeConfig,
        prepare_env_cfg,
        success_fn_for,
        task_cameras,
    )
    from sim_bridge.server import SimServerEndpoint

    env = FakeBiArmManagerBasedRLEnv()
    success_term = prepare_env_cfg(env.cfg)  # as main() does: nothing resets the scene inside step
    cfg = LeisaacBridgeConfig(step_hz=120.0, daemon_staleness_s=0.1, arms=BI_ARM_SIDES, cameras=BI_ARM_CAMERAS)
    ep = SimServerEndpoint("tcp://127.0.0.1:0", backend="leisaac:fake-bi-arm", arms=BI_ARM_SIDES)
    bridge = LeisaacBridge(env, ep, config=cfg, success_fn=success_fn_for(env, success_term))
    bridge.reset(0)
    ep.cameras = task_cameras(bridge._policy_obs(), cfg.cameras, cfg.publish_hz)
    ep.open()
    thread = threading.Thread(target=bridge.run, daemon=True)
    thread.start()
    links = {side: SimFollower(ep.endpoint, staleness_s=0.5, arm=side) for side in SIDES}
    try:
        for link in links.values():
            link.connect()
        yield env, bridge, links
    finally:
        for link in links.values():
            link.close()
        bridge.stop()
        thread.join(5)
        ep.close()


def test_leisaac_bi_arm_task_takes_both_arms_as_one_twelve_wide_action(leisaac_bi_arm) -> None:
    from calibration.conventions import sim_rad_to_units, units_to_sim_rad
    from sim_bridge.leisaac_follower import is_bi_arm_task

    env, _bridge, links = leisaac_bi_arm
    assert is_bi_arm_task("LeIsaac-SO101-CleanToyTable-BiArm-v0") and not is_bi_arm_task("LeIsaac-SO101-PickOrange-v0")
    # both arms after the reset re-align to their daemon targets: wait for the action to carry both
    links["left"].write_goals(LEFT_POSE)
    links["right"].write_goals(RIGHT_POSE)
    want = np.concatenate([units_to_sim_rad(LEFT_POSE), units_to_sim_rad(RIGHT_POSE)]).astype(np.float32)

    def both_on_target() -> bool:
        for link in links.values():
            link.write_goals(LEFT_POSE if link.arm == "left" else RIGHT_POSE)  # the daemon sends every cycle
        return bool(env.actions_seen) and np.allclose(env.actions_seen[-1][0], want, atol=1e-4)

    wait_for(both_on_target, 20, "the action holding the left targets, then the right ones")
    assert env.actions_seen[-1].shape == (1, 12)
    # each link reads its own arm: the policy term <side>_joint_pos, in LeRobot units
    for side, pose in zip(SIDES, (LEFT_POSE, RIGHT_POSE)):
        wait_for(lambda: np.allclose(links[side].read_joints(), pose, atol=0.5), 10, f"{side} state on its target")
        q = env.scene.joint_pos[f"{side}_arm"][0].astype(np.float64)
        assert np.allclose(links[side].read_joints(), sim_rad_to_units(q), atol=1.0)
    # the right link moves only the right half of the action
    moved = RIGHT_POSE + np.array([10.0, 0.0, 0.0, 0.0, 0.0, 20.0])
    want_moved = np.concatenate([units_to_sim_rad(LEFT_POSE), units_to_sim_rad(moved)]).astype(np.float32)

    def right_moved() -> bool:
        links["left"].write_goals(LEFT_POSE)
        links["right"].write_goals(moved)
        return np.allclose(env.actions_seen[-1][0], want_moved, atol=1e-4)

    wait_for(right_moved, 10, "the right half of the action on the right link's new target")
    # the task's cameras reach the first arm's link
    cams = links["left"].cameras()
    wait_for(lambda: all(n in cams and cams[n].latest_frame() is not None for n in CAMERAS), 10, "the bi-arm cameras")


def test_leisaac_bi_arm_reset_reaches_both_links_and_each_arm_holds_its_reset_pose(leisaac_bi_arm) -> None:
    _env, bridge, links = leisaac_bi_arm
    before = {side: link.scene_resets() for side, link in links.items()}
    links["left"].reset_episode(timeout_s=10)
    wait_for(lambda: all(link.scene_resets() > before[s] for s, link in links.items()), 5, "both links saw the reset")
    assert all(bridge.drive(side).realigning or bridge.drive(side).daemon_target_rad is None for side in SIDES)
