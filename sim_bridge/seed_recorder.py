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

Every demo carries the seed its episode was reset with (``annotate_demos.py`` calls
``env.seed(int(episode.seed))`` and fails on a demo without one); LeIsaac's recorder writes
``env.cfg.seed``. The stepping thread only snapshots each step; a single writer thread
concatenates and writes the chunks, lzf-compressed as LeIsaac's teleop script configures its
recorder (``compression = "lzf"``; its ``SingleThreadHDF5DatasetWriter`` writes on a worker
thread too), so a 184 MB flush of 100 steps of two 640x480 cameras never stalls a step.

Only numpy and h5py (both in Isaac Lab's Python); no torch import.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("so101d.sim.seed")

FLUSH_STEPS = 100  # StreamingRecorderManager's flush period and chunk length
COMPRESSION = "lzf"  # teleop_se3_agent.py: recorder_manager.compression = "lzf"
# Chunks waiting for the writer before a step waits for it (each ~184 MB with two 640x480 cameras):
# the writer only falls this far behind when the disk is slower than the sim makes data.
MAX_QUEUED_JOBS = 3


class SeedRecordingError(RuntimeError):
    """The seed file could not be written (disk full, file removed): the demos after it are lost."""


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


def snapshot_tree(x: Any) -> Any:
    """Nested dict of tensors / arrays -> the same nesting of numpy copies (first axis = envs):
    the writer reads them later, after the env may have overwritten its buffers in place (LeIsaac
    deep-copies an episode before handing it to its writer thread)."""
    if isinstance(x, dict):
        return {k: snapshot_tree(v) for k, v in x.items()}
    return np.array(to_numpy(x), copy=True)


class _ChunkBuffer:
    """One chunk's rows, copied straight into arrays preallocated for ``rows`` steps: the step's
    copy is the only one (no per-step arrays to concatenate later, which for two 640x480 cameras
    would be a 184 MB copy per chunk competing with the stepping thread). Buffers are reused once
    written (``reset``): fresh memory costs a page fault per 4 kB on first touch, ~1.5 ms a step."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.n = 0
        self.tree: dict[str, Any] = {}

    def add(self, step: dict[str, Any]) -> None:
        self._put(self.tree, step)
        self.n += 1

    def _put(self, dst: dict[str, Any], src: dict[str, Any]) -> None:
        for k, v in src.items():
            if isinstance(v, dict):
                self._put(dst.setdefault(k, {}), v)
                continue
            a = to_numpy(v)
            old = dst.get(k)
            if old is None or old.shape[1:] != a.shape[1:] or old.dtype != a.dtype:
                dst[k] = np.empty((self.rows * a.shape[0], *a.shape[1:]), a.dtype)
            m = a.shape[0]  # rows per step: the number of envs (1 here)
            dst[k][self.n * m : (self.n + 1) * m] = a

    def filled(self) -> dict[str, Any]:
        def cut(t: dict[str, Any]) -> dict[str, Any]:
            return {k: cut(v) if isinstance(v, dict) else v[: self.n * (v.shape[0] // self.rows)] for k, v in t.items()}

        return cut(self.tree)

    def reset(self) -> _ChunkBuffer:
        self.n = 0
        return self


def _append(group: Any, key: str, value: Any, compression: str | None = COMPRESSION) -> None:
    if isinstance(value, dict):
        sub = group.require_group(key)
        for k, v in value.items():
            _append(sub, k, v, compression)
        return
    data = np.asarray(value)
    if key not in group:
        group.create_dataset(
            key,
            data=data,
            maxshape=(None, *data.shape[1:]),
            chunks=(min(FLUSH_STEPS, max(1, data.shape[0])), *data.shape[1:]),
            compression=compression,
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

    ``begin`` / ``step`` / ``end`` run on the stepping thread and only queue work; the writer
    thread does every h5py call after ``__init__``, in order. ``close`` waits for it and raises
    ``SeedRecordingError`` if a write failed (the failure is also logged when it happens).
    """

    def __init__(
        self,
        path: Path,
        env_name: str,
        flush_steps: int = FLUSH_STEPS,
        compression: str | None = COMPRESSION,
        max_queued_jobs: int = MAX_QUEUED_JOBS,
    ) -> None:
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
        self.compression = compression
        self._chunk = _ChunkBuffer(flush_steps)
        self._free_chunks: queue.SimpleQueue[_ChunkBuffer] = queue.SimpleQueue()  # written, ready for reuse
        self.demo_name: str | None = None
        self.error: BaseException | None = None
        self.queue_waits = 0  # steps that waited for the writer (it fell MAX_QUEUED_JOBS behind)
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=max_queued_jobs)
        self._writer = threading.Thread(target=self._write_jobs, name="seed-hdf5-writer", daemon=True)
        self._writer.start()

    @property
    def recording(self) -> bool:
        return self.demo_name is not None

    # -- stepping thread ---------------------------------------------------------------------------
    def begin(self, initial_state: Any, seed: int) -> str:
        """Start a demo; ``seed``: the seed its episode was reset with (the env's ``cfg.seed``
        when the reset gave none), which Mimic's annotate step hands to ``env.seed``."""
        if seed is None:
            raise ValueError("a seed demo needs the env's seed (annotate_demos.py calls env.seed(int(episode.seed)))")
        if self.demo_name is not None:
            self.end(success=None)
        name = self.demo_name = f"demo_{self.demo_count}"
        state = snapshot_tree(initial_state)
        seed_int = int(seed)

        def create() -> None:
            g = self.data.create_group(name)
            g.attrs["num_samples"] = 0
            g.attrs["seed"] = seed_int
            _append(g, "initial_state", state, self.compression)
            self.f.flush()

        self._submit(create)
        return name

    def step(self, actions: Any, obs: Any, states: Any, processed_actions: Any) -> None:
        if self.demo_name is None:
            return
        self._chunk.add({"actions": actions, "obs": obs, "states": states, "processed_actions": processed_actions})
        if self._chunk.n >= self.flush_steps:
            self._flush()

    def _flush(self) -> None:
        if not self._chunk.n or self.demo_name is None:
            return
        chunk, name = self._chunk, self.demo_name
        try:
            self._chunk = self._free_chunks.get_nowait()
        except queue.Empty:
            self._chunk = _ChunkBuffer(self.flush_steps)

        def write_chunk() -> None:
            g = self.data[name]
            for k, v in chunk.filled().items():
                _append(g, k, v, self.compression)
            g.attrs["num_samples"] = int(g.attrs["num_samples"]) + chunk.n
            self.f.flush()
            self._free_chunks.put(chunk.reset())

        self._submit(write_chunk)

    def end(self, success: bool | None) -> str | None:
        """Close the episode's demo; ``success`` None leaves the attribute out (unknown)."""
        if self.demo_name is None:
            return None
        self._flush()
        name = self.demo_name

        def finish() -> None:
            g = self.data[name]
            if success is not None:
                g.attrs["success"] = bool(success)
            self.data.attrs["total"] = int(self.data.attrs["total"]) + int(g.attrs["num_samples"])
            self.f.flush()
            log.info("seed demo %s written to %s (success=%s)", name, self.path, success)

        self._submit(finish)
        self.demo_count += 1
        self.demo_name = None
        return name

    def _submit(self, job: Callable[[], None]) -> None:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self.queue_waits += 1
            log.warning("seed writer is %d chunks behind (disk too slow?): this step waits", self._jobs.maxsize)
            self._jobs.put(job)

    # -- writer thread -----------------------------------------------------------------------------
    def _write_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self.error is not None:
                continue  # the file is in an unknown state: write nothing more into it
            try:
                job()
            except Exception as exc:
                self.error = exc
                log.error("seed file %s: write failed (%s); no further seed demos are written", self.path, exc)

    def close(self) -> None:
        if self.demo_name is not None:
            self.end(success=None)
        self._jobs.put(None)
        self._writer.join()
        self.f.close()
        if self.error is not None:
            raise SeedRecordingError(f"seed file {self.path}: a write failed: {self.error}") from self.error
