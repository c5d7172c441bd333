"""One tiny ACT per recipe per test run, shared by every file and every xdist worker.

Training a tiny ACT (synthetic dataset, a few optimiser steps, torch import) costs seconds;
ten files used to train the same recipe each. The first caller trains it under a file lock in
the run's shared temp folder, later callers (any worker) wait on the lock and get a private copy,
so a test that corrupts or edits its checkpoint cannot touch another's.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import wait_for

from daemon.policy.tiny import tiny_act_checkpoint

_DONE_MARKER = "trained.ok"


def _run_shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's basetemp is <run>/popen-gwN; the run folder is shared by all.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    shared = base / "shared-policies"
    shared.mkdir(parents=True, exist_ok=True)
    return shared


def tiny_act(
    tmp_path_factory: pytest.TempPathFactory,
    cameras: dict[str, tuple[int, int]],
    steps: int = 5,
    frames_per_episode: int = 30,
    chunk_size: int = 10,
) -> Path:
    """A private copy of the run's tiny ACT checkpoint for this recipe; trained once per run."""
    recipe = {
        "cameras": {name: list(hw) for name, hw in sorted(cameras.items())},
        "steps": steps,
        "frames_per_episode": frames_per_episode,
        "chunk_size": chunk_size,
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    shared = _run_shared_dir(tmp_path_factory)
    work = shared / f"act-{key}"
    with open(shared / f"act-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (work / _DONE_MARKER).exists():
            shutil.rmtree(work, ignore_errors=True)  # a half-trained folder from a killed worker
            checkpoint = tiny_act_checkpoint(
                work, cameras, steps=steps, frames_per_episode=frames_per_episode, chunk_size=chunk_size
            )
            (work / _DONE_MARKER).write_text(str(checkpoint.relative_to(work)))
        relative = (work / _DONE_MARKER).read_text()
    copy = tmp_path_factory.mktemp(f"act-{key}") / "checkpoint"
    shutil.copytree(work / relative, copy)
    return copy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LeRobotServer:
    """LeRobot's policy server, unmodified, as an operator starts it (CPU, loopback)."""

    def __init__(self, port: int, workdir: Path, inference_latency_s: float = 0.0):
        self.port, self.workdir, self.proc = port, workdir, None
        self.inference_latency_s = inference_latency_s

    def start(self) -> None:
        # --inference_latency=0: no artificial sleep in GetActions (its default pads to 1/fps)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lerobot.async_inference.policy_server",
                "--host=127.0.0.1",
                f"--port={self.port}",
                "--fps=30",
                f"--inference_latency={self.inference_latency_s}",
            ],
            cwd=self.workdir,
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "server.err", "ab"),
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )

        def accepting() -> bool:
            assert self.proc.poll() is None, (self.workdir / "server.err").read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(accepting, 60, "LeRobot's policy server listening")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None
