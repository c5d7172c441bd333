"""The daemon's configuration: one TOML file, one dataclass per section.

Every key has a default here, and ``daemon/configs/so101d.example.toml`` documents each one (a test
checks the two agree). Adding a key is one dataclass field; the loader validates types from the
annotations, so a typo ("follower.prot") or a bad value ("control.rate_hz = -5") is an error that
names the key, never a silently ignored setting: on a robot arm a misspelt safety limit must not
fall back to a default unnoticed.

Sections: [leader] [follower] [arms.left] [arms.right] [calibration] [control] [safety] [socket]
[recording] [cameras.<name>] [leisaac_remote_leader] [policy] [service] [display].

A bimanual configuration (two pairs, LeRobot's bi_so_leader / bi_so_follower) names each pair's
ports in [arms.left] and [arms.right]; [leader] and [follower] then hold what both pairs share
(ids as the pair's id, baud rate, gripper protection). The daemon drives both pairs in one loop
(daemon/service/daemon.py ``build_loop``)."""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from calibration.conventions import JOINT_NAMES
from daemon.config.ring_bound import DEFAULT_RING_MAX_MB, RING_S_MAX, StreamSize, bound_refusal


class ConfigError(ValueError):
    """A configuration problem; the message starts with the dotted key (or the file)."""


SERVICE_SOCKET_PATH = "/run/so101d/control.sock"


def default_socket_path() -> str:
    """Root (the service) -> /run/so101d/control.sock; a user -> $XDG_RUNTIME_DIR/so101d/control.sock.

    Falls back to /tmp/so101d-<uid>/control.sock when there is no runtime dir (containers, CI).
    """
    # systemd sets RUNTIME_DIRECTORY for RuntimeDirectory=so101d (/run/so101d), also when the
    # service runs as its own unprivileged user.
    service_runtime = os.environ.get("RUNTIME_DIRECTORY")
    if service_runtime:
        return os.path.join(service_runtime.split(":")[0], "control.sock")
    if os.geteuid() == 0:
        return SERVICE_SOCKET_PATH
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "so101d", "control.sock")
    return f"/tmp/so101d-{os.geteuid()}/control.sock"


# -------------------------------------------------------------------------------------------------
# sections
# -------------------------------------------------------------------------------------------------
@dataclass
class LeaderConfig:
    port: str = "/dev/ttyACM0"  # serial port of the leader arm (a udev name like /dev/so101-leader is better)
    id: str = "leader"  # calibration id: <calibration root>/teleoperators/so_leader/<id>.json
    baudrate: int = 1_000_000


@dataclass
class FollowerConfig:
    kind: Literal["feetech", "sim"] = "feetech"  # real/emulated STS3215 bus, or a simulator over ZeroMQ
    port: str = "/dev/ttyACM1"  # serial port (kind = "feetech")
    endpoint: str = "tcp://127.0.0.1:5555"  # simulator endpoint (kind = "sim")
    id: str = "follower"  # calibration id: <calibration root>/robots/so_follower/<id>.json
    baudrate: int = 1_000_000
    torque_off_on_shutdown: bool = False  # False: hold the last pose (torque on) when the daemon stops
    # Gripper protection written to the servo at connect (LeRobot 0.6.1's values; LR#3942).
    gripper_max_torque_limit: int = 500  # 0..1000 (0.1 % of stall torque)
    gripper_protection_current: int = 250  # 6.5 mA units
    gripper_overload_torque: int = 25  # percent
    stale_timeout_s: float = 0.1  # sim only: state older than this counts as a lost follower
    # sim only: "degrees" keeps the leader's angles; "leisaac" maps the leader's calibrated range
    # onto the sim joint range exactly as LeIsaac's own leader does (calibration.conventions)
    sim_mapping: Literal["degrees", "leisaac"] = "degrees"
    # what `dataset check` compares joint speeds with (daemon/data/feasibility.py's rated-speed table)
    servo_model: Literal["sts3215"] = "sts3215"
    supply_voltage_v: float = 7.4  # the follower's servo supply: 7.4 V (SO-101 kit) or 12 V servos


ARM_SIDES: tuple[str, ...] = ("left", "right")  # LeRobot's bimanual sides, left first


