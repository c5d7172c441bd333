"""Shared-memory rings between the loop-side recorder and the writer process.

Two single-producer / single-consumer rings, no locks:

- a *record* ring of fixed-size structured records (frames and episode control, in order);
- a *pixel* ring of slots, each holding one image per camera (HxWx3 uint8) and, for a camera
  recorded with depth, its depth map (HxWx1 uint16 millimetres, same frame, same capture time).

Producer and consumer each own one counter (``head`` for the producer, ``tail`` for the
consumer) in a small shared int64 array; a counter is only ever written by its owner and only
after the data it covers is in place. A frame whose pixels cannot get a slot (writer behind)
still gets its record with ``pixel_slot = -1``: the writer repeats the previous image, so the
video keeps one frame per table row and the frame is counted as missing, never silently dropped.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from multiprocessing import shared_memory

import numpy as np

from daemon.data.shm_names import segment_name, sweep_stale

MAX_CAMERAS = 4
TASK_BYTES = 512

KIND_FRAME = 1
KIND_START = 2
KIND_SAVE = 3
KIND_DISCARD = 4


def record_dtype(n_joints: int = 6) -> np.dtype:
    """One record's layout; ``n_joints``: the width of the joint vectors (6 per arm: 12 on a
    bimanual rig)."""
    return np.dtype(
        [
            ("kind", np.int32),
            ("episode_seq", np.int32),
            ("frame_index", np.int32),  # START: the episode's number (dataset index) as announced
            ("pixel_slot", np.int32),
            ("success", np.int32),  # SAVE: 1 success, 0 failure, -1 not judged
            ("grid_s", np.float64),  # frame time on the fps grid, seconds since the episode start
            ("taken_s", np.float64),  # monotonic time the recorder took the frame
            ("state_s", np.float64),  # monotonic time of the state sample (the loop cycle)
            ("state", np.float32, (n_joints,)),
            ("action", np.float32, (n_joints,)),
            ("teleop", np.float32, (n_joints,)),
            ("cam_capture_s", np.float64, (MAX_CAMERAS,)),  # NaN: no image yet
            ("cam_seq", np.int64, (MAX_CAMERAS,)),
            ("source", "S64"),  # FRAME: who drove the arms (schema.SOURCE_KEY), ASCII
            ("task", f"S{TASK_BYTES}"),  # START: the task text; SAVE: the tag extras as JSON (or empty)
        ]
    )


RECORD_DTYPE = record_dtype(6)  # one arm's

# counters: 0 head, 1 tail, 2 pixel head, 3 pixel tail, 4 records lost (record ring full)
N_COUNTERS = 8


@dataclass
class RingSpec:
    """Names and sizes, passed to the writer process (plain data, spawn-safe)."""

    records_name: str
    pixels_name: str
    counters_name: str
    n_records: int
    n_pixel_slots: int
    cameras: list[tuple[str, int, int]]  # (name, height, width), in dataset order
    depths: list[int] = field(default_factory=list)  # indices of the cameras recorded with depth
    n_joints: int = 6  # the joint vectors' width: 6 per arm

    @property
    def dtype(self) -> np.dtype:
        return record_dtype(self.n_joints)

    def layout(self) -> tuple[list[int], list[int], int]:
        """Byte offsets in a slot of each camera's image and each depth map, and the slot size.
        Depth maps first and slots a multiple of 8 bytes: every uint16 view is aligned."""
        off = 0
        depth_offsets = []
        for c in self.depths:
            _, h, w = self.cameras[c]
            depth_offsets.append(off)
            off += h * w * 2
        image_offsets = []
        for _, h, w in self.cameras:
            image_offsets.append(off)
            off += h * w * 3
        return image_offsets, depth_offsets, -(-off // 8) * 8

    @property
    def slot_bytes(self) -> int:
        return self.layout()[2]


class Ring:
    """Both rings plus counters; ``create`` in the recorder, ``attach`` in the writer."""

    def __init__(self, spec: RingSpec, create: bool) -> None:
        self.spec = spec
        self._owner = create
        pix_bytes = max(1, spec.slot_bytes * spec.n_pixel_slots)
        if create:
            sweep_stale()  # a killed process group's segments (the resource tracker died with it)
            rec_bytes = spec.dtype.itemsize * spec.n_records
            self._shm_rec = shared_memory.SharedMemory(segment_name("records"), create=True, size=rec_bytes)
            self._shm_pix = shared_memory.SharedMemory(segment_name("pixels"), create=True, size=pix_bytes)
            self._shm_cnt = shared_memory.SharedMemory(segment_name("counters"), create=True, size=8 * N_COUNTERS)
            spec.records_name, spec.pixels_name, spec.counters_name = (
                self._shm_rec.name,
                self._shm_pix.name,
                self._shm_cnt.name,
            )
        else:
            self._shm_rec = shared_memory.SharedMemory(name=spec.records_name)
            self._shm_pix = shared_memory.SharedMemory(name=spec.pixels_name)
            self._shm_cnt = shared_memory.SharedMemory(name=spec.counters_name)
        self.records: np.ndarray = np.ndarray((spec.n_records,), dtype=spec.dtype, buffer=self._shm_rec.buf)
        self.counters: np.ndarray = np.ndarray((N_COUNTERS,), dtype=np.int64, buffer=self._shm_cnt.buf)
        self._pix: np.ndarray = np.ndarray((pix_bytes,), dtype=np.uint8, buffer=self._shm_pix.buf)
        if create:
            self.counters[:] = 0
        self._map_every_page(write=create)
        # per camera (and per depth map): its place in each slot
        self._offsets, self._depth_offsets, self._slot_bytes = spec.layout()

    def _map_every_page(self, write: bool) -> None:
        """Every page of both rings in this process's memory now, not as the head first reaches
        it: a page of shared memory counts in a process's RSS from its first touch, so the
        record ring (692 bytes a frame) made the daemon's and the writer's RSS climb about
        1.2 MB a minute while recording, for 18 minutes until the ring wrapped. Its size is the
        bound; touched here, it is paid once at open and RSS stays flat."""
        for shm in (self._shm_rec, self._shm_pix):
            pages: np.ndarray = np.ndarray((shm.size,), dtype=np.uint8, buffer=shm.buf)[:: mmap.PAGESIZE]
            if write:
                pages[:] = 0  # the owner: the pages are allocated (a new segment reads as zeros)
            else:
                int(pages.sum())  # the writer: a read maps each page

    @property
    def mapped_bytes(self) -> int:
        """What both rings take (every page mapped from the start: the RSS they add)."""
        return self._shm_rec.size + self._shm_pix.size

    @classmethod
    def create(
        cls,
        cameras: list[tuple[str, int, int]],
        n_records: int,
        n_pixel_slots: int,
        depths: list[int] | None = None,
        n_joints: int = 6,
    ) -> Ring:
        if len(cameras) > MAX_CAMERAS:
            raise ValueError(f"at most {MAX_CAMERAS} cameras can be recorded, got {len(cameras)}")
        spec = RingSpec(
            "", "", "", int(n_records), int(n_pixel_slots), list(cameras), sorted(depths or []), int(n_joints)
        )
        return cls(spec, create=True)

    @classmethod
    def attach(cls, spec: RingSpec) -> Ring:
        return cls(spec, create=False)

    def image_view(self, slot: int, cam: int) -> np.ndarray:
        _, h, w = self.spec.cameras[cam]
        start = slot * self._slot_bytes + self._offsets[cam]
        return self._pix[start : start + h * w * 3].reshape(h, w, 3)

    def depth_view(self, slot: int, cam: int) -> np.ndarray:
        """Camera ``cam``'s depth map in ``slot`` (HxWx1 uint16); the camera must be in ``depths``."""
        _, h, w = self.spec.cameras[cam]
        start = slot * self._slot_bytes + self._depth_offsets[self.spec.depths.index(cam)]
        return self._pix[start : start + h * w * 2].view(np.uint16).reshape(h, w, 1)

    # producer side ----------------------------------------------------------------------------
    def records_free(self) -> int:
        return self.spec.n_records - int(self.counters[0] - self.counters[1])

    def pixel_slot_free(self) -> bool:
        return self.spec.n_pixel_slots > 0 and int(self.counters[2] - self.counters[3]) < self.spec.n_pixel_slots

    def claim_pixel_slot(self) -> int:
        return int(self.counters[2] % self.spec.n_pixel_slots)

    def publish_pixel_slot(self) -> None:
        self.counters[2] += 1

    def next_record(self) -> np.ndarray:
        """The record to fill (a 1-element view); call ``publish_record`` once it is complete."""
        i = int(self.counters[0] % self.spec.n_records)
        return self.records[i : i + 1]

    def publish_record(self) -> None:
        self.counters[0] += 1

    # consumer side ----------------------------------------------------------------------------
    def pending(self) -> int:
        return int(self.counters[0] - self.counters[1])

    def record_at_tail(self) -> np.ndarray:
        i = int(self.counters[1] % self.spec.n_records)
        return self.records[i : i + 1]

    def release_record(self, had_pixels: bool) -> None:
        if had_pixels:
            self.counters[3] += 1
        self.counters[1] += 1

    def pixel_backlog(self) -> int:
        return int(self.counters[2] - self.counters[3])

    def close(self) -> None:
        # drop numpy views before closing the mappings
        self.records = None  # type: ignore[assignment]
        self.counters = None  # type: ignore[assignment]
        self._pix = None  # type: ignore[assignment]
        for shm in (self._shm_rec, self._shm_pix, self._shm_cnt):
            try:
                shm.close()
            except BufferError:
                pass
            if self._owner:
                try:
                    shm.unlink()
                except FileNotFoundError:
                    pass
