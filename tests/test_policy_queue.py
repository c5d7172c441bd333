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
    base = dict(action_period_s=P, interpolate=False, max_obs_age_s=10.0, refill_below=2, blend_s=0.0)
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


# -- issue 16: refill by usable horizon, smooth chunk boundaries --------------------------------
def test_actions_past_max_obs_age_do_not_count_as_queued() -> None:
    # LeRobot's default ACT: 100 actions at 30 fps (3.3 s) but only 1 s of them usable
    aq = ActionQueue(QueueConfig(action_period_s=1 / 30, max_obs_age_s=1.0, refill_below=10))
    aq.add_chunk(10.0, ramp(100, 0.0), now_s=10.17)
    assert aq.usable_horizon_s(10.17) == pytest.approx(0.83)
    assert aq.depth(10.17) == 25  # slots 6..30 start within 1 s of the observation, not 94
    # 0.3 s before the chunk expires, an inference of 0.2 s (+ margin) must already be under way
    assert aq.needs_refill(10.7, lead_s=0.35)
    assert not aq.needs_refill(10.5, lead_s=0.35)


def test_usable_horizon_ends_at_the_chunk_end_when_that_comes_first() -> None:
    aq = q(max_obs_age_s=5.0)
    aq.add_chunk(10.0, ramp(10, 0.0), now_s=10.1)
    assert aq.usable_horizon_s(10.1) == pytest.approx(0.9)
    assert aq.usable_horizon_s(11.5) == 0.0 and q().usable_horizon_s(0.0) == 0.0


def test_refill_on_horizon_never_runs_dry_while_inference_is_faster_than_a_chunk() -> None:
    """One inference in flight at a time, the loop at 100 Hz: the queue never runs dry (the
    old count rule, refill_below=10 of 100 actions, ran dry once per max_obs_age_s)."""
    latency = 0.17
    for lead_s, expect_dry in ((latency + 0.05, False), (None, True)):
        aq = ActionQueue(QueueConfig(action_period_s=1 / 30, max_obs_age_s=1.0, refill_below=10))
        in_flight: float | None = None  # obs time of the request being computed
        dry = 0
        now = 0.0
        while now < 10.0:
            if in_flight is not None and now >= in_flight + latency:
                aq.add_chunk(in_flight, ramp(100, 0.0), now_s=now)
                in_flight = None
            if lead_s is not None:
                refill = aq.needs_refill(now, lead_s)
            else:  # the old rule: raw count of the newest chunk's actions left, usable or not
                newest = aq.newest_obs_time()
                refill = newest is None or 100 - math.ceil((now - newest) * 30) <= 10
            if in_flight is None and (len(aq) == 0 or refill):
                in_flight = now
            if now > 0.5 and aq.target(now) is None:
                dry += 1
            now = round(now + 0.01, 6)
        assert (dry > 0) is expect_dry, dry
    assert aq.chunks_expired >= 8  # the old rule: one expiry a second


def test_latest_merge_fades_a_new_chunk_in_over_blend_s() -> None:
    """A new chunk that disagrees with the current one by 30 degrees: without a fade the target
    steps 30 degrees in one cycle; with blend_s = 0.1 s no 10 ms cycle moves more than 3.1."""
    for blend_s, max_step in ((0.0, 30.0), (0.1, 3.1)):
        aq = q(merge="latest", blend_s=blend_s, interpolate=True, action_period_s=1 / 30)
        aq.add_chunk(10.0, np.zeros((100, 6)), now_s=10.0)
        targets = []
        for i in range(100):
            now = 10.0 + i * 0.01
            if i == 40:
                aq.add_chunk(10.2, np.full((100, 6), 30.0), now_s=now)
            targets.append(aq.target(now)[0])
        steps = np.abs(np.diff(targets))
        assert steps.max() == pytest.approx(max_step, abs=0.11), steps.max()
        assert targets[-1] == 30.0  # the new chunk wins once faded in


def test_fades_chain_when_chunks_arrive_faster_than_blend_s() -> None:
    aq = q(merge="latest", blend_s=0.1, interpolate=True)
    aq.add_chunk(10.0, np.zeros((100, 6)), now_s=10.0)
    aq.add_chunk(10.02, np.full((100, 6), 10.0), now_s=10.05)
    before = aq.target(10.07)[0]
    aq.add_chunk(10.04, np.full((100, 6), 20.0), now_s=10.07)
    assert aq.target(10.07)[0] == pytest.approx(before)  # the third starts from where the fade was
    assert aq.target(10.2)[0] == 20.0


def test_average_merge_is_unchanged_by_blend_s() -> None:
    aq = q(merge="average", ensemble_coeff=0.0, blend_s=0.1)
    aq.add_chunk(10.0, ramp(10, 0.0), now_s=10.0)
    aq.add_chunk(10.2, ramp(10, 100.0), now_s=10.2)
    assert aq.target(10.25)[0] == pytest.approx((2.0 + 100.0) / 2)
