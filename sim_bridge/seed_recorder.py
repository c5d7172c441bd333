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
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("so101d.sim.seed")

FLUSH_STEPS = 100  # StreamingRecorderManager's flush period and chunk length
COMPRESSION = "lzf"  # teleop_se3_agent.py: recorder_manager.compression = "lzf"
# Chunks waiting for the writer before a step waits for it (each ~184 MB with two 640x480 cameras):
# the writer falls this far behind when compressing and writing is slower than the sim makes data.
MAX_QUEUED_JOBS = 3


class SeedRecordingError(RuntimeError):
    """A seed-file write failed or would not fit (disk full, file-size limit, file removed). The
    demo in progress was ended (cut to its written rows, ``success=False``, or dropped when it
    had none); demos closed before it stay as they were; nothing more is recorded."""


def space_left_bytes(path: Path) -> int:
    """Bytes that can still be written to ``path``: the file system's free space for us, capped by
    this process's file-size limit (``RLIMIT_FSIZE``, which also governs a quota-like ulimit)."""
    import os
    import resource

    st = os.statvfs(path.parent)
    left = st.f_bavail * st.f_frsize
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        size = path.stat().st_size if path.exists() else 0
        left = min(left, soft - size)
    return int(left)


# Room kept free beyond a chunk's raw size before it is written: HDF5's metadata for a chunk
# (B-tree nodes, the superblock's end-of-file) and the attributes that close a demo. A write that
# runs out of room midway leaves the file's recorded end beyond its real end, and the whole file
# unreadable, so the writer refuses before that can happen.
SPACE_MARGIN_BYTES = 8 * 1024 * 1024