@dataclass
class ArmPairConfig:
    """One [arms.<side>] table of a bimanual configuration: one leader and the follower it drives.

    Its ids follow LeRobot's bimanual classes (lerobot/robots/bi_so_follower/bi_so_follower.py,
    lerobot/teleoperators/bi_so_leader/bi_so_leader.py): arm ids ``<id>_left`` / ``<id>_right``
    in the single-arm calibration folders, so a LeRobot bimanual calibration is used as it is."""

    leader_port: str = ""  # serial port of this side's leader (required)
    follower_port: str = ""  # serial port of this side's follower (required; none with follower.kind = "sim")
    leader_id: str = ""  # calibration id; empty: "<[leader] id>_<side>" (LeRobot's BiSOLeader ids)
    follower_id: str = ""  # calibration id; empty: "<[follower] id>_<side>" (LeRobot's BiSOFollower ids)


@dataclass
class CalibrationConfig:
    root: str = ""  # empty: LeRobot's ($HF_LEROBOT_CALIBRATION or ~/.cache/huggingface/lerobot/calibration)


@dataclass
class ControlConfig:
    rate_hz: float = 100.0  # control loop rate; one leader read + follower write + read is ~1.5 ms at 1 Mbaud
    start_mode: Literal["idle", "teleop"] = "teleop"  # mode once both arms are connected
    overlap_io: bool = True  # read the leader on a worker thread while the follower is written/read
    health_period_s: float = 0.5  # how often follower health registers (temperature, load...) are read
    reconnect_backoff_min_s: float = 0.2  # retry a lost arm after this, doubling...
    reconnect_backoff_max_s: float = 2.0  # ...up to this
    realtime_priority: int = (
        0  # 1..99: run the loop thread SCHED_FIFO at this priority (needs CAP_SYS_NICE / LimitRTPRIO); 0: off
    )


@dataclass
class SafetyConfig:
    align_speed_deg_s: float = 30.0  # start-up / after-hold alignment speed (body joints, deg/s)
    align_gripper_speed_pct_s: float = 50.0  # gripper alignment speed (percent of range per second)
    align_tolerance_deg: float = 2.0  # aligned when every joint is within this of the target
    max_step_deg: float = 10.0  # per-cycle step limit while tracking (body joints, degrees)
    max_step_gripper_pct: float = 20.0  # per-cycle step limit of the gripper (percent of range)
    leader_stale_s: float = 0.1  # leader unreadable this long -> follower holds its measured pose
    on_fault: Literal["hold", "torque_off"] = "hold"  # reaction to overload/overheat/voltage/missing servo
    fault_bits: int = (
        1 | 4 | 8 | 32
    )  # STS3215 status bits that count as a fault (voltage, overheat, overcurrent, overload)
    max_temperature_c: float = 70.0  # a servo hotter than this is a fault
    # two arms (a bimanual pair) are one task: a fault or a lost follower on either arm holds
    # both ("all"); "faulted" holds only the arm that faulted while the other keeps tracking
    fault_holds: Literal["all", "faulted"] = "all"


@dataclass
class SocketConfig:
    path: str = ""  # empty: /run/so101d/control.sock as root, else $XDG_RUNTIME_DIR/so101d/control.sock
    mode: int = 0o660  # file mode of the socket: who may command the arm (owner + group)
    max_request_bytes: int = 65536  # larger requests get an error reply

    def resolved_path(self) -> str:
        return self.path or default_socket_path()


@dataclass
class DepthEncoderSettings:
    """[recording.depth_encoder]: how depth streams are quantised, LeRobot's DepthEncoderConfig
    fields under their names (metres; lerobot/configs/video.py). Unset: LeRobot's defaults. A
    depth_max just past the workspace gives the near range finer steps."""

    depth_min: float | None = None  # depth at the lowest 12-bit code
    depth_max: float | None = None  # depth at the highest code; farther is stored as depth_max
    shift: float | None = None  # offset before the logarithm (use_log)
    use_log: bool | None = None  # logarithmic codes: finer near, coarser far


@dataclass
class RecordingConfig:
    enabled: bool = False
    dataset_root: str = "~/so101d/datasets"  # datasets live under <dataset_root>/<repo_id>
    repo_id: str = "local/so101d"
    fps: int = 30
    task: str = "teleoperation"  # default task string of an episode
    on_shutdown: Literal["save", "discard"] = "save"  # the episode in progress at SIGTERM / stop
    stop_timeout_s: float = 120.0  # at stop, how long to wait for the writer to commit saved episodes
    min_free_mb: float = 500.0  # an episode starts only with this much free disk space for the dataset
    # continuous recording (`record --continuous`, `policy start --continuous`; LeRobot's sentry):
    # a new episode every rotate_s seconds, or once the episode's video holds about rotate_mb MB
    # (LeRobot's estimate; 200 is its DEFAULT_VIDEO_FILE_SIZE_IN_MB), whichever comes first; 0: off
    rotate_s: float = 0.0
    rotate_mb: float = 200.0
    # the pre-roll buffer (`so101d episode keep --last S`): between episodes the last ring_s seconds
    # of frames (joints and camera images) are kept in memory, at most ring_max_mb MiB of images
    # (frames x cameras x W*H*3, +W*H*2 per depth stream: checked at load); 0: off
    ring_s: float = 0.0
    ring_max_mb: float = DEFAULT_RING_MAX_MB
    depth_encoder: DepthEncoderSettings = field(default_factory=DepthEncoderSettings)


