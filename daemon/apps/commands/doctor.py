"""`so101d doctor`: bring-up check of a bench (the first real one, and every new one).

Read-only by default. For each arm (leader, follower) it:

1. identifies the adapter (driver, USB ids, ftdi_sio latency timer from sysfs) and every servo,
   pinged by id (a broadcast ping collides on a real bus): model number and firmware;
2. reads every register the daemon relies on, runs the configuration as a dry run (what
   ``connect`` would write, read only) and reads them all again: nothing may have changed;
3. checks that the 31-byte health block the daemon sync-reads (registers 40..70, across reserved
   ones LeRobot never reads) agrees with the same registers read one by one;
4. times round trips per adapter (sync reads of the six positions) against the wire time and the
   configured control period;
5. checks the calibration files against the servos.

With ``--power-cycle`` (the operator's consent is asked first) it then configures the arm as the
daemon would (torque off, EEPROM written with Lock 0), asks the operator to unplug the arm's
*power* and plug it back, and proves that the calibration and the configuration survived (and
that a power cycle really happened: Lock is back at its power-on 1).

The report is plain text an operator can paste into a bug report (``--json`` for a machine).
Exit status 0 when nothing failed (warnings allowed), 1 when a check failed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from daemon.config.settings import CameraConfig

PASS, WARN, FAIL, INFO = "PASS", "WARN", "FAIL", "INFO"

# Registers the daemon relies on (configuration, calibration, protections, state).
RELIED_ON: tuple[str, ...] = (
    "Firmware_Major_Version",
    "Firmware_Minor_Version",
    "Model_Number",
    "ID",
    "Baud_Rate",
    "Return_Delay_Time",
    "Response_Status_Level",
    "Min_Position_Limit",
    "Max_Position_Limit",
    "Max_Temperature_Limit",
    "Max_Voltage_Limit",
    "Min_Voltage_Limit",
    "Max_Torque_Limit",
    "Phase",
    "P_Coefficient",
    "D_Coefficient",
    "I_Coefficient",
    "Protection_Current",
    "Homing_Offset",
    "Operating_Mode",
    "Protection_Time",
    "Overload_Torque",
    "Torque_Enable",
    "Acceleration",
    "Torque_Limit",
    "Lock",
    "Maximum_Acceleration",
    "Status",
)
# Health-block registers whose value does not move between two reads of an idle arm.
STABLE_HEALTH = ("Torque_Enable", "Acceleration", "Torque_Limit", "Lock", "Status")
ROUND_TRIPS = 200


@dataclass
class Check:
    name: str
    status: str  # PASS, WARN, FAIL, INFO
    detail: str
    next_step: str = ""  # the command that fixes it, where one does


@dataclass
class ArmReport:
    role: str
    port: str
    adapter: dict[str, Any] = field(default_factory=dict)
    servos: dict[str, dict[str, Any]] = field(default_factory=dict)  # joint -> id, model, firmware
    registers: dict[str, dict[str, int]] = field(default_factory=dict)  # joint -> register -> value
    would_write: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # joint -> reg -> [reads, would write]
    round_trip_ms: dict[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: str, detail: str, next_step: str = "") -> None:
        self.checks.append(Check(name, status, detail, next_step))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="daemon configuration (ports, calibration ids, rate); default: built-in defaults",
    )
    p.add_argument("--leader", metavar="PORT", help="the leader's port (overrides the configuration)")
    p.add_argument("--follower", metavar="PORT", help="the follower's port (overrides the configuration)")
    p.add_argument("--only", choices=("leader", "follower"), help="check one arm only")
    p.add_argument("--calibration-root", metavar="DIR", help="calibration root (overrides the configuration)")
    p.add_argument("--leader-id", metavar="ID", help="leader calibration id (overrides the configuration)")
    p.add_argument("--follower-id", metavar="ID", help="follower calibration id (overrides the configuration)")
    p.add_argument(
        "--round-trips",
        type=int,
        default=ROUND_TRIPS,
        metavar="N",
        help=f"sync reads timed per adapter (default {ROUND_TRIPS})",
    )
    p.add_argument(
        "--power-cycle",
        action="store_true",
        help="configure the arms (writes EEPROM, torque off: asks first), walk through a power cycle and "
        "check that calibration and configuration persist",
    )
    p.add_argument(
        "--power-cycle-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="how long to wait for the servos after the power cycle",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--no-cameras",
        action="store_true",
        help="do not open the configured cameras (the bandwidth is still estimated)",
    )


# -------------------------------------------------------------------------------------------------
# the checks
# -------------------------------------------------------------------------------------------------
def _joint_ids() -> dict[str, int]:
    from calibration.conventions import JOINT_IDS, JOINT_NAMES

    return {n: JOINT_IDS[n] for n in JOINT_NAMES}


def _adapter(port: str) -> dict[str, Any]:
    from daemon.system.serial_ports import scan_ports
    from drivers.feetech_bus import latency_timer_ms

    real = os.path.realpath(port)
    info: dict[str, Any] = {"device": real}
    for p in scan_ports():
        if p.device == real:
            info.update({k: v for k, v in asdict(p).items() if v is not None})
            break
    else:
        info["driver"] = "none (not a USB serial adapter: a pty or an unknown device)"
    timer = latency_timer_ms(port)
    if timer is not None:
        info["latency_timer_ms"] = timer
    return info


def read_registers(bus: Any, ids: dict[str, int]) -> dict[str, dict[str, int]]:
    return {joint: {reg: bus.read(reg, sid) for reg in RELIED_ON} for joint, sid in ids.items()}


def identify(rep: ArmReport, bus: Any, ids: dict[str, int]) -> bool:
    from drivers.arm_interface import BusTimeoutError

    missing = []
    for joint, sid in ids.items():
        try:
            model = bus.ping(sid, retries=2)
        except BusTimeoutError:
            missing.append(f"{joint} (id {sid})")
            continue
        fw = (bus.read("Firmware_Major_Version", sid), bus.read("Firmware_Minor_Version", sid))
        rep.servos[joint] = {"id": sid, "model": model, "firmware": f"{fw[0]}.{fw[1]}"}
    if missing:
        rep.add("servos answer", FAIL, "no reply from " + ", ".join(missing) + " (power, cable, id or baud rate?)")
        return False
    models = {s["model"] for s in rep.servos.values()}
    firmware = {s["firmware"] for s in rep.servos.values()}
    rep.add("servos answer", PASS, f"ids {sorted(ids.values())} answer a ping by id")
    rep.add(
        "model",
        PASS if models == {777} else FAIL,
        ", ".join(f"{j} {s['model']}" for j, s in rep.servos.items()) + " (STS3215 = 777)",
    )
    rep.add(
        "firmware",
        PASS if len(firmware) == 1 else FAIL,
        f"{firmware.pop()} on every servo"
        if len(firmware) == 1
        else "mixed: " + ", ".join(f"{j} {s['firmware']}" for j, s in rep.servos.items()),
    )
    return True


def diagnose_ids(rep: ArmReport, bus: Any) -> None:
    """Servos missing at their ids: is this a new kit (every servo at the factory id 1, colliding),
    duplicate ids, or servos at another baud rate? Each names ``so101d setup-motors``."""
    from drivers.servo_setup import diagnose_lone_id_one, scan

    setup = f"so101d setup-motors {rep.role} --port {rep.port}"
    configured = bus.baudrate
    try:
        sightings = scan(bus)
    finally:
        bus.set_baudrate(configured)
    elsewhere = [s for s in sightings if s.baudrate != configured]
    if elsewhere:
        rep.add(
            "baud rate",
            FAIL,
            "servos answer at another rate than the configured "
            f"{configured}: {'; '.join(s.describe() for s in elsewhere)}: give every servo its id and {configured} baud",
            setup,
        )
    here = next((s for s in sightings if s.baudrate == configured), None)
    if here is None:
        if not sightings:
            rep.add(
                "servo ids",
                FAIL,
                "no servo answers a broadcast ping at any baud rate: check the arm's power supply and cables",
            )
        return
    repeated = len(here.ids) != len(set(here.ids)) or here.noise_bytes > 0
    if set(here.ids) <= {1}:
        try:
            lone = diagnose_lone_id_one(bus)
        finally:
            bus.set_baudrate(configured)
        if lone.new_kit:
            rep.add(
                "servo ids",
                FAIL,
                f"only id 1 answers ({here.describe()}; {lone.why}): the servos still have the factory id of a new kit",
                setup,
            )
        else:
            rep.add("servo ids", FAIL, f"only id 1 answers ({here.describe()}): {lone.why}")
    elif repeated:
        rep.add("servo ids", FAIL, f"duplicate ids answer together ({here.describe()})", setup)


def dry_run(rep: ArmReport, arm: Any, bus: Any, ids: dict[str, int]) -> None:
    before = read_registers(bus, ids)
    plan = arm.plan_configuration()
    after = read_registers(bus, ids)
    rep.registers = before
    name_by_id = {sid: j for j, sid in ids.items()}
    rep.would_write = {
        name_by_id[sid]: {reg: [held, want] for reg, (held, want) in w.items()} for sid, w in plan.items()
    }
    changed = [
        f"{j} {reg} {before[j][reg]} -> {after[j][reg]}"
        for j in ids
        for reg in RELIED_ON
        if before[j][reg] != after[j][reg] and reg != "Status"
    ]
    rep.add(
        "dry run is read-only",
        FAIL if changed else PASS,
        "; ".join(changed) or "registers identical before and after the configure dry run",
    )
    if rep.would_write:
        listing = "; ".join(
            f"{j}: " + ", ".join(f"{r} {h}->{w}" for r, (h, w) in regs.items()) for j, regs in rep.would_write.items()
        )
        rep.add("configuration", INFO, f"connect would write {listing}")
    else:
        rep.add("configuration", PASS, "every servo already holds the daemon's configuration")
    latched = [f"{j} (status 0x{before[j]['Status']:02x})" for j in ids if before[j]["Status"] & 0x28]
    if latched:
        rep.add("protections", FAIL, "overload/over-current latched on " + ", ".join(latched) + ": power-cycle the arm")


def health_block(rep: ArmReport, bus: Any, ids: dict[str, int]) -> None:
    from drivers.feetech_arm import HEALTH_LEN, HEALTH_START
    from drivers.feetech_bus import decode_value, register_spec

    blocks = bus.sync_read_bytes(HEALTH_START, HEALTH_LEN, list(ids.values()), what="SYNC_READ health")
    bad = []
    for joint, sid in ids.items():
        for reg in STABLE_HEALTH:
            addr, size = register_spec(reg)
            in_block = decode_value(reg, blocks[sid][addr - HEALTH_START : addr - HEALTH_START + size])
            alone = bus.read(reg, sid)
            if in_block != alone:
                bad.append(f"{joint} {reg}: block {in_block}, alone {alone}")
    rep.add(
        "health block read",
        FAIL if bad else PASS,
        "; ".join(bad)
        or f"the {HEALTH_LEN}-byte sync read of {HEALTH_START}..{HEALTH_START + HEALTH_LEN - 1} agrees with single reads",
    )


def round_trips(rep: ArmReport, bus: Any, ids: dict[str, int], n: int, rate_hz: float) -> None:
    from drivers.protocol import STATUS_OVERHEAD_BYTES, wire_time_s

    id_list = list(ids.values())
    samples = []
    retries0 = bus.counters.retries
    for _ in range(n):
        t0 = time.perf_counter()
        bus.sync_read("Present_Position", id_list)
        samples.append(time.perf_counter() - t0)
    samples.sort()
    p50, p99, worst = samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))], samples[-1]
    wire = wire_time_s(8 + len(id_list) + len(id_list) * (STATUS_OVERHEAD_BYTES + 2), bus.baudrate)
    rep.round_trip_ms = {
        "p50": round(p50 * 1e3, 3),
        "p99": round(p99 * 1e3, 3),
        "max": round(worst * 1e3, 3),
        "wire": round(wire * 1e3, 3),
        "samples": n,
        "retries": bus.counters.retries - retries0,
    }
    period = 1.0 / rate_hz
    timer = rep.adapter.get("latency_timer_ms")
    detail = (
        f"sync read of {len(id_list)} positions: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, max {worst * 1e3:.2f} ms "
        f"(wire {wire * 1e3:.2f} ms, ratio {p50 / wire:.1f}); period at {rate_hz:g} Hz {period * 1e3:.1f} ms"
    )
    hint = (
        f"; FTDI latency_timer is {timer} ms: set it to 1 (the udev rule of so101d install-service)"
        if timer and timer > 1
        else ""
    )
    if p50 > 0.8 * period:
        # The loop reads the follower (the leader in parallel on its own adapter), then writes:
        # a read that takes most of the period leaves no room for the rest of the cycle.
        rep.add("round trip", FAIL, f"{detail}: {rate_hz:g} Hz is impossible on this adapter{hint}")
    elif p50 > 0.5 * period or hint:
        rep.add("round trip", WARN, f"{detail}: little room left in the period{hint}")
    else:
        rep.add("round trip", PASS, detail)


def calibration(rep: ArmReport, bus: Any, cal: Any, source: str, arm_id: str = "") -> None:
    from drivers.calibration_io import verify_against_servos

    redo = f"so101d calibrate {rep.role} --port {rep.port} --id {arm_id or rep.role}"
    if cal is None:
        rep.add("calibration", WARN, f"no calibration file ({source}): run `so101d calibrate`", redo)
        return
    mismatches = verify_against_servos(bus, cal)
    if mismatches:
        rep.add(
            "calibration",
            FAIL,
            f"{source} differs from the servos: " + "; ".join(m.describe() for m in mismatches),
            redo,
        )
    else:
        rep.add("calibration", PASS, f"{source} matches the servos")


# -------------------------------------------------------------------------------------------------
# power cycle (operator consent)
# -------------------------------------------------------------------------------------------------
def _ask(prompt: str) -> str:
    print(prompt, end="", flush=True)
    line = sys.stdin.readline()
    if not line:
        raise EOFError("no answer (stdin closed)")
    return line.strip()


def _wait_answering(bus: Any, ids: dict[str, int], timeout_s: float) -> bool:
    from drivers.arm_interface import ArmError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if not bus.is_open:
                bus.open()  # an adapter powered from the arm comes back as a new device
            if all(bus.ping(sid, retries=0) == 777 for sid in ids.values()):
                return True
        except ArmError:
            bus.close()
            time.sleep(0.2)
    return False


def power_cycle(
    reps: list[tuple[ArmReport, Any]], ids: dict[str, int], timeout_s: float, ask: Callable[[str], str]
) -> None:
    """Configure every arm as the daemon would, have the operator cycle the power, compare."""
    names = " and ".join(r.role for r, _ in reps)
    answer = ask(
        f"--power-cycle: torque goes OFF on the {names} (support the follower!) and the daemon's configuration "
        "is written to the servos' EEPROM. Continue? [y/N] "
    )
    if answer.lower() not in ("y", "yes"):
        for rep, _ in reps:
            rep.add("power cycle", INFO, "skipped: the operator declined")
        return
    kept: dict[str, dict[str, dict[str, int]]] = {}
    for rep, arm in reps:
        arm.connect()
        arm.set_torque(False)  # Lock 0: a power cycle is then visible as Lock back at 1
        if arm.configure_warnings:
            rep.add("configure", WARN, "; ".join(arm.configure_warnings))
        else:
            rep.add("configure", PASS, "every register kept its value")
        kept[rep.role] = read_registers(arm.bus, ids)
    ask(
        f"Now unplug the POWER supply of the {names} (not the USB cable), wait 5 s, plug it back in, then press Enter: "
    )
    for rep, arm in reps:
        if not _wait_answering(arm.bus, ids, timeout_s):
            rep.add("power cycle", FAIL, f"the servos did not answer within {timeout_s:g} s after the power cycle")
            continue
        after = read_registers(arm.bus, ids)
        if any(after[j]["Lock"] != 1 for j in ids):
            rep.add(
                "power cycle", FAIL, "Lock is still 0: the servos did not lose power (unplug the power supply, not USB)"
            )
            continue
        from drivers.sts3215_table import CONTROL_TABLE, EEPROM_END

        lost = [
            f"{j} {reg} {kept[rep.role][j][reg]} -> {after[j][reg]}"
            for j in ids
            for reg in RELIED_ON
            if CONTROL_TABLE[reg][0] < EEPROM_END and after[j][reg] != kept[rep.role][j][reg]
        ]
        rep.add(
            "power cycle",
            FAIL if lost else PASS,
            "EEPROM lost: " + "; ".join(lost) if lost else "calibration and configuration survived the power cycle",
        )
        g = "gripper"
        if g in after and after[g]["Torque_Limit"] != after[g]["Max_Torque_Limit"]:
            rep.add(
                "torque cap",
                WARN,
                f"gripper Torque_Limit {after[g]['Torque_Limit']} after power-on, Max_Torque_Limit {after[g]['Max_Torque_Limit']}",
            )


# -------------------------------------------------------------------------------------------------
# report
# -------------------------------------------------------------------------------------------------
def environment() -> dict[str, str]:
    from importlib import metadata

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "so101d": version("so101d"),
        "lerobot": version("lerobot"),
        "pyserial": version("pyserial"),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "machine": platform.machine(),
    }


# -------------------------------------------------------------------------------------------------
# the cameras: USB bandwidth of the configured streams, and what each camera really delivers
# -------------------------------------------------------------------------------------------------
CAMERA_SETTLE_S = 15.0  # LeRobot's warmup, then a second of frames timed


def camera_report(cameras_cfg: Mapping[str, CameraConfig], open_cameras: bool) -> ArmReport | None:
    """The [cameras] part of the report; None without real cameras configured."""
    from daemon.service.cameras import driver_config
    from drivers.camera_bandwidth import Stream, advice, estimate
    from drivers.camera_lerobot import LeRobotCamera

    real = {n: c for n, c in sorted(cameras_cfg.items()) if c.kind in ("opencv", "intelrealsense", "zmq")}
    if not real:
        return None
    rep = ArmReport("cameras", ", ".join(real))
    usb = [Stream(n, c.width, c.height, float(c.fps), c.fourcc) for n, c in real.items() if c.kind == "opencv"]
    if usb:
        status, text = advice(estimate(usb))
        rep.add("usb bandwidth", status, text, "" if status == PASS else 'set fourcc = "MJPG" in [cameras.*]')
    if not open_cameras:
        return rep
    for name, c in real.items():
        cam = LeRobotCamera(driver_config(name, c))
        cam.start()
        deadline = time.monotonic() + CAMERA_SETTLE_S + c.warmup_s
        while cam.state in ("opening", "verifying") and time.monotonic() < deadline:
            time.sleep(0.1)
        st = cam.stats()
        cam.stop()
        if cam.state == "streaming":
            age = st["last_frame_age_s"]
            rep.add(
                f"camera {name}",
                WARN if st["problems"] else PASS,
                f"{st['device']}: {st['format']}; configured {c.fps} fps, measured {st['fps_verified']} fps; "
                f"dropped {st['frames_dropped']}; newest frame {age if age is not None else '?'} s old"
                + (f"; {'; '.join(st['problems'])} (on_mismatch = warn)" if st["problems"] else "")
                + _depth_text(st["depth"]),
            )
        else:
            rep.add(
                f"camera {name}",
                FAIL,
                cam.refusal() or st["error"] or f"no frame within {CAMERA_SETTLE_S:g} s",
                "so101d find-cameras",
            )
    return rep


def _depth_text(depth: dict[str, Any] | None) -> str:
    """A RealSense's depth stream, as the camera check shows it ("" for a camera without depth)."""
    if depth is None:
        return ""
    h, w, _ = depth["shape"]
    return f"; depth {depth['stream']}: {w}x{h} uint16 {depth['unit']}, {depth['frames']} maps with their colour frames"


