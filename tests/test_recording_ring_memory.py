"""The rings' memory is taken once, at open: recording does not make RSS climb.

A page of shared memory counts in a process's RSS when the process first touches it; the record
ring is 32768 records of 692 bytes, so a ring touched record by record grew the daemon's (and the
writer's) RSS by ~1.2 MB a minute at 30 fps until it wrapped, 18 minutes later.
"""

from __future__ import annotations

from pathlib import Path

from daemon.recording.ring import KIND_FRAME, Ring


def rss_shmem_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1])
    raise AssertionError("no RssShmem in /proc/self/status")


def test_writing_records_does_not_grow_the_resident_memory():
    ring = Ring.create([("front", 48, 64)], n_records=32768, n_pixel_slots=4)
    reader = Ring.attach(ring.spec)  # the writer's side, here in the same process
    try:
        before_kb = rss_shmem_kb()
        for k in range(6000):  # 3.3 min at 30 fps: 4 MB of records
            rec = ring.next_record()
            rec["kind"] = KIND_FRAME
            rec["frame_index"] = k
            ring.publish_record()
            assert int(reader.record_at_tail()["frame_index"][0]) == k
            reader.release_record(False)
        grown_kb = rss_shmem_kb() - before_kb
        assert grown_kb < 256, f"RSS grew {grown_kb} kB writing 6000 records"
        assert before_kb * 1024 >= ring.mapped_bytes  # paid at open instead
    finally:
        reader.close()
        ring.close()
