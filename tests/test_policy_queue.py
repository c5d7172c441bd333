"""ActionQueue: time indexing, stale dropping, merging (latest / temporal ensembling), refill."""

from __future__ import annotations

import math

import numpy as np
import pytest

from daemon.policy.action_queue import ActionQueue, QueueConfig

P = 0.1  # action period in these tests


def ramp(n: int, start: float, step: float = 1.0) -> np.ndarray:
    """Chunk whose action k is start + k*step on every joint."""
    return np.repeat((start + step * np.arange(n))[:, None], 6, axis=1)


def q(**kw) -> ActionQueue:
    base = dict(action_period_s=P, interpolate=False, max_obs_age_s=10.0, refill_below=2)
    base.update(kw)
    return ActionQueue(QueueConfig(**base))


def test_empty_queue_holds() -> None:
    assert q().target(5.0) is None


def test_actions_are_indexed_by_observation_time() -> None:
    aq = q()
    aq.add_chunk(obs_time_s=10.0, actions=ramp(5, 0.0), now_s=10.0)
    assert aq.target(10.0)[0] == 0.0
    assert aq.target(10.05)[0] == 0.0
    assert aq.target(10.1001)[0] == 1.0
    assert aq.target(10.45)[0] == 4.0
    assert aq.target(10.51) is None  # exhausted: hold, never replay an old action


def test_slots_passed_during_inference_are_dropped_stale() -> None:
    aq = q()
    # computed from an observation 0.25 s old: actions 0 and 1 are already in the past
    kept = aq.add_chunk(obs_time_s=10.0, actions=ramp(5, 0.0), now_s=10.25)
    assert kept == 3
    assert aq.actions_dropped_stale == 2
    assert aq.target(10.25)[0] == 2.0


def test_chunk_from_too_old_observation_is_rejected_and_expires() -> None:
    aq = q(max_obs_age_s=0.3)
    assert aq.add_chunk(10.0, ramp(10, 0.0), now_s=10.5) == 0
    assert aq.chunks_rejected == 1 and aq.target(10.5) is None
    aq.add_chunk(11.0, ramp(10, 0.0), now_s=11.0)
    assert aq.target(11.2) is not None
    assert aq.target(11.35) is None  # the observation got older than 0.3 s
    assert aq.chunks_expired == 1


def test_latest_merge_prefers_the_newest_chunk() -> None:
    aq = q(merge="latest")
    aq.add_chunk(10.0, ramp(10, 0.0), now_s=10.0)
    aq.add_chunk(10.2, ramp(10, 100.0), now_s=10.2)
    assert aq.target(10.25)[0] == 100.0
    assert aq.target(10.35)[0] == 101.0


def test_average_merge_is_temporal_ensembling() -> None:
    coeff = 0.5
    aq = q(merge="average", ensemble_coeff=coeff)
    aq.add_chunk(10.0, ramp(10, 0.0), now_s=10.0)  # at 10.25: action 2 -> 2
    aq.add_chunk(10.2, ramp(10, 100.0), now_s=10.2)  # at 10.25: action 0 -> 100
    w0, w1 = 1.0, math.exp(-coeff)
    expected = (w0 * 2.0 + w1 * 100.0) / (w0 + w1)
    assert aq.target(10.25)[0] == pytest.approx(expected)
    # once the old chunk is exhausted only the new one counts
    assert aq.target(11.05)[0] == pytest.approx(108.0)


def test_interpolation_between_slots() -> None:
    aq = q(interpolate=True)
    aq.add_chunk(10.0, ramp(5, 0.0, step=10.0), now_s=10.0)
    assert aq.target(10.05)[0] == pytest.approx(5.0)
    assert aq.target(10.125)[0] == pytest.approx(12.5)
    assert aq.target(10.45)[0] == pytest.approx(40.0)  # last action held through its slot


def test_depth_and_refill_threshold() -> None:
    aq = q(refill_below=2)
    assert aq.needs_refill(0.0)
    aq.add_chunk(10.0, ramp(5, 0.0), now_s=10.0)
    assert aq.depth(10.0) == 5 and not aq.needs_refill(10.0)
    assert aq.depth(10.21) == 2 and aq.needs_refill(10.21)


def test_bad_chunks_are_refused() -> None:
    aq = q()
    with pytest.raises(ValueError, match="NaN"):
        aq.add_chunk(10.0, np.full((3, 6), np.nan), 10.0)
    with pytest.raises(ValueError, match=r"\(n, 6\)"):
        aq.add_chunk(10.0, np.zeros((3, 5)), 10.0)
    with pytest.raises(ValueError):
        QueueConfig(merge="median")
    assert aq.target(10.0) is None


def test_target_returns_a_copy() -> None:
    aq = q()
    aq.add_chunk(10.0, ramp(3, 1.0), now_s=10.0)
    a = aq.target(10.0)
    a[:] = 99.0
    assert aq.target(10.0)[0] == 1.0
