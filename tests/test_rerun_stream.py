"""Live data in Rerun: `so101d rerun`, `[display] rerun` and `--rerun` on `run` / `demo`.

Every piece is real: the daemon on the virtual bench (emulated arms, two virtual cameras), the
streamer process, and a real Rerun sink: the `rerun` binary shipped in the rerun-sdk wheel,
receiving over gRPC on loopback and saving to an .rrd file, read back with Rerun's own reader.
The sink runs with CI=1, which turns Rerun's usage analytics off (tests never use the network).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import rerun_cli  # rerun-sdk (a dependency): its wheel ships the viewer binary
from support import free_port, poll_until, wait_status
from test_service_signals import REPO, alive

from calibration.conventions import JOINT_NAMES
from daemon.api.client import ControlClient
from daemon.apps.commands.demo import prepare_bench
from daemon.apps.rerun_stream import JOINT_SERIES, MODE_ENTITY, camera_entity, joint_entity, viewer_reachable
from daemon.config.settings import ConfigError, config_from_dict, dump_toml
from drivers.emulator.process import EmulatorProcess

RERUN_BIN = Path(rerun_cli.__file__).with_name("rerun")  # the binary itself: the `rerun` script only wraps it
CAMERAS = ("front", "wrist")  # daemon/configs/virtual_bench.toml
JOINT_ENTITIES = [f"/{joint_entity(prefix, j)}" for _, prefix in JOINT_SERIES for j in JOINT_NAMES]


# ---------------------------------------------------------------------------------------------
# the pieces
# ---------------------------------------------------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **extra}


def _so101d(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", *args], capture_output=True, text=True, timeout=120, env=env or _env()
    )


class Sink:
    """A headless Rerun viewer stand-in: `rerun --save FILE` listening on 127.0.0.1:port."""

    def __init__(self, port: int, rrd: Path) -> None:
        self.port, self.rrd = port, rrd
        self.log = rrd.with_suffix(".log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(RERUN_BIN), "--bind", "127.0.0.1", "--port", str(port), "--save", str(rrd)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, CI="1"),
            )
        assert poll_until(lambda: viewer_reachable("127.0.0.1", port) is None or self.proc.poll() is not None, 30)
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def read_rrd(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Entity path -> its chunks' columns, from an .rrd (possibly still being written: a torn
    last message makes the read fail, and the caller polls again)."""
    import rerun as rr

    out: dict[str, list[dict[str, Any]]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no footer/manifest": the sink is still writing it
        for chunk in rr.experimental.RrdReader(path).stream().to_chunks():
            out.setdefault(chunk.entity_path, []).append(chunk.to_record_batch().to_pydict())
    return out


def rows(data: dict[str, list[dict[str, Any]]], entity: str, column: str) -> list[Any]:
    return [v for cols in data.get(entity, []) for v in cols.get(column, [])]


def wait_recording(path: Path, min_rows: int = 60, timeout_s: float = 90.0) -> dict[str, list[dict[str, Any]]]:
    """Poll the .rrd until every joint series has ``min_rows`` samples, every camera a frame, and the mode is there."""
    last: dict[str, list[dict[str, Any]]] = {}

    def complete() -> bool:
        nonlocal last
        if not path.exists():
            return False
        try:
            last = read_rrd(path)
        except Exception:  # a message half written: read again
            return False
        joints_ok = all(len(rows(last, e, "Scalars:scalars")) >= min_rows for e in JOINT_ENTITIES)
        cameras_ok = all(rows(last, f"/{camera_entity(c)}", "EncodedImage:blob") for c in CAMERAS)
        return joints_ok and cameras_ok and bool(rows(last, f"/{MODE_ENTITY}", "TextLog:text"))

    assert poll_until(complete, timeout_s, period_s=0.5), (
        f"recording incomplete: { {k: len(v) for k, v in last.items()} }"
    )
    return last


def check_recording(data: dict[str, list[dict[str, Any]]]) -> None:
    """Joints as numbers on the daemon_cycle timeline, JPEGs that decode to the cameras' size, the mode."""
    import cv2
    import numpy as np

    for entity in JOINT_ENTITIES:
        values = rows(data, entity, "Scalars:scalars")
        assert all(len(v) == 1 and np.isfinite(v[0]) for v in values), (entity, values[:3])
        cycles = rows(data, entity, "daemon_cycle")
        assert cycles and cycles == sorted(cycles) and cycles[-1] > cycles[0], (entity, cycles[:5])
    # the follower moves with the demo's leader (pick and place: some joint is always on its way)
    spans = [np.ptp([v[0] for v in rows(data, f"/observation.{j}.pos", "Scalars:scalars")]) for j in JOINT_NAMES]
    assert max(spans) > 0.5, spans
    for camera in CAMERAS:
        blob = rows(data, f"/{camera_entity(camera)}", "EncodedImage:blob")[-1]  # a batch of one blob
        img = cv2.imdecode(np.asarray(blob, dtype=np.uint8).ravel(), cv2.IMREAD_COLOR)
        assert img is not None and img.shape == (240, 320, 3), camera
        assert rows(data, f"/{camera_entity(camera)}", "EncodedImage:media_type")[-1] in ("image/jpeg", ["image/jpeg"])
    modes = rows(data, f"/{MODE_ENTITY}", "TextLog:text")
    assert any("teleop" in str(m) for m in modes), modes


class Bench:
    """Emulated arms + `so101d run` on the virtual bench's configuration (recording off)."""

    def __init__(self, directory: Path, display_rerun: str = "", run_args: tuple[str, ...] = (), **env: str) -> None:
        self.dir = directory
        self.sock = directory / "control.sock"
        self.log = directory / "daemon.log"
        self.emulator = EmulatorProcess(directory, wire_time=False).start()
        _, data = prepare_bench(directory, socket_path=str(self.sock), record=False)
        if display_rerun:
            data["display"] = {"rerun": display_rerun}
        (directory / "so101d.toml").write_text(dump_toml(config_from_dict(data)))
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "daemon.apps.cli", "run", "--config", str(directory / "so101d.toml"), *run_args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_env(**env),
            )

    def wait_teleop(self) -> dict[str, Any]:
        return wait_status(self.sock, lambda s: s["mode"] == "teleop", timeout_s=90, proc=self.proc)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout_s: float = 60.0) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            m = re.search(pattern, self.text())
            if m:
                found.append(m)
            return m is not None

        assert poll_until(seen, timeout_s, period_s=0.1), f"no {pattern!r} in the daemon's log:\n{self.text()[-3000:]}"
        return found[0]

    def cycles(self) -> int:
        with ControlClient(self.sock) as c:
            return int(c.request("status.live")["cycles"])

    def streamer_pid(self) -> int:
        return int(self.wait_log(r"Rerun streamer for \S+ started \(pid (\d+)\)").group(1))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.emulator.stop()


