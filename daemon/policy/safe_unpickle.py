"""Restricted unpickling of LeRobot policy-server replies (never ``pickle.loads`` on the wire).

LeRobot 0.6.1's async inference answers ``GetActions`` with ``pickle.dumps(list[TimedAction])``
(lerobot/async_inference/policy_server.py, ``PolicyServer.GetActions``). A plain ``pickle.loads``
of that would run whatever a hostile or compromised server put in it. ``loads_actions`` resolves
only the globals an action chunk is made of and refuses every other one, naming it:

- ``lerobot.async_inference.helpers.TimedAction`` (the chunk's element type),
- ``torch._utils._rebuild_tensor_v2`` (how a CPU tensor pickles) and ``collections.OrderedDict``
  (its empty backward-hooks argument),
- ``torch.storage._load_from_bytes``: how the tensor's storage pickles. Torch's own version calls
  ``torch.load(..., weights_only=False)`` on the bytes (a second, unrestricted unpickler), and its
  ``weights_only=True`` path cannot read this legacy storage format in torch 2.x (AttributeError on
  ``UntypedStorage.dtype``), so it is replaced here by ``_storage_from_legacy_bytes``, which parses
  the legacy ``torch.save`` layout (serialization.py ``_legacy_load``) with the same allow-list idea:
  four small data pickles whose only global is a storage class, then raw little-endian bytes,
- numpy's array reconstruction (``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``,
  ``numpy.dtype``), in case a server sends numpy actions,
- plain builtins data (lists, tuples, dicts, numbers, strings need no global at all).
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any

MAX_REPLY_BYTES = 64 * 1024 * 1024  # a chunk of 100 x 6 floats is ~20 kB; anything near this is wrong
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch/serialization.py MAGIC_NUMBER
_LEGACY_PROTOCOL = 1001


class UnsafePickleError(ValueError):
    """The server's reply names a type we do not load (the message names it)."""


def _storage_dtypes() -> dict[tuple[str, str], Any]:
    import torch

    names = {
        "FloatStorage": torch.float32,
        "DoubleStorage": torch.float64,
        "HalfStorage": torch.float16,
        "BFloat16Storage": torch.bfloat16,
        "LongStorage": torch.int64,
        "IntStorage": torch.int32,
        "ShortStorage": torch.int16,
        "CharStorage": torch.int8,
        "ByteStorage": torch.uint8,
        "BoolStorage": torch.bool,
    }
    out: dict[tuple[str, str], Any] = {("torch", n): d for n, d in names.items()}
    out[("torch.storage", "UntypedStorage")] = torch.uint8
    out[("torch", "UntypedStorage")] = torch.uint8
    return out


class _StorageType:
    """Stand-in for a storage class named in the legacy pickle: only its dtype is kept."""

    def __init__(self, dtype: Any):
        self.dtype = dtype


class _LegacyHeaderUnpickler(pickle.Unpickler):
    """The legacy file's magic number, protocol version and sys-info: plain data, no globals."""

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(f"tensor storage header names {module}.{name}; refused")


class _LegacyStorageUnpickler(pickle.Unpickler):
    def __init__(self, f: io.BytesIO, dtypes: dict[tuple[str, str], Any]):
        super().__init__(f)
        self._dtypes = dtypes
        self.storages: dict[str, tuple[Any, int]] = {}  # key -> (dtype, numel)

    def find_class(self, module: str, name: str) -> Any:
        dtype = self._dtypes.get((module, name))
        if dtype is None:
            raise UnsafePickleError(f"tensor storage names {module}.{name}; refused (not a storage type)")
        return _StorageType(dtype)

    def persistent_load(self, pid: Any) -> Any:
        if (
            not isinstance(pid, tuple)
            or len(pid) != 6
            or pid[0] != "storage"
            or not isinstance(pid[1], _StorageType)
            or not isinstance(pid[2], str)
            or pid[3] != "cpu"
            or not isinstance(pid[4], int)
            or pid[5] is not None
        ):
            raise UnsafePickleError(f"tensor storage reference {pid!r:.120} is not a plain CPU storage; refused")
        _, st, key, _loc, numel, _view = pid
        self.storages[key] = (st.dtype, numel)
        return key


