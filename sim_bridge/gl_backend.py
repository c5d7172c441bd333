"""The OpenGL backend MuJoCo renders with (MUJOCO_GL), checked before mujoco is imported.

``import mujoco`` binds its offscreen context at import time (mujoco/rendering/classic/
gl_context.py): with MUJOCO_GL=osmesa and no libOSMesa, PyOpenGL's OSMesa platform loads nothing
and the import dies 30 lines deep in ``AttributeError: 'NoneType' object has no attribute
'glGetError'``. ``import_mujoco`` says instead which library is missing and how to get it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from types import ModuleType

DEFAULT_BACKEND = "egl"  # headless, and what a desktop or a GPU server has

# MUJOCO_GL -> (library PyOpenGL loads for it (OpenGL/platform/<backend>.py), Debian/Ubuntu package)
LIBRARIES: dict[str, tuple[str, str]] = {
    "osmesa": ("OSMesa", "libosmesa6"),
    "egl": ("EGL", "libegl1"),
}


class GLBackendUnavailable(RuntimeError):
    """MUJOCO_GL names a backend this machine cannot render with (the message says why)."""


def _loadable(name: str) -> bool:
    path = ctypes.util.find_library(name)
    if path is None:
        return False
    try:
        ctypes.CDLL(path)
    except OSError:
        return False
    return True


def check_gl_backend(backend: str) -> None:
    """Raise GLBackendUnavailable when the backend's library cannot be loaded here."""
    lib = LIBRARIES.get(backend)
    if lib is None or _loadable(lib[0]):
        return
    name, package = lib
    others = " or ".join(f"MUJOCO_GL={b}" for b in LIBRARIES if b != backend)
    raise GLBackendUnavailable(
        f"MUJOCO_GL={backend}: the {name} library (lib{name}.so) is not installed, so MuJoCo cannot render; "
        f"install it (Debian/Ubuntu: sudo apt install {package}) or use {others}"
    )


def import_mujoco() -> ModuleType:
    """``import mujoco`` with MUJOCO_GL defaulting to egl, failing with one clear error."""
    backend = os.environ.setdefault("MUJOCO_GL", DEFAULT_BACKEND).strip().lower()
    check_gl_backend(backend)
    try:
        import mujoco
    except (ImportError, OSError, AttributeError, RuntimeError) as exc:  # what a broken GL stack raises
        raise GLBackendUnavailable(
            f"MUJOCO_GL={backend}: MuJoCo could not set up its renderer ({type(exc).__name__}: {exc}); "
            f"try another backend (MUJOCO_GL=egl, osmesa or glfw)"
        ) from exc
    return mujoco
