"""Child process for the kill -9 tests: records, then announces the moment to be killed.

usage: recording_crash_child.py ROOT MODE
  mid_episode: two episodes saved and committed, a third recording -> "KILL-ME"
  mid_save:    two episodes committed, a third saved (queued) -> "KILL-ME" at once
  save_then_die: two episodes committed, a third saved; the child SIGKILLs itself (not its
               writer) the instant save_episode answers, before any other line of it runs
  mid_rollover: the writer SIGKILLs itself right after a commit opened a new packed file (the
               test made the dataset with tiny size targets); one episode saved -> "KILL-ME"
  power_cut:   one small camera; once the dataset's saved episodes are committed (the restart's
               repair), one episode is recorded and saved, the answer is printed ("SAVED <json>")
               and the whole process group (this process and its writer) is SIGKILLed
               POWER_CUT_DELAY_MS (argv[3]) after the answer, as a power cut does.
  before_ready: the writer is started and its pid printed at once ("WRITER <pid>", before it
               is ready: it is still importing LeRobot), then the child SIGKILLs itself.
Prints "WRITER <pid>" once the writer process runs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recording_support import SyntheticLoop, record_frames

from daemon.data.recorder import Recorder, RecorderConfig
from drivers.cameras import CameraConfig, VirtualArmCamera


def power_cut(root: str, delay_ms: float) -> None:
    cams = [VirtualArmCamera(CameraConfig("front", width=64, height=48))]
    rec = Recorder(RecorderConfig(root=root), cams)
    rec.open()
    rec.wait_ready(120)
    print(f"WRITER {rec._proc.pid}", flush=True)
    with SyntheticLoop(rec):
        task = f"power cut {delay_ms:g} ms after the answer"
        rec.start_episode(task)
        record_frames(rec, 12)
        reply = rec.save_episode(True)
        cut_at = time.monotonic() + delay_ms / 1000.0
        print("SAVED " + json.dumps(dict(reply, task=task)), flush=True)
        while time.monotonic() < cut_at:  # spin: a sleep's wake-up may come late on a busy machine
            pass
        os.killpg(0, signal.SIGKILL)


def main() -> None:
    root, mode = sys.argv[1], sys.argv[2]
    if mode == "power_cut":
        power_cut(root, float(sys.argv[3]))
        return
    if mode == "before_ready":
        rec = Recorder(RecorderConfig(root=root), [])
        rec.open()
        print(f"WRITER {rec._proc.pid}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    cams = [VirtualArmCamera(CameraConfig(n, width=160, height=120)) for n in ("front", "wrist")]
    fault = "kill_in_rollover" if mode == "mid_rollover" else ""
    rec = Recorder(RecorderConfig(root=root, fault=fault), cams)
    rec.open()
    rec.wait_ready(120)
    print(f"WRITER {rec._proc.pid}", flush=True)
    if mode == "mid_rollover":
        with SyntheticLoop(rec):
            rec.start_episode("rolls over")
            record_frames(rec, 15)
            rec.save_episode(True)  # its commit is where the writer dies
            print("KILL-ME", flush=True)
            time.sleep(600)  # waits to be killed: the test's SIGKILL ends it
    with SyntheticLoop(rec):
        for i in range(2):
            rec.start_episode(f"episode {i}")
            record_frames(rec, 15)
            rec.save_episode(True)
        assert rec.wait_saved(90)
        rec.start_episode("the victim")
        record_frames(rec, 20)
        if mode == "save_then_die":
            reply = rec.save_episode(True)
            os.kill(os.getpid(), signal.SIGKILL)  # the answer was given: the writer must keep it
            print(reply)  # never runs
        if mode == "mid_save":
            rec.save_episode(True)
        print("KILL-ME", flush=True)
        time.sleep(600)  # waits to be killed: the test's SIGKILL ends it


if __name__ == "__main__":
    main()
