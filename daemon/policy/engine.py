"""One observation in, one action chunk out: the only code that runs a policy's forward pass.

Both the policy worker process (shared-memory path for the control loop) and the ZeroMQ server
(serve.py, for other local clients) call ``PolicyEngine.infer``; keeping one implementation means
the latency numbers of both paths measure the same work.

Input: joint state (6,) in LeRobot units and RGB uint8 frames (H, W, 3) per camera, exactly what
the daemon records; output: (n, 6) float32 absolute joint targets in LeRobot units, action 0
meant for the observation's own time, action k for ``k`` policy periods later.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from daemon.data.schema import IMAGE_KEY_PREFIX, STATE_KEY
from daemon.policy.checkpoint import CheckpointError, ExpectedIO, LoadedPolicy, load_policy
from daemon.policy.fused_io import FusedIO, device_not_fusable, fuse

# Test and benchmark knob: every forward pass lasts at least this many seconds (the real one runs,
# then sleeps out the rest, inside its timing), so a tiny checkpoint behaves like a big one on a
# slow machine without touching LeRobot. Read when the engine is built (the worker inherits it).
FORWARD_DELAY_ENV = "SO101D_POLICY_FORWARD_DELAY_S"


def forward_delay_from_env() -> float:
    raw = os.environ.get(FORWARD_DELAY_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{FORWARD_DELAY_ENV}={raw!r}: must be a number of seconds") from None
    if not (0.0 <= v <= 60.0):
        raise ValueError(f"{FORWARD_DELAY_ENV}={raw!r}: must be within 0..60 s")
    return v


@dataclass
class InferenceTimings:
    """Where one inference's time went, in seconds."""

    preprocess_s: float = 0.0
    forward_s: float = 0.0
    postprocess_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.preprocess_s + self.forward_s + self.postprocess_s


