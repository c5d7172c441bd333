"""The control API's messages, declared once: every verb's request and reply, every section of
``status``, the error reply and the API version.

These declarations are the contract. The socket checks each request against its verb's request
type before a handler sees it (daemon/api/requests.py); the JSON schema and the Markdown reference
in docs/reference/ are generated from them (daemon/api/reference.py); the CLI, the console and the
Rerun streamer decode replies into the reply types (``decode_reply``) instead of reading string
keys of their own.

Versioning: ``API_VERSION`` is ``MAJOR.MINOR``. Every reply carries it as ``api_version``. A new
field (a reply or status field, an optional request field) raises MINOR: an older client decodes a
newer reply, ignoring what it does not know, and a reply field it knows but the daemon does not
send yet takes its default. Renaming or removing a field, or changing its type, raises MAJOR; the
client refuses to talk across majors and says which side is older (daemon/api/client.py).

Reply and status fields all have defaults so that an older daemon's (or a failed section's)
reply still decodes: a client renders "-" for a value not given rather than guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Final, cast

import msgspec

API_VERSION: Final = "1.5"
TEXT_MAX_CHARS: Final = 4096  # any text field (a path, a task, a camera name)
TASK_MAX_CHARS: Final = 500
MAX_FRAME_SEQ: Final = 2**53  # a frame counter: any real one is far below JSON's exact-integer limit
PREVIEW_MAX_SIDE_PX: Final = 1920  # a preview larger than this is a recording, not a preview
_NO_NUL = r"^[^\x00]*$"  # no path, name or task holds one (and os calls raise on it)


def _text(max_chars: int = TEXT_MAX_CHARS, doc: str = "") -> Any:
    return msgspec.Meta(max_length=max_chars, pattern=_NO_NUL, description=doc or None)


def api_major(version: str) -> int | None:
    """The major part of an ``api_version`` (None: not a version this client can read)."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


# ==================================================================== requests
class RequestBase(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="cmd"):
    """A request: ``{"cmd": VERB, FIELD: value, ...}``; every field is optional on the socket
    (null or absent: the handler's default)."""


class NoFields(RequestBase):
    """A verb that takes no fields."""


class CameraPreviewRequest(RequestBase, tag="camera.preview"):
    camera: Annotated[str, _text(200, "the camera's name (camera.list)")] | None = None
    max_width: Annotated[int, msgspec.Meta(ge=16, le=PREVIEW_MAX_SIDE_PX, description="pixels")] | None = None
    max_height: Annotated[int, msgspec.Meta(ge=16, le=PREVIEW_MAX_SIDE_PX, description="pixels")] | None = None
    quality: Annotated[int, msgspec.Meta(ge=10, le=95, description="JPEG quality")] | None = None
    after_seq: (
        Annotated[
            int,
            msgspec.Meta(
                ge=0,
                le=MAX_FRAME_SEQ,
                description="answer `unchanged` until a frame newer than this",
                extra={"what": "a frame number or null"},
            ),
        ]
        | None
    ) = None


ROTATE_S_MAX: Final = 86400.0
ROTATE_MB_MAX: Final = 100_000.0


class EpisodeStartRequest(RequestBase, tag="episode.start"):
    task: Annotated[str, _text(TASK_MAX_CHARS, "the task's words (LeRobot's task)")] | None = None
    origin: Annotated[str, _text(64, "who drives the episode: teleop, policy, ...")] | None = None
    continuous: bool | None = None  # record until save/discard, a new episode at each rotation
    rotate_s: (
        Annotated[float, msgspec.Meta(gt=0, le=ROTATE_S_MAX, description="continuous: seconds per episode")] | None
    ) = None
    rotate_mb: (
        Annotated[float, msgspec.Meta(gt=0, le=ROTATE_MB_MAX, description="continuous: video MB per episode")] | None
    ) = None


class EpisodeSaveRequest(RequestBase, tag="episode.save"):
    success: bool | None = None


KEEP_S_MAX: Final = 600.0  # [recording] ring_s's top (daemon/config/ring_bound.py RING_S_MAX)


class EpisodeKeepRequest(RequestBase, tag="episode.keep"):
    last_s: (
        Annotated[
            float,
            msgspec.Meta(le=KEEP_S_MAX, description="seconds before now to keep, above 0, at most [recording] ring_s"),
        ]
        | None
    ) = None
    task: Annotated[str, _text(TASK_MAX_CHARS, "the task's words (LeRobot's task)")] | None = None


class PolicyLoadRequest(RequestBase, tag="policy.load"):
    path: Annotated[str, _text(doc="checkpoint folder or Hub id (default: [policy] path)")] | None = None
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=600, description="wait this long for the load")] | None = None


