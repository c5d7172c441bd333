"""SIGHUP: which configuration keys changed, and which of them can be applied without a restart.

Live keys are those the control loop reads every cycle or on its next event (safety limits,
health period, reconnect backoff, the task text of the next episode). Everything that is bound
at start — ports, ids, loop rate, socket, cameras, dataset location, policy, what is written to
the servos at connect — needs a restart; a reload logs those keys and keeps their old values,
so the running daemon never ends up half-configured. A file that does not load keeps the whole
old configuration.

Usage (daemon core, main thread, after SIGHUP):
    notifier.reloading()
    try:
        applied, plan = reload_config(path, daemon.cfg)
    except ConfigError as exc:   # bad file: log it, keep running as before
        ...
    else:
        loop.call(lambda: loop.apply_config(applied))   # the loop swaps its cfg between cycles
        log plan.summary()
    notifier.ready()
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# fnmatch patterns over dotted keys.
LIVE_KEYS: tuple[str, ...] = (
    "safety.*",
    "control.health_period_s",
    "control.reconnect_backoff_min_s",
    "control.reconnect_backoff_max_s",
    "control.start_mode",  # only consulted at (re)start: changing it live is harmless
    "follower.torque_off_on_shutdown",
    "follower.stale_timeout_s",
    "recording.task",
    "recording.on_shutdown",  # read when the daemon stops
)


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dataclass / dict tree -> {"section.key": value}; camera tables give "cameras.front.width"."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    elif isinstance(obj, dict):
        items = obj
    else:
        return {prefix: obj}
    out: dict[str, Any] = {}
    if not items and prefix:
        out[prefix] = {}  # an empty table (no cameras) is still a value that can change
    for k, v in items.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten(v, key))
    return out


def is_live(key: str, patterns: tuple[str, ...] = LIVE_KEYS) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


@dataclass
class ReloadPlan:
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (old, new)
    live: list[str] = field(default_factory=list)
    restart_required: list[str] = field(default_factory=list)

    @property
    def nothing_changed(self) -> bool:
        return not self.changed

    def summary(self) -> str:
        if not self.changed:
            return "configuration reloaded: nothing changed"
        parts = []
        if self.live:
            parts.append(
                "applied " + ", ".join(f"{k} {self.changed[k][0]!r} -> {self.changed[k][1]!r}" for k in self.live)
            )
        if self.restart_required:
            parts.append("restart needed for " + ", ".join(self.restart_required) + " (kept the running values)")
        return "configuration reloaded: " + "; ".join(parts)


def plan_reload(old: Any, new: Any, patterns: tuple[str, ...] = LIVE_KEYS) -> ReloadPlan:
    a, b = flatten(old), flatten(new)
    plan = ReloadPlan()
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va == vb:
            continue
        plan.changed[key] = (None if va is _MISSING else va, None if vb is _MISSING else vb)
        (
            plan.live if is_live(key, patterns) and va is not _MISSING and vb is not _MISSING else plan.restart_required
        ).append(key)
    return plan


def apply_live(current: Any, new: Any, plan: ReloadPlan) -> Any:
    """A copy of ``current`` with only the live keys taken from ``new`` (never mutates either)."""
    out = copy.deepcopy(current)
    for key in plan.live:
        *path, last = key.split(".")
        target = out
        for part in path:
            target = target[part] if isinstance(target, dict) else getattr(target, part)
        value = copy.deepcopy(plan.changed[key][1])
        if isinstance(target, dict):
            target[last] = value
        else:
            setattr(target, last, value)
    return out


def reload_config(path: str | Path, current: Any) -> tuple[Any, ReloadPlan]:
    """Load ``path`` (daemon.config.settings.load_config: raises ConfigError on a bad file, leaving the
    caller on ``current``), and return (config to run with, plan)."""
    from daemon.config.settings import load_config

    new = load_config(path)
    plan = plan_reload(current, new)
    return apply_live(current, new, plan), plan


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()
