"""The daemon's configuration: one TOML file, one dataclass per section (settings.py), and which keys a
SIGHUP reload may change (reload.py).

May import: calibration, drivers, daemon.system.
"""