def render_text(env: dict[str, str], reps: list[ArmReport], config: str | None = None) -> str:
    out = ["so101d doctor report", "=" * 20, " ".join(f"{k}={v}" for k, v in env.items()), ""]
    for r in reps:
        out.append(f"[{r.role}] {r.port}")
        if r.adapter:
            out.append("  adapter: " + ", ".join(f"{k}={v}" for k, v in r.adapter.items()))
        for j, s in r.servos.items():
            regs = r.registers.get(j, {})
            short = ", ".join(
                f"{k}={regs[k]}"
                for k in ("Return_Delay_Time", "Maximum_Acceleration", "Max_Torque_Limit", "Torque_Limit", "Lock")
                if k in regs
            )
            out.append(f"  {j:<13} id {s['id']} model {s['model']} fw {s['firmware']}  {short}")
        for c in r.checks:
            out.append(f"  {c.status:<4} {c.name}: {c.detail}")
        out.append("")
    worst = overall(reps)
    out.append(f"next: {next_step(reps, config)}")
    out.append(f"result: {worst}")
    return "\n".join(out)


def next_step(reps: list[ArmReport], config: str | None = None) -> str:
    """The command to type now: the fix of the first failed check that has one (then of the first
    warning), else starting the daemon."""
    for status in (FAIL, WARN):
        for r in reps:
            for c in r.checks:
                if c.status == status and c.next_step:
                    return c.next_step
    if any(c.status == FAIL for r in reps for c in r.checks):
        return "fix the failed checks above, then run so101d doctor again"
    return f"so101d run --config {config or 'so101d.toml'}"