class PolicyStartRequest(RequestBase, tag="policy.start"):
    task: Annotated[str, _text(TASK_MAX_CHARS)] | None = None
    record: bool | None = None
    continuous: bool | None = None  # the evaluation recording rotates episodes (as episode.start's)
    rotate_s: (
        Annotated[float, msgspec.Meta(gt=0, le=ROTATE_S_MAX, description="continuous: seconds per episode")] | None
    ) = None
    rotate_mb: (
        Annotated[float, msgspec.Meta(gt=0, le=ROTATE_MB_MAX, description="continuous: video MB per episode")] | None
    ) = None


class PolicyStopRequest(RequestBase, tag="policy.stop"):
    success: bool | None = None
    discard: bool | None = None


class ReplayStartRequest(RequestBase, tag="replay.start"):
    dataset: Annotated[str, _text(doc="the dataset's folder (absolute path, on the daemon's machine)")] | None = None
    episode: Annotated[int, msgspec.Meta(ge=0, le=MAX_FRAME_SEQ, description="episode index")] | None = None
    speed: Annotated[float, msgspec.Meta(ge=0.01, le=1, description="fraction of the episode's fps")] | None = None
    record: bool | None = None
    ticket: Annotated[str, _text(64, "the client's name for this start: a replay.stop with it cancels it")] | None = (
        None
    )


class ReplayStopRequest(RequestBase, tag="replay.stop"):
    ticket: Annotated[str, _text(64, "stop the replay.start with this ticket, even one not yet arrived")] | None = None


class ArmAcquireRequest(RequestBase, tag="arm.acquire"):
    arm: Annotated[str, _text(64, "which arm (default: follower)")] | None = None
    client: Annotated[str, _text(200, "who asks, in words (shown to a client refused)")] | None = None
    pid: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1,
                le=2**31,
                description="the client's process id (the socket's peer, by the kernel's word, is taken instead)",
            ),
        ]
        | None
    ) = None


class ArmLeaseRequest(RequestBase, tag="arm.release"):
    lease: Annotated[str, _text(64, "the lease arm.acquire gave")] | None = None


_JOINT_VALUE = msgspec.Meta(ge=-1e6, le=1e6, description="degrees (the gripper 0..100)")


class ArmActionRequest(RequestBase, tag="arm.action"):
    """A joint target for the acquired arm, LeRobot's units (so101_follower's ``<joint>.pos``)."""

    lease: Annotated[str, _text(64, "the lease arm.acquire gave")] | None = None
    shoulder_pan: Annotated[float, _JOINT_VALUE] | None = None
    shoulder_lift: Annotated[float, _JOINT_VALUE] | None = None
    elbow_flex: Annotated[float, _JOINT_VALUE] | None = None
    wrist_flex: Annotated[float, _JOINT_VALUE] | None = None
    wrist_roll: Annotated[float, _JOINT_VALUE] | None = None
    gripper: Annotated[float, _JOINT_VALUE] | None = None


class LeaderAcquireRequest(RequestBase, tag="leader.acquire"):
    arm: Annotated[str, _text(64, "the arm whose own leader to drive (default: the primary arm's)")] | None = None
    client: Annotated[str, _text(200, "who asks, in words (shown to a client refused)")] | None = None
    pid: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1,
                le=2**31,
                description="the client's process id (the socket's peer, by the kernel's word, is taken instead)",
            ),
        ]
        | None
    ) = None


class LeaderReleaseRequest(RequestBase, tag="leader.release"):
    lease: Annotated[str, _text(64, "the lease leader.acquire gave")] | None = None


class LeaderGoalRequest(RequestBase, tag="leader.goal"):
    """A goal for the acquired leader, LeRobot's units; a joint left out keeps its goal."""

    lease: Annotated[str, _text(64, "the lease leader.acquire gave")] | None = None
    shoulder_pan: Annotated[float, _JOINT_VALUE] | None = None
    shoulder_lift: Annotated[float, _JOINT_VALUE] | None = None
    elbow_flex: Annotated[float, _JOINT_VALUE] | None = None
    wrist_flex: Annotated[float, _JOINT_VALUE] | None = None
    wrist_roll: Annotated[float, _JOINT_VALUE] | None = None
    gripper: Annotated[float, _JOINT_VALUE] | None = None


class CameraShareRequest(RequestBase, tag="camera.share"):
    camera: Annotated[str, _text(200, "the camera's name (camera.list)")] | None = None


class ArmObserveRequest(RequestBase, tag="arm.observe"):
    arm: Annotated[str, _text(64, "which arm (default: follower)")] | None = None


# ==================================================================== replies
class Reply(msgspec.Struct, kw_only=True):
    """Every ok reply: ``ok`` and ``api_version`` come first, the verb's fields after."""

    ok: bool = True
    api_version: str = API_VERSION


class ErrorReply(msgspec.Struct, kw_only=True):
    """Every refused or failed request."""

    ok: bool = False
    error: str = ""
    field: str | None = None  # the request field at fault (e.g. "task"), when one is
    api_version: str = API_VERSION


class Empty(Reply):
    pass


