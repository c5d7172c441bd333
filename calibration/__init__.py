"""Calibration as data, and the one place where units are converted.

- ``calibration_file``  LeRobot's per-arm calibration JSON: read, validate, write, locate
- ``conventions``       raw ticks <-> LeRobot units <-> LeIsaac simulation radians
- ``procedure``         the calibration procedure (interactive CLI and a non-interactive API)
"""