# ---------------------------------------------------------------------------------------------
# addresses
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["localhost", "127.0.0.1:99999", "rerun+http://127.0.0.1:9876/proxy", ":9876"])
def test_a_bad_display_rerun_is_a_configuration_error_naming_the_key(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=r"^display\.rerun: "):
        config_from_dict({"display": {"rerun": value}})
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[display]\nrerun = "{value}"\n')
    r = _so101d("run", "--config", str(bad))
    assert r.returncode == 2 and "configuration error" in r.stderr and "display.rerun" in r.stderr, r.stderr


def test_good_addresses_and_bad_flags() -> None:
    for good in ("127.0.0.1:9876", "viewer.lan:9876", "[::1]:9876"):
        assert config_from_dict({"display": {"rerun": good}}).display.rerun == good
    r = _so101d("run", "--rerun", "9876")
    assert r.returncode == 2 and "--rerun" in r.stderr and "HOST:PORT" in r.stderr, r.stderr
    r = _so101d("rerun", "--connect", "viewer:port", "--socket", "/nonexistent.sock")
    assert r.returncode == 2 and "1..65535" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_so101d_rerun_by_hand_streams_joints_and_frames_and_follows_a_viewer_restart(tmp_path: Path) -> None:
    bench = Bench(tmp_path / "bench")
    port = free_port()
    sink = Sink(port, tmp_path / "first.rrd")
    streamer: subprocess.Popen[str] | None = None
    try:
        bench.wait_teleop()
        streamer = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", "rerun", "--connect", f"127.0.0.1:{port}"]
            + ["--socket", str(bench.sock)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(),
        )
        check_recording(wait_recording(sink.rrd))

        # the viewer closed and opened again (same port): the stream carries on into the new one
        sink.stop()
        sink = Sink(port, tmp_path / "second.rrd")
        check_recording(wait_recording(sink.rrd))
        assert streamer.poll() is None
        streamer.send_signal(signal.SIGTERM)
        out, _ = streamer.communicate(timeout=30)
        assert streamer.returncode == 0, out
        assert f"streaming to the Rerun viewer at 127.0.0.1:{port}" in out, out
        assert f"the Rerun viewer at 127.0.0.1:{port} went away" in out, out
        assert bench.proc.poll() is None
    finally:
        if streamer is not None and streamer.poll() is None:
            streamer.kill()
            streamer.wait()
        sink.stop()
        bench.close()


@pytest.mark.e2e
def test_display_rerun_waits_for_an_absent_viewer_then_streams_and_stops_with_the_daemon(tmp_path: Path) -> None:
    port = free_port()  # nobody listens there yet
    bench = Bench(tmp_path / "bench", display_rerun=f"127.0.0.1:{port}")
    sink: Sink | None = None
    try:
        bench.wait_teleop()
        pid = bench.streamer_pid()
        bench.wait_log(rf"WARNING so101d\.rerun: no Rerun viewer at 127\.0\.0\.1:{port} \(Connection refused\)")
        # the daemon is not held up by it: it teleoperates and its loop runs on
        before = bench.cycles()
        assert poll_until(lambda: bench.cycles() > before + 50, 30)
        assert bench.proc.poll() is None and alive(pid)

        sink = Sink(port, tmp_path / "late.rrd")  # the operator opens the viewer now
        check_recording(wait_recording(sink.rrd))

        bench.proc.terminate()
        assert bench.proc.wait(60) == 0, bench.text()[-3000:]
        assert not alive(pid), "the Rerun streamer outlived the daemon"
        assert "exited with status" not in bench.text()  # a stop the daemon asked for is no failure
    finally:
        if sink is not None:
            sink.stop()
        bench.close()