class Pong(Reply):
    pong: bool = True


class VersionReply(Reply):
    daemon_version: str = ""


class HelpReply(Reply):
    verbs: list[str] = msgspec.field(default_factory=list)


class MessageReply(Reply):
    """A verb that changes the loop's mode: what came of it."""

    message: str = ""
    mode: str | None = None


# -------------------------------------------------------------- status sections
class BusCounters(msgspec.Struct, kw_only=True):
    """A Feetech bus's counters since the daemon started."""

    transactions: int = 0
    retries: int = 0
    failures: int = 0
    reconnects: int = 0


class LinkStatus(msgspec.Struct, kw_only=True):
    """One arm's connection."""

    connected: bool = False
    port: str | None = None
    since_s: float | None = None
    connects: int = 0
    losses: int = 0
    last_error: str = ""
    configure_warnings: list[str] = msgspec.field(default_factory=list)
    bus: BusCounters | None = None  # None: the arm keeps no bus counters (a simulator)
    missing_servos: list[str] = msgspec.field(default_factory=list)  # joints silent at the last attempt
    next_try_in_s: float | None = None  # while reconnecting: seconds to the next full attempt
    waiting: str = ""  # while not connected: what is missing, on which port, when the next try is


class StageTiming(msgspec.Struct, kw_only=True):
    """One stage's times, ms: percentiles over the recent window, max since start."""

    count: int = 0
    window: int = 0
    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    max_all_time: float | None = None
    mean: float | None = None


class SafetyStatus(msgspec.Struct, kw_only=True):
    align_speed_deg_s: float | None = None
    max_step_deg: float | None = None
    leader_stale_s: float | None = None
    on_fault: str | None = None
    fault_latched: str = ""  # stays until the operator clears it
    fault_now: str = ""  # what the servos report right now
    limited_cycles: int = 0
    limit_hits: dict[str, int] = msgspec.field(default_factory=dict)


class JointsStatus(msgspec.Struct, kw_only=True):
    """Joint name -> degrees (the gripper 0..100), None where not read yet."""

    leader: dict[str, float] | None = None
    follower: dict[str, float] | None = None
    command: dict[str, float] | None = None


class ServoStatus(msgspec.Struct, kw_only=True):
    temperature_c: float | None = None
    voltage_v: float | None = None
    load_pct: float | None = None
    current_ma: float | None = None
    status: int | None = None  # the servo's status bits
    torque: bool | None = None


class ArmStatus(msgspec.Struct, kw_only=True):
    """One driven arm: the source assigned to it, its own safety state, its links and pose."""

    source: str = ""  # the target source driving it ("leader", "policy", ...)
    mode: str = "?"
    reason: str = ""
    kind: str = "?"
    connected: bool = False
    teleop_source: str = ""  # the leader that drives it in teleop ("leader"; "right_leader" ...)
    fault: str = ""  # latched or seen now
    follower: LinkStatus | None = None
    leader: LinkStatus | None = None  # its teleop leader's link
    joints: JointsStatus | None = None
    errors: int = 0
    limited_cycles: int = 0
    servos: dict[str, ServoStatus] | None = None
    missing_servos: list[str] = msgspec.field(default_factory=list)


class SocketHealth(msgspec.Struct, kw_only=True):
    serving: bool = True
    thread_restarts: int = 0
    last_thread_failure: str | None = None
    connections: int = 0
    requests: int = 0
    errors: int = 0


class FramesRefused(msgspec.Struct, kw_only=True):
    count: int = 0
    last: str = ""


class DepthStats(msgspec.Struct, kw_only=True):
    """A RealSense camera's depth stream (``use_depth``), recorded as ``<camera>_depth``."""

    stream: str = ""
    shape: list[int] = msgspec.field(default_factory=list)  # height, width, 1
    unit: str = "mm"
    frames: int = 0  # depth maps published with a colour frame
    refused: int = 0  # colour frames dropped because their depth map was missing or of another shape


class CameraStats(msgspec.Struct, kw_only=True):
    """A camera's capture counters (only ``error`` where they could not be read)."""

    name: str = ""
    width: int | None = None
    height: int | None = None
    fps_configured: float | None = None
    frames: int = 0
    fps_measured: float | None = None
    read_failures: int = 0
    stalled: bool = False
    stall_events: int = 0
    last_frame_age_s: float | None = None
    error: str = ""
    # a real camera (LeRobot's classes): what it negotiated and delivers
    kind: str | None = None
    device: str | None = None
    state: str | None = None  # opening, verifying, streaming, refused, gone
    format: str = ""
    fourcc: str = ""
    fps_negotiated: float | None = None
    fps_verified: float | None = None  # measured over its first second
    fps_recent: float | None = None
    frames_dropped: int = 0
    gone_events: int = 0
    gone_for_s: float | None = None
    problems: list[str] = msgspec.field(default_factory=list)
    depth: DepthStats | None = None  # a RealSense with use_depth: its depth stream


