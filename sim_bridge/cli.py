"""``so101d sim-follower``: serve a simulated follower for the daemon (MuJoCo on any CPU).

The LeIsaac backend runs inside a LeIsaac source install on a GPU workstation with its own
Python (Isaac Sim 5.1 / Isaac Lab 2.3): ``python -m sim_bridge.leisaac_follower`` there.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

log = logging.getLogger("so101d.sim")

BI_ARM_SIDES = ("left", "right")  # LeRobot's bimanual sides, left first (daemon.config.settings.ARM_SIDES)
SINGLE_ARM_CAMERAS = "front,wrist"
# LeIsaac's bi-arm template's cameras (tasks/template/bi_arm_env_cfg.py), as LeRobot's BiSOFollower
# names a per-arm camera (<side>_wrist) and a top-level one (top)
BI_ARM_CAMERAS = "left_wrist,right_wrist,top"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=["mujoco", "leisaac"],
        default="mujoco",
        help="simulator (leisaac: prints how to start it on the GPU workstation)",
    )
    p.add_argument(
        "--bind",
        default="tcp://127.0.0.1:5555",
        help="endpoint to bind: tcp://127.0.0.1:PORT or ipc:///path (default %(default)s)",
    )
    p.add_argument("--rate-hz", type=float, default=30.0, help="state and camera rate (default %(default)s)")
    p.add_argument(
        "--arms",
        default="",
        help="the two-arm scene: 'left,right' (LeRobot's sides; a bimanual daemon's [arms] drive them), "
        "empty for one arm (default)",
    )
    p.add_argument(
        "--cameras",
        default=None,
        help="comma-separated cameras, empty for none (default front,wrist; with --arms left_wrist,right_wrist,top)",
    )
    p.add_argument("--camera-size", default="320x240", help="WIDTHxHEIGHT of every camera (default %(default)s)")
    p.add_argument("--jpeg-quality", type=int, default=None, help="send JPEG frames of this quality instead of raw RGB")
    p.add_argument(
        "--daemon-staleness-ms",
        type=float,
        default=100.0,
        help="hold the pose when the daemon is silent this long (default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the cube placement")


def _parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--camera-size: expected WIDTHxHEIGHT, got {text!r}") from None
    if not (16 <= w <= 4096 and 16 <= h <= 4096):
        raise SystemExit(f"--camera-size: {w}x{h} is out of range (16..4096)")
    return w, h


def run(args: argparse.Namespace) -> int:
    if args.backend == "leisaac":
        print(
            "The LeIsaac follower runs inside a LeIsaac source install on a GPU workstation:\n"
            f"  PYTHONPATH=$PWD python -m sim_bridge.leisaac_follower --bind {args.bind} --task LeIsaac-SO101-PickOrange-v0 "
            "--enable_cameras --device cuda --headless\n(see the README's simulation section)."
        )
        return 2
    from sim_bridge.gl_backend import GLBackendUnavailable

    try:
        from sim_bridge.mujoco_follower import MujocoFollower, MujocoFollowerConfig
    except GLBackendUnavailable as exc:
        print(f"so101d sim-follower: {exc}", file=sys.stderr)
        return 2

    width, height = _parse_size(args.camera_size)
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    if arms and arms != BI_ARM_SIDES:
        print(f"so101d sim-follower: --arms {args.arms!r}: the two-arm scene's arms are 'left,right'", file=sys.stderr)
        return 2
    default_cams = BI_ARM_CAMERAS if arms else SINGLE_ARM_CAMERAS
    cams = tuple(c.strip() for c in (default_cams if args.cameras is None else args.cameras).split(",") if c.strip())
    cfg = MujocoFollowerConfig(
        bind=args.bind,
        rate_hz=args.rate_hz,
        cameras=cams,
        camera_width=width,
        camera_height=height,
        jpeg_quality=args.jpeg_quality,
        daemon_staleness_s=args.daemon_staleness_ms / 1000.0,
        seed=args.seed,
        arms=arms,
    )
    sim = MujocoFollower(cfg)

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        sim.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    endpoint = sim.open()
    log.info(
        "MuJoCo follower serving at %s (%s%s, %.0f Hz)",
        endpoint,
        f"arms {', '.join(arms)}; " if arms else "",
        ", ".join(cams) or "no cameras",
        cfg.rate_hz,
    )
    sim.run()
    log.info("stopped after %d ticks (%d overruns)", sim.ticks, sim.overruns)
    return 0
