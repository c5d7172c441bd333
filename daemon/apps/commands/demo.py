"""`so101d demo`: the daemon on the virtual bench (what `make run` starts).

It is exactly `so101d run` on a bench configuration: the emulator runs as a subprocess
(`so101d emulate`, its own process and GIL, wire time modelled) serving an emulated leader (moving
through a pick-and-place demo) and follower on pseudo-terminals in a run directory; the emulated
arms' reference calibrations are written to a bench calibration root there; the daemon runs on
daemon/configs/virtual_bench.toml with those paths filled in, and live status is printed to the
terminal until Ctrl-C (or ``--duration`` seconds).

Meanwhile it records ``--record N`` short demo episodes (default 3; 0 = no recording) with two
virtual cameras into a dataset that outlives the demo (~/so101d/demo-datasets, or <--dir>/datasets),
then prints where it is and the exact command that loads it (again when the demo exits).

``--bimanual``: the same on the two-pair bench (`so101d emulate --bimanual`: four emulated arms,
the leaders running the handover), the daemon on [arms.left] / [arms.right]; the demo episodes
record both arms (LeRobot's bi_so_follower layout) with a top-level camera and one camera per arm
(``left_wrist``, ``right_wrist``, as LeRobot names a per-arm camera), into their own dataset
(``local/so101d-demo-bimanual``: a single-arm demo dataset is never appended to).

``--sim``: the followers are the MuJoCo follower's arms instead of emulated buses: `so101d
sim-follower` runs as a subprocess on an ipc endpoint in the run directory (``--arms left,right``,
its two-arm scene, under ``--bimanual``), the daemon drives it as ``follower.kind = "sim"`` and
records the sim's cameras (``front``, ``wrist``; ``left_wrist``, ``right_wrist``, ``top``).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from daemon.apps.commands.run import add_rerun_argument, rerun_argument_error

log = logging.getLogger("so101d.demo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (scripted use)")
    parser.add_argument(
        "--dir",
        metavar="DIR",
        help="run directory for ports, calibration and config (default: a temporary one, removed at exit)",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="bench configuration (default: daemon/configs/virtual_bench.toml)"
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="control socket (default: the usual per-user path, so `so101d status` finds it)",
    )
    parser.add_argument("--no-wire-time", action="store_true", help="emulator answers at once (no modelled wire time)")
    parser.add_argument(
        "--quiet", action="store_true", help="errors and the final summary only (no status, no progress lines)"
    )
    parser.add_argument(
        "--record",
        type=int,
        default=3,
        metavar="N",
        help="record N demo episodes, then say how to load them (default 3; 0 = no recording)",
    )
    parser.add_argument(
        "--episode-time", type=float, default=5.0, metavar="S", help="length of a demo episode (default 5 s)"
    )
    parser.add_argument(
        "--bimanual",
        action="store_true",
        help="two pairs (so101d emulate --bimanual, the handover): the daemon drives and records both arms",
    )
    parser.add_argument(
        "--sim",
        action="store_true",
        help="followers simulated in MuJoCo (so101d sim-follower; its two-arm scene with --bimanual), "
        "the leaders emulated",
    )
    parser.add_argument(
        "--sim-camera-size", default="320x240", metavar="WxH", help="the sim's camera size (default %(default)s)"
    )
    add_rerun_argument(parser)


BIMANUAL_REPO_ID = "local/so101d-demo-bimanual"  # never the single-arm demo's dataset: another layout
BIMANUAL_TASK = "demo: hand over"
# the bimanual demo's cameras, named as LeRobot's BiSOFollower names them: a top-level camera
# unprefixed, a per-arm camera prefixed by its side (each virtual camera draws its own arm)
BIMANUAL_CAMERAS = ("front", "left_wrist", "right_wrist")
# --sim: the MuJoCo follower's cameras (sim_bridge/cli.py's defaults), sized by the simulator
SIM_CAMERAS = ("front", "wrist")
SIM_BIMANUAL_CAMERAS = ("left_wrist", "right_wrist", "top")


def sim_bench_data(data: dict[str, Any], endpoint: str, bimanual: bool) -> dict[str, Any]:
    """The bench configuration with its followers the simulator's arms at ``endpoint``."""
    follower = data.setdefault("follower", {})
    follower.pop("port", None)
    follower.update(kind="sim", endpoint=endpoint)
    follower.setdefault("stale_timeout_s", 0.5)  # a laptop rendering and encoding: not a cable pulled
    for pair in (data.get("arms") or {}).values():
        pair.pop("follower_port", None)
    names = SIM_BIMANUAL_CAMERAS if bimanual else SIM_CAMERAS
    data["cameras"] = {name: {"kind": "sim"} for name in names}
    return data


