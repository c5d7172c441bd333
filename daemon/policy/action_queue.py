"""Time-stamped action chunks, consumed by the control loop at its own rate.

A policy predicts a chunk of ``n`` actions from one observation taken at ``obs_time_s``
(``time.monotonic()``, shared by every process on the machine); action ``k`` is meant for
``obs_time_s + k * action_period_s`` (the dataset's frame period, 1/30 s by default). The control
loop runs faster (100 Hz) and asks for the target *now*:

- each chunk is indexed by time, so actions whose slot has already passed by the time the chunk
  arrives (inference latency) are never used: they are counted as dropped-stale;
- a chunk computed from an observation older than ``max_obs_age_s`` is dropped whole;
- between two slots the target is linearly interpolated (``interpolate``), so a 30 Hz policy
  drives a 100 Hz loop without steps;
- overlapping chunks are merged: ``latest`` (the newest chunk that covers now wins, cross-faded in
  from the chunk it replaces over ``blend_s`` so a chunk boundary is not a step) or ``average``
  (ACT's temporal ensembling: every live chunk that covers now, weighted
  ``exp(-ensemble_coeff * i)`` with i = 0 for the oldest);
- ``usable_horizon_s(now)`` is the time until the last action that will still be used: a chunk's
  end or ``max_obs_age_s`` after its observation, whichever comes first. The runner asks for the
  next chunk when that horizon falls to its measured inference latency plus a margin (counting
  queued actions would also count the ones that expire before their slot: docs/design/policy-refill.md).
  ``refill_below`` remains a floor on the action count.

Everything here is plain numpy on (6,) arrays and a handful of chunks: a few microseconds per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

MergeMode = Literal["latest", "average"]


@dataclass
class QueueConfig:
    action_period_s: float = 1.0 / 30.0
    merge: MergeMode = "latest"
    ensemble_coeff: float = 0.01
    max_obs_age_s: float = 1.0
    refill_below: int = 5
    interpolate: bool = True
    max_chunks: int = 8  # bound on overlapping chunks kept (memory and cost stay bounded)
    # merge = "latest": a new chunk takes over from the one it replaces linearly over this long, so
    # two chunks that disagree by D move the target by D * loop_period / blend_s per cycle, not by D
    blend_s: float = 0.1

    def __post_init__(self) -> None:
        if not (self.action_period_s > 0 and math.isfinite(self.action_period_s)):
            raise ValueError(f"action_period_s must be > 0, got {self.action_period_s}")
        if self.merge not in ("latest", "average"):
            raise ValueError(f"merge must be 'latest' or 'average', got {self.merge!r}")
        if self.max_obs_age_s <= 0:
            raise ValueError(f"max_obs_age_s must be > 0, got {self.max_obs_age_s}")
        if self.refill_below < 0:
            raise ValueError(f"refill_below must be >= 0, got {self.refill_below}")
        if self.max_chunks < 1:
            raise ValueError("max_chunks must be >= 1")
        if not (self.blend_s >= 0 and math.isfinite(self.blend_s)):
            raise ValueError(f"blend_s must be >= 0, got {self.blend_s}")

    @property
    def usable_actions(self) -> int:
        """How many actions of a chunk can be used at most: slot k is usable while its start is no
        later than ``max_obs_age_s`` after the observation."""
        return math.floor(self.max_obs_age_s / self.action_period_s + 1e-9) + 1

    def chunk_horizon_s(self, n_actions: int) -> float:
        """How long a fresh chunk of n actions can drive the arm, from its observation."""
        return min(n_actions * self.action_period_s, self.max_obs_age_s)


class _Chunk:
    __slots__ = ("actions", "arrived_s", "end_s", "n", "obs_time_s", "seq")

    def __init__(self, obs_time_s: float, actions: np.ndarray, seq: int, arrived_s: float, end_s: float):
        self.obs_time_s = obs_time_s
        self.actions = actions
        self.n = actions.shape[0]
        self.seq = seq
        self.arrived_s = arrived_s  # when it joined the queue: the cross-fade starts here
        self.end_s = end_s  # last instant an action of it is used (chunk end or observation too old)


class ActionQueue:
    """Merges time-stamped chunks and answers "what now?" for the control loop."""

    def __init__(self, config: QueueConfig | None = None, action_dim: int = 6):
        self.config = config or QueueConfig()
        self.action_dim = action_dim
        self._chunks: list[_Chunk] = []  # sorted by obs_time_s, oldest first
        self._seq = 0
        self.chunks_added = 0
        self.chunks_rejected = 0  # whole chunk too old on arrival
        self.actions_dropped_stale = 0  # actions whose slot had passed on arrival
        self.chunks_expired = 0  # the newest chunk ran out because its observation got too old
        self._out = np.zeros(action_dim, dtype=np.float64)

    # -- producer side ------------------------------------------------------------------------
    def add_chunk(self, obs_time_s: float, actions: np.ndarray, now_s: float) -> int:
        """Add a chunk computed from the observation at obs_time_s; returns actions kept usable."""
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != self.action_dim or a.shape[0] == 0:
            raise ValueError(f"action chunk must be (n, {self.action_dim}), got {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError("action chunk contains NaN or inf")
        cfg = self.config
        if now_s - obs_time_s > cfg.max_obs_age_s:
            self.chunks_rejected += 1
            self.actions_dropped_stale += a.shape[0]
            return 0
        # Slots fully in the past on arrival: the latency ate them.
        passed = int(max(0.0, (now_s - obs_time_s) / cfg.action_period_s))
        usable = max(0, a.shape[0] - passed)
        self.actions_dropped_stale += min(passed, a.shape[0])
        if usable == 0:
            self.chunks_rejected += 1
            return 0
        self._seq += 1
        end_s = obs_time_s + cfg.chunk_horizon_s(a.shape[0])
        chunk = _Chunk(obs_time_s, a.copy(), self._seq, now_s, end_s)
        i = len(self._chunks)
        while i > 0 and self._chunks[i - 1].obs_time_s > obs_time_s:
            i -= 1
        self._chunks.insert(i, chunk)
        if len(self._chunks) > cfg.max_chunks:
            del self._chunks[0 : len(self._chunks) - cfg.max_chunks]
        self.chunks_added += 1
        return usable

    def clear(self) -> None:
        self._chunks.clear()

    # -- consumer side (control loop) ----------------------------------------------------------
    def _value(self, c: _Chunk, now_s: float) -> np.ndarray | None:
        u = (now_s - c.obs_time_s) / self.config.action_period_s
        if u < 0.0:
            u = 0.0
        k = int(u)
        if k >= c.n:
            return None
        if self.config.interpolate and k + 1 < c.n:
            f = u - k
            return c.actions[k] * (1.0 - f) + c.actions[k + 1] * f
        return c.actions[k]

    def _prune(self, now_s: float) -> None:
        cfg = self.config
        keep = []
        newest = self._chunks[-1] if self._chunks else None
        for c in self._chunks:
            if now_s - c.obs_time_s > cfg.max_obs_age_s:
                # only the chunk that was driving counts: a superseded one ageing out is normal
                self.chunks_expired += c is newest
            elif (now_s - c.obs_time_s) / cfg.action_period_s >= c.n:
                pass  # exhausted
            else:
                keep.append(c)
        if len(keep) != len(self._chunks):
            self._chunks = keep

    def target(self, now_s: float) -> np.ndarray | None:
        """Merged target at now_s (a new array), or None when nothing fresh covers now."""
        self._prune(now_s)
        if not self._chunks:
            return None
        if self.config.merge == "latest":
            v = self._latest(len(self._chunks) - 1, now_s)
            return None if v is None else np.array(v, dtype=np.float64)
        acc = self._out
        acc[:] = 0.0
        wsum = 0.0
        for i, c in enumerate(self._chunks):  # oldest first: i = 0 weighs most when coeff > 0
            v = self._value(c, now_s)
            if v is None:
                continue
            w = math.exp(-self.config.ensemble_coeff * i)
            acc += w * v
            wsum += w
        if wsum == 0.0:
            return None
        return acc / wsum

    def _latest(self, i: int, now_s: float) -> np.ndarray | None:
        """Value of the newest chunk at or below index i that covers now, cross-faded from the
        chunk it replaced while within ``blend_s`` of its arrival (recursively: that one may
        itself still be fading in when chunks arrive faster than blend_s)."""
        while i >= 0:
            c = self._chunks[i]
            v = self._value(c, now_s)
            if v is not None:
                blend = self.config.blend_s
                if blend > 0 and now_s < c.arrived_s + blend:
                    old = self._latest(i - 1, now_s)
                    if old is not None:
                        a = max(0.0, now_s - c.arrived_s) / blend
                        return old * (1.0 - a) + v * a
                return v
            i -= 1
        return None

    def depth(self, now_s: float) -> int:
        """Future actions of the newest chunk that will still be used (0 when empty): actions
        whose slot comes after the observation got too old are not counted."""
        if not self._chunks:
            return 0
        c = self._chunks[-1]
        u = (now_s - c.obs_time_s) / self.config.action_period_s
        return max(0, min(c.n, self.config.usable_actions) - max(0, math.ceil(u)))

    def usable_horizon_s(self, now_s: float) -> float:
        """Seconds until the last action that will still be used runs out (0 when empty)."""
        end = max((c.end_s for c in self._chunks), default=now_s)
        return max(0.0, end - now_s)

    def needs_refill(self, now_s: float, lead_s: float = 0.0) -> bool:
        """Ask for the next chunk now? When what is left lasts no longer than ``lead_s`` (the
        runner's measured inference latency plus a margin), or the action count is at the floor."""
        return self.usable_horizon_s(now_s) <= lead_s or self.depth(now_s) <= self.config.refill_below

    def newest_obs_time(self) -> float | None:
        return self._chunks[-1].obs_time_s if self._chunks else None

    def __len__(self) -> int:
        return len(self._chunks)
