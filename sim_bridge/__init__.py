"""Simulator servers at the edge: MuJoCo and LeIsaac followers speaking ``drivers.sim_protocol``.

The daemon-side client is ``drivers.sim_follower``; this package may import everything below it
and nothing imports it back (``.ci/check_imports.py``).
"""