class StagedTag(msgspec.Struct, kw_only=True):
    """The tag the writer staged with an episode (daemon/data/schema.py ``EpisodeTag``)."""

    episode_index: int | None = None
    episode_number: int | None = None
    success: bool | None = None
    origin: str | None = None
    follower_kind: str | None = None
    bench: str | None = None
    source: dict[str, Any] = msgspec.field(default_factory=dict)
    frames: int | None = None
    late_frames: int | None = None
    missing_frames: int | None = None
    worst_camera_skew_ms: float | None = None
    notes: list[str] = msgspec.field(default_factory=list)


class LastStaged(msgspec.Struct, kw_only=True):
    """The last episode the writer staged (empty before the first)."""

    episode_seq: int | None = None
    frames: int | None = None
    tag: StagedTag | None = None


class LastSaved(msgspec.Struct, kw_only=True):
    """The last episode committed to the dataset (empty before the first)."""

    episode: int | None = None
    episode_index: int | None = None
    frames: int | None = None
    commit_s: float | None = None


class ContinuousStatus(msgspec.Struct, kw_only=True):
    """A continuous recording in progress (``record --continuous``, LeRobot's sentry strategy)."""

    rotate_s: float | None = None
    rotate_mb: float | None = None
    frames_per_episode: int | None = None
    limit: str | None = None  # rotate_s | rotate_mb: the one that cuts
    first_episode: int | None = None  # names the session
    part: int | None = None  # the episode recording now is the session's part-th (0: first)
    rotated: int = 0  # episodes cut and saved so far


class PrerollStatus(msgspec.Struct, kw_only=True):
    """The pre-roll buffer (``[recording] ring_s``): what ``episode keep`` can take now."""

    ring_s: float | None = None
    max_frames: int | None = None  # ceil(ring_s * fps)
    frames: int = 0  # buffered now
    buffered_s: float | None = None
    bound_mb: float | None = None  # MiB of camera frames it can keep alive at most
    paused: bool = False  # an episode records: nothing is buffered meanwhile
    fed: int = 0  # rows buffered since the recorder opened (grows while frames come)


class KeptStatus(msgspec.Struct, kw_only=True):
    """The episode in progress was kept (``episode keep``): its rows from the buffer."""

    frames: int | None = None  # rows from before the verb
    last_s: float | None = None  # the seconds asked for
    grid_t0_s: float | None = None  # frame 0's monotonic grid time
    flush_left: int = 0  # kept rows the writer has not been handed yet


class RecordingStatus(msgspec.Struct, kw_only=True):
    """The recorder (``episode.status``, and ``status``'s ``recording``). A section whose extra
    failed carries only ``error``."""

    phase: str | None = None  # None: the section failed (see error)
    error: str | None = None
    dataset: str | None = None
    repo_id: str | None = None
    fps: int | None = None
    episode: int | None = None
    task: str | None = None
    origin: str | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    elapsed_s: float | None = None
    frames: int | None = None
    continuous: ContinuousStatus | None = None  # None: no continuous recording
    preroll: PrerollStatus | None = None  # None: [recording] ring_s is 0 (off)
    kept: KeptStatus | None = None  # None: the episode in progress (if any) was started, not kept
    episodes_in_dataset: int | None = None
    saves_pending: int = 0
    lost_episodes: list[str] = msgspec.field(default_factory=list)
    dropped_episodes: list[str] = msgspec.field(default_factory=list)
    saving: list[int] = msgspec.field(default_factory=list)  # answered saved, not on the disk yet
    disk_free_mb: float | None = None
    min_free_mb: float | None = None
    waiting_for: str | None = None
    frames_refused: dict[str, FramesRefused] = msgspec.field(default_factory=dict)
    writer_alive: bool | None = None
    writer_pid: int | None = None
    writer_backlog_frames: int | None = None
    writer_backlog_records: int | None = None
    last_staged: LastStaged = msgspec.field(default_factory=LastStaged)
    last_saved: LastSaved = msgspec.field(default_factory=LastSaved)
    last_committed: str | None = None  # "episode 4 (dataset episode 3)"
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    cameras: list[CameraStats] = msgspec.field(default_factory=list)


class TakeoverStatus(msgspec.Struct, kw_only=True):
    phase: str | None = None
    error: str | None = None
    max_error: float | None = None


class CorrectionStatus(msgspec.Struct, kw_only=True):
    """The operator's correction in progress (``policy correct`` ... ``policy resume``)."""

    number: int = 0  # 1 for the run's first
    phase: str | None = None  # taking_over | operator | failed
    error: str | None = None
    operator_s: float | None = None  # how long the leader has driven in it


class LatencyStats(msgspec.Struct, kw_only=True):
    """p50 / p99 (/ p99.9) / max over a window of ``n``, ms (the section is null before the first)."""

    p50: float | None = None
    p99: float | None = None
    p99_9: float | None = msgspec.field(default=None, name="p99.9")
    max: float | None = None
    n: int | None = None


