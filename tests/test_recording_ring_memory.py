"""The rings' memory is taken once, at open: recording does not make RSS climb.

A page of shared memory counts in a process's RSS when the process first touches it; the record
ring is 32768 records of 692 bytes, so a ring touched record by record grew the daemon's (and the
writer's) RSS by ~1.2 MB a minute at 30 fps until it wrapped, 18 minutes later.
"""

from __future__ import annotations

from pathlib import Path

from daemon.data.ring import KIND_FRAME, Ring


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


def test_a_killed_process_groups_ring_segments_are_swept_at_the_next_start(tmp_path):
    """SIGKILL of the whole group takes Python's resource tracker too: the segments stay in
    /dev/shm. The next ring made removes them (its maker is gone), and nothing that is not ours
    or whose maker still runs."""
    import os
    import signal
    import subprocess
    import sys

    from daemon.data.shm_names import SHM_DIR, segment_name

    repo = Path(__file__).resolve().parents[1]
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from daemon.data.ring import Ring; r = Ring.create([('front', 48, 64)], 64, 2);"
            "print(r.spec.records_name, r.spec.pixels_name, r.spec.counters_name, flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(repo)),
        start_new_session=True,
    )
    names = child.stdout.readline().split() if child.stdout else []
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert len(names) == 3 and all((SHM_DIR / n).exists() for n in names), names
    alive = SHM_DIR / segment_name("records")  # this process's own name: its maker runs
    alive.write_bytes(b"\0")
    foreign = SHM_DIR / f"psm_not_ours_{os.getpid()}"
    foreign.write_bytes(b"\0")
    try:
        ring = Ring.create([("front", 48, 64)], n_records=64, n_pixel_slots=2)
        ring.close()
        assert not any((SHM_DIR / n).exists() for n in names), names
        assert alive.exists() and foreign.exists()
    finally:
        alive.unlink()
        foreign.unlink()