class PolicyEngine:
    """A loaded policy plus the glue LeRobot's rollout code applies around it."""

    def __init__(self, loaded: LoadedPolicy, task: str = "", max_actions: int | None = None, fused_io: bool = True):
        import torch

        self._torch = torch
        self.loaded = loaded
        self.info = loaded.info
        self.task = task
        self.max_actions = max_actions
        self._device = torch.device(loaded.device)
        self._uses_queues = self.info.policy_type == "diffusion"
        self.forward_delay_s = forward_delay_from_env()
        self.camera_names = self.info.camera_names
        # LeRobot's pipelines as measured affine maps where that is exactly what they do
        # (fused_io.py); ``io`` says which path runs, for the worker's info and `policy status`
        self.fused: FusedIO | None = None
        self.io = "LeRobot's pipelines"
        if fused_io:
            self.fused, self.io = self._fuse()
        self.reset()

    @classmethod
    def from_checkpoint(
        cls,
        path: str,
        expected: ExpectedIO | None = None,
        device: str | None = None,
        task: str = "",
        fused_io: bool = True,
    ) -> PolicyEngine:
        return cls(load_policy(path, expected, device), task=task, fused_io=fused_io)

    def _fuse(self) -> tuple[FusedIO | None, str]:
        """One zero observation through LeRobot's preprocessor and the policy gives a chunk of the
        policy's own shape; fuse() then measures both pipelines against it."""
        torch = self._torch
        why = device_not_fusable(self.loaded.device)
        if why:  # no probe forward pass on an accelerator
            return None, why
        dim = int((self.info.state_shape or (0,))[0])
        cams = {name: (h, w) for name, (_c, h, w) in self.info.cameras.items()}
        zeros = np.zeros(dim, dtype=np.float32), {n: np.zeros((h, w, 3), np.uint8) for n, (h, w) in cams.items()}
        with torch.inference_mode():
            chunk = self.predict(self.loaded.preprocessor(self.raw_observation(*zeros)))
        self.reset()
        return fuse(
            self.loaded.preprocessor,
            self.loaded.postprocessor,
            self.raw_observation,
            dim,
            cams,
            chunk,
            self.loaded.device,
        )

    def raw_observation(self, state: np.ndarray, images: Mapping[str, np.ndarray]) -> dict[str, object]:
        """The observation dict LeRobot's preprocessor takes (its rollout code's layout)."""
        torch = self._torch
        obs: dict[str, object] = {STATE_KEY: torch.from_numpy(state).unsqueeze(0).to(self._device)}
        for name in self.camera_names:
            if self._device.type == "cpu":
                # HWC -> CHW as one contiguous uint8 copy first: LeRobot's normaliser is slower
                # on a permuted (strided) float view; same values (bench/bench_policy.py prints both)
                img = torch.from_numpy(np.ascontiguousarray(images[name].transpose(2, 0, 1)))
            else:  # an accelerator: the uint8 frame goes up as it is, the permute happens there
                img = torch.from_numpy(images[name]).to(self._device).permute(2, 0, 1)
            obs[IMAGE_KEY_PREFIX + name] = img.unsqueeze(0).float().div_(255.0)
        obs["task"] = self.task
        obs["robot_type"] = "so101_follower"
        return obs

    def predict(self, batch: dict[str, Any]) -> Any:
        """The policy's forward pass on a preprocessed batch: the normalised action chunk."""
        torch = self._torch
        policy = self.loaded.policy
        if self._uses_queues:
            # Diffusion keeps n_obs_steps of history in its queues (what select_action does).
            from lerobot.policies.utils import populate_queues
            from lerobot.utils.constants import OBS_IMAGES

            b = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and k != "action"}
            if policy.config.image_features:
                b[OBS_IMAGES] = torch.stack([b[k] for k in policy.config.image_features], dim=-4)
            policy._queues = populate_queues(policy._queues, b)
            return policy.predict_action_chunk(b)
        return policy.predict_action_chunk(batch)

    def reset(self) -> None:
        """Forget observation history (diffusion's n_obs_steps queue); call at episode start."""
        self.loaded.policy.reset()

    def check_observation(self, state: np.ndarray, images: dict[str, np.ndarray]) -> None:
        """Raise ValueError naming what is wrong with an observation (never reaches torch)."""
        if state.shape != tuple(self.info.state_shape or ()):
            raise ValueError(f"state shape {state.shape}, policy expects {self.info.state_shape}")
        if not np.all(np.isfinite(state)):
            raise ValueError("state contains NaN or inf")
        for name, (c, h, w) in self.info.cameras.items():
            img = images.get(name)
            if img is None:
                raise ValueError(f"camera {name!r} missing from the observation")
            if img.shape != (h, w, c) or img.dtype != np.uint8:
                raise ValueError(f"camera {name!r}: got {img.dtype} {img.shape}, policy expects uint8 {(h, w, c)}")

    def infer(self, state: np.ndarray, images: dict[str, np.ndarray]) -> tuple[np.ndarray, InferenceTimings]:
        """Action chunk (n, action_dim) float32 in LeRobot units, plus timings."""
        torch = self._torch
        state = np.asarray(state, dtype=np.float32)
        self.check_observation(state, images)
        fused = self.fused
        t0 = time.perf_counter()
        with torch.inference_mode():
            if fused is not None:
                batch = fused.preprocess(state, images)
            else:
                batch = self.loaded.preprocessor(self.raw_observation(state, images))
            t1 = time.perf_counter()
            chunk = self.predict(batch)
            if self._device.type == "cuda":
                torch.cuda.synchronize()
            if self.forward_delay_s > 0:
                # sleep to an absolute end: a forward pass of the requested duration in total
                end = t1 + self.forward_delay_s
                while (left := end - time.perf_counter()) > 0:
                    time.sleep(left)
            t2 = time.perf_counter()
            actions = fused.postprocess(chunk) if fused is not None else None
            if actions is None:
                actions = self.loaded.postprocessor(chunk)
            out = actions.detach().to("cpu").numpy()
        t3 = time.perf_counter()
        out = np.asarray(out, dtype=np.float32).reshape(-1, out.shape[-1])
        if self.max_actions is not None:
            out = out[: self.max_actions]
        if not np.all(np.isfinite(out)):
            raise CheckpointError("the policy produced NaN or inf actions")
        return np.ascontiguousarray(out), InferenceTimings(t1 - t0, t2 - t1, t3 - t2)
