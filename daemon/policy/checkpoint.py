"""Load a LeRobot 0.6.1 policy checkpoint folder offline, safely, and check it fits the daemon.

A checkpoint folder is what ``policy.save_pretrained(dir)`` plus the pre/post-processors'
``save_pretrained(dir)`` write (or lerobot-train's ``pretrained_model/``): ``config.json``,
``model.safetensors``, ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and their
``*.safetensors`` state files.

Safety: a checkpoint is data from someone else. Anything that could be unpickled (``.bin``,
``.pt``, ``.pth``, ``.pkl``, ``.ckpt`` ...) is refused *before* torch or LeRobot touches the
folder; weights and processor states are read with safetensors only (LeRobot's own loaders use
``safetensors.load_file`` for both). Loading is offline: the Hub is never asked, and a config
naming torchvision backbone weights to download gets them switched off (the checkpoint's own
weights replace them anyway).

``inspect_checkpoint`` and ``check_inputs`` only read JSON (cheap, no torch): the daemon calls
them in its own process to give an immediate, readable list of mismatches; ``load_policy`` (torch)
runs in the policy worker process.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibration.conventions import FEATURE_NAMES, NUM_JOINTS
from daemon.data.schema import ACTION_KEY, IMAGE_KEY_PREFIX, STATE_KEY

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "policy_preprocessor.json"
POSTPROCESSOR_FILE = "policy_postprocessor.json"
# Suffixes of formats that are (or may be) pickles: never opened.
UNSAFE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
# Policies whose inference we support (chunking policies with a predict_action_chunk).
SUPPORTED_TYPES = ("act", "diffusion", "smolvla", "pi0", "pi05")
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# The look through a folder for pickle-capable files is bounded: a checkpoint is a handful of
# files a level or two deep, and a request must not make the daemon walk a whole file system.
MAX_WALK_DEPTH = 6
MAX_WALK_ENTRIES = 2000  # files and folders together
MAX_WALK_S = 2.0
MAX_CHECKPOINT_BYTES = 64 * 1024**3  # the model file; the largest supported policies are a few GB


class CheckpointError(ValueError):
    """The folder is not a loadable, safe LeRobot checkpoint (message says why)."""


class CheckpointNotAllowed(CheckpointError):
    """A path outside the folders the daemon may load policies from (nothing else is said about it)."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint is fine but expects other inputs/outputs than the daemon provides."""

    def __init__(self, path: Path, mismatches: list[str]):
        self.mismatches = list(mismatches)
        lines = "\n".join(f"  - {m}" for m in self.mismatches)
        super().__init__(f"policy {path} does not fit this daemon's configuration:\n{lines}")


@dataclass(frozen=True)
class ExpectedIO:
    """What the daemon can feed a policy and what it needs back.

    cameras: {camera name: (height, width)} as configured (RGB uint8 frames).
    """

    cameras: dict[str, tuple[int, int]] = field(default_factory=dict)
    state_dim: int = NUM_JOINTS
    action_dim: int = NUM_JOINTS
    arms: tuple[str, ...] = ()  # a bimanual rig's arms, in the vector's order (LeRobot's: left, right)

    @classmethod
    def for_arms(cls, cameras: dict[str, tuple[int, int]], arms: tuple[str, ...]) -> ExpectedIO:
        """What a rig of ``arms`` feeds and takes: every arm's joints in one vector (() or one arm: six)."""
        if len(arms) < 2:
            return cls(cameras=dict(cameras))
        width = NUM_JOINTS * len(arms)
        return cls(cameras=dict(cameras), state_dim=width, action_dim=width, arms=tuple(arms))

    def joints_text(self) -> str:
        """The daemon's joint vector in words, for a mismatch: its width and its features' names."""
        if not self.arms:
            if self.state_dim != NUM_JOINTS:
                return f"({self.state_dim},)"
            return f"({self.state_dim},): {FEATURE_NAMES[0]} .. {FEATURE_NAMES[-1]}, one arm"
        parts = ", ".join(f"{a}_{FEATURE_NAMES[0]} .. {a}_{FEATURE_NAMES[-1]}" for a in self.arms)
        return f"({self.state_dim},): {parts}, {len(self.arms)} arms ({', '.join(self.arms)})"