@pytest.mark.e2e
def test_a_missing_rerun_sdk_is_one_clear_line_and_the_daemon_runs_on(tmp_path: Path) -> None:
    # an environment without rerun-sdk: a package named rerun that cannot be imported, first on the path
    shadow = tmp_path / "no-rerun" / "rerun"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'rerun'\")\n")
    bench = Bench(
        tmp_path / "bench",
        run_args=("--rerun", f"127.0.0.1:{free_port()}"),
        PYTHONPATH=f"{shadow.parent}{os.pathsep}{REPO}",
    )
    try:
        bench.wait_teleop()
        bench.wait_log(r"ERROR so101d\.rerun: rerun-sdk is not installed .*pip install 'rerun-sdk>=0\.24\.0,<0\.34\.0'")
        bench.wait_log(r"the Rerun streamer for \S+ exited with status 3; the daemon runs on without it")
        before = bench.cycles()
        assert poll_until(lambda: bench.cycles() > before + 50, 30)
        assert bench.wait_teleop()["mode"] == "teleop"
    finally:
        bench.close()


@pytest.mark.e2e
def test_kill_9_of_the_demo_takes_its_rerun_streamer_with_it(tmp_path: Path) -> None:
    sock = tmp_path / "so101d.sock"
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", "demo", "--record", "0", "--duration", "600"]
            + ["--dir", str(tmp_path / "run"), "--socket", str(sock), "--rerun", f"127.0.0.1:{free_port()}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
        )
    try:
        wait_status(sock, lambda s: s["mode"] == "teleop", timeout_s=90, proc=demo)
        found: list[int] = []

        def started() -> bool:
            m = re.search(r"Rerun streamer for \S+ started \(pid (\d+)\)", log.read_text(errors="replace"))
            found.extend([int(m.group(1))] if m else [])
            return bool(found)

        assert poll_until(started, 30), log.read_text()[-3000:]
        assert poll_until(lambda: "no Rerun viewer at" in log.read_text(errors="replace"), 60)
        assert alive(found[0])
        demo.send_signal(signal.SIGKILL)
        demo.wait()
        assert poll_until(lambda: not alive(found[0]), 10), "the Rerun streamer outlived a killed demo"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


@pytest.mark.e2e
def test_a_bimanual_daemon_streams_each_arms_joints_under_lerobots_bimanual_names(tmp_path: Path) -> None:
    """`so101d run` on the virtual bimanual bench, `so101d rerun` beside it: every joint of both
    arms arrives as observation.left_<joint>.pos ... observation.right_<joint>.pos (LeRobot's
    bi_so_follower keys), each arm moving after its own leader."""
    import numpy as np
    from bimanual_support import write_bimanual_config

    sides = ("left", "right")
    entities = [
        f"/{joint_entity(prefix, f'{s}_{j}')}" for _, prefix in JOINT_SERIES for s in sides for j in JOINT_NAMES
    ]
    sock = tmp_path / "control.sock"
    port = free_port()
    with EmulatorProcess(tmp_path / "rig", bimanual=True, calibration_out=tmp_path / "rig" / "calibration") as rig:
        rig.control({"cmd": "set_motion", "arm": "left_leader", "motion": "handover-left"})
        rig.control({"cmd": "set_motion", "arm": "right_leader", "motion": "handover-right"})
        config = write_bimanual_config(rig, tmp_path, f'\n[socket]\npath = "{sock}"\n')
        daemon = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env=_env(),
        )
        sink = Sink(port, tmp_path / "bimanual.rrd")
        streamer = None
        try:
            wait_status(
                sock, lambda s: all(a["mode"] == "teleop" for a in s["arms"].values()), timeout_s=90, proc=daemon
            )
            streamer = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "daemon.apps.cli",
                    "rerun",
                    "--connect",
                    f"127.0.0.1:{port}",
                    "--socket",
                    str(sock),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                env=_env(),
            )
            last: dict[str, list[dict[str, Any]]] = {}

            def complete() -> bool:
                nonlocal last
                try:
                    last = read_rrd(sink.rrd) if sink.rrd.exists() else {}
                except Exception:  # a message half written: read again
                    return False
                return all(len(rows(last, e, "Scalars:scalars")) >= 30 for e in entities)

            assert poll_until(complete, 90, period_s=0.5), f"incomplete: { {k: len(v) for k, v in last.items()} }"
            pans = {
                s: [v[0] for v in rows(last, f"/observation.{s}_shoulder_pan.pos", "Scalars:scalars")] for s in sides
            }
            assert not np.allclose(pans["left"][-10:], pans["right"][-10:], atol=1.0), pans
            assert not rows(last, "/observation.shoulder_pan.pos", "Scalars:scalars")  # no unprefixed arm
        finally:
            for proc in (streamer, daemon):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    proc.wait(60)
            sink.stop()