class WorkerInfo(msgspec.Struct, kw_only=True):
    """The local inference worker, as it reported itself ready (empty until then)."""

    policy_type: str | None = None
    chunk_size: int | None = None
    n_action_steps: int | None = None
    cameras: list[str] = msgspec.field(default_factory=list)
    device: str | None = None
    warmup_s: float | None = None
    pid: int | None = None
    heap: str | None = None  # what was done to the allocator, in words
    io: str | None = None  # how observations and actions are converted, in words
    torch_threads: int | None = None
    omp_wait_policy: str | None = None


class PolicyServerStatus(msgspec.Struct, kw_only=True):
    """The remote backend (LeRobot's policy server): round trip, network and its compute apart."""

    address: str | None = None
    checkpoint: str | None = None
    connected: bool = False
    connects: int = 0
    failures: int = 0
    error: str | None = None
    round_trip_ms: LatencyStats | None = None
    network_ms: LatencyStats | None = None  # SendObservations: an upper bound on network time
    get_actions_ms: LatencyStats | None = None
    decode_ms: LatencyStats | None = None
    server_compute_ms: float | None = None  # LeRobot's server sends none: always null
    server_compute_note: str | None = None


class PolicyGcStatus(msgspec.Struct, kw_only=True):
    daemon_collections: int = 0
    daemon_full_collections: int = 0
    daemon_max_pause_ms: float | None = None
    daemon_frozen_objects: int | None = None
    worker_ms: LatencyStats | None = None
    worker_page_faults: LatencyStats | None = None


class PolicyStatus(msgspec.Struct, kw_only=True):
    """The policy (``policy.status``, and ``status``'s ``policy``); ``state`` "none": no policy."""

    state: str | None = None  # None: the section failed (see error)
    error: str | None = None
    driving: bool = False
    takeover: TakeoverStatus | None = None
    episode_open: bool = False
    correction: CorrectionStatus | None = None  # null: the policy drives (or no run)
    corrections: int = 0  # corrections of this run
    corrections_mode: str | None = None  # [policy] corrections: in_episode | episodes
    checkpoint: str | None = None
    policy_type: str | None = None
    cameras: list[str] = msgspec.field(default_factory=list)
    arms: list[str] = msgspec.field(default_factory=list)  # the arms it drives, in its vector's order
    joints: int | None = None  # the width of its state and action (six per arm)
    worker: WorkerInfo = msgspec.field(default_factory=WorkerInfo)
    merge: str | None = None  # how a new chunk joins the queue
    queue_depth: int | None = None
    usable_horizon_ms: float | None = None
    chunk_horizon_ms: float | None = None
    refill_lead_ms: float | None = None
    warning: str | None = None  # inference slower than a chunk can drive
    chunks_live: int | None = None
    chunk_age_ms: float | None = None
    inference_latency_ms: LatencyStats | None = None
    overhead_ms: LatencyStats | None = None
    stages_ms: dict[str, LatencyStats | None] = msgspec.field(default_factory=dict)  # None: no sample yet
    overhead_stages: list[str] = msgspec.field(default_factory=list)
    gc: PolicyGcStatus | None = None
    requests: int = 0
    results: int = 0
    timeouts: int = 0
    actions_dropped_stale: int = 0
    chunks_rejected: int = 0
    chunks_expired: int = 0
    chunks_discarded: int = 0  # asked for before a correction's resume: dropped, never played
    cameras_not_ready: int = 0
    worker_errors: int = 0
    last_error: str | None = None
    backend: str | None = None
    server: PolicyServerStatus | None = None


class SimStatus(msgspec.Struct, kw_only=True):
    seed_recording_error: str | None = None
    error: str | None = None


class PedalStatus(msgspec.Struct, kw_only=True):
    """The foot pedal ([pedal] device): whether it is there, and what its last press did."""

    device: str = ""
    state: str = "?"  # waiting (not plugged in yet), connected, unplugged, error
    name: str | None = None  # the input device's name (evdev)
    problem: str | None = None  # why it is not connected, and since when
    keys: dict[str, str] = msgspec.field(default_factory=dict)  # action -> evdev key code
    presses: int = 0
    unplugs: int = 0
    last_key: str | None = None
    last_verb: str | None = None  # the verb the last press asked for
    last_reply: str | None = None  # its answer (the refusal, when refused)


