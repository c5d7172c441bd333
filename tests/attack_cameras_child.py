"""Child process for tests/test_attack_cameras.py's power cut with a real camera: records one
episode from LeRobot's OpenCV camera on a named pipe (fed by the test), saves it, prints the
answer ("SAVED <json>") and SIGKILLs its whole process group (itself and its writer) DELAY_MS after
the answer, as a power cut does.

usage: attack_cameras_child.py ROOT PIPE DELAY_MS
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recording_support import SyntheticLoop, record_frames, wait_until

from daemon.data.recorder import Recorder, RecorderConfig
from drivers.camera_lerobot import LeRobotCamera
from drivers.cameras import CameraConfig


def main() -> None:
    root, pipe, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    cam = LeRobotCamera(CameraConfig("front", device=pipe, width=160, height=120, fps=30))
    rec = Recorder(RecorderConfig(root=root), [cam])
    rec.open()
    rec.wait_ready(120)
    print(f"WRITER {rec._proc.pid}", flush=True)
    assert wait_until(lambda: cam.state == "streaming", 60), cam.stats()
    with SyntheticLoop(rec):
        task = f"real camera, power cut {delay_ms:g} ms after the answer"
        rec.start_episode(task)
        record_frames(rec, 20)
        reply = rec.save_episode(True)
        cut_at = time.monotonic() + delay_ms / 1000.0
        print("SAVED " + json.dumps(dict(reply, task=task)), flush=True)
        while time.monotonic() < cut_at:  # spin: a sleep's wake-up may come late on a busy machine
            pass
        os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    main()