@dataclass
class CameraConfig:
    """One [cameras.<name>] table. Real cameras open through LeRobot's camera classes; the keys
    after ``fps`` are those classes' options, under their names (lerobot/cameras/*/configuration_*.py)."""

    kind: Literal["opencv", "intelrealsense", "zmq", "virtual", "sim"] = "opencv"
    device: str = "/dev/video0"  # opencv: LeRobot's index_or_path (a /dev/v4l/by-id path survives a replug)
    width: int = 640
    height: int = 480
    fps: int = 30
    # What the camera negotiates (size, rate, FOURCC) is checked at open: "refuse" stops recording
    # naming both values; "warn" records at the rate/format the camera gives and tags the episode
    # (a different size always refuses: the dataset's image shape is the configured one)
    on_mismatch: Literal["refuse", "warn"] = "refuse"
    fourcc: str = ""  # opencv: "MJPG", "YUYV", ...; "" keeps the camera's default
    backend: Literal["any", "v4l2"] = "any"  # opencv: OpenCV's capture backend
    rotation: Literal[0, 90, 180, -90] = 0  # opencv, intelrealsense: degrees clockwise
    color_mode: Literal["rgb", "bgr"] = "rgb"
    warmup_s: int = 1  # seconds LeRobot reads before the camera counts as open
    serial_number_or_name: str = ""  # intelrealsense: which camera
    use_depth: bool = False  # intelrealsense: record the depth stream too, as <name>_depth (docs/cameras.md)
    server_address: str = ""  # zmq: the image server's host
    port: int = 5555  # zmq
    camera_name: str = "zmq_camera"  # zmq: the camera's name on that server
    timeout_ms: int = 5000  # zmq: a read waits at most this long


@dataclass
class LeisaacRemoteLeaderConfig:
    enabled: bool = False  # publish the leader in LeIsaac's 24-byte remote-leader format
    bind: str = "tcp://127.0.0.1:5556"


@dataclass
class PolicyConfig:
    enabled: bool = False  # load `path` when the daemon starts (then `so101d policy start`)
    path: str = ""  # checkpoint directory (safetensors)
    device: str = "cpu"
    task: str = ""  # language instruction for VLA policies; also the evaluation episodes' task
    action_fps: float = 30.0  # rate of the policy's actions (the training dataset's fps)
    merge: Literal["latest", "average"] = "latest"  # overlapping chunks: newest wins, or temporal ensembling
    ensemble_coeff: float = 0.01  # merge = "average": weight exp(-coeff * i), i = 0 the oldest chunk
    refill_below: int = (
        10  # floor: also ask when this few usable actions remain (main rule: usable horizon vs measured latency)
    )
    max_obs_age_s: float = 1.0  # actions computed from an older observation are dropped
    record: bool = True  # with [recording] enabled, `policy start` records an evaluation episode
    # `policy correct` ... `resume` with recording: "in_episode" keeps the operator's correction in
    # the evaluation episode (its frames `intervention` = true); "episodes" records only the
    # corrections, each its own episode (LeRobot's DAgger default, record_autonomous = false)
    corrections: Literal["in_episode", "episodes"] = "in_episode"
    # local worker: threads for the forward pass; 0 = every core but one (left to the control
    # loop). Every core: its OpenMP threads then wait passively (policy/worker.py torch_threads)
    torch_threads: int = 0
    # Where the forward pass runs: "local" (a worker process here) or "lerobot-server" (LeRobot's
    # async policy server at `server`; `path` is then the checkpoint path or hub id ON the server)
    backend: Literal["local", "lerobot-server"] = "local"
    server: str = ""  # lerobot-server: HOST:PORT of `python -m lerobot.async_inference.policy_server`
    server_policy_type: str = "act"  # lerobot-server: the policy type the server loads (act, smolvla, pi0, ...)
    actions_per_chunk: int = 50  # lerobot-server: actions the server returns per observation
    # Folders `policy.load PATH` may load from (besides `path` above and folders the daemon's own
    # user owns): anything else is answered "not allowed" before the folder is looked into.
    allowed_dirs: list[str] = field(default_factory=list)