class StatusReply(Reply):
    """``status``: the loop, the arms, timing, safety, servos, the socket, and one section per
    attached part (recording, policy, sim), absent when that part is not attached."""

    mode: str = "?"
    intent: str | None = None
    reason: str = ""
    fault: str = ""
    torque_wanted: bool | None = None
    follower_kind: str = "?"
    uptime_s: float | None = None
    rate_hz_target: float | None = None
    rate_hz: float | None = None
    cycles: int = 0
    overruns: int = 0
    missed_cycles: int = 0
    limited_cycles: int = 0
    leader_errors: int = 0
    follower_errors: int = 0
    hook_errors: int = 0
    overlap_io: bool | None = None
    rate_warning: str = ""
    scheduling: str = "?"
    power_cycle_required: str = ""
    safety: SafetyStatus | None = None
    timing_ms: dict[str, StageTiming] = msgspec.field(default_factory=dict)
    leader: LinkStatus | None = None
    follower: LinkStatus | None = None
    arms: dict[str, ArmStatus] = msgspec.field(default_factory=dict)
    worst_calls_ms: dict[str, float] = msgspec.field(default_factory=dict)  # per source and hook: its longest call
    leader_age_s: float | None = None
    joints: JointsStatus = msgspec.field(default_factory=JointsStatus)
    servos: dict[str, ServoStatus] | None = None
    missing_servos: list[str] = msgspec.field(default_factory=list)
    health_age_s: float | None = None
    socket: str | None = None
    config: str | None = None
    reloads: int = 0
    verbs: list[str] = msgspec.field(default_factory=list)
    control_socket: SocketHealth | None = None
    recording: RecordingStatus | None = None
    policy: PolicyStatus | None = None
    sim: SimStatus | None = None
    pedal: PedalStatus | None = None
    cameras: dict[str, CameraStats] = msgspec.field(default_factory=dict)  # the cameras in use, by name


class LiveJoints(msgspec.Struct, kw_only=True, array_like=False):
    """Six values in JOINT_NAMES order (degrees; the gripper 0..100), None where not read yet."""

    leader: list[float] | None = None
    command: list[float] | None = None
    follower: list[float] | None = None


class LiveArm(msgspec.Struct, kw_only=True):
    """One driven arm of a rig with several: its own mode, the source driving it, and its joints
    (the leader's: the leader that drives it in teleop)."""

    mode: str = "?"
    reason: str = ""
    source: str = ""
    driver: str = ""  # teleop, policy, correction, replay, client; "" nobody (held, idle, fault)
    joints: LiveJoints = msgspec.field(default_factory=LiveJoints)


class LiveStatus(Reply):
    """``status.live``: the few fields that change every cycle (a 20 Hz plot reads them).
    ``arms``: each arm's, by name, only when the daemon drives more than one (a single-arm rig's
    reply stays as small as before: ``joints`` is that arm's)."""

    mode: str = "?"
    reason: str = ""
    fault: str = ""
    cycles: int = 0
    driver: str = ""  # who drives (the first arm): teleop, policy, correction, replay, client; "" nobody
    joints: LiveJoints = msgspec.field(default_factory=LiveJoints)
    arms: dict[str, LiveArm] | None = None


class CameraInfo(msgspec.Struct, kw_only=True):
    name: str
    width: int
    height: int
    kind: str
    stats: CameraStats = msgspec.field(default_factory=CameraStats)


class CameraList(Reply):
    cameras: list[CameraInfo] = msgspec.field(default_factory=list)


class CameraPreview(Reply):
    """The newest frame, downscaled and JPEG-encoded (base64). ``unchanged``: no frame newer than
    ``after_seq`` (no image); ``jpeg_b64`` null with ``why``: no frame yet."""

    camera: str = ""
    seq: int | None = None
    width: int | None = None
    height: int | None = None
    age_ms: float | None = None
    capture_monotonic_s: float | None = None  # CLOCK_MONOTONIC, one clock for this machine
    encode_ms: float | None = None
    jpeg_b64: str | None = None
    unchanged: bool = False
    why: str | None = None


class EpisodeOutcome(msgspec.Struct, kw_only=True):
    """What happened to an episode (started, saved, discarded), or ``error`` where it failed."""

    message: str | None = None
    error: str | None = None
    episode: int | None = None  # the operator's number
    episode_index: int | None = None  # where it is in the dataset, once saved
    task: str | None = None
    origin: str | None = None
    frames: int | None = None
    success: bool | None = None
    queued: bool | None = None
    handed_to_writer: bool | None = None
    durable: bool | None = None  # on the disk (false: still saving; status says when)
    discarded_frames: int | None = None
    continuous: ContinuousStatus | None = None  # start: the continuous recording begun
    kept_frames: int | None = None  # keep: rows taken from the buffer (frames 0..kept_frames-1)
    kept_s: float | None = None  # keep: the seconds they span (kept_frames / fps)


class EpisodeReply(EpisodeOutcome, kw_only=True):
    """episode.start / keep / save / discard."""

    ok: bool = True
    api_version: str = API_VERSION


class PolicyReply(Reply):
    """policy.load / start / stop / takeover / correct / resume / unload: what came of it."""

    message: str = ""
    state: str | None = None  # load: loading / ready / error
    error: str | None = None
    cameras: list[str] = msgspec.field(default_factory=list)  # load: the cameras the policy reads
    mode: str | None = None
    phase: str | None = None  # takeover's (and correct's) first phase
    episode: EpisodeOutcome | int | None = None  # the evaluation episode (start: opened; stop: saved)