@dataclass(frozen=True)
class CheckpointInfo:
    """What the checkpoint's config.json says, read without torch."""

    path: Path
    policy_type: str
    state_shape: tuple[int, ...] | None
    cameras: dict[str, tuple[int, int, int]]  # name -> (C, H, W) as the policy expects
    other_inputs: dict[str, tuple[int, ...]]  # e.g. observation.environment_state
    action_shape: tuple[int, ...] | None
    chunk_size: int
    n_action_steps: int
    n_obs_steps: int
    device: str
    raw_config: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def camera_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.cameras))


def admit_checkpoint_path(given: str, allowed_dirs: list[str], owner_uid: int) -> Path:
    """Where a request may load a policy from, decided before anything inside is looked at.

    Allowed: a folder under one of ``allowed_dirs``, or one that ``owner_uid`` (the daemon's
    user) or root owns along its whole path (the daemon's own files). Anything else, existing or
    not, is ``CheckpointNotAllowed`` with the same words: the reply says nothing of what is there."""
    where = ", ".join(allowed_dirs) if allowed_dirs else "none configured"
    refusal = CheckpointNotAllowed(
        f"policy path {given!r} is not allowed: policies load from [policy] path, [policy] allowed_dirs "
        f"({where}) or folders of the daemon's own user"
    )
    try:
        lexical = Path(os.path.abspath(os.path.expanduser(given)))
        resolved = Path(os.path.realpath(lexical))
    except (OSError, ValueError):  # a link the daemon may not read (/proc/1/root), a NUL
        raise refusal from None
    for root in allowed_dirs:
        top = Path(os.path.realpath(os.path.expanduser(root)))
        if resolved == top or top in resolved.parents:
            return resolved
    try:
        owned = all(os.stat(p).st_uid in (owner_uid, 0) for p in (resolved, *resolved.parents))
    except OSError:
        owned = False
    if owned:
        return resolved
    raise refusal


def _refuse_unsafe_files(path: Path) -> None:
    """Pickle-capable files anywhere in the folder are refused by name. The look follows no link
    and is bounded in depth, in entries (files and folders alike, counted while a folder is
    listed, not after) and in time: a folder beyond the bounds is not a checkpoint."""
    unsafe: list[str] = []
    seen = 0
    deadline_s = time.monotonic() + MAX_WALK_S
    pending: list[tuple[Path, int]] = [(path, 0)]
    too_big = CheckpointError(
        f"{path} is not a checkpoint: more than {MAX_WALK_ENTRIES} entries or {MAX_WALK_DEPTH} levels to look "
        "through (a checkpoint folder has a handful of files)"
    )
    while pending:
        here, depth = pending.pop()
        try:
            with os.scandir(here) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_WALK_ENTRIES or time.monotonic() > deadline_s:
                        raise too_big
                    if entry.is_dir(follow_symlinks=False):
                        if depth + 1 >= MAX_WALK_DEPTH:
                            raise too_big
                        pending.append((Path(entry.path), depth + 1))
                    elif entry.name.lower().endswith(UNSAFE_SUFFIXES):
                        unsafe.append(str(Path(entry.path).relative_to(path)))
        except OSError:
            continue  # a folder we may not list holds nothing we would load
    if unsafe:
        raise CheckpointError(
            f"refusing checkpoint {path}: it contains file(s) in a pickle-capable format "
            f"({', '.join(sorted(unsafe))}); only safetensors checkpoints are loaded. Convert the weights with "
            "safetensors.torch.save_file in a trusted environment and remove the other files."
        )


