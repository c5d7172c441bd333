"""Video encoders stay below the control loop, even when so101d runs as root.

LeRobot's default encoder, SVT-AV1, creates its threads SCHED_FIFO 99 when it may (root or
CAP_SYS_NICE) and leaves the thread that opened it at FIFO 99 too: above the loop (FIFO 40 at most)
and the kernel's IRQ threads. Found when a test's daemon loop, started in a process that had
written a tiny training dataset, ran FIFO 99 without asking. The operator's story:

- as root, LeRobot's encoder on a thread that kept its rights takes FIFO 99 (shown in a child
  process, so this one stays clean);
- the same encoder run through ``run_without_realtime`` keeps every thread at normal priority, and
  the caller keeps its own right to real time (the loop still gets FIFO);
- the tiny-dataset helper the policy tests and benches use leaves its caller's scheduling alone;
- the recorder's writer process holds no right to real time at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import av
import numpy as np
import pytest
from recording_support import SyntheticLoop, record_frames
from support import may_take_fifo

from daemon.data.recorder import Recorder, RecorderConfig
from daemon.system.realtime import current_policy, give_up_realtime_right, run_without_realtime
from drivers.cameras import CameraConfig, VirtualArmCamera

REPO = Path(__file__).resolve().parents[1]
CAP_SYS_NICE_BIT = 1 << 23
REALTIME = {os.SCHED_FIFO, os.SCHED_RR}


def _thread_policies() -> set[int]:
    policies = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            policies.add(os.sched_getscheduler(int(tid)))
        except OSError:  # the thread ended meanwhile
            pass
    return policies


def encode_av1(frames: int = 12) -> set[int]:
    """Encode a short clip with SVT-AV1 (LeRobot's default codec); the scheduling policies seen
    among this process's threads while the encoder runs."""
    import io

    seen: set[int] = set()
    container = av.open(io.BytesIO(), "w", format="mp4")
    stream = container.add_stream("libsvtav1", rate=30)
    stream.width, stream.height, stream.pix_fmt = 160, 128, "yuv420p"
    rng = np.random.default_rng(0)
    for i in range(frames):
        frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (128, 160, 3), dtype=np.uint8), format="rgb24")
        for packet in stream.encode(frame):
            container.mux(packet)
        if i == frames // 2:
            seen |= _thread_policies()
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    return seen | {os.sched_getscheduler(0)}


def test_as_root_lerobots_default_encoder_takes_fifo_99() -> None:
    if not may_take_fifo():
        pytest.skip("this process may not take SCHED_FIFO, so neither can the encoder")
    probe = (
        "import os, sys; sys.path.insert(0, 'tests');"
        "from test_realtime_encoders import encode_av1;"
        "seen = encode_av1();"
        "print(sorted(seen), os.sched_getparam(0).sched_priority)"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    policies, caller_priority = r.stdout.strip().rsplit(" ", 1)
    assert str(os.SCHED_FIFO) in policies and caller_priority == "99", r.stdout


def test_an_encoder_run_without_realtime_keeps_every_thread_below_the_loop() -> None:
    before = current_policy()
    could = may_take_fifo()
    seen = run_without_realtime(encode_av1)
    assert seen and not seen & REALTIME, seen
    assert current_policy() == before  # the caller's thread is untouched ...
    assert may_take_fifo() == could  # ... and keeps its right to real time (the loop needs it)


def test_run_without_realtime_hands_back_the_result_or_the_error() -> None:
    assert run_without_realtime(lambda: threading.current_thread().name) == "so101d-no-realtime"
    with pytest.raises(ZeroDivisionError):
        run_without_realtime(lambda: 1 / 0)


def test_a_thread_that_gave_up_the_right_is_refused_real_time() -> None:
    said: list[str] = []
    refused: list[bool] = []

    def body() -> None:
        said.append(give_up_realtime_right())
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            refused.append(False)
        except PermissionError:
            refused.append(True)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert "CAP_SYS_NICE" in said[0], said
    if "RLIMIT_RTPRIO 0" in said[0]:
        assert refused == [True], said


def test_the_tiny_dataset_helper_leaves_its_callers_scheduling_alone(tmp_path: Path) -> None:
    from daemon.policy.tiny import make_synthetic_dataset

    before = current_policy()
    ds = make_synthetic_dataset(tmp_path / "ds", {"front": (48, 64)}, episodes=1, frames_per_episode=8)
    assert ds.num_episodes == 1 and ds.num_frames == 8
    assert current_policy() == before, "writing the dataset changed this thread's scheduling"


def _cap_eff(status_file: Path) -> int:
    for line in status_file.read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no CapEff in {status_file}")


def test_the_recorders_writer_encodes_av1_without_real_time(tmp_path: Path) -> None:
    """LeRobot's default codec in our writer process: mid-episode, while SVT-AV1's threads run,
    none of the writer's threads is real time, and the thread that runs the writer has no right."""
    cams = [VirtualArmCamera(CameraConfig("front", width=160, height=128, fps=30))]
    rec = Recorder(RecorderConfig(root=str(tmp_path / "ds"), fps=30, vcodec="libsvtav1", preset="12"), cams)
    rec.open()
    try:
        rec.wait_ready(120)
        with SyntheticLoop(rec):
            rec.start_episode("encode")
            record_frames(rec, 20)
            pid = rec.writer_pid
            assert pid is not None
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
            policies = {os.sched_getscheduler(int(t.name)) for t in tasks if t.exists()}
            rec.discard_episode()  # the encoder's threads were what mattered, not the clip
            assert rec.wait_saved(60), rec.status()
        assert len(tasks) > 8, "SVT-AV1's threads were not running mid-episode"
        assert not policies & REALTIME, policies
        assert not _cap_eff(Path(f"/proc/{pid}/status")) & CAP_SYS_NICE_BIT
    finally:
        rec.close()
