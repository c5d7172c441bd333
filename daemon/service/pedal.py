"""A USB foot pedal, read by the daemon through python-evdev and mapped to the control socket's verbs.

The daemon reads the pedal itself (not a client): under systemd it is the one process that is
always there, so the pedal works whichever client (console, ``so101d record``, none) is open, and
a press goes through the same verb, with the same refusals, as the console's button or a
terminal key. The key codes and the device path are LeRobot's DAgger pedal defaults
(lerobot/rollout/configs.py ``DAggerPedalConfig``; the reader mirrors lerobot/utils/pedal.py:
key-down events only, the code's name as python-evdev gives it).

What each pedal does depends on who drives: daemon/api/input_actions.py, the table the terminal
sessions use too.

A pedal configured but not plugged in is waited for; one unplugged mid-session is said once and
picked up again when it is back; nothing else stops. A path that is not an input device, or
python-evdev missing, refuses the start (a configured pedal that silently does nothing would be
worse).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import threading
import time
from typing import Any, Protocol

import msgspec

from daemon.api.input_actions import Action, Driver, verb_for
from daemon.api.messages import PedalStatus
from daemon.config.settings import PedalConfig
from daemon.service.context import DaemonContext

log = logging.getLogger("so101d.pedal")

REPLUG_POLL_S = 0.25  # how often an unplugged pedal's path is looked for
SELECT_TIMEOUT_S = 0.25  # the reader's longest wait, so a stop is seen promptly
STOP_WAIT_S = 15.0  # at stop, how long a press's verb may still take
EV_KEY, KEY_DOWN = 0x01, 1  # linux/input-event-codes.h: a key event; its value 1 is a press


class PedalError(RuntimeError):
    """The pedal cannot be used as configured (the message names ``pedal.device`` and the fix)."""


class VerbHandler(Protocol):
    def handle(self, req: Any) -> dict[str, Any]: ...


class DriverProbe(Protocol):
    def __call__(self) -> Driver: ...


class InputDeviceLike(Protocol):
    """What the reader uses of python-evdev's ``InputDevice``."""

    name: str

    def fileno(self) -> int: ...

    def read(self) -> Any: ...

    def close(self) -> None: ...


class Evdev(Protocol):
    """The python-evdev module, as far as the reader uses it."""

    def InputDevice(self, path: str) -> InputDeviceLike: ...

    def categorize(self, event: Any) -> Any: ...


def import_evdev() -> Evdev:
    try:
        import evdev
    except ImportError:
        raise PedalError(
            "pedal.device is set but python-evdev is not installed: "
            "`.venv/bin/pip install evdev` (or `pip install 'so101d[pedal]'`), or empty pedal.device"
        ) from None
    return evdev


def _open_problem(path: str, exc: OSError) -> str:
    """Why the pedal at ``path`` cannot be opened, with the fix (at start and at a replug alike)."""
    if isinstance(exc, PermissionError):
        return (
            f"pedal.device {path}: permission denied; add the daemon's user to the 'input' group "
            "(`sudo usermod -aG input USER`, then log in again) or give the device a udev rule"
        )
    if exc.errno in (errno.ENOTTY, errno.EINVAL):
        return (
            f"pedal.device {path}: not an input device ({exc.strerror or exc}); "
            "use the pedal's event device, e.g. /dev/input/by-id/usb-...-event-kbd (`ls /dev/input/by-id`)"
        )
    return f"pedal.device {path}: cannot open it: {exc}"


