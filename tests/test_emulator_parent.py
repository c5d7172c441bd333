"""The virtual bench's emulator never outlives the process that started it.

`so101d demo` runs `so101d emulate` in its own session (so a Ctrl-C reaches the daemon first).
When the demo is killed outright (kill -9, the OOM killer) it cannot stop the emulator, which
must notice by itself and exit, removing its port links.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from support import poll_until, wait_status
from test_service_signals import REPO, alive, cmdline, descendants

from drivers.emulator.process import EmulatorProcess


def test_kill_9_of_the_demo_takes_its_emulator_and_helpers_with_it(tmp_path: Path) -> None:
    run_dir, sock = tmp_path / "run", tmp_path / "so101d.sock"
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    with open(tmp_path / "demo.log", "wb") as out:
        demo = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daemon.apps.cli",
                "demo",
                "--duration",
                "600",
                "--record",
                "0",
                "--quiet",
                "--dir",
                str(run_dir),
                "--socket",
                str(sock),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_status(sock, lambda s: s["mode"] == "teleop", timeout_s=60, proc=demo)
        ours = descendants(demo.pid)
        emulators = [p for p in ours if "emulate" in cmdline(p)]
        assert len(emulators) == 1, [cmdline(p) for p in ours]
        assert (run_dir / "leader").is_symlink()

        demo.send_signal(signal.SIGKILL)
        demo.wait()

        assert poll_until(lambda: not alive(emulators[0]), 10), "the emulator outlived the demo"
        assert poll_until(lambda: not any(alive(p) for p in ours), 10), {p: cmdline(p) for p in ours if alive(p)}
        assert not (run_dir / "leader").exists() and not (run_dir / "follower").exists(), "port links left behind"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def test_an_emulator_started_from_a_worker_thread_lives_on_after_that_thread_ends(tmp_path: Path) -> None:
    """The kernel's parent-death signal follows the starting *thread*; a test fixture or tool that
    starts the emulator from a thread must not lose it when the thread ends."""
    emu = EmulatorProcess(tmp_path, wire_time=False)
    t = threading.Thread(target=emu.start)
    t.start()
    t.join()
    try:
        assert emu.proc is not None and emu.proc.poll() is None
        assert not poll_until(lambda: emu.proc.poll() is not None, 1.5), "the emulator died with its starting thread"
        assert emu.control({"cmd": "ping"})["pid"] == emu.pid
    finally:
        assert emu.stop() == 0