def sim_follower_command(endpoint: str, bimanual: bool, camera_size: str) -> list[str]:
    """`so101d sim-follower` serving the bench's simulated followers at ``endpoint``."""
    arms = ["--arms", "left,right"] if bimanual else []
    return [
        sys.executable,
        "-m",
        "daemon.apps.cli",
        "sim-follower",
        "--bind",
        endpoint,
        "--camera-size",
        camera_size,
        *arms,
    ]


def bimanual_bench_data(data: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The bench configuration made two pairs on ``so101d emulate --bimanual``'s links in
    ``run_dir``: [arms.left] / [arms.right], no [leader] / [follower] port, its own dataset."""
    for section in ("leader", "follower"):
        data.setdefault(section, {}).pop("port", None)
    data["arms"] = {
        side: {"leader_port": str(run_dir / f"{side}_leader"), "follower_port": str(run_dir / f"{side}_follower")}
        for side in ("left", "right")
    }
    # four buses in one cycle: the bench's 100 Hz asks more than a laptop shared with four
    # emulated arms and three encoders gives (a servo read timing out holds both arms); 50 Hz is
    # still above the 30 fps recorded
    control = data.setdefault("control", {})
    if control.get("rate_hz", 100.0) == 100.0:
        control["rate_hz"] = 50.0
    rec = data.setdefault("recording", {})
    if rec.get("repo_id", "local/so101d-demo") == "local/so101d-demo":
        rec["repo_id"] = BIMANUAL_REPO_ID
    if rec.get("task", "demo: pick and place") == "demo: pick and place":
        rec["task"] = BIMANUAL_TASK
    cams = data.get("cameras") or {}
    if set(cams) == {"front", "wrist"}:  # the single-arm bench's: one per arm instead of "wrist"
        wrist = cams["wrist"]
        data["cameras"] = {"front": cams["front"], **{name: dict(wrist) for name in BIMANUAL_CAMERAS[1:]}}
    return data


def bench_config_data(base_file: str | None) -> dict[str, Any]:
    if base_file:
        return tomllib.loads(Path(base_file).read_text())
    text = resources.files("daemon").joinpath("configs/virtual_bench.toml").read_text()
    return tomllib.loads(text)


def prepare_bench(
    run_dir: Path,
    base_file: str | None = None,
    socket_path: str | None = None,
    dataset_root: str | Path | None = None,
    record: bool = True,
    bimanual: bool = False,
    sim_endpoint: str | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Bench calibration root + configuration for arms linked at run_dir/leader and run_dir/follower.

    ``dataset_root`` replaces [recording] dataset_root; ``record=False`` turns recording off.
    ``bimanual``: two pairs linked at run_dir/left_leader ... run_dir/right_follower; their
    calibrations are the emulator's own (``--calibration-out``: the right arm's horns differ).
    ``sim_endpoint``: the followers are the simulator's arms there (``sim_bench_data``)."""
    from calibration.calibration_file import save_calibration
    from daemon.config.settings import config_from_dict, dump_toml
    from drivers.emulator import reference_calibration

    data = bench_config_data(base_file)
    data.setdefault("leader", {})["port"] = str(run_dir / "leader")
    data.setdefault("follower", {})["port"] = str(run_dir / "follower")
    data.setdefault("calibration", {})["root"] = str(run_dir / "calibration")
    if socket_path:
        data.setdefault("socket", {})["path"] = socket_path
    if dataset_root is not None:
        data.setdefault("recording", {})["dataset_root"] = str(dataset_root)
    if not record:
        data.setdefault("recording", {})["enabled"] = False
    if bimanual:
        data = bimanual_bench_data(data, run_dir)
    if sim_endpoint:
        data = sim_bench_data(data, sim_endpoint, bimanual)
    cfg = config_from_dict(data)
    root = Path(cfg.calibration.root)
    if not bimanual:
        save_calibration(reference_calibration("leader"), "leader", cfg.leader.id, root)
        if not sim_endpoint:
            save_calibration(reference_calibration("follower"), "follower", cfg.follower.id, root)
    (run_dir / "so101d.toml").write_text(dump_toml(cfg))
    return cfg, data


def run(args: argparse.Namespace) -> int:
    from daemon.api.server import SocketInUseError
    from daemon.config.settings import ConfigError
    from daemon.service.daemon import Daemon, StartupError
    from drivers.emulator.process import EmulatorProcess

    if args.record < 0:
        print(f"so101d demo: --record must be 0 or more, got {args.record}", file=sys.stderr)
        return 2
    if not args.episode_time > 0:
        print(f"so101d demo: --episode-time must be positive, got {args.episode_time}", file=sys.stderr)
        return 2
    bad = rerun_argument_error(args) or (_camera_size_error(args.sim_camera_size) if args.sim else "")
    if bad:
        print(f"so101d demo: {bad}", file=sys.stderr)
        return 2
    if args.quiet:  # errors, warnings and the final summary only (the recording writer too)
        from daemon.system.logs import set_log_level

        set_log_level(logging.getLevelName(max(logging.getLogger().level, logging.WARNING)))
    temp = args.dir is None
    run_dir = Path(tempfile.mkdtemp(prefix="so101d-demo-")) if temp else Path(args.dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    emu = None
    sim: subprocess.Popen[bytes] | None = None
    sim_endpoint = f"ipc://{run_dir / 'sim.sock'}" if args.sim else None
    try:
        try:
            # the dataset must outlive the run dir when that is temporary: then the config's root
            ds_root = run_dir / "datasets" if (not temp and not args.config) else None
            cfg, _ = prepare_bench(
                run_dir,
                args.config,
                args.socket,
                dataset_root=ds_root,
                record=args.record > 0,
                bimanual=args.bimanual,
                sim_endpoint=sim_endpoint,
            )
        except (ConfigError, OSError, tomllib.TOMLDecodeError) as exc:
            print(f"so101d demo: bad bench configuration: {exc}", file=sys.stderr)
            return 2
        if sim_endpoint:
            # its own process (its own GIL, the physics and the rendering off the daemon's cycle);
            # the daemon's follower links find it whenever it is up (ZeroMQ redials)
            sim = subprocess.Popen(sim_follower_command(sim_endpoint, args.bimanual, args.sim_camera_size))
            _watch_sim(sim)
        emu = EmulatorProcess(
            run_dir,
            wire_time=not args.no_wire_time,
            leader_motion="demo",  # under --bimanual: each side's handover
            bimanual=args.bimanual,
            # two pairs: the emulator writes each arm's calibration (LeRobot's <id>_left / <id>_right)
            calibration_out=cfg.calibration.root if args.bimanual else None,
            extra_args=["--leader-id", cfg.leader.id, "--follower-id", cfg.follower.id] if args.bimanual else None,
        )
        emu.start()
        ports = [str(p) for p in emu.links.values()]
        log.info(
            "virtual bench: emulator pid %s, ports %s, config %s", emu.pid, ", ".join(ports), run_dir / "so101d.toml"
        )
        try:
            daemon = Daemon(cfg, rerun=args.rerun)
        except StartupError as exc:
            print(f"so101d demo: cannot start: {exc}", file=sys.stderr)
            return 2
        if not args.quiet:
            print(
                f"so101d demo: daemon on the virtual bench; control socket {daemon.socket_path}"
                f" (try `so101d status --watch --socket {daemon.socket_path}`); Ctrl-C stops",
                file=sys.stderr,
            )
        # at a terminal: the live table; into a pipe or file: one status line a second; quiet: neither
        live = not args.quiet and sys.stdout.isatty()
        demo = (
            _DemoRecording(
                daemon,
                args.record,
                args.episode_time,
                live,
                args.quiet,
                task=cfg.recording.task if args.bimanual else "",
            )
            if cfg.recording.enabled and args.record > 0
            else None
        )
        try:
            if args.quiet:
                return daemon.run_forever(duration_s=args.duration)
            if not live:
                from daemon.apps.commands.status import one_line

                last = [0.0]

                def tick() -> None:
                    now = time.monotonic()
                    if now - last[0] >= 1.0 and daemon.loop.cycles:
                        last[0] = now
                        _print_line(one_line(daemon.status()))

                return daemon.run_forever(duration_s=args.duration, on_tick=tick)
            return _run_live(daemon, args.duration)
        except SocketInUseError as exc:
            print(f"so101d demo: {exc} (stop it, or give --socket PATH)", file=sys.stderr)
            return 2
        except StartupError as exc:  # e.g. the demo dataset was recorded with other cameras
            print(f"so101d demo: cannot start: {exc}", file=sys.stderr)
            return 2
        finally:
            if demo is not None:
                demo.stop()
                if daemon.loop.cycles:
                    demo.summary(cfg)
    finally:
        if sim is not None:
            sim.terminate()
            try:
                sim.wait(10)
            except subprocess.TimeoutExpired:
                sim.kill()
                sim.wait()
        if emu is not None:
            emu.stop()
        if temp:
            shutil.rmtree(run_dir, ignore_errors=True)


def _camera_size_error(text: str) -> str:
    """Why ``--sim-camera-size`` is not WIDTHxHEIGHT in the sim's range ("" when it is)."""
    w, sep, h = text.lower().partition("x")
    if not (sep and w.isdigit() and h.isdigit() and 16 <= int(w) <= 4096 and 16 <= int(h) <= 4096):
        return f"--sim-camera-size: expected WIDTHxHEIGHT, each 16..4096, got {text!r}"
    return ""


def _watch_sim(sim: subprocess.Popen[bytes]) -> None:
    """Say at once when the simulator exits under a running demo (the followers then stay lost)."""

    def wait() -> None:
        rc = sim.wait()
        if rc not in (0, -15):  # -15: our own terminate at the end of the demo
            log.error(
                "so101d demo: the simulator (so101d sim-follower) exited with code %s: the followers are lost", rc
            )

    threading.Thread(target=wait, name="demo-sim-watch", daemon=True).start()


def _print_line(text: str) -> None:
    """A progress line on stdout; a closed terminal or reader (EIO, EPIPE) does not stop the demo."""
    try:
        print(text, flush=True)
    except OSError:
        pass


class _DemoRecording:
    """``record_demo_episodes`` on a thread beside the live status; stopped (the episode in
    progress discarded) before the recorder closes."""

    def __init__(
        self, daemon: Any, episodes: int, episode_s: float, live: bool, quiet: bool = False, task: str = ""
    ) -> None:
        from daemon.data.demo_session import record_demo_episodes

        self._stop = threading.Event()
        self.saved = 0
        self.error = ""
        # live: lines go through logging (printed above the status table); quiet: only the final
        # summary (summary()) is printed; else plain stdout, one line per episode
        say = log.info if live else (lambda text: None) if quiet else _print_line

        def body() -> None:
            try:
                self.saved = (
                    record_demo_episodes(daemon, episodes, episode_s, say=say, stop=self._stop.is_set, task=task)
                    if task
                    else record_demo_episodes(daemon, episodes, episode_s, say=say, stop=self._stop.is_set)
                )  # no task: the pick-and-place demo's
            except Exception as exc:
                self.error = str(exc)
                log.error("demo recording failed: %s", exc)

        self._thread = threading.Thread(target=body, name="demo-recording", daemon=True)
        daemon.on_stop.insert(0, self.stop)  # before the recorder's close
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def summary(self, cfg: Any) -> None:
        """Printed when the demo exits: the dataset is complete on disk now."""
        from daemon.data.demo_session import episodes_on_disk, how_to_load
        from daemon.service.attach_recording import dataset_root

        root = dataset_root(cfg.recording).resolve()
        n = episodes_on_disk(root)
        if n == 0:
            print(f"so101d demo: no episodes recorded{': ' + self.error if self.error else ''}", flush=True)
            return
        print(f"so101d demo: {n} episodes in the dataset", flush=True)
        print(how_to_load(str(root), cfg.recording.repo_id), flush=True)


def _run_live(daemon: Any, duration: float | None) -> int:
    """Live status table in place; log lines printed above it (rich), no flicker."""
    from rich.live import Live
    from rich.logging import RichHandler

    from daemon.apps.commands.status import render

    root = logging.getLogger()
    old_handlers = root.handlers[:]
    with Live(refresh_per_second=4, auto_refresh=False, transient=False) as live:
        from daemon.system.logs import ThirdPartyBelowInfo

        handler = RichHandler(console=live.console, show_path=False, show_time=True)
        handler.addFilter(ThirdPartyBelowInfo())
        root.handlers[:] = [handler]
        last = [0.0]

        def tick() -> None:
            now = time.monotonic()
            if now - last[0] >= 0.25:
                last[0] = now
                try:
                    live.update(render(daemon.status()), refresh=True)
                except OSError:  # EIO: the terminal closed; its SIGHUP is on the way (daemon/system/terminal.py)
                    pass

        try:
            return daemon.run_forever(duration_s=duration, on_tick=tick)
        finally:
            root.handlers[:] = old_handlers