def _storage_from_legacy_bytes(data: bytes) -> Any:
    """torch.storage._load_from_bytes without a second unrestricted unpickler."""
    import torch

    if not isinstance(data, (bytes, bytearray)):
        raise UnsafePickleError(f"tensor storage payload is {type(data).__name__}, not bytes")
    f = io.BytesIO(data)
    header = _LegacyHeaderUnpickler(f)
    if header.load() != _LEGACY_MAGIC:
        raise UnsafePickleError("tensor storage payload: bad magic number")
    if header.load() != _LEGACY_PROTOCOL:
        raise UnsafePickleError("tensor storage payload: unknown protocol version")
    sys_info = _LegacyHeaderUnpickler(f).load()
    if not isinstance(sys_info, dict) or sys_info.get("little_endian") is not True:
        raise UnsafePickleError("tensor storage payload: not little-endian")
    u = _LegacyStorageUnpickler(f, _storage_dtypes())
    root_key = u.load()
    keys = _LegacyHeaderUnpickler(f).load()
    if not isinstance(root_key, str) or keys != [root_key] or set(u.storages) != {root_key}:
        raise UnsafePickleError("tensor storage payload: expected exactly one storage")
    dtype, numel = u.storages[root_key]
    elem = torch.empty((), dtype=dtype).element_size()
    head = f.read(8)
    if len(head) != 8:
        raise UnsafePickleError("tensor storage payload: truncated")
    (count,) = struct.unpack("<q", head)
    raw = f.read()
    # the header counts elements of the storage's dtype (bytes for an untyped storage)
    if count < 0 or count * elem != len(raw) or numel not in (count, count * elem):
        raise UnsafePickleError(f"tensor storage payload: {len(raw)} bytes for {count} x {elem}-byte elements")
    untyped = torch.frombuffer(bytearray(raw), dtype=torch.uint8).untyped_storage() if raw else torch.UntypedStorage(0)
    return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def _allowed() -> dict[tuple[str, str], Any]:
    import collections

    import numpy as np
    import torch._utils
    from lerobot.async_inference.helpers import TimedAction

    allowed: dict[tuple[str, str], Any] = {
        ("lerobot.async_inference.helpers", "TimedAction"): TimedAction,
        ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
        ("torch.storage", "_load_from_bytes"): _storage_from_legacy_bytes,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(mod, "_reconstruct")] = np.core.multiarray._reconstruct  # type: ignore[attr-defined]
    for mod in ("numpy.dtypes",):
        for n in ("Float32DType", "Float64DType"):
            allowed[(mod, n)] = getattr(np.dtypes, n)
    return allowed


class _ReplyUnpickler(pickle.Unpickler):
    def __init__(self, f: io.BytesIO, allowed: dict[tuple[str, str], Any]):
        super().__init__(f)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        obj = self._allowed.get((module, name))
        if obj is None:
            raise UnsafePickleError(
                f"the policy server's reply asks to load {module}.{name}, which is not part of an action "
                "chunk; refused (nothing from it was run)"
            )
        return obj

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("the policy server's reply uses a persistent id; refused")


_ALLOWED: dict[tuple[str, str], Any] | None = None


def loads_actions(data: bytes) -> Any:
    """Unpickle a GetActions reply with the allow-list above (UnsafePickleError otherwise)."""
    global _ALLOWED
    if len(data) > MAX_REPLY_BYTES:
        raise UnsafePickleError(f"the policy server's reply is {len(data)} bytes (> {MAX_REPLY_BYTES}); refused")
    if _ALLOWED is None:
        _ALLOWED = _allowed()
    try:
        return _ReplyUnpickler(io.BytesIO(data), _ALLOWED).load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # truncated / malformed: say so, never guess
        raise UnsafePickleError(
            f"the policy server's reply is not a readable pickle: {type(exc).__name__}: {exc}"
        ) from None
