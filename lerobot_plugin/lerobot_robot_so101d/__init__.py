"""so101d as a LeRobot plugin: robot ``so101d`` and teleoperator ``so101d``.

LeRobot's CLIs import this distribution at start (its name begins with ``lerobot_robot_``), which
registers the two config types; LeRobot then finds the device classes here by its own lookup
(``make_device_from_device_class``: the config class's name without ``Config``, in this package).
"""

from lerobot_robot_so101d.config_so101d import SO101DConfig, SO101DTeleopConfig
from lerobot_robot_so101d.so101d import SO101D
from lerobot_robot_so101d.so101d_teleop import SO101DTeleop

__all__ = ["SO101D", "SO101DConfig", "SO101DTeleop", "SO101DTeleopConfig"]
