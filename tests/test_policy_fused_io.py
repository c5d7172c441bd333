"""LeRobot's pre/post-processing, fused: the same chunk as LeRobot's pipelines, or the pipelines.

The engine measures the checkpoint's own pipelines at load (daemon/policy/fused_io.py) and runs
the fused form only when a random observation proves it gives what the pipelines give. These
tests hold it to that: a real ACT and Diffusion checkpoint give the same actions both ways, and a
pipeline that does anything else than a per-element affine map is kept, with the reason said.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from daemon.data.schema import IMAGE_KEY_PREFIX, STATE_KEY
from daemon.policy.checkpoint import ExpectedIO
from daemon.policy.engine import PolicyEngine
from daemon.policy.fused_io import fuse
from daemon.policy.tiny import make_synthetic_dataset, train_tiny_policy

H, W = 48, 64
CAMS = {"front": (H, W)}
KEY = IMAGE_KEY_PREFIX + "front"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("ds") / "synthetic", CAMS, episodes=1, frames_per_episode=20)


@pytest.fixture(scope="module", params=["act", "diffusion"])
def ckpt(request, dataset, tmp_path_factory) -> Path:
    kind = request.param
    return train_tiny_policy(dataset, tmp_path_factory.mktemp(kind) / "ckpt", policy_type=kind, steps=2).checkpoint


def _observation(rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    return rng.normal(0.0, 40.0, 6).astype(np.float32), {"front": rng.integers(0, 256, (H, W, 3), dtype=np.uint8)}


def test_the_fused_engine_gives_the_chunk_lerobots_pipelines_give(ckpt: Path) -> None:
    import torch

    fused = PolicyEngine.from_checkpoint(str(ckpt), ExpectedIO(cameras=CAMS))
    plain = PolicyEngine.from_checkpoint(str(ckpt), ExpectedIO(cameras=CAMS), fused_io=False)
    assert fused.io == "fused pre- and postprocessing (checked against LeRobot's pipelines at load)"
    assert plain.io == "LeRobot's pipelines" and plain.fused is None
    rng = np.random.default_rng(7)
    for _ in range(3):
        state, images = _observation(rng)
        fused.reset()
        plain.reset()
        torch.manual_seed(1)  # Diffusion starts its denoising from noise: the same noise both ways
        a, _ = fused.infer(state, images)
        torch.manual_seed(1)
        b, _ = plain.infer(state, images)
        assert a.shape == b.shape and a.dtype == b.dtype == np.float32
        # float32 rounding of the same arithmetic in another order, on values of tens of degrees
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-3)
        assert np.abs(b).max() > 1.0  # real joint values, not a pair of zero chunks


@pytest.fixture(scope="module")
def act_engine(dataset, tmp_path_factory) -> PolicyEngine:
    ck = train_tiny_policy(dataset, tmp_path_factory.mktemp("act1") / "ckpt", policy_type="act", steps=1).checkpoint
    return PolicyEngine.from_checkpoint(str(ck), ExpectedIO(cameras=CAMS), fused_io=False)


def _fuse(engine: PolicyEngine, pre=None, post=None, device: str = "cpu"):
    import torch

    state, images = _observation(np.random.default_rng(0))
    with torch.inference_mode():
        chunk = engine.predict(engine.loaded.preprocessor(engine.raw_observation(state, images)))
    return fuse(
        pre or engine.loaded.preprocessor,
        post or engine.loaded.postprocessor,
        engine.raw_observation,
        6,
        CAMS,
        chunk,
        device,
    )


def test_a_preprocessor_that_is_not_affine_keeps_lerobots_pipelines(act_engine: PolicyEngine) -> None:
    def squares_the_image(obs):
        out = act_engine.loaded.preprocessor(obs)
        out[KEY] = out[KEY] * out[KEY]
        return out

    fused, why = _fuse(act_engine, pre=squares_the_image)
    assert fused is None
    assert why.startswith("LeRobot's pipelines (the fused observation.images.front differs: values differ by up to")


def test_a_preprocessor_with_more_outputs_keeps_lerobots_pipelines(act_engine: PolicyEngine) -> None:
    import torch

    def tokenizes(obs):
        out = act_engine.loaded.preprocessor(obs)
        out["observation.language.tokens"] = torch.zeros(1, 8, dtype=torch.long)
        return out

    fused, why = _fuse(act_engine, pre=tokenizes)
    assert fused is None and "not just state and images" in why and "observation.language.tokens" in why


def test_a_state_dependent_extra_output_keeps_lerobots_pipelines(act_engine: PolicyEngine) -> None:
    def says_the_state(obs):
        out = act_engine.loaded.preprocessor(obs)
        out["note"] = f"{float(out[STATE_KEY][0, 0]):.3f}"
        return out

    fused, why = _fuse(act_engine, pre=says_the_state)
    assert fused is None and "depend on the observation" in why


def test_a_postprocessor_that_is_not_affine_keeps_only_that_one(act_engine: PolicyEngine) -> None:
    import torch

    def clamps(chunk):
        return act_engine.loaded.postprocessor(chunk).clamp(-10.0, 10.0)

    fused, why = _fuse(act_engine, post=clamps)
    assert fused is not None and fused.action is None
    assert why.startswith(
        "fused preprocessing (checked against LeRobot's at load); LeRobot's postprocessor (values differ"
    )
    assert fused.postprocess(torch.zeros(1, 10, 6)) is None  # the engine then runs LeRobot's postprocessor


def test_a_chunk_of_another_shape_goes_through_lerobots_postprocessor(act_engine: PolicyEngine) -> None:
    import torch

    fused, _ = _fuse(act_engine)
    assert fused is not None and fused.action_shape is not None
    n = fused.action_shape[1]
    assert fused.postprocess(torch.zeros(1, n + 1, 6)) is None
    assert fused.postprocess(torch.zeros(1, n, 6)) is not None


def test_an_accelerator_keeps_lerobots_pipelines(act_engine: PolicyEngine) -> None:
    fused, why = _fuse(act_engine, device="cuda")
    assert fused is None and "CPU only" in why