def tree_nbytes(x: Any) -> int:
    if isinstance(x, dict):
        return sum(tree_nbytes(v) for v in x.values())
    return int(np.asarray(x).nbytes)


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
    like LeIsaac's ``--resume``, numbered from the highest existing ``demo_<n>`` + 1).

    What a crash can lose: ``begin`` / ``step`` / ``end`` run on the stepping thread and only
    queue work; the writer thread does every h5py call after ``__init__``, in order, and flushes
    after each. A demo's group is created with its first chunk and carries ``success=False``
    until ``end`` writes the verdict, so a demo cut short by a crash is skipped by LeIsaac's
    ``eef_action_process.py`` and converter alike, and a demo with no steps never reaches the
    file. A power cut loses the episode in progress's steps not yet written: the chunk being
    filled plus up to ``max_queued_jobs`` queued chunks (``flush_steps`` steps each). A closed
    demo is on disk (flushed and fsynced) once ``written_through(mark)`` holds for the mark taken
    after its ``end``; the bridge acknowledges the daemon's episode stop only then.

    A write that fails, or that would not fit (``space_left`` below the chunk's raw size plus
    ``SPACE_MARGIN_BYTES``: a write that runs out of room midway can leave the whole file
    unreadable), ends the demo in progress -- cut to the rows its ``num_samples`` counts, with
    ``success=False``, or dropped when none was written -- and stops the recording; ``error``
    says what happened and which demo, ``close`` raises it as ``SeedRecordingError``.
    """

    def __init__(
        self,
        path: Path,
        env_name: str,
        flush_steps: int = FLUSH_STEPS,
        compression: str | None = COMPRESSION,
        max_queued_jobs: int = MAX_QUEUED_JOBS,
        space_left: Callable[[Path], int] = space_left_bytes,
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
        self.demo_count = next_demo_index(self.data)
        self.flush_steps = flush_steps
        self.compression = compression
        self.space_left = space_left
        self._chunk = _ChunkBuffer(flush_steps)
        self._free_chunks: queue.SimpleQueue[_ChunkBuffer] = queue.SimpleQueue()  # written, ready for reuse
        self.demo_name: str | None = None
        self._demo_steps = 0
        self._first: tuple[Any, int] | None = None  # (initial_state, seed) until the demo's first chunk
        self.error: str | None = None  # set by the writer thread: what failed and what became of the demo
        self.queue_waits = 0  # steps that waited for the writer (it fell max_queued_jobs behind)
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=max_queued_jobs)
        self._progress = threading.Condition()
        self._submitted = self._finished = 0
        self._writer = threading.Thread(target=self._write_jobs, name="seed-hdf5-writer", daemon=True)
        self._writer.start()

    @property
    def recording(self) -> bool:
        return self.demo_name is not None

    @property
    def jobs_behind(self) -> int:
        """Writes queued or in progress (chunks, a demo's close)."""
        with self._progress:
            return self._submitted - self._finished

    # -- stepping thread ---------------------------------------------------------------------------
    def begin(self, initial_state: Any, seed: int) -> str | None:
        """Start a demo; ``seed``: the seed its episode was reset with (the env's ``cfg.seed``
        when the reset gave none), which Mimic's annotate step hands to ``env.seed``. None when
        recording stopped after a write failure (``error`` says why)."""
        if seed is None:
            raise ValueError("a seed demo needs the env's seed (annotate_demos.py calls env.seed(int(episode.seed)))")
        if self.demo_name is not None:
            self.end(success=False)  # a new episode before this one stopped: it was cut short
        if self.error is not None:
            return None
        self.demo_name = f"demo_{self.demo_count}"
        self._demo_steps = 0
        self._first = (snapshot_tree(initial_state), int(seed))
        return self.demo_name

    def step(self, actions: Any, obs: Any, states: Any, processed_actions: Any) -> None:
        if self.demo_name is None:
            return
        if self.error is not None:  # the writer ended the demo: queue nothing more
            self.demo_name = None
            return
        self._chunk.add({"actions": actions, "obs": obs, "states": states, "processed_actions": processed_actions})
        self._demo_steps += 1
        if self._chunk.n >= self.flush_steps:
            self._flush()

    def _flush(self) -> None:
        if not self._chunk.n or self.demo_name is None:
            return
        chunk, name, first = self._chunk, self.demo_name, self._first
        self._first = None
        try:
            self._chunk = self._free_chunks.get_nowait()
        except queue.Empty:
            self._chunk = _ChunkBuffer(self.flush_steps)

        def write_chunk() -> None:
            rows = chunk.filled()
            need = tree_nbytes(rows) + (tree_nbytes(first[0]) if first else 0) + SPACE_MARGIN_BYTES
            left = self.space_left(self.path)
            if left < need:
                raise SeedRecordingError(
                    f"not enough room for the next {chunk.n} steps: {need / 1e6:.0f} MB needed (raw size plus "
                    f"margin), {max(left, 0) / 1e6:.0f} MB left (free disk space or the file-size limit)"
                )
            if first is not None:
                g = self.data.create_group(name)
                g.attrs["num_samples"] = 0
                g.attrs["seed"] = first[1]
                g.attrs["success"] = False  # until end() writes the verdict: a cut-short demo is skipped
                _append(g, "initial_state", first[0], self.compression)
            g = self.data[name]
            for k, v in rows.items():
                _append(g, k, v, self.compression)
            g.attrs["num_samples"] = int(g.attrs["num_samples"]) + chunk.n
            self.f.flush()
            self._free_chunks.put(chunk.reset())

        self._submit(write_chunk, name)

    def end(self, success: bool) -> str | None:
        """Close the episode's demo with its verdict (False for one cut short: daemon lost, the
        follower stopping, a new episode). A demo with no steps is not written; returns the
        demo's name, or None when there was none in the file."""
        if self.demo_name is None:
            return None
        name, steps = self.demo_name, self._demo_steps
        self._flush()
        self.demo_name = None
        if steps == 0:
            self._first = None
            log.info("seed demo %s had no steps: nothing written", name)
            return None
        verdict = bool(success)

        def finish() -> None:
            g = self.data[name]
            g.attrs["success"] = verdict
            self.data.attrs["total"] = int(self.data.attrs["total"]) + int(g.attrs["num_samples"])
            self._sync()
            log.info("seed demo %s written to %s (success=%s)", name, self.path, verdict)

        self._submit(finish, name)
        self.demo_count += 1
        return name

    def wait_written(self, timeout_s: float) -> bool:
        """Wait until every queued write is done (True), or ``timeout_s`` passed (False)."""
        with self._progress:
            return self._progress.wait_for(lambda: self._finished >= self._submitted, timeout_s)

    @property
    def writes_submitted(self) -> int:
        """A mark for ``written_through``: the writes queued so far."""
        with self._progress:
            return self._submitted

    def written_through(self, mark: int) -> bool:
        """Every write queued up to ``mark`` is done (on disk, for a demo's close: fsynced)."""
        with self._progress:
            return self._finished >= mark

    def _submit(self, job: Callable[[], None], demo: str) -> None:
        def run() -> None:
            if self.error is None:  # after a failure nothing more goes into the file
                try:
                    job()
                except Exception as exc:
                    self._fail(demo, exc)

        with self._progress:
            self._submitted += 1
        try:
            self._jobs.put_nowait(run)
        except queue.Full:
            self.queue_waits += 1
            log.warning("seed writer %d chunks behind: this step waits for it", self._jobs.maxsize)
            self._jobs.put(run)

    # -- writer thread -----------------------------------------------------------------------------
    def _sync(self) -> None:
        """Flush HDF5's buffers and have the OS put them on disk (a closed demo survives a power cut)."""
        import os

        self.f.flush()
        os.fsync(self.f.id.get_vfd_handle())

    def _fail(self, demo: str, exc: BaseException) -> None:
        """A write of ``demo`` failed: cut it to its counted rows (or drop it), stop recording."""
        outcome = self._cut(demo)
        self.error = (
            f"seed file {self.path}: writing {demo} failed ({exc}); {outcome}; no further seed demos are recorded"
        )
        log.error("%s", self.error)

    def _cut(self, demo: str) -> str:
        import h5py

        try:
            if demo not in self.data:
                return f"{demo} was not started in the file"
            g = self.data[demo]
            n = int(g.attrs["num_samples"])
            if n == 0:
                del self.data[demo]
                self._sync()
                return f"{demo} dropped (no steps were written)"

            def cut(group: Any) -> None:
                for key, item in group.items():
                    if key == "initial_state" and group is g:
                        continue
                    if isinstance(item, h5py.Group):
                        cut(item)
                    elif item.shape[0] > n:
                        item.resize(n, axis=0)

            cut(g)
            g.attrs["success"] = False
            self._sync()
            return f"{demo} cut to its {n} written steps (success=False)"
        except Exception as exc:
            return f"{demo} could not be cut to its written steps ({exc}); it is marked success=False"

    def _write_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            finally:
                with self._progress:
                    self._finished += 1
                    self._progress.notify_all()

    def close(self) -> None:
        """End a demo still open (cut short: ``success=False``), wait for the writer, close the
        file; raises ``SeedRecordingError`` when a write failed."""
        if self.demo_name is not None:
            self.end(success=False)
        self._jobs.put(None)
        self._writer.join()
        try:
            self.f.close()
        except Exception as exc:
            if self.error is None:
                self.error = f"seed file {self.path}: closing it failed ({exc})"
        if self.error is not None:
            raise SeedRecordingError(self.error)


def next_demo_index(data: Any) -> int:
    """The next free ``demo_<n>`` number: one past the highest in the file (a file whose user
    deleted a bad demo has a gap; counting the groups would reuse an existing name)."""
    taken = [int(m.group(1)) for name in data if (m := re.fullmatch(r"demo_(\d+)", name))]
    return max(taken, default=-1) + 1