def _member(folder: Path, rel: str) -> Path | None:
    """``folder/rel`` as the file to open: a regular file whose every link resolves inside the
    folder (None: there is none). A link that leads out, or anything but a regular file (a FIFO
    would block its reader, a device never ends), is refused; nothing of it is opened or quoted."""
    candidate = folder / rel
    try:
        os.lstat(candidate)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointNotAllowed(f"{folder} is not a checkpoint: {rel} is not allowed ({exc.strerror})") from None
    top = Path(os.path.realpath(folder))
    real = Path(os.path.realpath(candidate))
    if top not in real.parents:
        raise CheckpointError(
            f"{folder} is not a checkpoint: {rel} is a link that leads out of the folder "
            "(copy the file into the checkpoint folder)"
        )
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointNotAllowed(f"{folder} is not a checkpoint: {rel} is not allowed ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{folder} is not a checkpoint: {rel} is not a regular file")
    return real


def _open_regular(path: Path) -> int:
    """An fd of ``path`` if it is (still) a regular file: no link followed, no FIFO waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{path} is not a regular file")
    return fd


def _read_json(folder: Path, rel: str) -> dict[str, Any]:
    """A JSON object from ``folder/rel`` (see ``_member``); errors name the file, never its text."""
    member = _member(folder, rel)
    if member is None:
        raise CheckpointError(f"checkpoint {folder} is missing {rel}")
    try:
        fd = _open_regular(member)
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"cannot read {folder / rel}: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{folder / rel} is larger than {MAX_CONFIG_BYTES} bytes: not a policy config")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise CheckpointError(f"cannot read {folder / rel}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:  # its message gives the position, not the text
        raise CheckpointError(f"cannot read {folder / rel}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{folder / rel}: expected a JSON object")
    return data


def _shape(entry: Any, key: str, path: Path) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in entry["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path / CONFIG_FILE}: feature {key!r} has no valid shape") from exc


def _check_processor_states(path: Path, name: str) -> None:
    """Every state file a processor pipeline names must be a safetensors file inside the folder."""
    cfg = _read_json(path, name)
    steps = cfg.get("steps", [])
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        state = step.get("state_file") if isinstance(step, dict) else None
        if state is None:
            continue
        # the name is not quoted back: it is text from a file
        if not isinstance(state, str) or not state.endswith(".safetensors"):
            raise CheckpointError(f"{path / name}: step {i}'s state file is not a .safetensors file")
        try:
            inside = Path(os.path.realpath(path)) in Path(os.path.realpath(path / state)).parents
        except (OSError, ValueError):
            inside = False
        if not inside:
            raise CheckpointError(f"{path / name}: step {i}'s state file points outside the checkpoint")
        if _member(path, state) is None:
            raise CheckpointError(f"{path / name}: step {i}'s state file is missing")


def inspect_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Validate a checkpoint folder's files and read its interface (no torch, no unpickling).

    Every file it opens is a regular file inside the folder (links that lead out are refused),
    and no refusal quotes what a file says: the folder may be shared with people who could
    otherwise read other users' files through a link."""
    path = Path(path).expanduser()
    try:
        top = os.stat(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint folder {path} does not exist") from None
    except (OSError, ValueError):
        raise CheckpointNotAllowed(f"checkpoint folder {path} is not allowed") from None
    if stat.S_ISREG(top.st_mode):
        raise CheckpointError(
            f"{path} is a file; give the checkpoint folder (config.json + model.safetensors + processors)"
        )
    if not stat.S_ISDIR(top.st_mode):
        raise CheckpointError(f"{path} is not a checkpoint: not a folder")
    if _member(path, CONFIG_FILE) is None:  # before any walk: most folders are not checkpoints at all
        raise CheckpointError(f"{path} is not a checkpoint: it has no {CONFIG_FILE}")
    model = _member(path, MODEL_FILE)
    if model is not None and model.stat().st_size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{path} is not a checkpoint: {MODEL_FILE} is larger than {MAX_CHECKPOINT_BYTES} bytes")
    _refuse_unsafe_files(path)
    missing = [n for n in (CONFIG_FILE, MODEL_FILE, PREPROCESSOR_FILE, POSTPROCESSOR_FILE) if _member(path, n) is None]
    if missing:
        hint = ""
        if PREPROCESSOR_FILE in missing or POSTPROCESSOR_FILE in missing:
            hint = (
                " (LeRobot 0.6 saves normalisation in processor files: save them with "
                "preprocessor.save_pretrained(dir) and postprocessor.save_pretrained(dir))"
            )
        raise CheckpointError(f"checkpoint {path} is missing {', '.join(missing)}{hint}")
    model = _member(path, MODEL_FILE)
    assert model is not None
    with os.fdopen(_open_regular(model), "rb") as fh:
        head = fh.read(8)
        size = os.fstat(fh.fileno()).st_size
    if len(head) < 8 or int.from_bytes(head, "little") > size:
        raise CheckpointError(f"{path / MODEL_FILE} is not a safetensors file (bad header)")
    for name in (PREPROCESSOR_FILE, POSTPROCESSOR_FILE):
        _check_processor_states(path, name)

    cfg = _read_json(path, CONFIG_FILE)
    policy_type = cfg.get("type", "")
    if not policy_type:
        raise CheckpointError(f"{path / CONFIG_FILE} has no policy 'type'")
    if policy_type not in SUPPORTED_TYPES:
        # not quoted: text read from a file is never echoed (say what is supported instead)
        raise CheckpointError(
            f"{path / CONFIG_FILE} names a policy type this daemon does not run "
            f"(supported: {', '.join(SUPPORTED_TYPES)})"
        )
    inputs = cfg.get("input_features") or {}
    outputs = cfg.get("output_features") or {}
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        raise CheckpointError(f"{path / CONFIG_FILE}: input_features/output_features must be objects")
    state_shape = None
    cameras: dict[str, tuple[int, int, int]] = {}
    other: dict[str, tuple[int, ...]] = {}
    for key, entry in inputs.items():
        shape = _shape(entry, key, path)
        ftype = str((entry or {}).get("type", ""))
        if key == STATE_KEY:
            state_shape = shape
        elif ftype == "VISUAL" or key.startswith(IMAGE_KEY_PREFIX):
            if not key.startswith(IMAGE_KEY_PREFIX) or len(shape) != 3:
                other[key] = shape
            else:
                cameras[key[len(IMAGE_KEY_PREFIX) :]] = (shape[0], shape[1], shape[2])
        else:
            other[key] = shape
    action_shape = _shape(outputs[ACTION_KEY], ACTION_KEY, path) if ACTION_KEY in outputs else None
    chunk = int(cfg.get("chunk_size") or cfg.get("horizon") or 1)
    n_action = int(cfg.get("n_action_steps") or chunk)
    return CheckpointInfo(
        path=path,
        policy_type=policy_type,
        state_shape=state_shape,
        cameras=cameras,
        other_inputs=other,
        action_shape=action_shape,
        chunk_size=chunk,
        n_action_steps=n_action,
        n_obs_steps=int(cfg.get("n_obs_steps") or 1),
        device=str(cfg.get("device") or "cpu"),
        raw_config=cfg,
    )


def check_inputs(info: CheckpointInfo, expected: ExpectedIO) -> list[str]:
    """Readable list of every way the policy's inputs/outputs differ from what the daemon has."""
    problems: list[str] = []
    if info.state_shape is None:
        problems.append(
            f"the policy takes no {STATE_KEY!r}; the daemon provides ({expected.state_dim},) joint positions"
        )
    elif info.state_shape != (expected.state_dim,):
        problems.append(
            f"{STATE_KEY}: policy expects shape {info.state_shape}{_trained_for(info.state_shape)}, "
            f"the daemon provides {expected.joints_text()}"
        )
    if info.action_shape is None:
        problems.append(f"the policy outputs no {ACTION_KEY!r}")
    elif info.action_shape != (expected.action_dim,):
        takes = "the followers take" if expected.arms else "the follower takes"
        problems.append(
            f"{ACTION_KEY}: policy outputs shape {info.action_shape}{_trained_for(info.action_shape)}, "
            f"{takes} ({expected.action_dim},)"
        )
    for name in sorted(set(info.cameras) - set(expected.cameras)):
        c, h, w = info.cameras[name]
        have = ", ".join(sorted(expected.cameras)) or "none"
        problems.append(f"camera {name!r} ({w}x{h}) expected by the policy is not configured (configured: {have})")
    for name in sorted(set(info.cameras) & set(expected.cameras)):
        c, h, w = info.cameras[name]
        eh, ew = expected.cameras[name]
        if c != 3:
            problems.append(f"camera {name!r}: policy expects {c} channels, cameras deliver 3 (RGB)")
        if (h, w) != (eh, ew):
            problems.append(f"camera {name!r}: policy expects {w}x{h}, configured {ew}x{eh}")
    for key, shape in sorted(info.other_inputs.items()):
        problems.append(f"input {key!r} {shape} is not something the daemon provides")
    return problems


def _trained_for(shape: tuple[int, ...]) -> str:
    """What a joint vector's width says of the rig a policy was trained on (six per SO-101)."""
    if len(shape) != 1 or shape[0] % NUM_JOINTS:
        return ""
    n = shape[0] // NUM_JOINTS
    return " (one arm's joints)" if n == 1 else f" ({n} arms' joints)"


def check_checkpoint(path: str | os.PathLike[str], expected: ExpectedIO) -> CheckpointInfo:
    """inspect + check_inputs; raises CheckpointMismatchError listing every mismatch."""
    info = inspect_checkpoint(path)
    problems = check_inputs(info, expected)
    if problems:
        raise CheckpointMismatchError(info.path, problems)
    return info


@dataclass
class LoadedPolicy:
    """A policy ready for inference: model + LeRobot pre/post-processor pipelines."""

    info: CheckpointInfo
    policy: Any  # lerobot PreTrainedPolicy
    preprocessor: Any
    postprocessor: Any
    device: str


def load_policy(
    path: str | os.PathLike[str], expected: ExpectedIO | None = None, device: str | None = None
) -> LoadedPolicy:
    """Load model + processors (torch; call this in the worker process). Offline, safetensors only."""
    info = check_checkpoint(path, expected) if expected is not None else inspect_checkpoint(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors
    except ImportError as exc:  # pragma: no cover - lerobot is a dependency
        raise CheckpointError(f"lerobot is not importable: {exc}") from exc
    try:
        policy_cls = get_policy_class(info.policy_type)
    except (ImportError, ModuleNotFoundError) as exc:
        raise CheckpointError(
            f"policy type {info.policy_type!r} needs packages that are not installed here ({exc}); "
            f"install lerobot's [{info.policy_type}] extra"
        ) from exc
    try:
        cfg = PreTrainedConfig.from_pretrained(str(info.path), local_files_only=True)
    except Exception as exc:  # draccus raises many types for a bad config
        raise CheckpointError(f"{info.path / CONFIG_FILE} is not a valid {info.policy_type} config: {exc}") from exc
    dev = device or info.device
    if dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            dev = "cpu"
    cfg.device = dev
    if hasattr(cfg, "pretrained_backbone_weights"):
        # The checkpoint's weights overwrite the backbone; never download ImageNet weights first.
        cfg.pretrained_backbone_weights = None
    try:
        policy = policy_cls.from_pretrained(str(info.path), config=cfg, local_files_only=True, strict=True)
    except (ImportError, ModuleNotFoundError, OSError) as exc:
        raise CheckpointError(f"cannot build {info.policy_type} policy offline: {exc}") from exc
    except RuntimeError as exc:  # missing/unexpected keys, shape mismatches
        raise CheckpointError(f"{info.path / MODEL_FILE} does not match its config.json: {exc}") from exc
    except Exception as exc:  # safetensors' own errors (truncated or corrupt file) and the like
        raise CheckpointError(f"cannot read the weights {info.path / MODEL_FILE}: {type(exc).__name__}: {exc}") from exc
    overrides = {"device_processor": {"device": dev}}
    try:
        pre, post = make_pre_post_processors(
            cfg, pretrained_path=str(info.path), preprocessor_overrides=overrides, postprocessor_overrides=overrides
        )
    except Exception as exc:
        raise CheckpointError(f"cannot load the processor pipelines of {info.path}: {exc}") from exc
    return LoadedPolicy(info=info, policy=policy, preprocessor=pre, postprocessor=post, device=dev)
