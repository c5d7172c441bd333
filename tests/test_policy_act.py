"""End to end with real LeRobot policies: a tiny ACT (and Diffusion) trained offline on a
LeRobotDataset in the daemon's schema, saved as LeRobot 0.6.1 saves checkpoints, loaded through
our safe loader, run in the policy worker process behind PolicySource."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from daemon.data.schema import ACTION_KEY
from daemon.policy.action_queue import QueueConfig
from daemon.policy.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    ExpectedIO,
    check_checkpoint,
    inspect_checkpoint,
    load_policy,
)
from daemon.policy.engine import PolicyEngine
from daemon.policy.runner import PolicyRunnerConfig, PolicySource
from daemon.policy.tiny import make_synthetic_dataset, synthetic_frame, synthetic_pose, train_tiny_policy
from drivers.cameras import Frame

H, W = 48, 64
CAMS = {"front": (H, W)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("ds") / "synthetic", CAMS, episodes=2, frames_per_episode=30)


@pytest.fixture(scope="module")
def act_ckpt(dataset, tmp_path_factory) -> Path:
    result = train_tiny_policy(dataset, tmp_path_factory.mktemp("act") / "ckpt", policy_type="act", steps=5)
    assert len(result.losses) == 5 and all(math.isfinite(v) for v in result.losses)
    return result.checkpoint


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_checkpoint_is_what_lerobot_saves_and_loads_offline(act_ckpt: Path) -> None:
    names = {p.name for p in act_ckpt.iterdir()}
    assert {"config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"} <= names
    info = inspect_checkpoint(act_ckpt)
    assert info.policy_type == "act"
    assert info.state_shape == (6,) and info.action_shape == (6,)
    assert info.cameras == {"front": (3, H, W)}
    loaded = load_policy(act_ckpt, ExpectedIO(cameras=CAMS))
    assert loaded.policy.config.pretrained_backbone_weights is None
    assert not loaded.policy.training


def test_actions_are_in_lerobot_units_through_the_processors(act_ckpt: Path, dataset) -> None:
    import torch

    engine = PolicyEngine.from_checkpoint(str(act_ckpt), ExpectedIO(cameras=CAMS))
    state = synthetic_pose(0.4)
    img = synthetic_frame(state, H, W)
    actions, timings = engine.infer(state, {"front": img})
    assert actions.shape == (10, 6) and actions.dtype == np.float32
    assert timings.forward_s > 0
    # Recompute by hand: normalised model output * dataset std + dataset mean (MEAN_STD).
    pol = engine.loaded.policy
    stats = dataset.meta.stats
    obs = {
        "observation.state": torch.from_numpy(
            (state - stats["observation.state"]["mean"]) / stats["observation.state"]["std"]
        ).float()[None],
        "observation.images.front": (
            (
                torch.from_numpy(img).permute(2, 0, 1).float() / 255.0
                - torch.as_tensor(stats["observation.images.front"]["mean"]).float()
            )
            / (torch.as_tensor(stats["observation.images.front"]["std"]).float() + 1e-8)
        )[None],
    }
    with torch.inference_mode():
        norm = pol.predict_action_chunk(obs)[0].numpy()
    by_hand = norm * stats[ACTION_KEY]["std"] + stats[ACTION_KEY]["mean"]
    np.testing.assert_allclose(actions, by_hand, rtol=1e-3, atol=1e-2)
    # and they are joint units, not normalised values: the gripper sits around its data mean (~50)
    assert abs(float(np.mean(actions[:, 5])) - float(stats[ACTION_KEY]["mean"][5])) < 3 * float(
        stats[ACTION_KEY]["std"][5]
    )


def test_pickle_checkpoints_are_refused_before_loading(act_ckpt: Path, tmp_path: Path) -> None:
    # a .bin beside the safetensors: refused, nothing unpickled
    ck = _copy(act_ckpt, tmp_path / "with_bin")
    (ck / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*only safetensors"):
        inspect_checkpoint(ck)
    with pytest.raises(CheckpointError, match="only safetensors"):
        load_policy(ck)
    # a .pt-only checkpoint (no model.safetensors)
    pt = tmp_path / "pt_only"
    pt.mkdir()
    shutil.copy(act_ckpt / "config.json", pt / "config.json")
    (pt / "model.pt").write_bytes(b"\x80\x04")
    with pytest.raises(CheckpointError, match=r"model\.pt"):
        inspect_checkpoint(pt)
    # a processor whose state file is not safetensors
    ck2 = _copy(act_ckpt, tmp_path / "bad_state")
    pre = json.loads((ck2 / "policy_preprocessor.json").read_text())
    for step in pre["steps"]:
        if step.get("state_file"):
            step["state_file"] = "../../stats.safetensors"
    (ck2 / "policy_preprocessor.json").write_text(json.dumps(pre))
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        inspect_checkpoint(ck2)
    # missing processors: the message says how LeRobot 0.6 saves them
    ck3 = _copy(act_ckpt, tmp_path / "no_proc")
    (ck3 / "policy_postprocessor.json").unlink()
    with pytest.raises(CheckpointError, match="postprocessor.save_pretrained"):
        inspect_checkpoint(ck3)


def test_mismatched_cameras_are_listed(act_ckpt: Path) -> None:
    with pytest.raises(CheckpointMismatchError) as err:
        check_checkpoint(act_ckpt, ExpectedIO(cameras={"wrist": (H, W)}))
    assert "camera 'front' (64x48) expected by the policy is not configured (configured: wrist)" in err.value.mismatches
    with pytest.raises(CheckpointMismatchError) as err:
        check_checkpoint(act_ckpt, ExpectedIO(cameras={"front": (480, 640)}))
    assert err.value.mismatches == ["camera 'front': policy expects 64x48, configured 640x480"]
    with pytest.raises(CheckpointMismatchError) as err:
        check_checkpoint(act_ckpt, ExpectedIO(cameras={}, state_dim=7))
    text = str(err.value)
    assert "observation.state" in text and "camera 'front'" in text
    assert check_checkpoint(act_ckpt, ExpectedIO(cameras={"front": (H, W), "wrist": (H, W)})).policy_type == "act"


@pytest.fixture(scope="module")
def diffusion_ckpt(dataset, tmp_path_factory) -> Path:
    return train_tiny_policy(
        dataset, tmp_path_factory.mktemp("diffusion") / "ckpt", policy_type="diffusion", steps=2
    ).checkpoint


def test_diffusion_loads_and_predicts_a_chunk(diffusion_ckpt: Path) -> None:
    engine = PolicyEngine.from_checkpoint(str(diffusion_ckpt), ExpectedIO(cameras=CAMS))
    assert engine.info.policy_type == "diffusion" and engine.info.n_obs_steps == 2
    state = synthetic_pose(0.2)
    actions, _ = engine.infer(state, {"front": synthetic_frame(state, H, W)})
    assert actions.shape == (8, 6) and np.all(np.isfinite(actions))


def test_smolvla_reports_what_is_missing(act_ckpt: Path, tmp_path: Path) -> None:
    ck = _copy(act_ckpt, tmp_path / "smol")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["type"] = "smolvla"
    (ck / "config.json").write_text(json.dumps(cfg))
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(CheckpointError, match="smolvla"):
            load_policy(ck)
    else:  # pragma: no cover - transformers is not installed here
        pytest.skip("transformers installed: SmolVLA would need its VLM weights offline")


class StillCamera:
    """A frame source with a fixed picture (the worker's chunks are then deterministic)."""

    def __init__(self, pixels: np.ndarray):
        self.pixels = pixels
        self.height, self.width = pixels.shape[:2]
        self.seq = 0

    def latest_frame(self) -> Frame:
        self.seq += 1
        return Frame(pixels=self.pixels, capture_monotonic_s=time.monotonic(), seq=self.seq)


def test_policy_worker_feeds_the_loop(act_ckpt: Path) -> None:
    state = synthetic_pose(0.4)
    img = synthetic_frame(state, H, W)
    reference, _ = PolicyEngine.from_checkpoint(str(act_ckpt), ExpectedIO(cameras=CAMS)).infer(state, {"front": img})
    period = 0.05
    # no interpolation and no cross-fade: every target must be exactly one of the chunk's actions
    qcfg = QueueConfig(action_period_s=period, interpolate=False, max_obs_age_s=30.0, refill_below=4, blend_s=0.0)
    src = PolicySource(PolicyRunnerConfig(str(act_ckpt), cameras=CAMS, queue=qcfg), {"front": StillCamera(img)})
    assert src.target(time.monotonic(), state) is None  # not started: hold
    src.start()
    try:
        assert src.wait_ready(90), src.error
        targets, costs = [], []
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and (src.results < 3 or len(targets) < 20):
            now = time.monotonic()
            t0 = time.perf_counter()
            a = src.target(now, state)
            costs.append(time.perf_counter() - t0)
            if a is not None:
                targets.append(a)
            time.sleep(0.01)
        assert src.results >= 3 and len(targets) >= 20, src.stats()
        for a in targets:
            assert a.shape == (6,)
            # every target is one of the chunk's actions (same observation -> same chunk)
            assert np.min(np.max(np.abs(reference - a), axis=1)) < 1e-3
        # stale slots (eaten by inference latency) were dropped, exactly those
        for _req, obs_t, recv_t, n, kept in src.chunk_log:
            if kept:
                assert n - kept == int((recv_t - obs_t) / period)
        st = src.stats()
        assert st["state"] == "ready" and st["inference_latency_ms"]["n"] >= 3
        assert st["stages_ms"]["forward"]["p50"] > 0
        # a chunk is live, and what is left of it is a part of it
        assert st["chunks_live"] >= 1 and st["queue_depth"] <= len(reference)
        assert float(np.median(costs)) < 0.005  # loop-side cost: microseconds, generous bound
    finally:
        src.stop()
    assert src.state == "stopped"


def test_a_broken_checkpoint_is_reported_not_crashed(act_ckpt: Path, tmp_path: Path) -> None:
    ck = _copy(act_ckpt, tmp_path / "broken")
    raw = (ck / "model.safetensors").read_bytes()
    (ck / "model.safetensors").write_bytes(raw[: len(raw) // 2])  # truncated weights
    src = PolicySource(PolicyRunnerConfig(str(ck), cameras=CAMS), {"front": StillCamera(np.zeros((H, W, 3), np.uint8))})
    src.start()
    try:
        assert not src.wait_ready(90)
        assert src.state == "error" and "model.safetensors" in (src.error or ""), src.error
        assert src.target(time.monotonic(), np.zeros(6)) is None
    finally:
        src.stop()