def overall(reps: list[ArmReport]) -> str:
    statuses = {c.status for r in reps for c in r.checks}
    return FAIL if FAIL in statuses else WARN if WARN in statuses else PASS


def run(args: argparse.Namespace) -> int:
    from calibration.calibration_file import CalibrationError, load_calibration
    from daemon.config.settings import ConfigError, load_config
    from drivers.arm_interface import ArmError, PortGoneError
    from drivers.feetech_arm import FeetechFollower, FeetechLeader, FollowerBusConfig, LeaderBusConfig

    try:
        cfg = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"so101d doctor: {exc}", file=sys.stderr)
        return 2
    if args.round_trips < 10:
        print("so101d doctor: --round-trips must be at least 10", file=sys.stderr)
        return 2
    root = Path(args.calibration_root).expanduser() if args.calibration_root else cfg.calibration_root()
    roles = [args.only] if args.only else ["leader", "follower"]
    unnamed = [role for role in roles if not getattr(args, role)]
    if cfg.bimanual and unnamed:
        # [leader] / [follower] hold no port in a bimanual configuration: checking their defaults
        # would report on a port that is not one of the rig's four
        print(
            "so101d doctor: [arms.left] / [arms.right]: checking a bimanual configuration's four arms is "
            f"not built yet; check one arm at a time with --{unnamed[0]} PORT (and --{unnamed[0]}-id ID)",
            file=sys.stderr,
        )
        return 2
    if cfg.follower.kind != "feetech" and "follower" in roles and not args.follower:
        roles.remove("follower")  # a simulated follower has no servos to check
    ids = _joint_ids()
    reps: list[tuple[ArmReport, Any]] = []
    for role in roles:
        port = (args.leader or cfg.leader.port) if role == "leader" else (args.follower or cfg.follower.port)
        arm_id = (args.leader_id or cfg.leader.id) if role == "leader" else (args.follower_id or cfg.follower.id)
        rep = ArmReport(role, port)
        source = f"{role} calibration '{arm_id}'"
        try:
            cal = load_calibration(role, arm_id, root)  # type: ignore[arg-type]
        except CalibrationError as exc:
            cal, source = None, f"{source}: {exc}"
        if role == "leader":
            arm: Any = FeetechLeader(port, cal, LeaderBusConfig(baudrate=cfg.leader.baudrate))
        else:
            from daemon.service.daemon import follower_bus_config

            bus_cfg = follower_bus_config(cfg) if cfg.follower.kind == "feetech" else FollowerBusConfig()
            arm = FeetechFollower(port, cal, bus_cfg)
        reps.append((rep, arm))
        bus = arm.bus
        try:
            rep.adapter = _adapter(port)
            bus.open()
        except PortGoneError as exc:
            hint = (
                " (is the daemon running? `systemctl stop so101d` first)"
                if "busy" in str(exc).lower() or "lock" in str(exc).lower()
                else ""
            )
            rep.add("port", FAIL, f"{exc}{hint}")
            continue
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("configuration", lambda: dry_run(rep, arm, bus, ids)),  # noqa: B023 (each step runs in this iteration)
            ("health block read", lambda: health_block(rep, bus, ids)),  # noqa: B023 (each step runs in this iteration)
            ("round trip", lambda: round_trips(rep, bus, ids, args.round_trips, cfg.control.rate_hz)),  # noqa: B023 (each step runs in this iteration)
            ("calibration", lambda: calibration(rep, bus, cal, source, arm_id)),  # noqa: B023 (each step runs in this iteration)
        ]
        try:
            if not identify(rep, bus, ids):
                diagnose_ids(rep, bus)
            else:
                for name, step in steps:
                    # one failed transaction fails its own check; the others still tell their story
                    try:
                        step()
                    except PortGoneError:
                        raise
                    except ArmError as exc:
                        rep.add(name, FAIL, f"bus error: {exc}")
        except ArmError as exc:
            rep.add("bus", FAIL, str(exc))
        finally:
            bus.close()
    usable = [
        (r, a) for r, a in reps if not any(c.status == FAIL and c.name in ("port", "servos answer") for c in r.checks)
    ]
    if args.power_cycle and usable:
        try:
            power_cycle(usable, ids, args.power_cycle_timeout, _ask)
        except (ArmError, EOFError) as exc:
            for r, _ in usable:
                r.add("power cycle", FAIL, str(exc))
        finally:
            for _, a in usable:
                a.bus.close()
    env = environment()
    only_reps = [r for r, _ in reps]
    cams = camera_report(cfg.cameras, open_cameras=not args.no_cameras)
    if cams is not None:
        only_reps.append(cams)
    if args.json:
        print(
            json.dumps(
                {
                    "environment": env,
                    "arms": [asdict(r) for r in only_reps],
                    "next": next_step(only_reps, args.config),
                    "result": overall(only_reps),
                },
                indent=2,
            )
        )
    else:
        print(render_text(env, only_reps, args.config))
    return 1 if overall(only_reps) == FAIL else 0