@dataclass
class ServiceConfig:
    watchdog: bool = True  # pet systemd's watchdog from the loop's own health (when WATCHDOG_USEC is set)
    lock_memory: bool = False  # mlockall at start (avoids page-fault stalls in the loop)


@dataclass
class DisplayConfig:
    # "HOST:PORT" of a Rerun viewer (its gRPC port, 9876 by default): the daemon starts
    # `so101d rerun` beside it, a client of the control socket in its own process. Empty: off.
    rerun: str = ""


# A USB foot pedal (LeRobot's DAgger pedal, lerobot/rollout/configs.py DAggerPedalConfig: its
# device path and key codes are the defaults here); read by the daemon through python-evdev.
LEROBOT_PEDAL_DEVICE = "/dev/input/by-id/usb-PCsensor_FootSwitch-event-kbd"


@dataclass
class PedalConfig:
    # the pedal's input device (an evdev /dev/input/... path; by-id survives a replug); empty: no
    # pedal. LeRobot's default: /dev/input/by-id/usb-PCsensor_FootSwitch-event-kbd
    device: str = ""
    # evdev key codes, each mapped to what it does (docs/operator-guide.md#a-foot-pedal); "" unbinds
    pause_resume: str = "KEY_A"  # teleop: hold / teleop again; a policy run: correct / resume
    correction: str = "KEY_B"  # a policy run: correct (the operator takes the arm) / resume
    save: str = "KEY_C"  # end the episode and keep it (LeRobot's third pedal uploads; so101d saves)
    keep: str = ""  # keep the last [recording] ring_s seconds as an episode (LeRobot's highlight save)

    def bindings(self) -> dict[str, str]:
        """action -> key code ("" where unbound)."""
        return {"pause_resume": self.pause_resume, "correction": self.correction, "save": self.save, "keep": self.keep}


@dataclass
class ConsoleSettings:
    # Host names `so101d console` answers to besides its bind address and localhost (a page under
    # any other name is refused: DNS rebinding), e.g. ["so101-bench.lan"]
    allowed_hosts: list[str] = field(default_factory=list)