class EpisodeStatusReply(RecordingStatus, kw_only=True):
    ok: bool = True
    api_version: str = API_VERSION


class PolicyStatusReply(PolicyStatus, kw_only=True):
    ok: bool = True
    api_version: str = API_VERSION


class ReplayJointError(msgspec.Struct, kw_only=True):
    """One joint's error over a replay (degrees; the gripper in % of its range)."""

    joint: str = ""
    p50: float | None = None
    p99: float | None = None
    max: float | None = None


class ReplayReport(msgspec.Struct, kw_only=True):
    """How well the arm followed a replayed episode (daemon/control/tracking_report.py)."""

    outcome: str = ""
    frames: int | None = None
    frames_played: int | None = None
    cycles: int | None = None
    error: list[ReplayJointError] = msgspec.field(default_factory=list)
    lag_ms: float | None = None
    shaped_cycles: int | None = None
    step_limited_cycles: int | None = None
    joint_limited_cycles: int | None = None
    shaped_frames: list[int] = msgspec.field(default_factory=list)
    sim_gap: list[ReplayJointError] = msgspec.field(default_factory=list)
    max_command_step: list[float] = msgspec.field(default_factory=list)
    dropped_cycles: int | None = None


class ReplayReply(Reply):
    """replay.start / stop / status: the replay's phase, its progress and, once ended, its report."""

    message: str = ""
    phase: str | None = None  # idle, aligning, playing, done, stopped
    dataset: str | None = None
    episode: int | None = None
    frame: int | None = None
    frames: int | None = None
    fps: float | None = None
    speed: float | None = None
    kind: str | None = None  # the source episode's kind: real, emulated, sim, generated
    recording: int | None = None  # the operator's number of the episode recording the replay
    report: ReplayReport | None = None


class ArmLeaseReply(Reply):
    """arm.acquire / arm.release: the lease, and the arm's state after the change."""

    message: str = ""
    arm: str = ""
    lease: str | None = None  # acquire: pass it with every arm.action and arm.release
    stale_s: float | None = None  # an action older than this is none: the arm holds
    mode: str | None = None


class ArmActionReply(Reply):
    """What the safety layer commands for the action, from the arm's state at its last cycle
    (the next cycle sends it unless that state changed meanwhile); LeRobot's units."""

    commanded: dict[str, float] | None = None  # None: nothing is commanded (torque off)
    mode: str = "?"
    reason: str = ""
    cycle: int = 0


class ArmObservation(Reply):
    """arm.observe: the measured pose at the newest cycle, and the leader's reading."""

    arm: str = ""
    follower: dict[str, float] | None = None  # None: not read yet (not connected)
    leader: dict[str, float] | None = None  # None: no leader, or not read yet
    leader_age_ms: float | None = None
    follower_age_ms: float | None = None
    command: dict[str, float] | None = None
    mode: str = "?"
    reason: str = ""
    source: str = ""  # who drives the arm now
    holder: str | None = None  # the client holding the arm (arm.acquire), None when free
    cycle: int = 0
    frames: dict[str, int] = msgspec.field(default_factory=dict)  # shared camera -> newest frame's seq in it


class ArmShareReply(Reply):
    """arm.share: where the arms' poses at the newest cycle are, in shared memory
    (daemon/api/pose_share.py): arm.observe's follower and leader without a request."""

    path: str = ""
    arms: list[str] = msgspec.field(default_factory=list)  # the share's arm order
    period_s: float = 0.0  # the loop's period: the record is rewritten every cycle


class LeaderDriveReply(Reply):
    """leader.acquire / leader.goal / leader.release: the leader driven for this client."""

    message: str = ""
    lease: str | None = None  # acquire: pass it with every leader.goal and leader.release
    phase: str = ""  # holding, moving (toward the goal, at the take-over's speed), released, failed
    goal: dict[str, float] | None = None  # the goal it drives toward (within the calibrated range)
    command: dict[str, float] | None = None  # the goal written last (on the way there)
    leader: dict[str, float] | None = None  # the leader's newest reading


class CameraShareReply(Reply):
    """camera.share: where the camera's newest frames are, in shared memory (drivers/frame_shm.py)."""

    camera: str = ""
    path: str = ""
    width: int = 0
    height: int = 0
    slots: int = 0


# ==================================================================== the verbs
@dataclass(frozen=True)
class VerbSpec:
    """One verb: what it takes, what it answers, what it does (for the reference)."""

    verb: str
    request: type[RequestBase]
    reply: type[msgspec.Struct]
    doc: str


