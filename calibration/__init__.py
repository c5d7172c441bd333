"""Calibration as data, and the one place where units are converted.

- ``calibration_file``  LeRobot's per-arm calibration JSON: read, validate, write, locate
- ``conventions``       raw ticks <-> LeRobot units <-> LeIsaac simulation radians
- ``procedure``         the calibration procedure as a step-driven API (``CalibrationSession``)
- ``servo_sync``        the calibration the servos hold: read, write, ``verify_against_servos``
- ``cli``               ``so101d calibrate leader|follower`` (interactive) and ``--verify``
"""
