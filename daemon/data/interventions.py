"""LeRobot's ``intervention`` column: which frames of a policy episode the operator drove.

LeRobot 0.6.1's DAgger rollout (``lerobot-rollout --strategy.type=dagger``) declares the feature
when it creates its dataset (lerobot/rollout/context.py: ``dataset_features["intervention"] =
{"dtype": "bool", "shape": (1,), "names": None}``) and writes ``np.array([True])`` on every frame
the teleoperator drove (CORRECTING) and ``[False]`` on the policy's frames (AUTONOMOUS)
(lerobot/rollout/strategies/dagger.py, ``_run_continuous``); in its default corrections-only mode
(``record_autonomous=False``, rollout/configs.py ``DAggerStrategyConfig``) each correction is an
episode of its own, every frame True.

Ours is derived from the per-frame ``so101d.source`` record (the control loop's ``CycleRecord``:
which source drove each arm that cycle), so it is true exactly where that record says so: a frame
is an intervention when some arm was driven by a source other than the policy (the operator's
leader). A frame held while the leader is brought over is the policy's (paused) frame: False.
A teleoperated episode in such a dataset is the operator's throughout: True on every frame, as
one of LeRobot's corrections-only episodes.

The column exists only in datasets created by a policy episode (the store decides when it creates
the dataset: store.py ``_create``); a dataset created by teleoperation keeps its features, and
later policy episodes in it keep their interventions in the tag and the source column only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

INTERVENTION_KEY = "intervention"
POLICY_SOURCE = "policy"  # the control loop's name of the policy's target source


def intervention_feature() -> dict[str, Any]:
    """The feature exactly as lerobot/rollout/context.py declares it for the DAgger strategy."""
    return {"dtype": "bool", "shape": (1,), "names": None}


def is_intervention(source: str) -> bool:
    """One frame's ``so101d.source`` ("follower=leader", "left=policy,right=leader") -> did the
    operator drive an arm in it. An empty record (unknown) is no intervention."""
    if not source:
        return False
    for part in source.split(","):
        _arm, _, name = part.partition("=")
        if name and name != POLICY_SOURCE:
            return True
    return False


def intervention_flags(sources: Sequence[str]) -> np.ndarray:
    """Per frame, as the column stores it (bool, one value a frame)."""
    return np.fromiter((is_intervention(s) for s in sources), dtype=bool, count=len(sources))


def intervention_runs(sources: Sequence[str], fps: float) -> tuple[int, float]:
    """(how many interventions, their total length in seconds): runs of intervention frames."""
    flags = intervention_flags(sources)
    if not flags.size:
        return 0, 0.0
    starts = int(flags[0]) + int(np.count_nonzero(flags[1:] & ~flags[:-1]))
    return starts, round(float(np.count_nonzero(flags)) / float(fps), 3)