@dataclass
class Config:
    leader: LeaderConfig = field(default_factory=LeaderConfig)
    follower: FollowerConfig = field(default_factory=FollowerConfig)
    arms: dict[str, ArmPairConfig] = field(default_factory=dict)  # bimanual: [arms.left], [arms.right]
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    socket: SocketConfig = field(default_factory=SocketConfig)
    recording: RecordingConfig = field(default_factory=RecordingConfig)
    cameras: dict[str, CameraConfig] = field(default_factory=dict)
    leisaac_remote_leader: LeisaacRemoteLeaderConfig = field(default_factory=LeisaacRemoteLeaderConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    display: DisplayConfig = field(default_factory=DisplayConfig)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    pedal: PedalConfig = field(default_factory=PedalConfig)

    def calibration_root(self) -> Path | None:
        return Path(self.calibration.root).expanduser() if self.calibration.root else None

    @property
    def bimanual(self) -> bool:
        """Two pairs ([arms.left] and [arms.right]) instead of one ([leader] and [follower] ports)."""
        return bool(self.arms)


# -------------------------------------------------------------------------------------------------
# semantic checks beyond types: (dotted key, predicate, what it must be)
# -------------------------------------------------------------------------------------------------
_POSITIVE = "must be > 0"
_CHECKS: list[tuple[str, typing.Callable[[Any], bool], str]] = [
    ("leader.baudrate", lambda v: v > 0, _POSITIVE),
    ("follower.baudrate", lambda v: v > 0, _POSITIVE),
    ("follower.gripper_max_torque_limit", lambda v: 0 <= v <= 1000, "must be 0..1000"),
    ("follower.gripper_protection_current", lambda v: 0 <= v <= 2047, "must be 0..2047"),
    ("follower.gripper_overload_torque", lambda v: 0 <= v <= 100, "must be 0..100"),
    ("follower.stale_timeout_s", lambda v: v > 0, _POSITIVE),
    ("control.rate_hz", lambda v: 0 < v <= 1000, "must be in (0, 1000]"),
    ("control.health_period_s", lambda v: v > 0, _POSITIVE),
    ("control.reconnect_backoff_min_s", lambda v: v > 0, _POSITIVE),
    ("control.reconnect_backoff_max_s", lambda v: v > 0, _POSITIVE),
    ("control.realtime_priority", lambda v: 0 <= v <= 99, "must be 0 (off) or 1..99"),
    ("policy.torch_threads", lambda v: 0 <= v <= 1024, "must be 0 (every core but one) or a thread count"),
    ("safety.align_speed_deg_s", lambda v: 0 < v <= 360, "must be in (0, 360]"),
    ("safety.align_gripper_speed_pct_s", lambda v: 0 < v <= 1000, "must be in (0, 1000]"),
    ("safety.align_tolerance_deg", lambda v: v > 0, _POSITIVE),
    ("safety.max_step_deg", lambda v: 0 < v <= 90, "must be in (0, 90]"),
    ("safety.max_step_gripper_pct", lambda v: 0 < v <= 100, "must be in (0, 100]"),
    ("safety.leader_stale_s", lambda v: v > 0, _POSITIVE),
    ("safety.fault_bits", lambda v: 0 <= v <= 255, "must be 0..255"),
    ("socket.mode", lambda v: 0 <= v <= 0o777, "must be a file mode 0..0o777"),
    ("socket.max_request_bytes", lambda v: 256 <= v <= 16 * 1024 * 1024, "must be 256..16 MiB"),
    ("recording.fps", lambda v: 0 < v <= 120, "must be 1..120"),
    ("recording.stop_timeout_s", lambda v: 0 < v <= 3600, "must be in (0, 3600]"),
    ("recording.min_free_mb", lambda v: v >= 0, "must be 0 (no check) or more"),
    ("recording.rotate_s", lambda v: 0 <= v <= 86400, "must be 0 (off) or up to 86400 s"),
    ("recording.rotate_mb", lambda v: 0 <= v <= 100_000, "must be 0 (off) or up to 100000 MB"),
    ("recording.ring_s", lambda v: 0 <= v <= RING_S_MAX, f"must be 0 (off) or up to {RING_S_MAX:g} s"),
    ("recording.ring_max_mb", lambda v: 0 < v <= 1024 * 1024, "must be in (0, 1048576] MiB"),
]
# The webcam formats V4L2 names in capitals; a lower-case spelling of one of these is that one
# (a FOURCC is case-sensitive, and lower-case codes of other formats exist, so only these).
_UPPERCASE_FOURCCS = frozenset({"MJPG", "YUYV", "UYVY", "H264", "HEVC", "NV12", "GREY", "RGB3", "BGR3", "YU12"})
_CAMERA_CHECKS: list[tuple[str, typing.Callable[[Any], bool], str]] = [
    ("width", lambda v: 0 < v <= 8192, "must be 1..8192"),
    ("height", lambda v: 0 < v <= 8192, "must be 1..8192"),
    ("fps", lambda v: 0 < v <= 240, "must be 1..240"),
    ("fourcc", lambda v: v == "" or (len(v) == 4 and v.isascii()), 'must be "" or 4 characters (MJPG, YUYV)'),
    ("warmup_s", lambda v: 0 <= v <= 60, "must be 0..60"),
    ("port", lambda v: 0 < v <= 65535, "must be 1..65535"),
    ("timeout_ms", lambda v: v > 0, _POSITIVE),
]


# -------------------------------------------------------------------------------------------------
# loading
# -------------------------------------------------------------------------------------------------
def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against annotation ``tp``; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(repr(c) for c in choices)}")
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            if arm is type(None):
                continue
            try:
                return _coerce(key, value, arm)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {_describe(value)}")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {_describe(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_describe(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list ([...]), got {_describe(value)}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(key, value, tp)
    raise ConfigError(f"{key}: unsupported type {tp!r}")  # a bug in a dataclass, not in the file


def _build(prefix: str, data: Any, cls: type) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a table ([{prefix}]), got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"{prefix}.{key}: unknown key (known keys of [{prefix}]: {known})")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        tp = hints[name]
        key = f"{prefix}.{name}"
        if typing.get_origin(tp) is dict:
            _, val_tp = typing.get_args(tp)
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: expected a table of tables ([{key}.<name>])")
            kwargs[name] = {k: _coerce(f"{key}.{k}", v, val_tp) for k, v in value.items()}
        else:
            kwargs[name] = _coerce(key, value, tp)
    obj = cls(**kwargs)
    obj.__dict__["_keys_given"] = frozenset(data)  # see keys_given(): defaults vs values the file set
    return obj


