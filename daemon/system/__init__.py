"""The operating system beneath the daemon: logs, realtime scheduling, sd_notify, terminals, serial ports.

Knows nothing of arms, loops or datasets; every other layer may use it.

May import: calibration, drivers.
"""
