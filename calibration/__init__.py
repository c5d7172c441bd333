"""Calibration as data, and the one place where units are converted (the bottom layer).

- ``calibration_file``  LeRobot's per-arm calibration JSON: read, validate, write, locate
- ``conventions``       the joint table; raw ticks <-> LeRobot units <-> LeIsaac simulation radians

This package imports nothing else of ours (``.ci/check_imports.py``). What drives servos lives
above it: the calibration registers in ``drivers.calibration_io``, the procedure in
``daemon.apps.calibration_procedure`` and ``so101d calibrate`` in ``daemon.apps.commands.calibrate``.
"""
