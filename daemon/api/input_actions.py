"""What an operator's input (a pedal, a terminal key, the console's button) asks for, in verbs.

A pedal press or a key is an *action*; which control-socket verb it becomes depends on who drives
the arm at that moment (:func:`verb_for`), and the verb's own refusals answer it. One table, so
the foot pedal (daemon/service/pedal.py) and the terminal sessions (daemon/apps/commands/) never
disagree. so101d's correction starts with the take-over that brings the leader to the follower, so
LeRobot's two steps (pause, then correct: lerobot/rollout/strategies/dagger.py) are one here and
both of LeRobot's inputs toggle it during a policy run; outside one, ``pause_resume`` holds the arm
and gives it back to the leader.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Action(Enum):
    PAUSE_RESUME = "pause_resume"
    CORRECTION = "correction"
    SAVE = "save"
    KEEP = "keep"  # keep the last seconds of the pre-roll buffer as an episode ([recording] ring_s)


@dataclass(frozen=True)
class Driver:
    """Who drives the arm when the operator presses."""

    intent: str  # the loop's: idle, hold, teleop, policy
    correcting: bool  # a policy run's correction: the operator drives, inside the policy episode
    policy_run: bool  # a policy is started (driving or being corrected)


def verb_for(action: Action, driver: Driver) -> str:
    """The control-socket verb ``action`` asks for now (refused by the verb when it cannot be done)."""
    if action is Action.SAVE:
        return "episode.save"
    if action is Action.KEEP:
        return "episode.keep"
    if driver.correcting:
        return "policy.resume"
    if driver.policy_run or action is Action.CORRECTION:
        return "policy.correct"  # refused with the reason when no policy runs
    return "teleop.stop" if driver.intent == "teleop" else "teleop.start"
