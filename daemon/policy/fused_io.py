"""LeRobot's pre- and post-processing as one affine operation per tensor, when that is provably
all they do.

For the policies we serve (ACT, Diffusion) LeRobot's pipelines rename keys, add the batch
dimension, move to the device and (un)normalise with the dataset statistics: per image channel,
per state and action element, ``y = a * x + b``. Run through the generic pipeline that costs
~0.4 ms per request right after a forward pass (cold caches; Python per step and per feature,
the image converted to float, then normalised in a second pass); fused it is one pass over the
frame from its uint8 pixels (bench/bench_policy.py prints both, interleaved).

Nothing about LeRobot's normalisation modes is re-implemented here. ``fuse()`` *measures* the
loaded pipelines: it runs them on an all-zero and an all-one observation (and chunk) to read off
``b`` and ``a``, then runs them on a random observation and accepts the fused form only if it
reproduces the pipeline's every output: the same tensor keys, shapes, dtypes and values (within
float rounding), and the same non-tensor entries. Any pipeline that does something else (a
tokenizer, a resize, a step that is not per-element affine, an accelerator device) keeps
LeRobot's pipeline, and the worker says why in its info.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from daemon.data.schema import IMAGE_KEY_PREFIX, STATE_KEY

# Accept the fused form when it matches the pipeline to float32 rounding of normalised values
# (|y| up to ~10 for ImageNet-style statistics: 1e-4 is ~100 ulps, far below one pixel level).
RTOL = 1e-4
ATOL = 1e-4

# Builds LeRobot's raw observation (the dict the preprocessor takes) from our state and frames.
RawObservation = Callable[[np.ndarray, Mapping[str, np.ndarray]], dict[str, Any]]


@dataclass
class Affine:
    """y = scale * x + offset, broadcast over the tensor (torch tensors on the CPU)."""

    scale: Any
    offset: Any


@dataclass
class FrameAffine:
    """y = scale * pixel + offset per channel of a uint8 frame: float32 arrays of shape (3, 1, 1)."""

    scale: np.ndarray
    offset: np.ndarray


@dataclass
class FusedIO:
    """The preprocessor and postprocessor as measured affine maps (see the module docstring)."""

    state: Affine  # on the state vector, (1, D)
    images: dict[str, FrameAffine]  # camera name -> map from its uint8 pixels to the (1, 3, H, W) tensor
    constants: dict[str, Any]  # the pipeline's non-tensor outputs (task, ...), the same every call
    action: Affine | None  # on the (1, n, dim) chunk; None: the postprocessor is kept
    action_shape: tuple[int, ...] | None

    def preprocess(self, state: np.ndarray, images: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """The batch LeRobot's preprocessor would give for (state float32 (D,), frames uint8 (H, W, 3))."""
        import torch

        batch: dict[str, Any] = dict(self.constants)
        s = torch.from_numpy(state).unsqueeze(0)
        batch[STATE_KEY] = torch.addcmul(self.state.offset, s, self.state.scale)
        for name, m in self.images.items():
            img = images[name]
            # uint8 HWC -> CHW (one contiguous byte copy), then scale into float and shift in
            # place. numpy, not torch: single-threaded, so no pool of sleeping OpenMP threads is
            # woken for a 0.2 ms job (torch took 0.26 ms on one thread, 0.44 ms on two passive
            # ones; bench_policy's fused-vs-pipeline section times it inside inferences)
            chw = np.ascontiguousarray(img.transpose(2, 0, 1))
            out = np.empty((1, 3, img.shape[0], img.shape[1]), dtype=np.float32)
            np.multiply(chw, m.scale, out=out[0])
            np.add(out, m.offset, out=out)
            batch[IMAGE_KEY_PREFIX + name] = torch.from_numpy(out)
        return batch

    def postprocess(self, chunk: Any) -> Any | None:
        """The postprocessor's output for ``chunk``, or None when the chunk is not the shape that
        was measured (the caller then runs LeRobot's postprocessor)."""
        import torch

        if self.action is None or tuple(chunk.shape) != self.action_shape or chunk.device.type != "cpu":
            return None
        return torch.addcmul(self.action.offset, chunk.float(), self.action.scale)


