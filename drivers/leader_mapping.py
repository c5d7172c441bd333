"""The leader as a simulated follower sees it under ``[follower] sim_mapping``.

``LeisaacMappedLeader`` wraps the daemon's leader so every reading is already in the sim
follower's units under LeIsaac's own leader map (``calibration.conventions.
leader_units_to_leisaac_sim_units``). Wrapping the leader (not the follower) keeps everything
downstream unchanged and truthful: the safety layer clamps to the sim arm's limits in the sim's
units, and the dataset records the sim arm's state and the target it was given, in the same units
as the HDF5 import writes (``sim_rad_to_units``). The episode's tag notes say which mapping was used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calibration.conventions import SimMapping, map_leader_to_sim


class LeisaacMappedLeader:
    """A LeaderArm whose ``read_joints`` applies a sim mapping; everything else is the leader's."""

    def __init__(self, leader: Any, leader_cal: Any, mapping: SimMapping = "leisaac") -> None:
        self._leader = leader
        self._cal = leader_cal
        self.sim_mapping = mapping
        # the leader's own reading before mapping, for consumers that want the leader itself
        # (the LeIsaac remote-leader publisher sends leader ticks, not sim targets)
        self.last_raw_units: np.ndarray | None = None

    def read_joints(self) -> np.ndarray:
        raw = self._leader.read_joints()
        self.last_raw_units = raw
        return map_leader_to_sim(raw, self.sim_mapping, self._cal)

    def __getattr__(self, name: str) -> Any:  # connect, close, port, calibration, kind...
        return getattr(self._leader, name)
