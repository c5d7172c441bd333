"""Dataset tools that work on a LeRobot v3.0 dataset at rest (import, export, inspect)."""