def fuse(
    preprocessor: Any,
    postprocessor: Any,
    raw_observation: RawObservation,
    state_dim: int,
    cameras: Mapping[str, tuple[int, int]],
    chunk: Any,
    device: str,
) -> tuple[FusedIO | None, str]:
    """Measure the pipelines; returns (FusedIO or None, what the worker uses, in words).

    ``cameras``: name -> (height, width) the policy takes; ``chunk``: one output of the policy's
    predict_action_chunk (its shape and dtype are what the postprocessor is measured on)."""
    import torch

    why = device_not_fusable(device)
    if why:
        return None, why
    rng = np.random.default_rng(0)
    zeros = np.zeros(state_dim, dtype=np.float32), {n: np.zeros((h, w, 3), np.uint8) for n, (h, w) in cameras.items()}
    ones = np.ones(state_dim, dtype=np.float32), {n: np.full((h, w, 3), 255, np.uint8) for n, (h, w) in cameras.items()}
    probe = (
        rng.normal(0.0, 50.0, state_dim).astype(np.float32),
        {n: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for n, (h, w) in cameras.items()},
    )
    with torch.inference_mode():
        out0 = preprocessor(raw_observation(*zeros))
        out1 = preprocessor(raw_observation(*ones))
        ref = preprocessor(raw_observation(*probe))
        expected_tensors = {STATE_KEY, *(IMAGE_KEY_PREFIX + n for n in cameras)}
        tensors = {k for k, v in ref.items() if isinstance(v, torch.Tensor)}
        if tensors != expected_tensors:
            return None, f"LeRobot's pipelines (the preprocessor outputs {sorted(tensors)}, not just state and images)"
        constants = {k: v for k, v in ref.items() if k not in tensors}
        if any(_differs(out0.get(k), v) or _differs(out1.get(k), v) for k, v in constants.items()):
            return None, "LeRobot's pipelines (the preprocessor's other outputs depend on the observation)"
        s0, s1 = out0[STATE_KEY].float(), out1[STATE_KEY].float()
        state = Affine(scale=(s1 - s0).reshape(1, state_dim).clone(), offset=s0.reshape(1, state_dim).clone())
        images: dict[str, FrameAffine] = {}
        for name in cameras:
            key = IMAGE_KEY_PREFIX + name
            i0, i1 = out0[key].float(), out1[key].float()
            if i0.dim() != 4 or i0.shape[1] != 3:
                return None, f"LeRobot's pipelines ({key} comes out as {tuple(i0.shape)}, not (1, 3, H, W))"
            b = i0[0, :, :1, :1]
            a = (i1[0, :, :1, :1] - b) / 255.0  # per uint8 pixel level
            images[name] = FrameAffine(scale=a.numpy().copy(), offset=b.numpy().copy())
        fused = FusedIO(state=state, images=images, constants=constants, action=None, action_shape=None)
        got = fused.preprocess(*probe)
        for k in sorted(tensors):
            why = _mismatch(got[k], ref[k])
            if why:
                return None, f"LeRobot's pipelines (the fused {k} differs: {why})"
        # the postprocessor, measured the same way on chunks of the policy's own shape and dtype
        c = chunk.detach().to("cpu")
        p0 = postprocessor(torch.zeros_like(c))
        p1 = postprocessor(torch.ones_like(c))
        pr_in = torch.from_numpy(rng.normal(0.0, 2.0, tuple(c.shape)).astype(np.float32)).to(c.dtype)
        pr = postprocessor(pr_in)
        if not all(isinstance(x, torch.Tensor) for x in (p0, p1, pr)):
            return (
                fused,
                "fused preprocessing (checked against LeRobot's at load); LeRobot's postprocessor (not a tensor out)",
            )
        fused.action = Affine(scale=(p1.float() - p0.float()).clone(), offset=p0.float().clone())
        fused.action_shape = tuple(c.shape)
        post = fused.postprocess(pr_in)
        why = "no output" if post is None else _mismatch(post, pr)
        if why:
            fused.action, fused.action_shape = None, None
            return fused, f"fused preprocessing (checked against LeRobot's at load); LeRobot's postprocessor ({why})"
    return fused, "fused pre- and postprocessing (checked against LeRobot's pipelines at load)"


def device_not_fusable(device: str) -> str | None:
    """Why the pipelines stay LeRobot's on ``device`` (None on the CPU, where fusing is measured)."""
    if device.split(":")[0] != "cpu":
        return f"LeRobot's pipelines (the fused form is measured on the CPU only; device {device})"
    return None


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except (TypeError, ValueError, RuntimeError):  # arrays or tensors: not a constant we can compare
        return True


def _mismatch(got: Any, ref: Any) -> str | None:
    import torch

    if tuple(got.shape) != tuple(ref.shape):
        return f"shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    if got.dtype != ref.dtype:
        return f"dtype {got.dtype} vs {ref.dtype}"
    if not torch.allclose(got, ref, rtol=RTOL, atol=ATOL):
        return f"values differ by up to {float((got - ref).abs().max()):.3g}"
    return None
