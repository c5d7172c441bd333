"""The dataset, one package: the schema every episode uses (schema.py), the loop-side recorder and
the writer process that owns the LeRobot v3.0 dataset (recorder.py, ring.py, writer.py, store.py),
dataset tools at rest (check, edit, tags, summary, repack) and Isaac Lab HDF5 interop.

May import: calibration, drivers, daemon.system, daemon.config, daemon.control.
"""