def _no_fields(verb: str) -> type[RequestBase]:
    """A request type for a verb without fields (each its own tag: the schema names the verb)."""
    name = "".join(p.capitalize() for p in verb.replace(".", "_").split("_")) + "Request"
    return cast(type[RequestBase], msgspec.defstruct(name, [], bases=(NoFields,), tag=verb, module=__name__))


def _spec(verb: str, reply: type[msgspec.Struct], doc: str, request: type[RequestBase] | None = None) -> VerbSpec:
    return VerbSpec(verb, request or _no_fields(verb), reply, doc)


_SPECS: Final = (
    _spec("ping", Pong, "Is the daemon answering."),
    _spec("version", VersionReply, "The API version and the daemon's package version."),
    _spec("help", HelpReply, "The verbs this daemon serves."),
    _spec("status", StatusReply, "Everything: mode, loop timing, arms, servos, the attached parts."),
    _spec("status.live", LiveStatus, "Mode and joints only: cheap enough to poll at 20 Hz."),
    _spec("config.reload", MessageReply, "Re-read the configuration file and apply what can change live."),
    _spec("hold", MessageReply, "Hold the arm where it is."),
    _spec("idle", MessageReply, "Stop commanding the arm."),
    _spec("teleop.start", MessageReply, "Align to the leader, then follow it."),
    _spec("teleop.stop", MessageReply, "Stop following the leader: hold."),
    _spec("torque.on", MessageReply, "Torque on: hold where it is."),
    _spec("torque.off", MessageReply, "Torque off: the arm goes limp (idle)."),
    _spec("camera.list", CameraList, "The daemon's cameras."),
    _spec("camera.preview", CameraPreview, "A camera's newest frame as a small JPEG.", CameraPreviewRequest),
    _spec("episode.start", EpisodeReply, "Start recording an episode.", EpisodeStartRequest),
    _spec("episode.save", EpisodeReply, "End the episode and keep it.", EpisodeSaveRequest),
    _spec("episode.discard", EpisodeReply, "End the episode and drop it."),
    _spec(
        "episode.keep",
        EpisodeReply,
        "Start an episode with the last seconds of the pre-roll buffer; it records on live until saved.",
        EpisodeKeepRequest,
    ),
    _spec("episode.status", EpisodeStatusReply, "The recorder's state."),
    _spec("policy.load", PolicyReply, "Load a policy checkpoint.", PolicyLoadRequest),
    _spec("policy.start", PolicyReply, "Let the loaded policy drive the arm.", PolicyStartRequest),
    _spec("policy.stop", PolicyReply, "Stop the policy: hold.", PolicyStopRequest),
    _spec("policy.takeover", PolicyReply, "Hand the arm from the policy to the leader, aligned."),
    _spec("policy.correct", PolicyReply, "The operator takes the arm inside the policy episode (leader aligned)."),
    _spec("policy.resume", PolicyReply, "Back to the policy in the same episode, from the measured pose."),
    _spec("policy.unload", PolicyReply, "Unload the policy."),
    _spec("policy.status", PolicyStatusReply, "The policy's state and timing."),
    _spec(
        "replay.start", ReplayReply, "Align to an episode's first action, then play its actions.", ReplayStartRequest
    ),
    _spec("replay.stop", ReplayReply, "Stop the replay now: hold.", ReplayStopRequest),
    _spec("replay.status", ReplayReply, "The replay's progress, and its tracking report once it ended."),
    _spec("arm.acquire", ArmLeaseReply, "Take the arm for this client: it follows arm.action.", ArmAcquireRequest),
    _spec("arm.action", ArmActionReply, "A joint target for the acquired arm, through safety.", ArmActionRequest),
    _spec("arm.observe", ArmObservation, "The arm's measured pose and the leader's, now.", ArmObserveRequest),
    _spec("arm.release", ArmLeaseReply, "Give the arm back: it holds where it is.", ArmLeaseRequest),
    _spec("leader.acquire", LeaderDriveReply, "Torque the leader on for this client: it holds.", LeaderAcquireRequest),
    _spec("leader.goal", LeaderDriveReply, "Move the acquired leader to a goal, at bounded speed.", LeaderGoalRequest),
    _spec("leader.release", LeaderDriveReply, "Let the leader go: torque off.", LeaderReleaseRequest),
    _spec("arm.share", ArmShareReply, "Share the arms' poses in memory, every cycle (same machine)."),
    _spec("camera.share", CameraShareReply, "Share a camera's frames in memory (same machine).", CameraShareRequest),
)
VERBS: Final[dict[str, VerbSpec]] = {s.verb: s for s in _SPECS}


class ReplyMismatch(ValueError):
    """A reply that does not fit its declared type (the message names the field)."""


def decode_reply[T: msgspec.Struct](reply: dict[str, Any], kind: type[T]) -> T:
    """A decoded reply (or status section) -> its declared type, or ReplyMismatch naming the field."""
    try:
        return msgspec.convert(reply, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise ReplyMismatch(f"{kind.__name__}: {exc}") from None
