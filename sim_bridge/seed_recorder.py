"""Seed demos for Isaac Lab Mimic, written by the LeIsaac follower while the daemon records.

The daemon's LeRobot dataset cannot hold what Mimic's first steps need: the scene state. LeIsaac's
``scripts/mimic/annotate_demos.py`` (and ``scripts/environments/teleoperation/replay.py``) call
``env.reset_to(episode.data["initial_state"], None, is_relative=True)`` -- Isaac Lab's
``InteractiveScene.reset_to`` indexes every articulation's ``root_pose``, ``root_velocity``,
``joint_position``, ``joint_velocity`` and every rigid object's ``root_pose``, ``root_velocity`` --
then step ``actions``; ``scripts/mimic/eef_action_process.py --to_ik`` reads
``obs/ee_frame_state`` (``--to_joint``: ``obs/joint_pos_target``). So the bridge, which owns the
env, records each daemon episode (start -> stop, the daemon's episode verbs) into an HDF5 file
with exactly what Isaac Lab's ``ActionStateRecorderManagerCfg`` terms record
(``isaaclab/envs/mdp/recorders/recorders.py``):

- ``initial_state``: ``scene.get_state(is_relative=True)`` when the episode starts;
- per step: ``actions`` (the action given to ``step``, pre-step), ``obs`` (the policy observation
  group as it was before the step: ``obs_buf["policy"]``), ``states`` (``scene.get_state(
  is_relative=True)`` after the step) and ``processed_actions`` (the action terms' processed
  actions after the step);

in the layout LeIsaac's ``StreamingHDF5DatasetFileHandler`` writes (``data.attrs["env_args"]``
JSON with ``env_name`` and ``type`` 2, ``data.attrs["total"]``, ``demo_<n>`` groups with
``num_samples``, ``seed``, ``success``; resizable datasets appended every ``flush_steps`` so an
episode never sits in memory whole -- 30 s of two 640x480 cameras would be 3 GB).

Only numpy and h5py (both in Isaac Lab's Python); no torch import.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("so101d.sim.seed")

FLUSH_STEPS = 100  # StreamingRecorderManager's flush period and chunk length


def to_numpy(x: Any) -> np.ndarray:
    """torch tensor (any device) or array-like -> numpy, without importing torch (the follower
    runs in Isaac Lab's Python, the tests without torch tensors)."""
    if hasattr(x, "detach"):
        x = x.detach()
    if hasattr(x, "cpu"):
        x = x.cpu()
    if hasattr(x, "numpy"):
        return x.numpy()
    return np.asarray(x)


def to_numpy_tree(x: Any) -> Any:
    """Nested dict of tensors / arrays -> the same nesting of numpy arrays (first axis = envs)."""
    if isinstance(x, dict):
        return {k: to_numpy_tree(v) for k, v in x.items()}
    return to_numpy(x)


def _concat_tree(steps: list[Any]) -> Any:
    if isinstance(steps[0], dict):
        return {k: _concat_tree([s[k] for s in steps]) for k in steps[0]}
    return np.concatenate([np.asarray(s) for s in steps], axis=0)


def _append(group: Any, key: str, value: Any) -> None:
    if isinstance(value, dict):
        sub = group.require_group(key)
        for k, v in value.items():
            _append(sub, k, v)
        return
    data = np.asarray(value)
    if key not in group:
        group.create_dataset(
            key,
            data=data,
            maxshape=(None, *data.shape[1:]),
            chunks=(min(FLUSH_STEPS, max(1, data.shape[0])), *data.shape[1:]),
        )
    else:
        ds = group[key]
        ds.resize(ds.shape[0] + data.shape[0], axis=0)
        ds[ds.shape[0] - data.shape[0] :] = data


class SeedDemoRecorder:
    """One HDF5 file of seed demos; ``begin`` / ``step`` / ``end`` per daemon episode.

    The file is opened in append mode (a restarted follower adds demos after the existing ones,
    like LeIsaac's ``--resume``) and flushed after every write, so a crash loses at most the
    steps since the last flush of the episode in progress (and that demo then has no ``success``
    attribute: LeIsaac's converter and our import count it as not successful).
    """

    def __init__(self, path: Path, env_name: str, flush_steps: int = FLUSH_STEPS) -> None:
        import h5py

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = h5py.File(self.path, "a")
        if "data" not in self.f:
            data = self.f.create_group("data")
            data.attrs["total"] = 0
            data.attrs["env_args"] = json.dumps({"env_name": env_name, "type": 2})
        self.data = self.f["data"]
        self.demo_count = len(self.data)
        self.flush_steps = flush_steps
        self._group: Any = None
        self._pending: list[dict[str, Any]] = []
        self.demo_name: str | None = None

    @property
    def recording(self) -> bool:
        return self._group is not None

    def begin(self, initial_state: Any, seed: int | None = None) -> str:
        if self._group is not None:
            self.end(success=None)
        self.demo_name = f"demo_{self.demo_count}"
        self._group = self.data.create_group(self.demo_name)
        self._group.attrs["num_samples"] = 0
        if seed is not None:
            self._group.attrs["seed"] = int(seed)
        _append(self._group, "initial_state", to_numpy_tree(initial_state))
        self.f.flush()
        return self.demo_name

    def step(self, actions: Any, obs: Any, states: Any, processed_actions: Any) -> None:
        if self._group is None:
            return
        self._pending.append(
            {
                "actions": to_numpy_tree(actions),
                "obs": to_numpy_tree(obs),
                "states": to_numpy_tree(states),
                "processed_actions": to_numpy_tree(processed_actions),
            }
        )
        if len(self._pending) >= self.flush_steps:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        block = _concat_tree(self._pending)
        for k, v in block.items():
            _append(self._group, k, v)
        self._group.attrs["num_samples"] = int(self._group.attrs["num_samples"]) + len(self._pending)
        self._pending.clear()
        self.f.flush()

    def end(self, success: bool | None) -> str | None:
        """Close the episode's demo; ``success`` None leaves the attribute out (unknown)."""
        if self._group is None:
            return None
        self._flush()
        if success is not None:
            self._group.attrs["success"] = bool(success)
        self.data.attrs["total"] = int(self.data.attrs["total"]) + int(self._group.attrs["num_samples"])
        name = self.demo_name
        self.demo_count += 1
        self._group = None
        self.demo_name = None
        self.f.flush()
        log.info("seed demo %s written to %s (success=%s)", name, self.path, success)
        return name

    def close(self) -> None:
        if self._group is not None:
            self.end(success=None)
        self.f.close()