def keys_given(section: Any) -> frozenset[str] | None:
    """The keys a configuration table set explicitly (None: built in Python, not from a file/dict).

    A sim camera takes its size from the simulator unless width/height were given."""
    return section.__dict__.get("_keys_given")


def parse_host_port(text: str, *, min_port: int = 1) -> tuple[str, int]:
    """ "HOST:PORT" (IPv6 as "[::1]:9876") -> (host, port min_port..65535); ValueError with the reason.

    One parser for every address an operator types (a Rerun viewer, LeRobot's policy server, the
    console's --bind, where port 0 means "any free port"); callers prefix the key or flag."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or any(c.isspace() or c in "/[]" for c in host):
        raise ValueError(f"{text!r} must be HOST:PORT (e.g. 127.0.0.1:9876)")
    if not port.isdigit() or not min_port <= int(port) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number {min_port}..65535")
    return host, int(port)


def _camera_device(cam: CameraConfig) -> str:
    """What a camera opens, the same text for the same device ("" for virtual, sim and ZMQ ones): a
    by-id link and the /dev/videoN it points at, an OpenCV index N and /dev/videoN (V4L2's)."""
    if cam.kind == "opencv" and str(cam.device) != "virtual":
        dev = f"/dev/video{cam.device}" if str(cam.device).isdigit() else str(cam.device)
        return os.path.realpath(dev)
    if cam.kind == "intelrealsense" and cam.serial_number_or_name:
        return f"realsense {cam.serial_number_or_name}"
    return ""  # virtual and sim cameras draw their own; a ZMQ image server serves many readers


def _one_camera_per_device(cameras: dict[str, CameraConfig]) -> None:
    """Two tables on one device never both stream (a V4L2 node's second open is busy, a pipe's two
    readers split its frames): said at load, naming both, not as two cameras forever opening."""
    seen: dict[str, str] = {}
    for name in sorted(cameras):
        dev = _camera_device(cameras[name])
        if dev and dev in seen:
            raise ConfigError(
                f"cameras.{name}: camera {seen[dev]!r} opens the same device ({dev}); one camera per device"
            )
        if dev:
            seen[dev] = name


def _check_ring_bound(cfg: Config) -> None:
    """The pre-roll buffer's memory bound against ring_max_mb: every configured camera at its
    configured size (a sim camera that leaves its size to the simulator counts at the defaults;
    the recorder checks again once the simulator announced it)."""
    rc = cfg.recording
    if rc.ring_s <= 0:
        return
    streams = [StreamSize(c.width, c.height, c.use_depth) for _, c in sorted(cfg.cameras.items())]
    why = bound_refusal(rc.ring_s, rc.fps, streams, rc.ring_max_mb)
    if why:
        raise ConfigError(why)


def validate(cfg: Config) -> Config:
    """Range checks that types cannot express; raises ConfigError naming the key."""
    for key, ok, what in _CHECKS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if not ok(value):
            raise ConfigError(f"{key}: {value!r} {what}")
    for cam_name, cam in cfg.cameras.items():
        if not cam_name.isidentifier():
            raise ConfigError(f"cameras.{cam_name}: camera names must be identifiers (letters, digits, _)")
        for name, ok, what in _CAMERA_CHECKS:
            value = getattr(cam, name)
            if not ok(value):
                raise ConfigError(f"cameras.{cam_name}.{name}: {value!r} {what}")
        if cam.use_depth and cam.kind != "intelrealsense":
            raise ConfigError(
                f"cameras.{cam_name}.use_depth: only kind = 'intelrealsense' has a depth stream (this one is {cam.kind!r})"
            )
        base = cfg.cameras.get(cam_name.removesuffix("_depth"))
        if cam_name.endswith("_depth") and base is not None and base.use_depth:
            raise ConfigError(
                f"cameras.{cam_name}: the name is taken by camera {cam_name.removesuffix('_depth')!r}'s depth stream"
            )
        if cam.fourcc.upper() in _UPPERCASE_FOURCCS:
            cam.fourcc = cam.fourcc.upper()  # "mjpg" means MJPG: V4L2 would take it as another, unknown code
    _one_camera_per_device(cfg.cameras)
    _check_ring_bound(cfg)
    de = cfg.recording.depth_encoder
    if de.depth_min is not None and de.depth_max is not None and de.depth_min >= de.depth_max:
        raise ConfigError(
            f"recording.depth_encoder.depth_min: {de.depth_min!r} must be below depth_max ({de.depth_max!r})"
        )
    if cfg.control.reconnect_backoff_max_s < cfg.control.reconnect_backoff_min_s:
        raise ConfigError("control.reconnect_backoff_max_s: must be >= control.reconnect_backoff_min_s")
    if cfg.arms:
        _validate_arms(cfg)
    elif cfg.follower.kind == "feetech":
        _check_distinct_ports("leader.port", cfg.leader.port, "follower.port", cfg.follower.port)
    for name in ("leader", "follower"):
        arm_id = getattr(cfg, name).id
        if not arm_id or "/" in arm_id:
            raise ConfigError(f"{name}.id: {arm_id!r} must be a non-empty name without '/'")
    addresses = (
        ("display.rerun", cfg.display.rerun, "a Rerun viewer's address; empty: off"),
        ("policy.server", cfg.policy.server, "LeRobot's policy server"),
    )
    for key, address, what in addresses:
        if address:
            try:
                parse_host_port(address)
            except ValueError as exc:
                raise ConfigError(f"{key}: {exc} ({what})") from None
    _validate_pedal(cfg.pedal)
    if cfg.pedal.device and cfg.pedal.keep and not (cfg.recording.enabled and cfg.recording.ring_s > 0):
        raise ConfigError(
            f"pedal.keep: {cfg.pedal.keep} keeps the last seconds, but nothing is buffered: "
            'set [recording] enabled = true and ring_s > 0, or keep = ""'
        )
    return cfg


def _validate_pedal(pedal: PedalConfig) -> None:
    """Key codes are evdev names (KEY_..., BTN_...), and one code does one thing."""
    bound: dict[str, str] = {}
    for action, code in pedal.bindings().items():
        if code == "":
            continue
        if not (code.startswith(("KEY_", "BTN_")) and code[4:].replace("_", "").isalnum() and code.isupper()):
            raise ConfigError(f'pedal.{action}: {code!r} must be an evdev key code such as "KEY_A" (or "" for none)')
        if code in bound:
            raise ConfigError(f"pedal.{action}: {code} is already pedal.{bound[code]}")
        bound[code] = action


def _validate_arms(cfg: Config) -> None:
    """A bimanual configuration: both pairs, each with both ports, four different serial ports,
    an own calibration id per arm; refusals name the key. With ``follower.kind = "sim"`` the
    followers are the two arms of one simulated scene at ``follower.endpoint`` (addressed by side,
    ``drivers.sim_protocol``): the pairs name their leader ports only."""
    unknown = sorted(set(cfg.arms) - set(ARM_SIDES))
    if unknown:
        raise ConfigError(f"arms.{unknown[0]}: unknown pair; a bimanual configuration has [arms.left] and [arms.right]")
    for side in ARM_SIDES:
        if side not in cfg.arms:
            other = next(s for s in ARM_SIDES if s != side)
            raise ConfigError(
                f"arms.{side}: missing: a bimanual configuration names both pairs ([arms.{other}] is given, "
                f"[arms.{side}] is not)"
            )
    for section in ("leader", "follower"):
        if "port" in (keys_given(getattr(cfg, section)) or ()):
            raise ConfigError(
                f"{section}.port: a bimanual configuration names its ports in [arms.left] and [arms.right] "
                f"(leader_port, follower_port); remove {section}.port"
            )
    ports: list[tuple[str, str]] = []
    ids: dict[str, list[tuple[str, str]]] = {"leader": [], "follower": []}
    sim = cfg.follower.kind == "sim"
    for side in ARM_SIDES:
        pair = cfg.arms[side]
        if sim and pair.follower_port:
            raise ConfigError(
                f"arms.{side}.follower_port: {pair.follower_port!r} with follower.kind = 'sim': a serial follower "
                f"on one side and the simulator on the other is not one task; with 'sim' both followers are the "
                f"two arms of the simulator at follower.endpoint (so101d sim-follower --arms left,right): remove "
                f"follower_port from [arms.left] and [arms.right]"
            )
        for role in ("leader", "follower"):
            key = f"arms.{side}.{role}_port"
            port = getattr(pair, f"{role}_port")
            if not port and not (sim and role == "follower"):
                raise ConfigError(f"{key}: missing: each pair names its leader_port and follower_port")
            if port:
                ports.append((key, port))
            if not getattr(pair, f"{role}_id"):
                # LeRobot's bimanual naming: f"{config.id}_left" (bi_so_leader.py, bi_so_follower.py)
                setattr(pair, f"{role}_id", f"{getattr(cfg, role).id}_{side}")
            arm_id = getattr(pair, f"{role}_id")
            if "/" in arm_id:
                raise ConfigError(f"arms.{side}.{role}_id: {arm_id!r} must be a name without '/'")
            ids[role].append((f"arms.{side}.{role}_id", arm_id))
    for i, (key_a, a) in enumerate(ports):
        for key_b, b in ports[i + 1 :]:
            _check_distinct_ports(key_a, a, key_b, b)
    for role, ((key_a, a), (key_b, b)) in ids.items():
        if a == b:
            raise ConfigError(
                f"{key_b}: {b!r} is {key_a} too: each {role} has its own calibration file "
                f"(leave both empty for LeRobot's <[{role}] id>_left / _right)"
            )


def _check_distinct_ports(key_a: str, a: str, key_b: str, b: str) -> None:
    """One serial port cannot serve two arms (each side takes an exclusive lock on it: the
    second would retry forever); a udev symlink names the same device as its target, and a bind
    mount or a second device node (a container's ``--device A:B``) is the same device too."""
    same: str | None = None
    if os.path.realpath(a) == os.path.realpath(b):
        same = "" if a == b else f" (both are {os.path.realpath(a)})"
    else:
        same = _same_device(a, b)
    if same is not None:
        raise ConfigError(
            f"{key_a} {a!r} and {key_b} {b!r} name the same serial port{same}: "
            "each arm needs its own (see `so101d find-ports`)"
        )


def _same_device(a: str, b: str) -> str | None:
    """' (both are device 188:0)' where two existing paths are one device, else None (a port
    not plugged in yet is not an error here)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return None
    if stat.S_ISCHR(sa.st_mode) and stat.S_ISCHR(sb.st_mode) and sa.st_rdev == sb.st_rdev:
        return f" (both are device {os.major(sa.st_rdev)}:{os.minor(sa.st_rdev)})"
    if (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino):
        return f" (both are the same file, {os.path.realpath(a)})"
    return None


def config_from_dict(data: dict[str, Any]) -> Config:
    return validate(_build_root(data))


def _build_root(data: dict[str, Any]) -> Config:
    hints = typing.get_type_hints(Config)
    names = {f.name for f in dataclasses.fields(Config)}
    for key in data:
        if key not in names:
            raise ConfigError(f"{key}: unknown section (known sections: {', '.join(sorted(names))})")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        tp = hints[name]
        if typing.get_origin(tp) is dict:
            _, val_tp = typing.get_args(tp)
            if not isinstance(value, dict):
                raise ConfigError(f"{name}: expected tables [{name}.<name>]")
            kwargs[name] = {k: _coerce(f"{name}.{k}", v, val_tp) for k, v in value.items()}
        else:
            kwargs[name] = _coerce(name, value, tp)
    return Config(**kwargs)


def load_config(path: str | Path | None) -> Config:
    """Load and validate a TOML file; ``None`` gives the defaults (leader on /dev/ttyACM0)."""
    if path is None:
        return validate(Config())
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read configuration: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _toml_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def dump_toml(cfg: Config) -> str:
    """Serialise a Config as TOML (used to write the virtual bench's generated configuration)."""
    lines: list[str] = []
    for section, value in config_to_dict(cfg).items():
        if section in ("cameras", "arms"):  # tables of tables: [cameras.<name>], [arms.<side>]
            for name, table in value.items():
                lines.append(f"[{section}.{name}]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items())
                lines.append("")
            continue
        if cfg.arms and section in ("leader", "follower"):
            value = {k: v for k, v in value.items() if k != "port"}  # the pairs name the ports
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in value.items() if not isinstance(v, dict))
        lines.append("")
        for name, table in value.items():  # a table inside the section: [recording.depth_encoder]
            if isinstance(table, dict):
                lines.append(f"[{section}.{name}]")
                # None: not set (TOML has no null); the key is left out, which reads back as None
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None)
                lines.append("")
    return "\n".join(lines)


__all__ = [
    "ARM_SIDES",
    "JOINT_NAMES",
    "ArmPairConfig",
    "CalibrationConfig",
    "CameraConfig",
    "Config",
    "ConfigError",
    "ControlConfig",
    "DisplayConfig",
    "FollowerConfig",
    "LeaderConfig",
    "LeisaacRemoteLeaderConfig",
    "PolicyConfig",
    "RecordingConfig",
    "SafetyConfig",
    "ServiceConfig",
    "SocketConfig",
    "config_from_dict",
    "default_socket_path",
    "dump_toml",
    "load_config",
    "parse_host_port",
    "validate",
]
