"""The two config types LeRobot's CLIs parse: ``--robot.type=so101d`` and ``--teleop.type=so101d``."""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.robots.config import RobotConfig
from lerobot.teleoperators.config import TeleoperatorConfig


@RobotConfig.register_subclass("so101d")
@dataclass
class SO101DConfig(RobotConfig):
    # the daemon's control socket (default: the one `so101d status` finds)
    socket: str | None = None
    # which of the daemon's arms this robot is: "follower" on a single-arm bench; on a bimanual one
    # "left" or "right" (one arm, so101_follower's keys), or "pair" (both, bi_so_follower's keys)
    arm: str = "follower"
    # the daemon's cameras to observe, by their names in its configuration ([cameras.NAME]);
    # their frames come through shared memory, so the daemon must run on this machine
    # (not `cameras`: LeRobot's RobotConfig checks that one holds camera configs of its own)
    daemon_cameras: list[str] = field(default_factory=list)
    # seconds to wait for one reply of the daemon before calling it gone
    timeout_s: float = 2.0


@TeleoperatorConfig.register_subclass("so101d")
@dataclass
class SO101DTeleopConfig(TeleoperatorConfig):
    # the daemon's control socket (default: the one `so101d status` finds)
    socket: str | None = None
    # the follower arm whose leader this is (the daemon's arm name), or "pair": a bimanual
    # daemon's two leaders, with bi_so_leader's keys
    arm: str = "follower"
    timeout_s: float = 2.0
