"""Rolling statistics: percentiles over the window, all-time max, no growth."""

from __future__ import annotations

import numpy as np

from daemon.control.timing_stats import LoopStats, RollingStats


def test_percentiles_over_window_and_all_time_max():
    s = RollingStats(capacity=100)
    assert s.summary().count == 0
    s.add(50.0)
    for v in range(1, 201):
        s.add(float(v) / 1000)
    summ = s.summary()
    assert summ.count == 201 and summ.window == 100
    assert summ.max == 0.2 and summ.max_all_time == 50.0
    assert abs(summ.p50 - np.percentile(np.arange(101, 201) / 1000, 50)) < 1e-12
    assert s.values().shape == (100,)


def test_loop_stats_summaries_in_ms():
    ls = LoopStats(capacity=8)
    ls.cycle.add(0.001)
    d = ls.summaries_ms()
    assert d["cycle"]["p50"] == 1.0 and d["period"]["count"] == 0