class PedalReader:
    """A thread that reads the pedal's key-down events and asks for the mapped verb."""

    def __init__(
        self, cfg: PedalConfig, evdev: Evdev, verbs: VerbHandler, driver: DriverProbe, keep_s: float = 0.0
    ) -> None:
        self.cfg = cfg
        self.keep_s = keep_s  # what the keep pedal keeps: the whole pre-roll buffer ([recording] ring_s)
        self._evdev = evdev
        self._verbs = verbs
        self._driver = driver
        self._actions = {code: Action(name) for name, code in cfg.bindings().items() if code}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._device: InputDeviceLike | None = None
        self.state = "waiting"  # waiting (not plugged in yet), connected, unplugged, error
        self.problem = ""
        self.name = ""
        self.presses = 0
        self.unplugs = 0
        self.last_key = ""
        self.last_verb = ""
        self.last_reply = ""
        self.connected = threading.Event()  # set while connected (tests and status wait on it)
        self._unknown_said: set[int] = set()

    # -- start / stop ----------------------------------------------------------------------------
    def check(self) -> None:
        """At start: open the pedal if it is there; raise PedalError if the path is no pedal."""
        path = self.cfg.device
        try:
            self._open()
        except FileNotFoundError:
            log.warning("pedal %s is not plugged in: waiting for it (the daemon runs without it)", path)
        except OSError as exc:
            raise PedalError(_open_problem(path, exc)) from None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="so101d-pedal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # a press being served finishes first (policy.correct may wait seconds for the loop)
            self._thread.join(timeout=STOP_WAIT_S)
            if self._thread.is_alive():
                log.warning("pedal: a press's verb still runs after %.0f s; the daemon stops anyway", STOP_WAIT_S)
        self._close()

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            return msgspec.to_builtins(
                PedalStatus(
                    device=self.cfg.device,
                    state=self.state,
                    name=self.name or None,
                    problem=self.problem or None,
                    keys={name: code for name, code in self.cfg.bindings().items() if code},
                    presses=self.presses,
                    unplugs=self.unplugs,
                    last_key=self.last_key or None,
                    last_verb=self.last_verb or None,
                    last_reply=self.last_reply or None,
                )
            )

    # -- the thread ------------------------------------------------------------------------------
    def _open(self) -> None:
        dev = self._evdev.InputDevice(self.cfg.device)
        with self._lock:
            self._device, self.name, self.state, self.problem = dev, dev.name, "connected", ""
        self.connected.set()
        log.info("pedal connected: %s (%s)", dev.name, self.cfg.device)

    def _close(self) -> None:
        self.connected.clear()
        with self._lock:
            dev, self._device = self._device, None
        if dev is not None:
            try:
                dev.close()
            except OSError:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._device is None:
                self._try_reopen()
                continue
            try:
                self._read_once(self._device)
            except OSError as exc:
                self._lost(exc)
            except Exception as exc:  # a bug must not end the pedal quietly
                log.exception("pedal reader failed")
                self._lost(OSError(errno.EIO, f"{type(exc).__name__}: {exc}"))

    def _read_once(self, dev: InputDeviceLike) -> None:
        ready, _, _ = select.select([dev.fileno()], [], [], SELECT_TIMEOUT_S)
        if not ready:
            return
        try:
            events = list(dev.read())
        except BlockingIOError:
            return
        for ev in events:
            if ev.type != EV_KEY or ev.value != KEY_DOWN:  # key-down only, as LeRobot's listener
                continue
            try:
                key = self._evdev.categorize(ev)
            except KeyError:  # a code python-evdev has no name for (a reprogrammed pedal): not ours
                self._unknown_code(ev.code)
                continue
            code = key.keycode[0] if isinstance(key.keycode, (list, tuple)) else key.keycode
            self._pressed(str(code))

    def _unknown_code(self, code: int) -> None:
        if code not in self._unknown_said:  # the reader thread's own set: no lock
            self._unknown_said.add(code)
            log.warning("pedal: key code %d has no evdev name; ignored (bind KEY_ names only)", code)

    def _lost(self, exc: OSError) -> None:
        self._close()
        with self._lock:
            self.state, self.problem = "unplugged", f"{exc.strerror or exc} at {time.strftime('%H:%M:%S')}"
            self.unplugs += 1
        # said once per unplug; the loop, the episode and every other input go on
        log.warning(
            "pedal %s unplugged (%s): everything else goes on; it is used again when plugged back",
            self.cfg.device,
            exc.strerror or exc,
        )

    def _try_reopen(self) -> None:
        if not os.path.exists(self.cfg.device):
            self._stop.wait(REPLUG_POLL_S)
            return
        try:
            self._open()
        except OSError as exc:
            problem = _open_problem(self.cfg.device, exc)
            with self._lock:
                said = self.problem == problem
                self.state, self.problem = "error", problem
            if not said:
                log.warning("pedal: %s", problem)
            self._stop.wait(REPLUG_POLL_S)

    def _pressed(self, code: str) -> None:
        action = self._actions.get(code)
        if action is None:
            log.debug("pedal: %s is not bound to any of %s", code, ", ".join(f"pedal.{a}" for a in self.cfg.bindings()))
            return
        verb = verb_for(action, self._driver())
        fields = {"last_s": self.keep_s or None} if action is Action.KEEP else {}
        reply = self._verbs.handle({"cmd": verb, **fields})
        text = str(reply.get("error") or reply.get("message") or ("done" if reply.get("ok") else reply))
        with self._lock:
            self.presses += 1
            self.last_key, self.last_verb, self.last_reply = code, verb, text
        if reply.get("error"):
            log.warning("pedal %s (%s): %s refused: %s", code, action.value, verb, text)
        else:
            log.info("pedal %s (%s): %s: %s", code, action.value, verb, text)


def _driver_of(ctx: DaemonContext) -> Driver:
    # what policy.status reports, read directly: "driving" is the loop's policy intent
    correcting = ctx.policy is not None and ctx.policy.correcting
    intent = ctx.loop.intent
    return Driver(intent=intent, correcting=correcting, policy_run=intent == "policy" or correcting)


def attach_pedal(ctx: DaemonContext) -> PedalReader | None:
    """The configured pedal, reading; None when ``[pedal] device`` is empty. Raises PedalError."""
    if not ctx.cfg.pedal.device:
        return None
    reader = PedalReader(
        ctx.cfg.pedal, import_evdev(), ctx.server, lambda: _driver_of(ctx), keep_s=ctx.cfg.recording.ring_s
    )
    reader.check()
    reader.start()
    ctx.on_stop.append(reader.stop)  # before the loop stops: no press reaches a stopping loop
    ctx.status_extras["pedal"] = reader.status
    return reader
