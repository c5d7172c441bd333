"""STS3215 bus emulator: emulated SO-101 arms served on pseudo-terminals.

In-process::

    arm = EmulatedArm("follower")
    with BusEmulator(tmp_path / "follower", arm) as bus:
        ...  # open tmp_path / "follower" with scservo_sdk, LeRobot or our driver

As a subprocess with a control socket: ``EmulatorProcess`` (drivers.emulator.process), or the
``so101d emulate`` command.
"""

from drivers.emulator.arm import EmulatedArm, reference_calibration
from drivers.emulator.bus_server import BusEmulator, BusStats
from drivers.emulator.motion import (
    DemoMotion,
    HandoverMotion,
    KeyframeMotion,
    MotionError,
    StillMotion,
    load_trajectory,
)
from drivers.emulator.servo import EmulatedServo

__all__ = [
    "BusEmulator",
    "BusStats",
    "DemoMotion",
    "EmulatedArm",
    "EmulatedServo",
    "HandoverMotion",
    "KeyframeMotion",
    "MotionError",
    "StillMotion",
    "load_trajectory",
    "reference_calibration",
]
